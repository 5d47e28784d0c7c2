"""``aios catalog`` and ``aios cost``: the installed clouds' offers and prices."""

from __future__ import annotations

from typing import Any

import click
from aios.errors import AiosError

from aios_cloud import cost as C
from aios_cloud.cli.common import _echo, _emit_json, _log, _print, _provider, _table
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.records import installed_clouds

# ------------------------------------------------------------------------------ catalog / cost


def _entries(cloud: str | None, config_file: str | None) -> list[Any]:
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
