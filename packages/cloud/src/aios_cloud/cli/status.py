"""``aios status``: clusters and jobs with their state, recoveries and goodput."""

from __future__ import annotations

from typing import Any

import click
from aios.errors import AiosError

from aios_cloud import shapes
from aios_cloud.cli.common import (
    _echo,
    _emit_json,
    _inventory_clouds,
    _log,
    _print,
    _provider,
    _store,
    _table,
)
from aios_cloud.controller import controller_of, remote_status
from aios_cloud.records import inventory, require_cluster
from aios_cloud.records import refresh as refresh_record
from aios_cloud.runs import JobGoodput, copied, job_goodput
from aios_cloud.store import JOB_FINAL

# ------------------------------------------------------------------------------ status


def _merge_controllers(
    store: Any, out: list[dict[str, Any]], recs: list[Any], refresh: bool
) -> None:
    """A job managed from a controller host: its controller, and (``--refresh``) the job as the
    controller sees it."""

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
    out = _rows(store, recs)
    _merge_controllers(store, out, recs, refresh)
    out += [_unrecorded_row(i) for i in unrecorded]
    if as_json:
        _emit_json(out)
        return
    if not out:
        _echo("no clusters (create one with `aios launch`)")
        return
    _show(out)


def _rows(store: Any, recs: list[Any]) -> list[dict[str, Any]]:
    """One row per recorded cluster: its hosts, jobs (shapes, goodput) and recoveries."""
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
    return out


def _unrecorded_row(i: Any) -> dict[str, Any]:
    """A cluster the cloud lists by its aios label that has no local record."""
    return {
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


def _show(out: list[dict[str, Any]]) -> None:
    """``aios status``'s table, then each cluster's recoveries, shapes, goodput and notes."""
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

    costs = [s["cost_usd"] for s in job_shapes]
    cost = sum(costs) if costs and all(c is not None for c in costs) else None
    # an ended job's records were copied when it ended (copied now if that never happened)
    refresh = job.state not in JOB_FINAL or not copied(job.cluster, job.id)
    g = job_goodput(rec, job, cost, refresh=refresh)
    return g.to_dict() if g else None


def _goodput_line(g: dict[str, Any]) -> str:
    return JobGoodput(
        g["goodput"],
        g["productive_s"],
        g["wall_s"],
        g["cost_usd"],
        g["usd_per_productive_hour"],
        g["source"],
        g["copied"],
    ).line()
