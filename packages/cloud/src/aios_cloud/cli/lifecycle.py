"""``aios stop``, ``start``, ``down``, ``autostop`` and ``cancel``."""

from __future__ import annotations

import click
from aios.errors import AiosError

from aios_cloud.cli.common import (
    _echo,
    _inventory_clouds,
    _log,
    _printer,
    _provider,
    _scheduler,
    _store,
)
from aios_cloud.controller import controller_of, stop_controller
from aios_cloud.jobs import cancel_job
from aios_cloud.lifecycle import (
    down_cluster,
    reinstall_agent,
    remember_autostop,
    remove_agent,
    start_cluster,
    stop_cluster,
)
from aios_cloud.provider.base import provisioning
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.records import dry_run_lines, inventory, require_cluster, runner_for_name_reset
from aios_cloud.store import JOB_CANCELLED, JOB_FINAL

# ------------------------------------------------------------------------------ stop / start / down


def _lifecycle(
    action: str,
    names: tuple[str, ...],
    dry_run: bool,
    config_file: str | None,
    cloud: str | None = None,
) -> None:
    store = _store()
    recs = []
    for n in names:
        rec = store.get_cluster(n)
        if rec is None and action == "delete":
            # no local record (deleted, another machine, an interrupted launch): find it in the
            # cloud by its aios-cluster label/tag
            _down_unrecorded(n, cloud, dry_run, config_file)
            continue
        recs.append(rec if rec is not None else require_cluster(store, n))
    for rec in recs:
        provider = _provider(rec.cloud, config_file)
        if dry_run:
            for line in dry_run_lines(provider.render(action, rec.name, rec.zone)):
                _echo(line)
            continue
        if action == "stop":
            stop_cluster(store, provider, rec)
            _log(f"stopped {rec.name}")
        elif action == "start":
            if isinstance(provider, SchedulerProvider):
                provider.start(rec.name, rec.zone)  # a job is not restarted in place: refused
            new = start_cluster(store, provisioning(provider, rec.name), rec, _log)
            _log(
                f"started {rec.name}: "
                + ", ".join(f"worker {h['worker_id']} {h['ip']}" for h in new.hosts)
            )
        else:
            ctl = controller_of(store, rec.name)
            if ctl and rec.ssh_key:
                # a controller that kept running would recreate the cluster it sees vanish
                stop_controller(rec, ctl, rec.ssh_key, _log)
            down_cluster(store, provider, rec)
            _log(f"deleted {rec.name}")


def _down_unrecorded(name: str, cloud: str | None, dry_run: bool, config_file: str | None) -> None:
    clouds = _inventory_clouds(cloud)
    if dry_run:
        for c in clouds:
            provider = _provider(c, config_file)
            _echo(f"# {name} has no local record: find it by its aios label on {c}, then delete it")
            for line in dry_run_lines(
                [
                    *provider.render("list", name, None),
                    *provider.render("delete", name, "<zone found>"),
                ]
            ):
                _echo(line)
        return
    found = False
    problems = []
    for c in clouds:
        provider = _provider(c, config_file)
        try:
            infos = [i for i in inventory(provider) if i.name == name]
        except AiosError as exc:
            problems.append(f"{c}: {exc.message}")
            continue
        for info in infos:
            _log(
                f"{name} has no local record; found it on {c} in {info.zone or '?'} by its "
                f"aios label ({info.state}); deleting"
            )
            provider.delete(info.name, info.zone)
            found = True
    if not found:
        more = f" ({'; '.join(problems)})" if problems else ""
        raise AiosError(
            f"no cluster named '{name}' here or in the cloud{more}", "see `aios status --refresh`"
        )
    runner_for_name_reset(name)
    _log(f"deleted {name}")


@click.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True)
@click.option("--config", "config_file")
def stop(names: tuple[str, ...], dry_run: bool, config_file: str | None) -> None:
    """Stop clusters (disks kept, compute billing stops)."""
    _lifecycle("stop", names, dry_run, config_file)


@click.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True)
@click.option("--config", "config_file")
def start(names: tuple[str, ...], dry_run: bool, config_file: str | None) -> None:
    """Start stopped clusters (host IPs and host keys may change; aios re-pins them)."""
    _lifecycle("start", names, dry_run, config_file)


@click.command()
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--cloud",
    help="Where to look for a cluster without a local record (default: every installed cloud).",
)
@click.option("--dry-run", is_flag=True)
@click.option("--config", "config_file")
def down(names: tuple[str, ...], cloud: str | None, dry_run: bool, config_file: str | None) -> None:
    """Delete clusters and everything aios created for them (also clusters without a local
    record, found in the cloud by their aios label/tag)."""
    _lifecycle("delete", names, dry_run, config_file, cloud)


@click.command()
@click.argument("name")
@click.argument("minutes", type=float, required=False)
@click.option(
    "--down", "down_", is_flag=True, help="Delete the cluster when idle instead of stopping it."
)
@click.option(
    "--cancel", is_flag=True, help="Remove the agent (the cluster runs until you stop it)."
)
@click.option("--config", "config_file")
def autostop(
    name: str, minutes: float | None, down_: bool, cancel: bool, config_file: str | None
) -> None:
    """Stop (or with --down delete) cluster NAME after MINUTES without a running job. The
    agent runs on the cluster's head host, so it works while this machine is off."""

    store = _store()
    rec = require_cluster(store, name)
    if cancel:
        remove_agent(rec, _printer())
        remember_autostop(store, name, None)
        store.event(name, "autostop", "autostop cancelled")
        _log(f"autostop of {name} cancelled")
        return
    if minutes is None or minutes < 0:
        raise AiosError(
            "aios autostop needs MINUTES (0 or more)", f"e.g. aios autostop {name} 30 [--down]"
        )
    job = store.latest_job(name)
    python = (job.spec or {}).get("python") if job else None
    provider = provisioning(_provider(rec.cloud, config_file), name)
    action = "down" if down_ else "stop"
    why = provider.stop_refusal(rec.spot, rec.accelerator) if action == "stop" else None
    if why:  # before anything is granted or installed
        raise AiosError(
            f"{name} cannot be stopped when idle: {why}",
            f"aios autostop {name} {minutes:g} --down (delete when idle)",
        )
    # the agent acts with the hosts' own credentials: rights granted (or the fix named) first
    provider.grant_autostop(rec.name, rec.zone, action)
    reinstall_agent(
        store,
        provider,
        rec,
        _printer(),
        _log,
        autostop={
            "idle_seconds": minutes * 60,
            "action": action,
            "python": python or provider.python(rec.accelerator),
            "poll": min(30.0, max(0.5, minutes * 60 / 4)),
        },
    )
    store.event(
        name,
        "autostop",
        f"{'autodown' if down_ else 'autostop'} after {minutes:g} min idle (agent on worker 0)",
    )


@click.command()
@click.argument("name")
@click.option(
    "--job", "job_id", type=int, help="Job id (default: every job of NAME that has not ended)."
)
@click.option("--config", "config_file")
def cancel(name: str, job_id: int | None, config_file: str | None = None) -> None:
    """Cancel a cluster's running job(s): the workers on every host are stopped (TERM, then
    KILL; scancel on Slurm, the Job deleted on Kubernetes) and the job is recorded CANCELLED; a
    managed job is not recovered. The cluster stays."""

    store = _store()
    rec = require_cluster(store, name)
    jobs = (
        [store.get_job(job_id)]
        if job_id
        else [j for j in store.jobs(name) if j.state not in JOB_FINAL]
    )
    if job_id and (jobs[0] is None or jobs[0].cluster != name):
        raise AiosError(f"cluster {name} has no job {job_id}", f"see `aios status {name}`")

    provider = _scheduler(rec) if not config_file else _provider(rec.cloud, config_file)
    scheduler = provider if isinstance(provider, SchedulerProvider) else None
    if not jobs:
        _log(f"{name} has no job that is still running")
        return
    for j in jobs:
        if j.state in JOB_FINAL:
            _log(f"job {j.id} already {j.state.lower()}")
            continue
        store.update_job(j.id, state=JOB_CANCELLED)  # first: the watcher must not recover it
        if scheduler is not None:  # Slurm: scancel; Kubernetes: delete the Job/JobSet and its pods
            scheduler.cancel(name)
        else:
            cancel_job(rec, j.id)
        store.event(name, "job-cancelled", f"job {j.id}: cancelled by the user", j.id)
        _log(f"job {j.id} cancelled")
