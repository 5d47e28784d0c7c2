"""``aios stacks [RUN_DIR | STATUS_DIR] [--pid PID] [--brief] [--json]``: every rank's Python
stack (all threads, DataLoader workers too) of a live run on this host, without stopping it.

The same view as the watchdog's (:mod:`aios.resilience.watchdog`): one line per rank saying where it is,
which ranks are missing from the collective the others wait in, then the full stacks. Without
an argument, every live run of this user on this host (launched by ``aios-run``, or by ``aios
launch`` on a cluster host, whose workers carry ``AIOS_RUN_STATUS_DIR``). On a cluster aios
launched: ``aios exec NAME -- aios stacks``. Imports no torch.
"""

from __future__ import annotations

import json
import os
import tempfile

import click

from aios.errors import AiosError
from aios.launcher import status as rank_status
from aios.launcher.contract import STATUS_DIR_ENV
from aios.resilience.stacks import collect, full_text, summarize


def _environ_dir(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(STATUS_DIR_ENV.encode() + b"="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return None


def live_status_dirs() -> list[str]:
    """Status folders of this user's live runs: aios-run's under the temp dir, and any named in
    the environment of this user's processes (workers of cluster jobs)."""
    found: set[str] = set()
    tmp = tempfile.gettempdir()
    try:
        for n in os.listdir(tmp):
            p = os.path.join(tmp, n)
            if (
                n.startswith(rank_status.PREFIX)
                and os.stat(p).st_uid == os.getuid()
                and rank_status.has_workers(p)
            ):
                found.add(p)
    except OSError:
        pass
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
        except OSError:
            continue
        d = _environ_dir(pid)
        if d and rank_status.has_workers(d):
            found.add(os.path.realpath(d))
    return sorted({os.path.realpath(d) for d in found})


def _run_info(d: str) -> dict[str, object]:
    try:
        with open(os.path.join(d, "run.json")) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {}


def _launcher(d: str) -> int | None:
    try:
        with open(os.path.join(d, "launcher")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def find_status_dirs(target: str | None, pid: int | None) -> list[str]:
    """The status folders ``target`` (run record dir, status dir) or ``pid`` (aios-run or a
    worker) name; all live ones when neither is given."""
    if target and rank_status.has_workers(target):
        return [os.path.realpath(target)]
    live = live_status_dirs()
    if pid is not None:
        out = [d for d in live if _launcher(d) == pid]
        d = _environ_dir(str(pid))
        if not out and d and rank_status.has_workers(d):
            out = [os.path.realpath(d)]
        if not out:
            raise AiosError(
                f"process {pid} is neither an aios-run nor a worker of a live run",
                "pass the pid of aios-run (or of a rank), or the run's record directory",
            )
        return out
    if target:
        want = os.path.realpath(target)
        out = [
            d
            for d in live
            if _run_info(d).get("run_dir") == want
            or _run_info(d).get("run_id") == os.path.basename(want.rstrip("/"))
        ]
        if not out:
            raise AiosError(
                f"no live run has the record directory '{target}' on this host",
                "run `aios stacks` without arguments to list the live runs here",
            )
        return out
    if not live:
        raise AiosError(
            "no live aios run on this host",
            "start one with aios-run, or run this on the host of the run (aios exec NAME -- aios stacks)",
        )
    return live


@click.command(name="stacks")
@click.argument("target", required=False)
@click.option("--pid", type=int, default=None, help="PID of aios-run (or of one of its ranks).")
@click.option("--brief", is_flag=True, help="Only the summary, not every thread's stack.")
@click.option("--json", "as_json", is_flag=True, help="Summary and stacks as JSON.")
@click.option(
    "--wait", type=float, default=10.0, show_default=True, help="Seconds to wait for each rank."
)
def stacks(target: str | None, pid: int | None, brief: bool, as_json: bool, wait: float) -> None:
    """Where each rank of a live run is: every thread's Python stack, without stopping it.

    TARGET: the run's record directory (runs/<run-id>) or its status folder; default: every
    live run of this user on this host.
    """
    out = []
    for d in find_status_dirs(target, pid):
        info = _run_info(d)
        dumps = collect(d, wait)
        head = f"run {info.get('run_id', '?')} (status {d}, launcher pid {_launcher(d) or '?'})"
        if as_json:
            out.append(
                {
                    "run_id": info.get("run_id"),
                    "status_dir": d,
                    "summary": summarize(dumps),
                    "ranks": [
                        {"rank": x.rank, "node": x.node, "host": x.host, "pid": x.pid,
                         "steps": x.steps, "state": x.state, "stacks": x.text,
                         "children": [{"pid": p, "state": s, "stacks": t} for p, s, t in x.children]}
                        for x in dumps
                    ],
                }
            )  # fmt: skip
            continue
        click.echo(head)
        for line in summarize(dumps):
            click.echo("  " + line)
        if not brief:
            click.echo(full_text(dumps, ""))
    if as_json:
        click.echo(json.dumps(out, indent=1))
