"""The job watcher (aios_cloud.watching.Watcher) against real sshd hosts: workers that stopped for a
preemption notice while the cloud still reports the machines running, and a replacement machine
answering at the same address with a new host key. The cloud side is a minimal provider over the
sshd hosts (core cannot depend on a cloud plugin; the plugins' own e2e tests cover theirs)."""

from __future__ import annotations

import io
import sys

import pytest
from aios.config.schema import resolve
from aios_cloud.jobs import JobSpec, cancel_job, poll_job, start_job, sync_code
from aios_cloud.provider.data import ClusterInfo, ClusterRequest
from aios_cloud.provider.states import READY
from aios_cloud.records import request_dict, save_hosts
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import JOB_FAILED, JOB_SUCCEEDED, ClusterRecord, Store
from aios_cloud.testing.loopback import LoopbackCloud
from aios_cloud.testing.sshd import SshdCluster
from aios_cloud.watching import Watcher, WatchOptions


@pytest.fixture
def env(tmp_path, monkeypatch, sshd_cluster):
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "aios-home"))
    return sshd_cluster(1)  # the aios pytest plugin: skips (fails with CI=true) without sshd


SCRIPT = """\
import os, pathlib, sys, time
mark = pathlib.Path(os.environ["HOME"]) / "attempts"
n = int(mark.read_text()) if mark.exists() else 0
mark.write_text(str(n + 1))
print(f"attempt {n + 1}", flush=True)
if n == 0 and MODE == "preempt":
    # what aios.runtime does once its emergency checkpoint is written (Runtime._preempted);
    # torchrun then reports exit 1 for the whole worker group
    with open(os.path.join(os.environ["AIOS_RUN_STATUS_DIR"], "rank0"), "w") as f:
        f.write("preempted /ckpt/ckpt-000000005")
    sys.exit(1)
if n == 0 and MODE == "long":
    time.sleep(120)
print("finished", flush=True)
"""


def _setup(c: SshdCluster, tmp_path, mode: str, managed: bool = True):
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(f"MODE = {mode!r}\n" + SCRIPT)
    store = Store()
    provider = LoopbackCloud(c)
    info = provider.info("wc")
    request = ClusterRequest(name="wc", accelerator="box", zone="z1", ssh_user=c.user)
    rec = ClusterRecord(
        name="wc",
        cloud="loop",
        zone="z1",
        accelerator="box",
        spot=True,
        state=READY,
        request=request_dict(request),
        ssh_user=c.user,
        ssh_key=str(c.client_key),
    )
    assert store.claim_cluster(rec)
    rec = save_hosts(store, rec, info, provider)
    spec = JobSpec(
        script="job.py", backend="cpu", python=sys.executable, workdir=str(work), bundle=False
    )
    config = resolve(flags={"nprocs": 1}, environ={}, check_backend=False)
    job_id = store.add_job(
        "wc",
        "job.py",
        backend="cpu",
        managed=managed,
        max_restarts=2 if managed else 0,
        checkpoint_dir=None,
        spec=spec.to_dict(),
    )
    out = io.StringIO()
    printer = LinePrinter(out)
    logs: list[str] = []
    sync_code(rec, spec, printer, logs.append)
    start_job(rec, job_id, spec, config, {}, printer, logs.append)
    return store, provider, rec, job_id, config, printer, logs


def _worker_log(c: SshdCluster, job_id: int) -> str:
    return (c.hosts[0].home / "aios" / "wc" / "jobs" / str(job_id) / "worker.log").read_text()


def test_cloud_watch_workers_stopped_for_preemption_recover_instead_of_failing(env, tmp_path):
    store, provider, rec, job_id, config, printer, logs = _setup(env, tmp_path, "preempt")
    opts = WatchOptions(poll=0.2, describe_every=0.2, follow=False, ssh_timeout=30)
    code = Watcher(
        store, provider, job_id, config, printer=printer, log=logs.append, options=opts
    ).run()
    job = store.get_job(job_id)
    assert code == 0 and job.state == JOB_SUCCEEDED, logs
    assert job.restarts == 1
    kinds = [e.kind for e in store.events("wc")]
    assert "preempted" in kinds and "recovered" in kinds
    assert any("preemption notice" in e.message for e in store.events("wc", kind="preempted"))
    # the cloud still said READY: the machines about to be reclaimed were replaced, not reused
    assert provider.calls.count("delete") == 1 and provider.calls.count("create") == 1
    assert (env.hosts[0].home / "attempts").read_text() == "2"
    assert "finished" in _worker_log(env, job_id)


def test_cloud_watch_preemption_exit_of_an_unmanaged_job_fails_with_the_hint(env, tmp_path):
    store, provider, rec, job_id, config, printer, logs = _setup(
        env, tmp_path, "preempt", managed=False
    )
    opts = WatchOptions(poll=0.2, describe_every=0.2, follow=False, ssh_timeout=30)
    code = Watcher(
        store, provider, job_id, config, printer=printer, log=logs.append, options=opts
    ).run()
    assert code == 1 and store.get_job(job_id).state == JOB_FAILED
    assert any("--max-restarts" in m and "preemption notice" in m for m in logs), logs
    ec = env.hosts[0].home / "aios" / "wc" / "jobs" / str(job_id) / "exit_code"
    assert (
        ec.read_text().strip() == "75"
    )  # aios.resilience.notices.EXIT_PREEMPTED, not torchrun's 1
    assert "delete" not in provider.calls


def test_cloud_watch_replaced_host_with_new_host_key_goes_through_recovery(env, tmp_path):
    store, provider, rec, job_id, config, printer, logs = _setup(env, tmp_path, "long")
    replaced: list[bool] = []

    def sleep(seconds: float) -> None:
        import time

        if not replaced and (env.hosts[0].home / "attempts").exists():
            # the machine goes away with the job, and a new one comes up at the same address
            env.hosts[0].stop()
            env.hosts[0].start(new_host_key=True)
            replaced.append(True)
        time.sleep(min(seconds, 0.2))

    opts = WatchOptions(poll=0.2, describe_every=60, follow=False, ssh_timeout=30)
    code = Watcher(
        store, provider, job_id, config, printer=printer, log=logs.append, options=opts, sleep=sleep
    ).run()
    job = store.get_job(job_id)
    assert replaced and code == 0 and job.state == JOB_SUCCEEDED, logs
    assert job.restarts == 1
    events = store.events("wc")
    assert any(e.kind == "preempted" and "hosts replaced" in e.message for e in events)
    assert any(
        e.kind == "recovered" and "reconnected to the replaced hosts" in e.message for e in events
    )
    assert (
        "describe" in provider.calls and "create" not in provider.calls
    )  # the cloud said it is up
    assert (env.hosts[0].home / "attempts").read_text() == "2"


def test_cloud_watch_asks_the_cloud_before_waiting_out_ssh_back_offs(env, tmp_path, monkeypatch):
    """Hosts that stop answering with the cloud saying the cluster is gone (a reclaimed spot
    capacity): the watcher asks the cloud at the first failed look and recovers at once, instead
    of first retrying SSH with back-off (1 + 2 + 4 + 8 + 16 s) as for a network hiccup."""
    from aios_cloud import ssh

    store, provider, rec, job_id, config, printer, logs = _setup(env, tmp_path, "long")
    gone: list[bool] = []
    backoffs: list[float] = []  # SSH back-offs between the hosts going away and the incident
    plain_init = ssh.SshRunner.__init__

    def init(self, *args, **kwargs) -> None:
        plain_init(self, *args, **kwargs)
        plain_sleep = self.sleep

        def sleep(seconds: float) -> None:
            if gone and not store.events("wc", kind="preempted"):
                backoffs.append(seconds)
            plain_sleep(seconds)

        self.sleep = sleep

    monkeypatch.setattr(ssh.SshRunner, "__init__", init)
    plain_create = provider.create

    def create(request: ClusterRequest) -> ClusterInfo:  # the cloud's new machine boots
        env.hosts[0].start(new_host_key=True)
        return plain_create(request)

    provider.create = create  # type: ignore[method-assign]

    def watcher_sleep(seconds: float) -> None:
        import time

        if not gone and (env.hosts[0].home / "attempts").exists():
            env.hosts[0].stop()  # the capacity is reclaimed: the machine and the cluster go
            provider.exists = False
            gone.append(True)
        time.sleep(min(seconds, 0.2))

    opts = WatchOptions(poll=0.2, describe_every=60, follow=False, ssh_timeout=30)
    code = Watcher(
        store,
        provider,
        job_id,
        config,
        printer=printer,
        log=logs.append,
        options=opts,
        sleep=watcher_sleep,
    ).run()
    job = store.get_job(job_id)
    assert gone and code == 0 and job.state == JOB_SUCCEEDED, logs
    assert any(
        e.kind == "preempted" and "cluster disappeared" in e.message for e in store.events("wc")
    )
    assert backoffs == []
    assert provider.calls.count("create") == 1
    assert (env.hosts[0].home / "attempts").read_text() == "2"


def test_cloud_watch_treats_host_maintenance_as_an_interruption(env, tmp_path):
    """A host event on a VM of a TPU slice interrupts the entire slice ("Manage GKE node
    disruption for GPUs and TPUs",
    https://cloud.google.com/kubernetes-engine/docs/how-to/handle-disruption-gpu-tpu): TPU
    ``UNHEALTHY_MAINTENANCE`` is an incident named in one line (a managed run recovers), never
    waited out as if the job resumed by itself."""
    from aios_cloud.provider.states import MAINTENANCE

    store, provider, rec, job_id, config, printer, logs = _setup(env, tmp_path, "ok")
    (tmp_path / "work" / "job.py").write_text(
        "import time\nprint('working', flush=True)\ntime.sleep(4)\nprint('finished', flush=True)\n"
    )
    sync_code(rec, JobSpec.from_dict(store.get_job(job_id).spec), printer, logs.append)
    start_job(
        rec,
        job_id,
        JobSpec.from_dict(store.get_job(job_id).spec),
        config,
        {},
        printer,
        logs.append,
    )
    described = []
    plain = provider.info

    def in_maintenance(name: str) -> ClusterInfo:
        info = plain(name)
        described.append(1)
        if len(described) <= 8:
            info.health, info.health_detail = MAINTENANCE, "UNHEALTHY_MAINTENANCE"
        return info

    provider.info = in_maintenance  # type: ignore[method-assign]
    opts = WatchOptions(poll=0.2, describe_every=0.2, follow=False, ssh_timeout=30, lost_after=2)
    code = Watcher(
        store, provider, job_id, config, printer=printer, log=logs.append, options=opts
    ).run()
    job = store.get_job(job_id)
    assert code != 0 and job.state != JOB_SUCCEEDED, logs
    assert any("host maintenance (UNHEALTHY_MAINTENANCE)" in ln for ln in logs), logs


def test_cloud_job_queue_runs_jobs_one_after_another_and_cancel_dequeues(env, tmp_path):
    """A job started while another runs waits in the cluster's queue (on the hosts themselves,
    recorded PENDING), starts when the earlier one ends; a queued job can be cancelled."""
    store, provider, rec, first, config, printer, logs = _setup(env, tmp_path, "ok")
    work = tmp_path / "work"
    # the first job runs until the test lets it end (an event, not a sleep: on a loaded machine
    # starting the other two could outlast any fixed time, and the second would not be queued)
    release = tmp_path / "release"
    (work / "slow.py").write_text(
        "import pathlib, time\n"
        "print('start', time.time(), flush=True)\n"
        f"release, deadline = pathlib.Path({str(release)!r}), time.monotonic() + 600\n"
        "while not release.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('end', time.time(), flush=True)\n"
    )
    (work / "quick.py").write_text("import time\nprint('start', time.time(), flush=True)\n")

    def add(script: str) -> tuple[int, JobSpec]:
        spec = JobSpec(
            script=script, backend="cpu", python=sys.executable, workdir=str(work), bundle=False
        )
        jid = store.add_job("wc", script, backend="cpu", spec=spec.to_dict())
        return jid, spec

    sync_code(
        rec,
        JobSpec(script="slow.py", backend="cpu", workdir=str(work), bundle=False),
        printer,
        logs.append,
    )
    slow, s1 = add("slow.py")
    quick, s2 = add("quick.py")
    cancelled, s3 = add("quick.py")
    for jid, spec in ((slow, s1), (quick, s2), (cancelled, s3)):
        start_job(rec, jid, spec, config, {}, printer, logs.append)
    assert [s for s, _ in poll_job(rec, quick)] == ["QUEUED"]
    cancel_job(rec, cancelled, grace=2)
    opts = WatchOptions(poll=0.2, describe_every=5, follow=False, ssh_timeout=30)
    seen: list[str] = []

    def sleep(seconds: float) -> None:
        import time

        seen.append(store.get_job(quick).state)
        release.touch()  # the watcher is watching the queued job: the first one may end now
        time.sleep(seconds)

    code = Watcher(
        store, provider, quick, config, printer=printer, log=logs.append, options=opts, sleep=sleep
    ).run()
    assert code == 0 and store.get_job(quick).state == JOB_SUCCEEDED, logs
    assert "PENDING" in seen  # recorded as waiting in the queue
    jobs = env.hosts[0].home / "aios" / "wc" / "jobs"
    slow_end = float((jobs / str(slow) / "worker.log").read_text().split("end ")[1].split()[0])
    quick_start = float(
        (jobs / str(quick) / "worker.log").read_text().split("start ")[1].split()[0]
    )
    assert quick_start >= slow_end
    assert (
        not (jobs / str(cancelled) / "exit_code").exists()
        and "start" not in (jobs / str(cancelled) / "worker.log").read_text()
    )
