"""A job's run records, copied from its hosts, and its goodput.

Rank 0 of a job writes the run record (:mod:`aios.runrecord.records`) on worker 0, under the job's code
directory (``~/aios/<cluster>/code/<logging.run_dir>/<run id>/``). The account of what the job's
time went to (:mod:`aios.runrecord.goodput`) is computed here, on this machine, from a copy of the files it
reads: ``diagnostics.json``, ``events.jsonl``, ``watchdog/hang-*.json`` and ``metrics.jsonl`` (its
last line only for ``aios status``; up to :data:`METRIC_LINES` lines for ``aios report``).

The copy lives in ``<aios home>/clusters/<cluster>/runs/<job id>/<run id>/`` and is kept after
the cluster is deleted: the watcher refreshes it every ``WatchOptions.copy_every`` seconds while
the job runs, when it is interrupted and when it ends (so
a recovered run's earlier attempts, written on hosts since deleted, stay in the account, and
``aios report CLUSTER`` works after ``--down``). Every record whose ``diagnostics.json`` changed
since the job was created belongs to it; the newest is the one reported (:func:`aios.runrecord.goodput.
read_attempts` follows its ``resume`` links to the earlier ones).

Who uses it: ``aios status`` (the goodput column, and the cost per productive hour where the
catalog has a price), ``aios report CLUSTER`` (the ``aios_report_target`` hook) and the watcher.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aios.errors import AiosError
from aios.runrecord import goodput
from aios.runrecord.render import _dur

from aios_cloud.records import record_hosts, remote_root, runner_for
from aios_cloud.request import JobSpec
from aios_cloud.shapes import money
from aios_cloud.store import ClusterRecord, JobRecord, Store, aios_home, cluster_dir

#: the lines of ``metrics.jsonl`` copied for ``aios report`` (its timeline); the goodput figures
#: themselves need only the last one
METRIC_LINES = 100_000
_MARK = "@@aios-file "
#: a record written up to this long before the job was recorded still belongs to it (clocks)
_SLACK_S = 120


def cache_dir(cluster: str, job_id: int) -> Path:
    """Where job ``job_id``'s run records are copied to."""
    return cluster_dir(cluster) / "runs" / str(job_id)


def remote_runs_dir(cluster: str, spec: JobSpec) -> str:
    """The job's ``logging.run_dir`` on its hosts (a relative one is under the code directory,
    where the job runs): ``--env AIOS_LOGGING__RUN_DIR=...``, an override, else ``runs``."""
    run_dir = "runs"
    for o in spec.overrides:
        key, eq, value = o.partition("=")
        if eq and key.strip() in ("logging.run_dir", "--logging.run_dir"):
            run_dir = value.strip()
    run_dir = spec.env.get("AIOS_LOGGING__RUN_DIR", run_dir)
    if run_dir.startswith("/"):
        return shlex.quote(run_dir)
    if run_dir.startswith("~/"):
        return "$HOME/" + shlex.quote(run_dir[2:])
    return f"{remote_root(cluster)}/code/" + shlex.quote(run_dir)


def pull_command(runs: str, since: float, full: bool) -> str:
    """The shell command that prints the job's run record files, each after a ``@@aios-file
    RUN/NAME`` line (only records whose ``diagnostics.json`` changed since ``since``)."""
    tail = METRIC_LINES if full else 1
    return (
        f"R={runs}; T={int(since)}; "
        'for d in "$R"/*/; do f="${d}diagnostics.json"; [ -f "$f" ] || continue; '
        '[ "$(stat -c %Y "$f")" -ge "$T" ] || continue; n=$(basename "$d"); '
        'for x in diagnostics.json events.jsonl; do [ -f "$d$x" ] && '
        f'{{ echo "{_MARK}$n/$x"; cat "$d$x"; echo; }}; done; '
        f'[ -f "${{d}}metrics.jsonl" ] && {{ echo "{_MARK}$n/metrics.jsonl"; '
        f'tail -n {tail} "${{d}}metrics.jsonl"; echo; }}; '
        'for h in "$d"watchdog/hang-*.json; do [ -f "$h" ] && '
        f'{{ echo "{_MARK}$n/watchdog/$(basename "$h")"; cat "$h"; echo; }}; done; '
        "done; true"
    )


def _store_files(dest: Path, lines: list[str]) -> int:
    """Write the files :func:`pull_command` printed under ``dest``; returns how many records."""
    files: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in lines:
        if line.startswith(_MARK):
            rel = line[len(_MARK) :].strip()
            parts = rel.split("/")
            # a record name and a file name, nothing that climbs out of dest
            if len(parts) in (2, 3) and not any(p in ("", ".", "..") for p in parts):
                cur = files.setdefault(rel, [])
            else:
                cur = None
        elif cur is not None:
            cur.append(line)
    for rel, body in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(ln for ln in body if ln.strip()) + "\n"
        if rel.endswith("/diagnostics.json"):
            text = _localize(text)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return len({rel.split("/")[0] for rel in files})


def _localize(text: str) -> str:
    """A copied ``diagnostics.json`` whose ``resume`` events name the record that wrote the
    checkpoint resumed by its name only: a path on the hosts means nothing here, a name is read
    beside this record (:func:`aios.runrecord.goodput.read_attempts`), among the job's other copies."""
    try:
        diag = json.loads(text)
    except ValueError:
        return text  # torn: left as it came (the account reads what it can)
    if not isinstance(diag, dict):
        return text
    for d in [diag, *(diag.get("previous_attempts") or [])]:
        for e in d.get("events") or [] if isinstance(d, dict) else []:
            if isinstance(e, dict) and e.get("kind") == "resume" and e.get("record"):
                e["record"] = os.path.basename(str(e["record"]).rstrip("/"))
    return json.dumps(diag)


def pull(rec: ClusterRecord, job: JobRecord, full: bool = False, timeout: float = 30.0) -> bool:
    """Copy job ``job``'s run records from worker 0 of ``rec`` into :func:`cache_dir`. Returns
    whether the hosts answered (False: unreachable, or no hosts); never raises for SSH trouble."""
    hosts = record_hosts(rec)
    if not hosts or hosts[0].ip.startswith("<"):
        return False
    spec = JobSpec.from_dict(job.spec) if job.spec else JobSpec(script=job.command)
    cmd = pull_command(remote_runs_dir(rec.name, spec), job.created - _SLACK_S, full)
    try:
        r = runner_for(rec, None, retries=0).run_one(hosts[0], cmd, stream=False, timeout=timeout)
    except Exception:  # noqa: BLE001 - the account is informative; the caller says what it shows
        return False
    if not r.ok:
        return False
    dest = cache_dir(rec.name, job.id)
    dest.mkdir(parents=True, exist_ok=True)  # copied, even when the job wrote no record yet
    _store_files(dest, r.stdout)
    return True


def copied(cluster: str, job_id: int) -> bool:
    """Whether the job's run records were ever copied here."""
    return (aios_home_cluster_runs(cluster) / str(job_id)).is_dir()


def aios_home_cluster_runs(cluster: str) -> Path:
    return aios_home() / "clusters" / cluster / "runs"


def newest_record(cluster: str, job_id: int) -> str | None:
    """The newest of the job's copied run records (by its attempt's launch time)."""
    d = cache_dir(cluster, job_id)
    best: tuple[float, str] | None = None
    if not d.is_dir():
        return None
    for run in d.iterdir():
        try:
            diag = json.loads((run / "diagnostics.json").read_text())
        except (OSError, ValueError):
            continue
        attempt = diag.get("attempt") or {}
        launched = float(attempt.get("launched") or diag.get("started") or 0.0)
        if best is None or launched > best[0]:
            best = (launched, str(run))
    return best[1] if best else None


@dataclass
class JobGoodput:
    """A job's goodput as ``aios status`` shows it."""

    goodput: float
    productive_s: float
    wall_s: float
    #: the job's spend so far (its shapes at the catalog's price; None: a shape without a price)
    cost_usd: float | None
    #: ``cost_usd`` per hour of productive steps (None: no price, or nothing productive yet)
    usd_per_productive_hour: float | None
    #: ``hosts``: copied just now; ``copy``: the copy kept here (the hosts did not answer, or the
    #: job ended)
    source: str
    #: when the copy was made (epoch seconds)
    copied: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "goodput": round(self.goodput, 6),
            "productive_s": round(self.productive_s, 3),
            "wall_s": round(self.wall_s, 3),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 4),
            "usd_per_productive_hour": (
                None
                if self.usd_per_productive_hour is None
                else round(self.usd_per_productive_hour, 4)
            ),
            "source": self.source,
            "copied": self.copied,
        }

    def line(self) -> str:
        """``goodput 87.3%: 1.2h productive of 1.4h wall, $3.10 per productive hour``."""

        out = (
            f"goodput {self.goodput:.1%}: {_dur(self.productive_s)} productive of "
            f"{_dur(self.wall_s)} wall"
        )
        if self.usd_per_productive_hour is not None:
            out += f", {money(self.usd_per_productive_hour)} per productive hour"
        elif self.cost_usd is not None:
            out += f", {money(self.cost_usd)} spent, nothing productive yet"
        if self.source == "copy":
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.copied))
            out += f" (as of {when})"
        return out


def job_goodput(
    rec: ClusterRecord | None,
    job: JobRecord,
    cost_usd: float | None,
    refresh: bool,
    timeout: float = 20.0,
) -> JobGoodput | None:
    """Job ``job``'s goodput: its run records copied from the hosts when ``refresh`` (and the
    hosts answer), else the copy kept here; None when there is no record of it yet."""

    source = "copy"
    if refresh and rec is not None and pull(rec, job, timeout=timeout):
        source = "hosts"
    run = newest_record(job.cluster, job.id)
    if run is None:
        return None
    try:
        r = goodput.report_for(run)
    except (OSError, ValueError):
        return None
    if not r.attempts:
        return None
    per_hour = None
    if cost_usd is not None and r.seconds["productive"] > 0:
        per_hour = cost_usd / (r.seconds["productive"] / 3600.0)
    copied = os.stat(os.path.join(run, "diagnostics.json")).st_mtime
    return JobGoodput(
        r.goodput, r.seconds["productive"], r.wall_s, cost_usd, per_hour, source, copied
    )


def report_target(name: str) -> str | None:
    """``aios report CLUSTER``: the newest run record of the cluster's newest job with one (its
    records copied from the hosts first when they answer, else the copy kept here, which
    outlives the cluster). None when ``name`` is no cluster this machine knows."""

    store = Store()
    try:
        rec = store.get_cluster(name)
        jobs = store.jobs(name)
        if rec is None and not jobs:
            return None
        answered = False
        for job in sorted(jobs, key=lambda j: j.id, reverse=True):
            if rec is not None and pull(rec, job, full=True, timeout=60.0):
                answered = True
            run = newest_record(name, job.id)
            if run is not None:
                return run
    finally:
        store.close()
    if not jobs:
        raise AiosError(
            f"cluster {name} has run no job", f"launch one with `aios launch --name {name}`"
        )
    asked = rec is not None and bool(record_hosts(rec))
    why = " and its hosts did not answer" if asked and not answered else ""
    raise AiosError(
        f"no run record of cluster {name}'s jobs was copied here{why}",
        f"a job writes one once its script calls aios.init (see `aios logs {name}`)",
    )
