"""The cloud commands: ``aios launch|status|exec|logs|ssh|sync|stop|start|down|catalog|cost``.

They work with any installed cloud plugin (``aios-cloud-gcp``, ``aios-cloud-aws``, third-party)
through :class:`aios_cloud.CloudProvider`. ``--dry-run`` on every command prints the equivalent
cloud CLI commands and per-worker commands and touches nothing (no cloud call, no SSH, no state
written). No torch import on any of these paths.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from aios.errors import AiosError

if TYPE_CHECKING:
    from aios_cloud.provider import Provider, SchedulerProvider

CLOUD_HELP = "Cloud plugin to use (gcp, aws, ...); default: the only one installed."


# ------------------------------------------------------------------------------ helpers


def _echo(msg: str) -> None:
    click.echo(msg)


def _log(msg: str) -> None:
    click.echo(f"[aios] {msg}", err=True)


def _config(config_file: str | None) -> Any:
    from aios.config.schema import resolve

    return resolve(config_file=config_file, check_backend=False)


def _cloud_name(cloud: str | None, store_cloud: str | None = None) -> str:
    from aios_cloud.records import cloud_name

    return cloud_name(cloud, store_cloud)


def _provider(cloud: str, config_file: str | None) -> Provider:
    from aios_cloud.records import get_provider

    return get_provider(cloud, _config(config_file))


def _store() -> Any:
    from aios_cloud.store import Store

    return Store()


def _printer() -> Any:
    from aios_cloud.ssh import LinePrinter

    return LinePrinter(sys.stdout)


def _emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _table(title: str, columns: list[str]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def _print(obj: Any) -> None:
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "0") or 0) or 220
    Console(soft_wrap=False, width=width).print(obj)


# ------------------------------------------------------------------------------ launch


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--cloud", help=CLOUD_HELP)
@click.option(
    "--accelerator",
    "-a",
    "--instance-type",
    "accelerator",
    help="Accelerator / instance type (v5litepod-8, v4-16, trn1.32xlarge), or candidates in order "
    "of preference (-a p5.48xlarge,trn1.32xlarge): the first with capacity is launched, and a "
    "managed recovery that finds none for the current type moves to the next.",
)
@click.option(
    "--cheapest",
    is_flag=True,
    help="Order the candidates of -a by the catalog's hourly price (spot with --spot).",
)
@click.option("--name", "-n", help="Cluster name (reused when it exists). Default: aios-USER-XXXX.")
@click.option("--zone", help="Zone to try first.")
@click.option("--region", help="Region (clouds that are regional).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Slices / instances.")
@click.option("--spot", is_flag=True, help="Spot / preemptible capacity.")
@click.option(
    "--max-restarts",
    type=int,
    default=0,
    show_default=True,
    help="Managed run: recover this many times from preemption or failure of the hosts.",
)
@click.option(
    "--queued",
    is_flag=True,
    help="Wait for capacity through a queued resource instead of failing on a stockout.",
)
@click.option("--valid-after", help="Queued: earliest start (RFC 3339 or +2h).")
@click.option("--valid-until", help="Queued: give up if not provisioned by then (RFC 3339 or +6h).")
@click.option("--image", help="Runtime version / image (default: per accelerator generation).")
@click.option("--disk-gb", type=int, help="Boot disk size.")
@click.option("--label", multiple=True, help="Label key=value on every resource.")
@click.option("--project", help="Cloud project (GCP).")
@click.option(
    "--backend", help="aios backend on the hosts (default: the accelerator's: xla, neuron, cuda)."
)
@click.option(
    "--checkpoint-dir",
    help="Bucket URL for checkpoints (gs://..., s3://...); required for --max-restarts.",
)
@click.option("--workdir", default=".", show_default=True, help="Directory synced to the hosts.")
@click.option(
    "--exclude",
    multiple=True,
    help="Extra glob excluded from code sync (data/.git/checkpoints always are).",
)
@click.option("--max-sync-mb", type=int, default=512, show_default=True)
@click.option("--requirements", type=click.Path(), help="requirements.txt installed by setup.")
@click.option(
    "--setup-script",
    type=click.Path(),
    help="Replace the default setup (pinned torch/torch_xla/libtpu) with this shell script.",
)
@click.option("--no-setup", is_flag=True, help="Skip setup (image already has everything).")
@click.option(
    "--no-bundle",
    is_flag=True,
    help="Do not ship this aios to the hosts (their image has it installed).",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter on the hosts (default: the provider's, e.g. the DLAMI's torch venv on AWS, python3 on TPU VMs).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    help="NAME=VALUE, or NAME to forward its value from here (secrets).",
)
@click.option(
    "--ssh-key",
    "--identity",
    "ssh_key",
    help="Private key (default: aios's own key in the aios home; --cloud ssh: your SSH setup).",
)
@click.option(
    "--hosts",
    help="--cloud ssh: your hosts, USER@HOST[:PORT][/WORKER_PORT],... (worker 0 first; node "
    "ranks follow the list; /WORKER_PORT: that host's own sshd port as the other hosts reach it).",
)
@click.option(
    "--hosts-file",
    type=click.Path(dir_okay=False),
    help="--cloud ssh: a file with one USER@HOST[:PORT][/WORKER_PORT] a line (# comments).",
)
@click.option(
    "--nprocs-per-host",
    type=int,
    help="--cloud ssh: processes per host (default: the accelerators found on each, else 1).",
)
@click.option(
    "--network", help="--cloud ssh: the hosts' own network (CIDR) for the master address."
)
@click.option(
    "--worker-port",
    type=click.IntRange(1, 65535),
    help="--cloud ssh: the sshd port the hosts reach each other at on their own network "
    "(default 22; the port in USER@HOST:PORT is how this machine reaches them, e.g. a NAT "
    "gateway's forward; HOST:PORT/WORKER_PORT sets it for one host).",
)
@click.option(
    "--host-wait",
    type=float,
    help="--cloud ssh: seconds a managed restart waits for every host to answer again (default "
    "120; a launch waits at most 30).",
)
@click.option(
    "--min-hosts",
    type=int,
    help="--cloud ssh, managed: continue on the hosts that answer when at least this many do "
    "(default: all), and grow back to every host at the next checkpoint when they return.",
)
@click.option("--ssh-user", default=None, help="Login user on the hosts.")
@click.option("--no-failover", is_flag=True, help="Do not move to other zones on a stockout.")
@click.option("--module", "-m", is_flag=True, help="SCRIPT is a module (python -m).")
@click.option(
    "--detach",
    "-d",
    is_flag=True,
    help="Return after the job starts; a background watcher keeps managing it.",
)
@click.option("--down", "down_after", is_flag=True, help="Delete the cluster when the job ends.")
@click.option(
    "--autostop",
    "autostop",
    type=float,
    default=None,
    help="Minutes without a running job after which an agent ON the head host stops the cluster "
    "(survives this laptop).",
)
@click.option(
    "--autodown", is_flag=True, help="With --autostop: delete the cluster instead of stopping it."
)
@click.option(
    "--controller",
    help="USER@HOST[:PORT]: run the managed job's recovery loop (and --down) there, detached, so "
    "it survives this machine.",
)
@click.option(
    "--controller-python", help="Interpreter on the controller host (default: this one's path)."
)
@click.option(
    "--reservation",
    help="Reserved capacity: GCP reservation name, AWS capacity reservation (cr-...) or capacity block id.",
)
@click.option(
    "--poll", type=float, default=5.0, show_default=True, help="Watcher poll interval in seconds."
)
@click.option(
    "--max-cost",
    metavar="USD",
    help="Spending limit: before the job's projected spend (the catalog's price x hosts x time) "
    "passes it, the job is checkpointed and stopped (exit 75; with --down the cluster is "
    "deleted). Needs a cloud with prices.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the equivalent cloud CLI and per-worker commands; touch nothing.",
)
@click.option("--config", "config_file", help="aios config YAML.")
def launch(**options: Any) -> None:
    """Provision cloud machines and run SCRIPT on every host.

    \b
    aios launch --cloud gcp -a v5litepod-8 --spot --zone us-west4-a train.py -- --epochs 3
    aios launch -a v4-16 --spot --max-restarts 3 --checkpoint-dir gs://b/ckpt train.py
    """
    from aios_cloud.launch import run
    from aios_cloud.request import LaunchRequest

    request = LaunchRequest.from_options(options)
    sys.exit(run(request, _echo, _log, _printer()))


# ------------------------------------------------------------------------------ status


def _merge_controllers(
    store: Any, out: list[dict[str, Any]], recs: list[Any], refresh: bool
) -> None:
    """A job managed from a controller host: its controller, and (``--refresh``) the job as the
    controller sees it."""
    from aios_cloud.controller import controller_of, remote_status

    for row, r in zip(out, recs, strict=True):
        ctl = controller_of(store, r.name)
        if not ctl:
            continue
        row["controller"] = {"target": ctl["target"], "pid": ctl["pid"], "dir": ctl["dir"]}
        if refresh and r.ssh_key:
            remote = remote_status(r, ctl, r.ssh_key)
            if remote is None:
                row["controller"]["state"] = "UNREACHABLE"
                continue
            row["controller"]["state"] = "RUNNING" if remote["controller_running"] else "ENDED"
            rj = {j["id"]: j for j in remote["jobs"]}.get(ctl["job"])
            local_id = store.events(r.name, kind="controller")[-1].job_id
            local = next((j for j in row["jobs"] if j["id"] == local_id), None)
            if rj and local:
                local.update(
                    {k: rj[k] for k in ("state", "restarts", "max_restarts", "exit_codes")}
                )
                # the controller keeps the job's shapes from its start on
                local["shapes"] = rj.get("shapes") or local.get("shapes", [])
                store.update_job(local["id"], state=rj["state"])
            row["recoveries"] += [e for e in remote["recoveries"] if e not in row["recoveries"]]


@click.command()
@click.argument("name", required=False)
@click.option(
    "--refresh",
    is_flag=True,
    help="Ask the cloud for the current state first, and list aios resources that have no local record.",
)
@click.option(
    "--cloud",
    help="With --refresh: the cloud to search for unrecorded resources (default: every installed one).",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--config", "config_file")
def status(
    name: str | None, refresh: bool, cloud: str | None, as_json: bool, config_file: str | None
) -> None:
    """Clusters and their jobs, with every preemption and recovery."""
    from aios_cloud import shapes
    from aios_cloud.records import (
        inventory,
        require_cluster,
    )
    from aios_cloud.records import refresh as refresh_record

    store = _store()
    recs = (
        [require_cluster(store, name)]
        if name and (store.get_cluster(name) or not refresh)
        else ([] if name else store.clusters())
    )
    if refresh:
        recs = [refresh_record(store, _provider(r.cloud, config_file), r) for r in recs]
    unrecorded: list[Any] = []
    if refresh:
        for c in _inventory_clouds(cloud):
            try:
                unrecorded += [
                    i
                    for i in inventory(_provider(c, config_file))
                    if store.get_cluster(i.name) is None and (not name or i.name == name)
                ]
            except AiosError as exc:
                _log(f"{c}: cannot list its aios resources ({exc})")
        if name and not recs and not unrecorded:
            require_cluster(store, name)
    out: list[dict[str, Any]] = []
    for r in recs:
        jobs = store.jobs(r.name)
        job_shapes = {j.id: shapes.job_shapes(store, r.name, j.id) for j in jobs}
        events = [
            e
            for e in store.events(r.name)
            if e.kind
            in ("preempted", "unhealthy", "recovered", "recovery-failed", "failover", "grow")
        ]
        out.append(
            {
                "name": r.name,
                "cloud": r.cloud,
                "zone": r.zone,
                "accelerator": r.accelerator,
                "spot": r.spot,
                "state": r.state,
                "hosts": [f"{h['worker_id']}:{h['ip']}" for h in r.hosts],
                "jobs": [
                    {
                        "id": j.id,
                        "state": j.state,
                        "command": j.command,
                        "restarts": j.restarts,
                        "max_restarts": j.max_restarts,
                        "exit_codes": j.exit_codes,
                        "shapes": job_shapes[j.id],
                        "goodput": _goodput(r, j, job_shapes[j.id]),
                    }
                    for j in jobs
                ],
                "recoveries": [
                    {"time": e.time, "kind": e.kind, "message": e.message} for e in events
                ],
            }
        )
    _merge_controllers(store, out, recs, refresh)
    for i in unrecorded:
        out.append(
            {
                "name": i.name,
                "cloud": i.cloud,
                "zone": i.zone,
                "accelerator": i.accelerator,
                "spot": i.spot,
                "state": f"{i.state} (no local record)",
                "hosts": [f"{h.worker_id}:{h.ip}" for h in i.hosts],
                "jobs": [],
                "recoveries": [],
                "unrecorded": True,
            }
        )
    if as_json:
        _emit_json(out)
        return
    if not out:
        _echo("no clusters (create one with `aios launch`)")
        return
    t = _table(
        "aios clusters",
        [
            "name",
            "cloud",
            "zone",
            "accelerator",
            "spot",
            "state",
            "hosts",
            "job",
            "restarts",
            "goodput",
        ],
    )
    for cl in out:
        j = cl["jobs"][-1] if cl["jobs"] else None
        g = j.get("goodput") if j else None
        t.add_row(
            cl["name"],
            cl["cloud"],
            cl["zone"] or "-",
            cl["accelerator"],
            "yes" if cl["spot"] else "no",
            cl["state"],
            str(len(cl["hosts"])),
            f"{j['id']} {j['state']}" if j else "-",
            f"{j['restarts']}/{j['max_restarts']}" if j else "-",
            f"{g['goodput']:.1%}" if g else "-",
        )
    _print(t)
    import datetime as _dt

    for cl in out:
        for e in cl["recoveries"]:
            ts = _dt.datetime.fromtimestamp(e["time"]).strftime("%Y-%m-%d %H:%M:%S")
            _echo(f"{cl['name']}: {ts} {e['kind']}: {e['message']}")
    for cl in out:
        for j in cl["jobs"]:
            js = j.get("shapes") or []
            if len(js) < 2 and not any(s["hourly_usd"] is not None for s in js):
                continue  # one shape without a price: the table says it all
            for k, s in enumerate(js, 1):
                _echo(f"{cl['name']}: job {j['id']} shape {k}: {shapes.describe(s)}")
            costs = [s["cost_usd"] for s in js if s["cost_usd"] is not None]
            if costs:
                unpriced = " (shapes without a price not counted)" if len(costs) < len(js) else ""
                _echo(
                    f"{cl['name']}: job {j['id']} cost so far {shapes.money(sum(costs))}{unpriced}"
                )
    for cl in out:
        for j in cl["jobs"]:
            if j.get("goodput"):
                _echo(f"{cl['name']}: job {j['id']} {_goodput_line(j['goodput'])}")
    for cl in out:
        if cl.get("controller"):
            ctl = cl["controller"]
            _echo(
                f"{cl['name']}: managed by a controller on {ctl['target']} (pid "
                f"{ctl['pid']}){' ' + ctl['state'] if 'state' in ctl else ''}"
            )
        if cl.get("unrecorded"):
            _echo(
                f"{cl['name']}: found in {cl['cloud']} by its aios label, no local record; "
                f"delete it with `aios down {cl['name']}`"
            )


def _goodput(rec: Any, job: Any, job_shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's goodput (:mod:`aios_cloud.runs`): its run records copied from the hosts while
    it runs (or when no copy exists yet), else the copy kept here; the cost per productive hour
    where every shape had a price."""
    from aios_cloud.runs import copied, job_goodput
    from aios_cloud.store import JOB_FINAL

    costs = [s["cost_usd"] for s in job_shapes]
    cost = sum(costs) if costs and all(c is not None for c in costs) else None
    # an ended job's records were copied when it ended (copied now if that never happened)
    refresh = job.state not in JOB_FINAL or not copied(job.cluster, job.id)
    g = job_goodput(rec, job, cost, refresh=refresh)
    return g.to_dict() if g else None


def _goodput_line(g: dict[str, Any]) -> str:
    from aios_cloud.runs import JobGoodput

    return JobGoodput(
        g["goodput"],
        g["productive_s"],
        g["wall_s"],
        g["cost_usd"],
        g["usd_per_productive_hour"],
        g["source"],
        g["copied"],
    ).line()


# ------------------------------------------------------------------------------ exec / logs / ssh


def _select(rec: Any, workers: tuple[int, ...]) -> list[Any]:
    from aios_cloud.records import record_hosts

    hosts = record_hosts(rec)
    if not workers:
        return hosts
    ids = {h.worker_id for h in hosts}
    bad = [w for w in workers if w not in ids]
    if bad:
        raise AiosError(
            f"cluster {rec.name} has no worker {bad[0]} (workers: {', '.join(map(str, sorted(ids)))})",
            "pass a valid --worker",
        )
    return [h for h in hosts if h.worker_id in workers]


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--worker", "-w", type=int, multiple=True, help="Only these workers (default: all).")
@click.option("--dry-run", is_flag=True)
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(name: str, command: tuple[str, ...], worker: tuple[int, ...], dry_run: bool) -> None:
    """Run COMMAND on every host of cluster NAME (in the synced code directory), in parallel,
    each output line prefixed with (worker N, ip). Exit status: the first non-zero one."""
    from aios_cloud.head import run_via_head
    from aios_cloud.records import (
        remote_root,
        require_cluster,
        runner_for,
    )

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
    from aios_cloud.head import run_via_head
    from aios_cloud.records import (
        remote_root,
        require_cluster,
        runner_for,
    )
    from aios_cloud.store import JOB_FINAL
    from aios_cloud.watching import LogFollower

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


def _scheduler(rec: Any) -> SchedulerProvider | None:
    """The provider of a batch-scheduler record (Slurm, Kubernetes jobs have no SSH hosts), else None."""
    from aios_cloud.provider import SchedulerProvider

    try:
        provider = _provider(rec.cloud, None)
    except AiosError:
        return None
    return provider if isinstance(provider, SchedulerProvider) else None


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--worker", "-w", type=int, default=0, show_default=True)
@click.option("--dry-run", is_flag=True)
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(name: str, worker: int, dry_run: bool, command: tuple[str, ...]) -> None:
    """Open a shell (or run COMMAND) on one host of cluster NAME."""
    from aios_cloud.records import (
        require_cluster,
        runner_for,
    )

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


# ------------------------------------------------------------------------------ sync


def _host_python(rec: Any) -> str:
    """The interpreter of the cluster's latest job (it has aios shipped next to it), else the
    provider's default for the accelerator."""
    job = _store().latest_job(rec.name)
    if job and (job.spec or {}).get("python"):
        return job.spec["python"]
    try:
        return _provider(rec.cloud, None).python(rec.accelerator)
    except AiosError:
        return "python3"


def _classify(loc: str, store: Any) -> tuple[str, Any, str]:
    """``("url", scheme, url)``, ``("cluster", rec, path)`` or ``("local", None, path)``."""
    if "://" in loc:
        return "url", loc.split("://", 1)[0], loc
    m = re.match(r"^([a-z][-a-z0-9]*):(.*)$", loc)
    if m and store.get_cluster(m.group(1)):
        return "cluster", store.get_cluster(m.group(1)), m.group(2) or "."
    return "local", None, loc


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option(
    "--worker",
    "-w",
    type=int,
    multiple=True,
    help="Cluster side: these workers (upload: default all; download: default 0).",
)
@click.option("--exclude", multiple=True)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    help="Bucket <-> cluster: NAME=VALUE or NAME (forwarded from here) for the copy on the hosts "
    "(endpoints, credentials).",
)
@click.option("--dry-run", is_flag=True)
def sync(
    src: str,
    dst: str,
    worker: tuple[int, ...],
    exclude: tuple[str, ...],
    env_items: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Copy between local paths, a cluster (NAME:PATH, relative to its code dir) and buckets
    (gs://..., s3://...). Bucket transfers show a progress bar for large files.

    \b
    aios sync ./data gs://bucket/data          local -> bucket
    aios sync gs://bucket/ckpt ./ckpt          bucket -> local
    aios sync ./config.yaml mycluster:configs/  local -> every host
    aios sync mycluster:out ./out -w 0          host 0 -> local
    aios sync gs://bucket/data mycluster:data   bucket -> every host (copied on the hosts)
    aios sync mycluster:out s3://bucket/out     host 0 -> bucket
    """
    from aios_cloud import transfer

    store = _store()
    s = _classify(src, store)
    d = _classify(dst, store)
    if s[0] == "cluster" and d[0] == "cluster":
        raise AiosError(
            "copying between two clusters is not supported", "sync to a bucket first, then from it"
        )
    if s[0] == "local" and not Path(s[2]).exists():
        raise AiosError(f"source {src} does not exist", "pass an existing local path")
    if s[0] == "url" or d[0] == "url":
        if "cluster" in (s[0], d[0]):
            from aios_cloud.jobs import job_env
            from aios_cloud.request import JobSpec, parse_env

            rec = s[1] if s[0] == "cluster" else d[1]
            if s[0] == "cluster" and len(worker) > 1:
                raise AiosError(
                    "cluster -> bucket copies from one worker (they would overwrite each other)",
                    "pass one -w N, and a different URL per worker",
                )
            env, forward = parse_env(list(env_items))
            env.update(job_env(JobSpec(script="", forward_env=forward), {}))
            hosts = _select(rec, worker or ((0,) if s[0] == "cluster" else ()))
            lines = transfer.bucket_cluster(
                s[2], d[2], rec, hosts, _host_python(rec), _printer(), dry_run, env, exclude
            )
        else:
            if env_items:
                raise AiosError("--env only applies to bucket <-> cluster copies", "drop --env")
            lines = transfer.copy_urls(s[2], d[2], dry_run=dry_run, excludes=exclude)
    elif s[0] == "local" and d[0] == "cluster":
        lines = transfer.upload_to_cluster(
            Path(s[2]), d[1], d[2], _select(d[1], worker), _printer(), dry_run, exclude
        )
    elif s[0] == "cluster" and d[0] == "local":
        hosts = _select(s[1], worker or (0,))
        lines = transfer.download_from_cluster(s[1], s[2], hosts, Path(d[2]), dry_run)
    else:
        raise AiosError(
            "both sides are local paths",
            "use cp/rsync, or name a cluster as NAME:PATH or a bucket URL",
        )
    for line in lines:
        _echo(line)


# ------------------------------------------------------------------------------ stop / start / down


def _lifecycle(
    action: str,
    names: tuple[str, ...],
    dry_run: bool,
    config_file: str | None,
    cloud: str | None = None,
) -> None:
    from aios_cloud.lifecycle import (
        down_cluster,
        start_cluster,
        stop_cluster,
    )
    from aios_cloud.provider import SchedulerProvider, provisioning
    from aios_cloud.records import (
        dry_run_lines,
        require_cluster,
    )

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
            from aios_cloud.controller import controller_of, stop_controller

            ctl = controller_of(store, rec.name)
            if ctl and rec.ssh_key:
                # a controller that kept running would recreate the cluster it sees vanish
                stop_controller(rec, ctl, rec.ssh_key, _log)
            down_cluster(store, provider, rec)
            _log(f"deleted {rec.name}")


def _inventory_clouds(cloud: str | None) -> list[str]:
    from aios_cloud.records import installed_clouds

    return [cloud] if cloud else installed_clouds()


def _down_unrecorded(name: str, cloud: str | None, dry_run: bool, config_file: str | None) -> None:
    from aios_cloud.records import (
        dry_run_lines,
        inventory,
        runner_for_name_reset,
    )

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
    from aios_cloud.lifecycle import (
        reinstall_agent,
        remember_autostop,
        remove_agent,
    )
    from aios_cloud.provider import provisioning
    from aios_cloud.records import (
        require_cluster,
    )

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
    from aios_cloud.jobs import cancel_job
    from aios_cloud.records import (
        require_cluster,
    )
    from aios_cloud.store import JOB_CANCELLED, JOB_FINAL

    store = _store()
    rec = require_cluster(store, name)
    jobs = (
        [store.get_job(job_id)]
        if job_id
        else [j for j in store.jobs(name) if j.state not in JOB_FINAL]
    )
    if job_id and (jobs[0] is None or jobs[0].cluster != name):
        raise AiosError(f"cluster {name} has no job {job_id}", f"see `aios status {name}`")
    from aios_cloud.provider import SchedulerProvider

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


# ------------------------------------------------------------------------------ catalog / cost


def _entries(cloud: str | None, config_file: str | None) -> list[Any]:
    from aios_cloud.records import installed_clouds

    # the ssh cloud offers nothing to buy: listed with --cloud ssh only
    clouds = [cloud] if cloud else [c for c in installed_clouds() if c != "ssh"]
    if not clouds:
        raise AiosError(
            "no cloud plugin is installed",
            "pip install -e './packages/core[gcp]' ./packages/cloud ./packages/backend-xla "
            "./packages/cloud-gcp (from the aios checkout), or for AWS: "
            "pip install -e './packages/core[aws]' ./packages/cloud ./packages/cloud-aws",
        )
    out = []
    for c in clouds:
        try:
            out.extend(_provider(c, config_file).catalog())
        except AiosError as exc:
            if cloud:
                raise
            _log(
                f"{c}: skipped: {exc.one_line()}"
            )  # an unreachable scheduler does not hide the other clouds
    return out


def _money(v: float | None, entry: Any = None) -> str:
    if v is None and entry is not None and (entry.extra or {}).get("price"):
        return str(entry.extra["price"])  # "n/a (your cluster)" for Slurm / Kubernetes
    if v is None and entry is not None and _recorded(entry) == "unknown price":
        return "unknown price"
    return "-" if v is None else f"${v:,.2f}"


def _recorded(entry: Any) -> str | None:
    """When the entry's prices were recorded (a date), "unknown price", or None (not said)."""
    value = (getattr(entry, "extra", None) or {}).get("prices_recorded")
    return str(value) if value else None


def _price_dates(entries: Any) -> str:
    dates = sorted(
        {
            f"{e.cloud} {_recorded(e)}"
            for e in entries
            if _recorded(e) and _recorded(e) != "unknown price"
        }
    )
    return f"prices as recorded: {', '.join(dates)}" if dates else ""


@click.command()
@click.option("--cloud", help="Only this cloud (default: every installed one).")
@click.option("--accelerator", "-a", "filter_", help="Only types containing this text.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--config", "config_file")
def catalog(cloud: str | None, filter_: str | None, as_json: bool, config_file: str | None) -> None:
    """Accelerator types with devices, memory, runtime, on-demand and spot price per hour."""
    entries = [e for e in _entries(cloud, config_file) if not filter_ or filter_ in e.accelerator]
    if as_json:
        _emit_json([e.to_dict() for e in entries])
        return
    if not entries and not filter_:
        raise AiosError(
            "no installed cloud listed anything",
            "see the notes above (a scheduler may be unreachable)",
        )
    if not entries:
        raise AiosError(
            f"no accelerator matches '{filter_}'",
            "run `aios catalog` without --accelerator to see all",
        )
    t = _table(
        "aios catalog (USD per hour for the whole type)",
        [
            "cloud",
            "accelerator",
            "devices",
            "memory/dev",
            "hosts",
            "per host",
            "runtime",
            "on-demand",
            "spot",
            "peak TFLOP/s",
            "zones",
        ],
    )
    for e in entries:
        t.add_row(
            e.cloud,
            e.accelerator,
            f"{e.devices} x {e.device_kind}",
            f"{e.memory_gb:.0f} GB",
            str(e.hosts),
            e.host_summary(),
            e.runtime or "-",
            _money(e.on_demand_hourly, e),
            _money(e.spot_hourly, e),
            f"{e.peak_tflops:,.0f}" if e.peak_tflops else "-",
            ", ".join(e.zones[:2]) + (f" +{len(e.zones) - 2}" if len(e.zones) > 2 else ""),
        )
    _print(t)


def _reservation_cost(
    cloud: str | None,
    accelerator: str | None,
    reservation: str,
    hours: float | None,
    nodes: int,
    as_json: bool,
    config_file: str | None,
) -> None:
    """``aios cost --reservation``: what the cloud says reserved capacity costs (live)."""
    from aios_cloud.provider import ClusterRequest

    if not cloud or not accelerator:
        raise AiosError(
            "--reservation needs --cloud and --accelerator",
            f"e.g. aios cost --cloud aws -a p5.48xlarge --reservation {reservation}",
        )
    if hours is not None and hours <= 0:
        raise AiosError(f"--hours must be positive, got {hours}", "pass e.g. --hours 48")
    provider = _provider(cloud, config_file)
    entry = provider.entry(accelerator)
    request = ClusterRequest("cost", accelerator, nodes=nodes, extra={"reservation": reservation})
    prices = provider.reservation_prices(request, hours=hours, live=True)
    if not prices:
        raise AiosError(
            f"--reservation {reservation} is billed by the hour on {cloud}, as the catalog says",
            f"drop --reservation: aios cost --cloud {cloud} -a {accelerator} --hours H",
        )
    hourly = entry.on_demand_hourly
    if as_json:
        _emit_json(
            [
                {
                    "cloud": cloud,
                    "accelerator": accelerator,
                    "nodes": nodes,
                    "reservation": reservation,
                    **p.to_dict(),
                    "on_demand_hourly_usd": None if hourly is None else hourly * nodes,
                }
                for p in prices
            ]
        )
        return
    for p in prices:
        _echo(f"{cloud} {accelerator} x{nodes}: {p.line()}")
    on_demand = "unknown" if hourly is None else f"${hourly * nodes:,.2f}/h"
    _echo(f"(on demand the same {nodes} x {accelerator} would be {on_demand})")


@click.command()
@click.option("--cloud", help="Only this cloud (default: every installed one).")
@click.option(
    "--accelerator", "-a", help="Estimate for this type (with --hours, or with --params/--tokens)."
)
@click.option("--hours", type=float, help="Run length for a plain hours x price estimate.")
@click.option("--nodes", type=int, default=1, show_default=True)
@click.option("--params", help="Model parameters (1.3B, 350M, 7e9).")
@click.option("--tokens", help="Training tokens (26B, 1T).")
@click.option("--precision", default="bf16-mixed", show_default=True)
@click.option(
    "--mfu",
    type=float,
    default=0.4,
    show_default=True,
    help="Assumed or measured model FLOPs utilisation.",
)
@click.option("--spot", is_flag=True, help="Rank by spot price.")
@click.option(
    "--reservation",
    help="With --accelerator: price reserved capacity billed as an upfront fee (AWS: "
    "block:cr-... for a Capacity Block you have, block with --hours for what EC2 offers now).",
)
@click.option("--by", type=click.Choice(["cost", "time"]), default="cost", show_default=True)
@click.option("--top", type=int, default=15, show_default=True)
@click.option(
    "--all",
    "include_all",
    is_flag=True,
    help="Include types whose memory cannot hold the training state.",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--config", "config_file")
def cost(
    cloud: str | None,
    accelerator: str | None,
    hours: float | None,
    nodes: int,
    params: str | None,
    tokens: str | None,
    precision: str,
    mfu: float,
    spot: bool,
    reservation: str | None,
    by: str,
    top: int,
    include_all: bool,
    as_json: bool,
    config_file: str | None,
) -> None:
    """Estimate the cost of a run (hours x price), or rank accelerators for a training job by
    hours and dollars from 6 x params x tokens FLOPs at peak x utilisation; with
    --reservation, the upfront fee of reserved capacity (an AWS Capacity Block) and its fee
    per hour."""
    from aios_cloud import cost as C

    if reservation:
        _reservation_cost(cloud, accelerator, reservation, hours, nodes, as_json, config_file)
        return

    if hours is None and not (params and tokens):
        raise AiosError(
            "aios cost needs --accelerator with --hours, or --params and --tokens",
            "e.g. aios cost --params 1.3B --tokens 26B",
        )
    entries = _entries(cloud, config_file)
    if hours is not None:
        if not accelerator:
            raise AiosError("--hours needs --accelerator", "add -a TYPE")
        matches = [e for e in entries if e.accelerator == accelerator]
        if not matches:
            raise AiosError(f"unknown accelerator '{accelerator}'", "see `aios catalog`")
        rows = []
        for e in matches:
            od, sp = C.hours_cost(e, hours, nodes)
            rows.append(
                {
                    "cloud": e.cloud,
                    "accelerator": e.accelerator,
                    "hours": hours,
                    "nodes": nodes,
                    "on_demand_usd": od,
                    "spot_usd": sp,
                    "prices_recorded": _recorded(e),
                }
            )
        if as_json:
            _emit_json(rows)
            return
        for row in rows:
            e = next(m for m in matches if m.cloud == row["cloud"])
            when = _recorded(e)
            _echo(
                f"{row['cloud']} {row['accelerator']} x{nodes} for {hours:g} h: on-demand "
                f"{_money(row['on_demand_usd'], e)}, spot {_money(row['spot_usd'], e)}"
                + (f" (prices as recorded on {when})" if when and when != "unknown price" else "")
            )
        return
    if not (params and tokens):
        raise AiosError(
            "aios cost needs --accelerator with --hours, or --params and --tokens",
            "e.g. aios cost --params 1.3B --tokens 26B",
        )
    p = C.parse_count(params, "--params")
    tk = C.parse_count(tokens, "--tokens")
    C.normalise_precision(precision)
    if accelerator:
        entries = [e for e in entries if e.accelerator == accelerator]
        if not entries:
            raise AiosError(f"unknown accelerator '{accelerator}'", "see `aios catalog`")
    ranked = C.rank(
        entries,
        p,
        tk,
        precision,
        mfu,
        spot=spot,
        include_unfit=include_all or bool(accelerator),
        by=by,
    )[:top]
    if as_json:
        _emit_json(
            {
                "flops": C.training_flops(p, tk),
                "mfu": mfu,
                "precision": precision,
                "ranking": [r.to_dict() for r in ranked],
            }
        )
        return
    _echo(
        f"{C.training_flops(p, tk):.3g} FLOPs (6 x {p:.3g} params x {tk:.3g} tokens), {precision}, utilisation {mfu:g}"
    )
    t = _table(
        f"ranked by {'spot' if spot else 'on-demand'} {by}",
        ["#", "cloud", "accelerator", "devices", "hours", "on-demand", "spot", "fits"],
    )
    for i, r in enumerate(ranked, 1):
        t.add_row(
            str(i),
            r.entry.cloud,
            r.entry.accelerator,
            str(r.entry.devices),
            f"{r.hours:,.1f}",
            _money(r.on_demand, r.entry),
            _money(r.spot, r.entry),
            "yes" if r.fits else f"no ({r.state_gb:.0f} GB state)",
        )
    _print(t)
    dates = _price_dates(r.entry for r in ranked)
    if dates:
        _echo(dates)
