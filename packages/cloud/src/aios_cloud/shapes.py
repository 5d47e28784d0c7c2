"""The shapes a run had, and the accelerator candidates it may move between.

A managed run follows capacity: ``aios launch -a TYPE1,TYPE2,...`` names candidates in order of
preference (``--cheapest``: by the catalog's price), a recovery that finds no capacity for the
current type launches the next, and a ``--cloud ssh`` run continues on the hosts that remain
(``--min-hosts``). Each stretch of the job on one shape (accelerator type, hosts, processes) is a
*shape*, kept in the cluster's event log as a ``shape`` event when it starts and a ``shape-end``
event when it ends, so ``aios status`` shows every shape with its steps (from the newest complete
checkpoint at its start and end), its time and, where the catalog has a price, its cost.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable
from typing import Any

from aios.checkpoint import MARKER, CheckpointStore

from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.errors import CloudError
from aios_cloud.records import record_hosts, request_from_dict, runner_for
from aios_cloud.store import ClusterRecord, Store

SHAPE = "shape"
SHAPE_END = "shape-end"


def hourly(provider: CloudProvider, accelerator: str, spot: bool, nodes: int) -> float | None:
    """The catalog's price of ``nodes`` x ``accelerator`` per hour (None: no price listed)."""
    try:
        price = provider.entry(accelerator).hourly(spot)
    except CloudError:
        return None
    return None if price is None else price * max(1, nodes)


def hourly_for_hosts(
    provider: CloudProvider, accelerator: str, spot: bool, hosts: int
) -> float | None:
    """The catalog's price per hour of a cluster of ``hosts`` machines of ``accelerator``: a
    type whose slice spans several hosts (a multi-host TPU slice) is priced per slice, so
    ``hosts`` counts ``ceil(hosts / entry.hosts)`` slices (None: no price listed)."""
    try:
        entry = provider.entry(accelerator)
    except CloudError:
        return None
    price = entry.hourly(spot)
    if price is None:
        return None
    return price * max(1, math.ceil(max(1, hosts) / max(1, entry.hosts)))


def record_hourly(provider: CloudProvider, rec: ClusterRecord) -> float | None:
    """What the cluster ``rec`` costs per hour as a shape is recorded: reserved capacity billed
    as an upfront fee (an AWS Capacity Block) at its fee per hour, or None when the cloud does
    not tell the fee (never the on-demand price it is not billed at); else the catalog's
    price of its hosts."""

    if (rec.request.get("extra") or {}).get("reservation"):
        try:
            reserved = provider.reservation_prices(request_from_dict(rec.request), live=True)
        except Exception:  # noqa: BLE001 - a price is information: the shape is recorded without
            return None
        if reserved:
            return reserved[0].hourly
    return hourly_for_hosts(provider, rec.accelerator, rec.spot, len(rec.hosts))


def order(
    provider: CloudProvider, names: list[str], spot: bool, nodes: int, cheapest: bool
) -> list[str]:
    """``names`` in the order they are tried: as given, or by price with ``cheapest`` (types
    without a price last, in the order given)."""
    if not cheapest:
        return list(names)
    price = {a: hourly(provider, a, spot, nodes) for a in names}
    return sorted(names, key=lambda a: _or_inf(price[a]))


def _or_inf(v: float | None) -> float:
    return math.inf if v is None else v


def money(v: float | None) -> str:
    return "no price" if v is None else f"${v:,.2f}"


# ------------------------------------------------------------------------------ steps


def newest_step(rec: ClusterRecord, checkpoint_dir: str | None) -> int | None:
    """The step of the newest complete checkpoint in ``checkpoint_dir`` (None: none, or it
    cannot be read). A bucket URL is read from here; a path on the hosts through worker 0."""
    if not checkpoint_dir:
        return None
    try:
        if "://" in checkpoint_dir:
            store = CheckpointStore(checkpoint_dir, keep=None)
            # a long-lived watcher: fsspec keeps listings of object stores per process (s3fs,
            # gcsfs), which would name checkpoints pruned since
            store.fs.invalidate_cache(store.root)
            info = store.latest(warn=False)
            return info.step if info else None
        d = shlex.quote(checkpoint_dir.rstrip("/"))
        cmd = (
            f'for c in {d}/ckpt-*; do [ -f "$c/{MARKER}" ] && basename "$c"; done '
            "2>/dev/null | sort | tail -1"
        )
        hosts = record_hosts(rec)
        if not hosts:
            return None
        r = runner_for(rec, None, retries=0).run_one(hosts[0], cmd, stream=False, timeout=30)
        name = (r.stdout[-1] if r.stdout else "").strip()
        digits = name.removeprefix("ckpt-").split("-", 1)[0]
        return int(digits) if name.startswith("ckpt-") and digits.isdigit() else None
    except Exception:  # noqa: BLE001 - the step is informative; a shape is recorded without it
        return None


# ------------------------------------------------------------------------------ the record


def begin(
    store: Store,
    rec: ClusterRecord,
    job_id: int,
    processes: int,
    price: float | None,
    step: int | None,
    why: str,
) -> None:
    """Record that job ``job_id`` starts on ``rec``'s current shape."""
    store.event(
        rec.name,
        SHAPE,
        json.dumps(
            {
                "accelerator": rec.accelerator,
                "hosts": len(rec.hosts),
                "processes": processes,
                "hourly_usd": price,
                "step": step,
                "why": why,
            }
        ),
        job_id,
    )


def end(store: Store, rec: ClusterRecord, job_id: int, step: int | None, why: str) -> None:
    """Record that the job's current shape ended (once: a shape already ended is left alone)."""
    shapes = job_shapes(store, rec.name, job_id)
    if not shapes or shapes[-1]["ended"] is not None:
        return
    store.event(rec.name, SHAPE_END, json.dumps({"step": step, "why": why}), job_id)


def job_shapes(
    store: Store, cluster: str, job_id: int, now: Callable[[], float] = time.time
) -> list[dict[str, Any]]:
    """Every shape of job ``job_id`` in order: accelerator, hosts, processes, start and end step
    and steps, seconds, hourly price and cost (None where unknown); the current one has
    ``ended`` None and runs to ``now``."""
    out: list[dict[str, Any]] = []
    for e in store.events(cluster):
        if e.job_id != job_id or e.kind not in (SHAPE, SHAPE_END):
            continue
        try:
            data = json.loads(e.message)
        except ValueError:
            continue
        if e.kind == SHAPE:
            if out and out[-1]["ended"] is None:  # never ended (a crashed watcher): ends here
                out[-1]["ended"] = e.time
            out.append(
                {
                    "accelerator": data.get("accelerator"),
                    "hosts": data.get("hosts"),
                    "processes": data.get("processes"),
                    "hourly_usd": data.get("hourly_usd"),
                    "why": data.get("why", ""),
                    "started": e.time,
                    "ended": None,
                    "from_step": data.get("step"),
                    "to_step": None,
                }
            )
        elif out and out[-1]["ended"] is None:
            out[-1]["ended"] = e.time
            out[-1]["to_step"] = data.get("step")
            out[-1]["end"] = data.get("why", "")
    t = now()
    for s in out:
        seconds = max(0.0, (s["ended"] if s["ended"] is not None else t) - s["started"])
        s["seconds"] = round(seconds, 1)
        a, b = s["from_step"], s["to_step"]
        s["steps"] = (b - (a or 0)) if b is not None else None
        price = s["hourly_usd"]
        s["cost_usd"] = None if price is None else round(price * seconds / 3600.0, 4)
    return out


def describe(s: dict[str, Any]) -> str:
    """One shape as ``aios status`` prints it."""
    steps = (
        f"steps {s['from_step'] or 0}->{s['to_step']} ({s['steps']})"
        if s["steps"] is not None
        else f"from step {s['from_step'] or 0}"
    )
    cost = (
        f"{money(s['cost_usd'])} at {money(s['hourly_usd'])}/h"
        if s["hourly_usd"] is not None
        else "no price in the catalog"
    )
    running = "" if s["ended"] is not None else ", running"
    return (
        f"{s['accelerator']} x {s['hosts']} hosts, {s['processes']} processes: {steps}, "
        f"{_duration(s['seconds'])}{running}, {cost}"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
