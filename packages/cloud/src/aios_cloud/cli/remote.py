"""``aios exec``, ``aios logs`` and ``aios ssh``: a cluster's hosts from here."""

from __future__ import annotations

import os
import shlex
import sys

import click
from aios.errors import AiosError

from aios_cloud.cli.common import _echo, _printer, _scheduler, _select, _store
from aios_cloud.head import run_via_head
from aios_cloud.records import remote_root, require_cluster, runner_for
from aios_cloud.store import JOB_FINAL
from aios_cloud.watching import LogFollower


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--worker", "-w", type=int, multiple=True, help="Only these workers (default: all).")
@click.option("--dry-run", is_flag=True)
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(name: str, command: tuple[str, ...], worker: tuple[int, ...], dry_run: bool) -> None:
    """Run COMMAND on every host of cluster NAME (in the synced code directory), in parallel,
    each output line prefixed with (worker N, ip). Exit status: the first non-zero one."""

    store = _store()
    rec = require_cluster(store, name)
    hosts = _select(rec, worker)
    cmd = " ".join(command) if len(command) > 1 else command[0]
    remote = f"cd {remote_root(name)}/code 2>/dev/null || true; {cmd}"
    runner = runner_for(rec, _printer())
    if dry_run:
        for h in hosts:
            _echo(f"({h.label}) {shlex.join(runner.argv(h, remote))}")
        return
    # a user's command may run for hours: a day's limit, Ctrl-C ends it at once
    codes = run_via_head(rec, remote, hosts, _printer(), timeout=86400)
    bad = [c for c in codes if c != 0]
    sys.exit(bad[0] if bad else 0)


exec_.name = "exec"


@click.command()
@click.argument("name")
@click.option("--job", "job_id", type=int, help="Job id (default: the latest).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--worker", "-w", type=int, multiple=True)
@click.option("--dry-run", is_flag=True)
def logs(
    name: str, job_id: int | None, follow: bool, worker: tuple[int, ...], dry_run: bool
) -> None:
    """Print a job's output from every host, prefixed with (worker N, ip)."""

    store = _store()
    rec = require_cluster(store, name)
    job = store.get_job(job_id) if job_id else store.latest_job(name)
    if job is None or job.cluster != name:
        raise AiosError(
            f"cluster {name} has no job {job_id if job_id else ''}".rstrip(),
            "see `aios status NAME`",
        )
    provider = _scheduler(rec)
    if provider is not None:
        sys.exit(provider.job_logs(rec, job, follow, dry_run, _echo))
    hosts = _select(rec, worker)
    d = f"{remote_root(name)}/jobs/{job.id}/worker.log"
    runner = runner_for(rec, _printer())
    if dry_run:
        for h in hosts:
            _echo(
                f"({h.label}) {shlex.join(runner.argv(h, ('tail -n +1 -F ' if follow else 'cat ') + d))}"
            )
        return
    if not follow:
        run_via_head(rec, f"cat {d} 2>/dev/null || echo '[aios] no log yet'", hosts, _printer())
        return
    import time

    follower = LogFollower(rec, job.id, _printer(), workers=[h.worker_id for h in hosts])
    try:
        while True:
            j = store.get_job(job.id)
            if j is None or j.state in JOB_FINAL:
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        follower.stop()


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--worker", "-w", type=int, default=0, show_default=True)
@click.option("--dry-run", is_flag=True)
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(name: str, worker: int, dry_run: bool, command: tuple[str, ...]) -> None:
    """Open a shell (or run COMMAND) on one host of cluster NAME."""

    store = _store()
    rec = require_cluster(store, name)
    host = _select(rec, (worker,))[0]
    runner = runner_for(rec)
    argv = runner.base_argv(host, tty=not command and sys.stdin.isatty())
    if command:
        argv.append(" ".join(command))
    if dry_run:
        _echo(shlex.join(argv))
        return
    os.execvp(argv[0], argv)
