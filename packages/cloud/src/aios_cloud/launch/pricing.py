"""The launch's prices: the spending limit (``--max-cost``) checked and shown, and the
price lines of the dry run."""

from __future__ import annotations

from aios.errors import AiosError

from aios_cloud import shapes
from aios_cloud.launch.context import Launch
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.request import LaunchRequest


def check_cost_limit(
    request: LaunchRequest, provider: CloudProvider, cloud: str, clusters: list[ClusterRequest]
) -> None:
    """``--max-cost`` projects the spend from what the capacity is billed at: the catalog's
    hourly price of every type the job may run on, or reserved capacity's fee per hour where it
    is billed as an upfront fee (:meth:`CloudProvider.reservation_prices`; a dry run calls no
    cloud, so the fee is read at launch)."""
    pricing = "spot" if request.spot else "on-demand"
    for c in clusters:
        reserved = (
            provider.reservation_prices(c, live=not request.dry_run) if request.reservation else []
        )
        if reserved:
            if not request.dry_run and reserved[0].hourly is None:
                raise AiosError(
                    f"--max-cost needs what {reserved[0].what} costs per hour, and {cloud} does "
                    "not tell its fee",
                    "drop --max-cost (the reservation's end bounds the run); `aios cost --cloud "
                    f"{cloud} -a {c.accelerator} --reservation {request.reservation}` shows what "
                    "is known",
                )
            continue
        if shapes.hourly(provider, c.accelerator, request.spot, c.nodes) is None:
            raise AiosError(
                f"--max-cost needs the price of {c.accelerator}, and the {cloud} catalog lists "
                f"no {pricing} price for it",
                f"drop --max-cost, or pick a type with a price (`aios catalog --cloud {cloud}`)",
            )


def cost_limit_line(launch: Launch) -> str | None:
    """``--dry-run``: what ``--max-cost`` will do."""
    limit, request = launch.request.cost_limit, launch.request
    if limit is None:
        return None
    c = launch.cluster
    reserved = launch.provider.reservation_prices(c, live=False) if request.reservation else []
    if reserved:
        price = reserved[0].hourly
        how = "the reservation's upfront fee per hour of its term, read at launch"
    else:
        price = shapes.hourly(launch.provider, c.accelerator, request.spot, c.nodes)
        how = "catalog price x time on each shape"
    hours = f", about {limit / price:.1f} h at {shapes.money(price)}/h" if price else ""
    down = " and the cluster deleted (--down)" if request.down_after else ""
    return (
        f"# cost limit: --max-cost {shapes.money(limit)}: the watcher projects the job's spend "
        f"({how}){hours}; before it passes the limit the job is checkpointed (SIGTERM, the "
        f"checkpoint.grace_seconds notice) and stopped{down}"
    )


def price_lines(launch: Launch) -> list[str]:
    """The dry run's prices: each candidate per hour (the catalog's, spot or on-demand as
    asked), the one launched first, and what a recovery without capacity moves to."""
    request, provider = launch.request, launch.provider
    if provider.user_hosts or launch.existing is not None:
        return []
    pricing = "spot" if request.spot else "on-demand"
    clusters = launch.clusters or [launch.cluster]
    if len(clusters) == 1:
        c = clusters[0]
        p = shapes.hourly(provider, c.accelerator, request.spot, c.nodes)
        reserved = provider.reservation_prices(c, live=False) if request.reservation else []
        if reserved:
            # billed as an upfront fee for its term (a Capacity Block), not by the hour
            return [
                f"# price: {c.nodes} x {c.accelerator} in {r.line()}; not the {pricing} "
                f"{shapes.money(p)}/h"
                for r in reserved
            ]
        return [f"# price: {c.nodes} x {c.accelerator}, {shapes.money(p)}/h ({pricing})"]
    how = "cheapest first (--cheapest)" if request.cheapest else "in the order given"
    out = [f"# candidates, {how}, {pricing} prices from the catalog:"]
    for i, c in enumerate(clusters):
        p = shapes.hourly(provider, c.accelerator, request.spot, c.nodes)
        cand = launch.spec.candidate(c.accelerator)
        role = (
            "chosen: launched first"
            if i == 0
            else f"if {clusters[i - 1].accelerator} has no capacity"
        )
        backend = f", backend {cand.backend}" if cand else ""
        out.append(
            f"#   {i + 1}. {c.nodes} x {c.accelerator}: {shapes.money(p)}/h{backend} ({role})"
        )
    return out
