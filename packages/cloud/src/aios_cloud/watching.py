"""Following a job's logs and watching it: the watcher polls the job and the cloud's view of the
cluster and, for a managed run, recovers from preemption or lost hosts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aios.errors import AiosError
from aios.resilience.notices import EXIT_PREEMPTED

from aios_cloud import runs, shapes
from aios_cloud.failover import create_with_failover, zone_order
from aios_cloud.head import HELPER_PYTHON, Head
from aios_cloud.jobs import JobSpec, cancel_job, poll_job, run_setup, start_job, sync_code
from aios_cloud.lifecycle import autostop_of, down_cluster, reinstall_agent
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterInfo
from aios_cloud.provider.errors import CapacityError, CloudError, NotOfferedError, QuotaError
from aios_cloud.provider.states import STOPPED, TERMINATED
from aios_cloud.records import (
    REQUEST_FIELDS,
    Log,
    info_from,
    record_hosts,
    remote_root,
    request_dict,
    request_from_dict,
    request_from_record,
    runner_for,
    save_hosts,
    with_public_key,
)
from aios_cloud.signals import signals_deferred, terminated
from aios_cloud.ssh import (
    SSH_RETRIES,
    LinePrinter,
    SshError,
    _kill,
    _reap,
    _spawn,
)
from aios_cloud.store import (
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_FINAL,
    JOB_PENDING,
    JOB_RECOVERING,
    JOB_RUNNING,
    JOB_SETTING_UP,
    JOB_SUCCEEDED,
    ClusterRecord,
    JobRecord,
    Store,
)


class LogFollower:
    """Every host's worker.log, each line prefixed, until :meth:`stop`: one ssh to the head
    host, which follows the other hosts over the cluster network."""

    def __init__(
        self,
        rec: ClusterRecord,
        job_id: int,
        printer: Callable[[str, str], None],
        from_start: bool = True,
        workers: list[int] | None = None,
    ) -> None:
        head = Head(rec)
        helper = head.ensure_helper()
        d = f"{remote_root(rec.name)}/jobs/{job_id}"
        req = {
            "hosts": head._hosts_json(
                [h for h in head.hosts if workers is None or h.worker_id in workers]
            ),
            "self": head.head.worker_id,
            "jobdir": d,
            "from_start": from_start,
        }
        argv = head.runner.argv(head.head, f"{HELPER_PYTHON} {helper} tail {head.root}")
        self.proc = _spawn(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            env=head.runner._env(),
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        self.thread = threading.Thread(
            target=self._pump, args=(self.proc, head.labels, printer), daemon=True
        )
        self.thread.start()

    @staticmethod
    def _pump(
        p: subprocess.Popen, labels: dict[int, str], printer: Callable[[str, str], None]
    ) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            tag, _, rest = line.rstrip("\n").partition(" ")
            w, _, text = rest.partition(" ")
            if tag == "O" and w.isdigit():
                printer(f"({labels.get(int(w), 'worker ' + w)})", text)

    def stop(self, drain: float = 1.0) -> None:
        time.sleep(drain)
        p = self.proc
        if p.poll() is None:
            try:
                assert p.stdin is not None
                p.stdin.close()  # the head's follower ends when its stdin closes
            except OSError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(p)
                p.wait()
        _reap(p)
        self.thread.join(2)


@dataclass
class WatchOptions:
    poll: float = 5.0
    describe_every: float = 15.0
    lost_after: int = 3
    straggler_grace: float = 60.0
    follow: bool = True
    ssh_timeout: float = 300.0
    #: seconds between copies of a running job's run records (its goodput outlives the hosts)
    copy_every: float = 300.0


class Watcher:
    """Watches one job to the end; on preemption/unhealthy/lost hosts it recovers (managed runs)
    up to ``max_restarts`` times: repair or recreate the cluster (zone failover), re-sync code,
    re-run setup, restart the job (which resumes from the newest complete checkpoint)."""

    def __init__(
        self,
        store: Store,
        provider: CloudProvider,
        job_id: int,
        config: Any,
        printer: Callable[[str, str], None] | None = None,
        log: Log | None = None,
        options: WatchOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.provider = provider
        self.job_id = job_id
        self.config = config
        self.printer = printer or LinePrinter()
        self.log = log or (lambda m: self.printer("[aios]", m))
        self.opt = options or WatchOptions()
        self.sleep = sleep
        #: the wall clock the spend (``--max-cost``) is projected with
        self.now = now
        self.follower: LogFollower | None = None
        self._unpriced = 0  # the shape --max-cost last said it has no price for
        self._pulled = self.now()  # when the job's run records were last copied here
        # hosts of a run that continued on fewer (--cloud ssh --min-hosts) answer again: the
        # newest checkpoint step then; the run grows back at the next one
        self._grow: tuple[list[str], int | None] | None = None

    # -------------------------------------------------------------- helpers
    def _job(self) -> JobRecord:
        job = self.store.get_job(self.job_id)
        if job is None:
            raise AiosError(f"job {self.job_id} does not exist", "see `aios status`")
        return job

    def _follow(self, rec: ClusterRecord) -> None:
        if self.opt.follow:
            self._unfollow()
            self.follower = LogFollower(rec, self.job_id, self.printer)

    def _unfollow(self) -> None:
        if self.follower:
            self.follower.stop()
            self.follower = None

    # -------------------------------------------------------------- main loop
    def run(self) -> int:
        """Returns the job's exit status (0 success)."""
        rec = self.store.get_cluster(self._job().cluster)
        if rec is None:
            return self._finish(JOB_CANCELLED, None, "cluster was deleted")
        self.store.update_job(self.job_id, watcher_pid=os.getpid())
        self._follow(rec)
        try:
            return self._loop()
        finally:
            self._unfollow()

    def _loop(self) -> int:
        """Observe the job and its cluster, classify what is seen into an incident (or none),
        act on it; once per poll until the job ends."""
        watch = _Watch()
        while True:
            job = self._job()
            if job.state in JOB_FINAL:
                return 0 if job.state == JOB_SUCCEEDED else 1
            rec = self.store.get_cluster(job.cluster)
            if rec is None:
                return self._finish(JOB_CANCELLED, None, "cluster was deleted")
            seen = self._observe(job, rec, watch)
            if seen is None:  # the API hiccuped: look again at the next poll
                self.sleep(self.opt.poll)
                continue
            incident = seen.incident or _host_incident(seen.states)
            if incident is None:
                code = self._on_exits(rec, seen, watch)
                if code is not None:
                    return code
                incident = _lost_incident(seen.states, watch, self.opt.lost_after)
            if incident is None and seen.described and job.managed and job.state == JOB_RUNNING:
                step = self._grow_at(job, rec)
                if step is not None:
                    self._grow_back(job, rec, step)
                    watch.reset()
                    continue
            if incident is not None:
                code = self._incident(job, rec, incident)
                if code is not None:
                    return code
                watch.reset()
                continue
            code = self._check_cost(job, rec)
            if code is not None:
                return code
            if job.state == JOB_RUNNING and self.now() - self._pulled >= self.opt.copy_every:
                # the account of an attempt whose hosts vanish without an incident we could
                # act on (a preempted slice, a deleted VM) is kept up to this long ago
                self._pulled = self.now()
                self._pull_records(rec, full=False, timeout=15.0)
            self.sleep(self.opt.poll)

    # -------------------------------------------------------------- observe
    def _observe(self, job: JobRecord, rec: ClusterRecord, watch: _Watch) -> _Seen | None:
        """Each worker's state, and (every ``describe_every`` seconds, or when a worker is not
        running) the cluster as the cloud describes it; ``None`` when the describe failed.

        Hosts that do not answer at once: the cloud is asked first (a preempted or deleted
        cluster is acted on now, not after SSH's back-offs), then, if it shows nothing wrong,
        the hosts again with the back-offs (a passing network hiccup is no lost host)."""
        states = self._poll(rec, retries=0)
        if any(s == "UNREACHABLE" for s, _ in states):
            now = time.monotonic()
            try:
                incident = _cluster_incident(self.provider.describe(rec.name, rec.zone))
            except CloudError:
                incident = None  # the look with back-offs below describes it again
            if incident is not None:
                watch.last_describe = now
                return _Seen(states, now, True, incident)
            states = self._poll(rec)
        now = time.monotonic()
        queued = bool(states) and all(s == "QUEUED" for s, _ in states)
        if queued != (job.state == JOB_PENDING):
            # waiting in the cluster's queue behind an earlier job
            self.store.update_job(self.job_id, state=JOB_PENDING if queued else JOB_RUNNING)
        states = [("RUNNING" if s == "QUEUED" else s, c) for s, c in states]
        described = now - watch.last_describe >= self.opt.describe_every or any(
            s != "RUNNING" for s, _ in states
        )
        incident = None
        if described:
            watch.last_describe = now
            try:
                info = self.provider.describe(rec.name, rec.zone)
            except CloudError as exc:
                self.log(f"describe {rec.name} failed ({exc}); retrying")
                return None
            incident = _cluster_incident(info)
        return _Seen(states, now, described, incident)

    def _poll(self, rec: ClusterRecord, retries: int = SSH_RETRIES) -> list[tuple[str, int | None]]:
        """:func:`poll_job`; every host unreachable when even that fails."""
        try:
            return poll_job(rec, self.job_id, retries=retries)
        except SshError as exc:  # defensive: poll_job maps per-host SSH trouble itself
            self.log(f"polling {rec.name} failed ({exc}); retrying")
            return [("UNREACHABLE", None)] * max(1, len(rec.hosts))

    # -------------------------------------------------------------- act on exits
    def _on_exits(self, rec: ClusterRecord, seen: _Seen, watch: _Watch) -> int | None:
        """The job's end when every worker exited; the others stopped when one failed and they
        did not follow within ``straggler_grace``."""
        states = seen.states
        codes = [c for s, c in states if s == "EXIT"]
        if len(codes) == len(states):
            if all(c == 0 for c in codes):
                return self._finish(JOB_SUCCEEDED, codes, "all workers exited 0")
            return self._finish(JOB_FAILED, codes, f"worker exit codes {codes}")
        if any(c != 0 for c in codes):
            watch.first_nonzero = watch.first_nonzero or seen.now
            if seen.now - watch.first_nonzero > self.opt.straggler_grace:
                cancel_job(rec, self.job_id)
                return self._finish(
                    JOB_FAILED,
                    [c if s == "EXIT" else -9 for s, c in states],
                    "a worker failed; the others were stopped",
                )
        return None

    # -------------------------------------------------------------- --max-cost
    def _stop_lead(self) -> float:
        """Seconds from one check of the spend to the job stopped: the next poll, then the
        grace its ranks get to write the emergency checkpoint (SIGTERM notice) and a margin."""
        return self.opt.poll + self._grace() + 5.0

    def _grace(self) -> float:
        return float(self.config.checkpoint.grace_seconds)

    def _check_cost(self, job: JobRecord, rec: ClusterRecord) -> int | None:
        """``--max-cost``: when the job's spend (each shape's catalog price x its time, on the
        injected clock) plus what the next :meth:`_stop_lead` seconds cost would pass the
        limit, checkpoint and stop the job. Returns the exit status then, else None."""
        limit = JobSpec.from_dict(job.spec).max_cost if job.spec else None
        if limit is None or job.state != JOB_RUNNING:
            return None
        js = shapes.job_shapes(self.store, rec.name, self.job_id, now=self.now)
        if not js:
            return None
        spent = sum(s["cost_usd"] or 0.0 for s in js)
        hourly = js[-1]["hourly_usd"] if js[-1]["ended"] is None else None
        if js[-1]["ended"] is None and hourly is None and self._unpriced != len(js):
            self._unpriced = len(js)  # once per shape
            self.log(
                f"--max-cost: no price is known for job {self.job_id}'s shape "
                f"({js[-1]['accelerator']} x {js[-1]['hosts']} hosts); its time is not counted"
            )
        lead = self._stop_lead()
        projected = spent + (hourly or 0.0) * lead / 3600.0
        if projected < limit:
            return None
        return self._stop_for_cost(rec, limit, spent, hourly, lead)

    def _stop_for_cost(
        self, rec: ClusterRecord, limit: float, spent: float, hourly: float | None, lead: float
    ) -> int:
        money = shapes.money
        at = f" at {money(hourly)}/h" if hourly is not None else ""
        msg = (
            f"job {self.job_id} has spent {money(spent)}{at}; the next {lead:.0f} s would pass "
            f"--max-cost {money(limit)}: checkpointing and stopping it"
        )
        self.log(msg)
        self.store.event(rec.name, "cost-limit", msg, self.job_id)
        grace = self._grace() + 5.0
        cancel_job(rec, self.job_id, grace=grace)
        saved = self._preempted_checkpoint(rec)
        if saved:
            what = f"checkpoint {saved} written; relaunch with the same checkpoint.dir to resume"
        else:
            what = "no emergency checkpoint was reported; the newest periodic checkpoint stands"
        self._finish(
            JOB_CANCELLED,
            None,
            f"stopped at the spending limit (--max-cost {money(limit)}, {money(spent)} spent); "
            + what,
        )
        return EXIT_PREEMPTED

    def _preempted_checkpoint(self, rec: ClusterRecord) -> str | None:
        """The emergency checkpoint rank 0 reported after the stop notice (its ``status/rank0``
        marker, ``preempted PATH``), else None."""
        hosts = record_hosts(rec)
        if not hosts:
            return None
        d = f"{remote_root(rec.name)}/jobs/{self.job_id}/status"
        try:
            r = runner_for(rec, None, retries=0).run_one(
                hosts[0], f"cat {d}/rank0 2>/dev/null; true", stream=False, timeout=30
            )
        except SshError:
            return None
        for line in r.stdout:
            word, _, path = line.strip().partition(" ")
            if word == "preempted" and path:
                return path.strip()
        return None

    def _pull_records(self, rec: ClusterRecord | None, full: bool, timeout: float) -> None:
        """Copy the job's run records here (its goodput outlives the hosts)."""
        job = self.store.get_job(self.job_id)
        if rec is not None and job is not None:
            runs.pull(rec, job, full=full, timeout=timeout)

    def _end_shape(self, job: JobRecord, rec: ClusterRecord | None, why: str) -> None:
        if rec is not None:
            shapes.end(
                self.store, rec, self.job_id, shapes.newest_step(rec, job.checkpoint_dir), why
            )

    def _grow_at(self, job: JobRecord, rec: ClusterRecord) -> int | None:
        """The checkpoint step at which a run on fewer hosts than its cluster lists grows back:
        once the missing hosts answer, the next checkpoint after that (None: not yet)."""
        if self._grow is None:
            back = self.provider.returned_hosts(request_from_record(rec), record_hosts(rec))
            if back:
                step = shapes.newest_step(rec, job.checkpoint_dir)
                self._grow = (back, step)
                self.log(
                    f"{', '.join(back)} answer again: job {self.job_id} grows back to every "
                    f"host at its next checkpoint (after step {step or 0})"
                )
            return None
        step = shapes.newest_step(rec, job.checkpoint_dir)
        if step is not None and (self._grow[1] is None or step > self._grow[1]):
            return step
        return None

    def _grow_back(self, job: JobRecord, rec: ClusterRecord, step: int) -> None:
        """Stop the job at its checkpoint and relaunch it on every host of the cluster (a
        planned restart: it uses none of the restarts ``--max-restarts`` allows)."""
        assert self._grow is not None
        back, self._grow = self._grow[0], None
        self._unfollow()
        self.log(
            f"job {self.job_id} reached the checkpoint of step {step}: stopping it to relaunch "
            f"on every host ({', '.join(back)} back); it resumes from that checkpoint"
        )
        cancel_job(rec, self.job_id)
        self._end_shape(job, rec, "grown back to every host")
        self.store.event(
            rec.name,
            "grow",
            f"job {self.job_id}: {', '.join(back)} back at step {step}",
            self.job_id,
        )
        self.store.update_job(self.job_id, state=JOB_RECOVERING)
        try:
            self._relaunch(job, rec, "hosts returned", "grow", "grown back")
        except AiosError as exc:
            self.store.event(rec.name, "recovery-failed", f"grow-back: {exc}", self.job_id)
            self.log(f"growing back failed: {exc}; the watcher recovers the run")

    def _finish(self, state: str, codes: list[int | None] | None, why: str) -> int:
        job = self.store.get_job(self.job_id)
        rec = self.store.get_cluster(job.cluster) if job else None
        if job:  # before the state: whoever sees the job ended sees its last shape ended too
            self._end_shape(job, rec, f"job {state.lower()}")
        self.store.update_job(self.job_id, state=state, exit_codes=codes, watcher_pid=None)
        if job:
            self.store.event(
                job.cluster, "job-" + state.lower(), f"job {self.job_id}: {why}", self.job_id
            )
        self.log(f"job {self.job_id} {state.lower()}: {why}")
        # the job's run records kept here (its goodput outlives the hosts; before any --down)
        self._pull_records(rec, full=True, timeout=60.0)
        if state == JOB_SUCCEEDED:
            return 0
        if codes:
            bad = [c for c in codes if c is not None and c != 0]
            return bad[0] if bad and 0 < bad[0] < 256 else 1
        return 1

    def _incident(self, job: JobRecord, rec: ClusterRecord, incident: str) -> int | None:
        self._unfollow()
        kind = (
            "preempted"
            if (
                incident in ("stopped", "cluster disappeared")
                or incident.startswith(("preempted", "hosts lost", "hosts replaced"))
            )
            else "unhealthy"
        )
        self.store.event(rec.name, kind, f"job {self.job_id}: {incident}", self.job_id)
        self.log(f"cluster {rec.name}: {incident}")
        if not incident.startswith(("cluster disappeared", "hosts lost", "hosts replaced")):
            # the attempt's record before its hosts may be replaced (its goodput account)
            self._pull_records(rec, full=True, timeout=15.0)
        self._end_shape(job, rec, incident)
        self._grow = None
        if not job.managed or job.restarts >= job.max_restarts:
            # nothing works unwatched: what still runs on the healthy hosts is stopped
            self.log(f"stopping job {self.job_id} on the remaining hosts of {rec.name}")
            cancel_job(rec, self.job_id)
            if not job.managed:
                why = (
                    f"{incident}; the job was stopped on the other hosts; relaunch with --spot "
                    "--max-restarts N to recover automatically"
                )
                return self._finish(JOB_FAILED, None, why)
            return self._finish(
                JOB_FAILED,
                None,
                f"{incident}; the {job.max_restarts} restarts allowed are used up; the job was "
                "stopped on the other hosts",
            )
        self.log(f"managed recovery takes over (restarts used {job.restarts}/{job.max_restarts})")
        n = self.store.bump_restarts(self.job_id)
        self.store.update_job(self.job_id, state=JOB_RECOVERING)
        self.log(f"recovery {n}/{job.max_restarts}: {incident}")
        try:
            self._relaunch(job, rec, incident, f"recovery {n}/{job.max_restarts}", "recovered")
            return None
        except AiosError as exc:
            self.store.event(rec.name, "recovery-failed", f"recovery {n}: {exc}", self.job_id)
            self.log(f"recovery {n} failed: {exc}")
            if self.store.get_job(self.job_id).restarts < job.max_restarts:  # type: ignore[union-attr]
                self.sleep(self.opt.poll)
                return None  # the loop notices the still-broken cluster and tries again
            return self._finish(JOB_FAILED, None, f"recovery failed: {exc}")

    def _relaunch(
        self, job: JobRecord, rec: ClusterRecord, incident: str, what: str, kind: str
    ) -> None:
        """Repair or recreate the cluster (the next candidate type when the current one has no
        capacity), then re-sync, set up and start the job there; it resumes from the newest
        checkpoint at whatever shape it now has."""
        autostop = autostop_of(rec)
        action, rec = self._recover_cluster(rec, incident)
        job = self._job()  # a move to another candidate changed the spec
        spec = JobSpec.from_dict(job.spec)
        self.store.update_job(self.job_id, state=JOB_SETTING_UP)
        Head(rec, self.printer, self.log).reach(self.opt.ssh_timeout)
        sync_code(rec, spec, self.printer, self.log)
        run_setup(rec, spec, self.printer, self.log)
        procs = start_job(
            rec,
            self.job_id,
            spec,
            self.config,
            self.provider.remote_env(self.provider.describe(rec.name, rec.zone) or info_from(rec)),
            self.printer,
            self.log,
        )
        self.store.update_job(self.job_id, state=JOB_RUNNING)
        shapes.begin(
            self.store,
            rec,
            self.job_id,
            procs,
            shapes.record_hourly(self.provider, rec),
            shapes.newest_step(rec, spec.checkpoint_dir),
            f"{what}: {action}",
        )
        # the recreated (or restarted) head host has no agent: install it again
        reinstall_agent(self.store, self.provider, rec, self.printer, self.log, autostop)
        self.store.event(
            rec.name,
            kind,
            f"{what}: {action} in {rec.zone} after {incident}; job {self.job_id} restarted on "
            f"{rec.accelerator} x {len(rec.hosts)} hosts, {procs} processes (resumes from the "
            "newest checkpoint)",
            self.job_id,
        )
        self.log(
            f"{what} done: {action} in {rec.zone}; job {self.job_id} runs on {rec.accelerator} "
            f"x {len(rec.hosts)} hosts, {procs} processes"
        )
        self._follow(rec)

    def _recover_cluster(self, rec: ClusterRecord, incident: str) -> tuple[str, ClusterRecord]:
        provider = self.provider
        runner = runner_for(rec)
        # a user's own host (--cloud ssh) with a new key is never trusted: its provider's
        # create checks the pinned keys and fails the recovery with one line
        if incident.startswith("hosts replaced") and not provider.user_hosts:
            # trust the new host keys only when the cloud itself says the cluster is up
            info = provider.describe(rec.name, rec.zone)
            if info is not None and info.ready and not info.unhealthy and not info.preempted:
                runner.reset_host_keys()
                return "reconnected to the replaced hosts", save_hosts(
                    self.store, rec, info, provider
                )
            self.log(
                f"{rec.name} is {info.state if info else 'gone'} after its hosts were replaced; recreating"
            )
        if incident.startswith("unhealthy") or incident == "stopped":
            info = provider.describe(rec.name, rec.zone)
            if info is not None:
                try:
                    if incident == "stopped":
                        info = provider.start(rec.name, rec.zone)
                        action = "started"
                    else:
                        action = provider.repair(info)
                        info = provider.describe(rec.name, rec.zone)
                    if info is not None and info.ready and not info.unhealthy:
                        runner.reset_host_keys()
                        return action, save_hosts(self.store, rec, info, provider)
                    self.log(f"{action} did not make {rec.name} healthy; recreating")
                except CloudError as exc:
                    self.log(f"repair failed ({exc}); recreating")
        # recreate (same zone first, then the others offering the type); no capacity for the
        # type anywhere: the next candidate of -a TYPE1,TYPE2,...
        provider.delete(rec.name, rec.zone)
        request = request_from_record(rec)
        request = with_public_key(request, rec.ssh_key) if rec.ssh_key else request
        spec = JobSpec.from_dict(self._job().spec)
        order = [rec.accelerator] + [
            c["accelerator"] for c in spec.candidates if c["accelerator"] != rec.accelerator
        ]
        for i, accel in enumerate(order):
            req = request
            if accel != rec.accelerator:
                zone = rec.zone if rec.zone in provider.zones(accel) else None
                # the candidate's own request as the launch validated it (its image, runtime)
                seen = (rec.request.get("candidates") or {}).get(accel)
                req = dataclasses.replace(
                    request_from_dict(seen) if seen else request,
                    accelerator=accel,
                    zone=zone,
                    ssh_public_key=request.ssh_public_key,
                )
            try:
                result = create_with_failover(
                    provider,
                    req,
                    zone_order(provider, req, pinned=False),
                    log=self.log,
                    sleep=self.sleep,
                    backoff=min(2.0, self.opt.poll),
                )
            except (CapacityError, QuotaError, NotOfferedError) as exc:
                self.store.event(rec.name, "failover", f"{accel}: {exc.message[:300]}", self.job_id)
                if i + 1 == len(order):
                    raise
                self.log(
                    f"no capacity for {accel} ({exc.message}); trying the next candidate, "
                    f"{order[i + 1]}"
                )
                continue
            break
        for a in result.attempts:
            self.store.event(
                rec.name, "failover", f"{a.zone}: {a.kind}: {a.message[:200]}", self.job_id
            )
        runner.reset_host_keys()
        moved = f" (moved from {rec.zone})" if result.zone != rec.zone else ""
        if accel != rec.accelerator:
            c = spec.candidate(accel)
            assert c is not None
            spec = spec.for_candidate(c)
            self.store.update_job(self.job_id, spec=spec.to_dict(), backend=spec.backend)
            self.store.update_cluster(rec.name, accelerator=accel)
            self.store.event(
                rec.name,
                "candidate",
                f"job {self.job_id}: {rec.accelerator} -> {accel} (backend {spec.backend})",
                self.job_id,
            )
            moved = f" as {accel} (no capacity for {rec.accelerator}){moved}"
        if result.zone != rec.zone or accel != rec.accelerator:
            # what the record keeps beside the request (the candidates, autostop) stays
            kept = {k: v for k, v in rec.request.items() if k not in REQUEST_FIELDS}
            self.store.update_cluster(
                rec.name,
                request={**kept, **request_dict(dataclasses.replace(req, zone=result.zone))},
            )
        new = save_hosts(self.store, rec, result.info, provider)
        return f"recreated{moved}", new


@dataclass
class _Watch:
    """What the watcher's loop carries from one poll to the next."""

    lost_count: int = 0  # polls in a row that found hosts lost or unreachable
    last_describe: float = 0.0  # when the cloud last described the cluster (monotonic)
    first_nonzero: float | None = None  # when a worker first exited non-zero (monotonic)

    def reset(self) -> None:
        """After a recovery or a grow: count afresh and describe at the next poll."""
        self.lost_count, self.last_describe, self.first_nonzero = 0, 0.0, None


@dataclass
class _Seen:
    """One poll's observation: each worker's ``(state, exit code)``, when (monotonic), whether
    the cloud described the cluster, and the incident that description shows."""

    states: list[tuple[str, int | None]]
    now: float
    described: bool
    incident: str | None


def _cluster_incident(info: ClusterInfo | None) -> str | None:
    """The incident the cloud's description of the cluster shows, if any."""
    if info is None:
        return "cluster disappeared"
    if info.preempted or info.state in (TERMINATED,):
        return "preempted"
    if info.state == STOPPED:
        return "stopped"
    if info.unhealthy:
        return f"unhealthy ({info.health_detail or info.health})"
    if info.in_maintenance:
        # a host event on a VM of a TPU slice interrupts the entire slice ("Manage GKE node
        # disruption for GPUs and TPUs"): the job's processes are gone and nothing resumes by
        # itself; a managed run recovers as from lost hosts
        return (
            f"host maintenance ({info.health_detail or 'maintenance'}): the slice's hosts were "
            "interrupted"
        )
    return None


def _host_incident(states: list[tuple[str, int | None]]) -> str | None:
    """The incident the workers' states show: replaced hosts, or workers that stopped for a
    preemption notice."""
    if any(s == "REPLACED" for s, _ in states):
        # a new machine answers at a host's address (new host key): the cloud replaced it
        # (spot reclaim and relaunch, maintenance); the job is gone with the old one
        which = ", ".join(f"worker {i}" for i, (s, _) in enumerate(states) if s == "REPLACED")
        return f"hosts replaced ({which}: new host key)"
    if any(s == "EXIT" and c == EXIT_PREEMPTED for s, c in states):
        # workers checkpointed and stopped for a spot/preemption notice; the cloud may still
        # report the machines running (EC2 gives 2 minutes)
        which = ", ".join(
            f"worker {i}" for i, (s, c) in enumerate(states) if s == "EXIT" and c == EXIT_PREEMPTED
        )
        return f"preempted (workers stopped for a preemption notice: {which})"
    return None


def _lost_incident(states: list[tuple[str, int | None]], watch: _Watch, after: int) -> str | None:
    """Hosts lost once ``after`` polls in a row found some lost or unreachable."""
    if not any(s in ("LOST", "UNREACHABLE") for s, _ in states):
        watch.lost_count = 0
        return None
    watch.lost_count += 1
    if watch.lost_count < after:
        return None
    which = ", ".join(
        f"worker {i}: {s.lower()}"
        for i, (s, _) in enumerate(states)
        if s not in ("RUNNING", "EXIT")
    )
    return f"hosts lost ({which})"


def after_watch_failure(
    store: Store,
    provider: CloudProvider,
    job_id: int,
    created: bool,
    exc: BaseException,
    log: Log,
    spawn_watcher: Callable[[], int],
) -> None:
    """The launcher stopped watching a running job (SIGTERM, or the watch itself failed):
    nothing may work unwatched. SIGTERM: the job is stopped on every host and a cluster this
    launch created is deleted. A failed watch: a managed job is handed to a background
    watcher; an unmanaged one is stopped on every host. The user is told which."""
    job = store.get_job(job_id)
    if job is None or job.state in JOB_FINAL:
        return
    rec = store.get_cluster(job.cluster)
    if rec is None:
        return
    with signals_deferred():
        if terminated():
            cancel_job(rec, job_id)
            store.update_job(job_id, state=JOB_CANCELLED, watcher_pid=None)
            store.event(rec.name, "job-cancelled", f"job {job_id}: launcher terminated", job_id)
            if created:
                down_cluster(store, provider, rec)
                log(
                    f"terminated: stopped job {job_id} and deleted {rec.name} (this launch created it)"
                )
            else:
                log(f"terminated: stopped job {job_id} on every host of {rec.name}")
            return
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        if job.managed:
            pid = spawn_watcher()
            store.update_job(job_id, watcher_pid=pid)
            log(
                f"the watch failed ({why}); a background watcher (pid {pid}) takes over job {job_id}'s managed recovery"
            )
            return
        cancel_job(rec, job_id)
        store.update_job(job_id, state=JOB_FAILED, watcher_pid=None)
        store.event(rec.name, "job-failed", f"job {job_id}: watch failed: {why}", job_id)
        log(
            f"the watch failed ({why}); stopped job {job_id} on every host so nothing runs unwatched"
        )
