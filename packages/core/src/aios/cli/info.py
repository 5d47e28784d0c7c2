"""``aios plugins|devices|env``: no torch, no pydantic of aios' own (the config schema loads with
``aios doctor|config``, :mod:`aios.cli.configured`)."""

from __future__ import annotations

import json
from typing import Any

import click

from aios.__about__ import __version__
from aios.config.redact import is_secret, redact
from aios.errors import AiosError, PluginError
from aios.plugins.registry import get_registry
from aios.types import DeviceReport


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


def _table(title: str, columns: list[str]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_lines=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def _registry() -> Any:
    return get_registry()


def _emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def _error_lines(reg: Any) -> None:
    for err in reg.errors:
        click.echo(f'aios: plugin error: "{err.plugin}": {err.error}', err=True)


# ------------------------------------------------------------------------------ plugins


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List plugins with their version, the hooks they implement, what they register and
    any load errors."""
    reg = _registry()
    rows = []
    for info in reg.plugins.values():
        rows.append(
            {
                "name": info.name,
                "version": info.version,
                "module": info.module,
                "hooks": info.hooks,
                "backends": sorted(b for b, s in reg.backends.items() if s.plugin == info.name),
                "clouds": sorted(c for c, s in reg.clouds.items() if s.plugin == info.name),
                "strategies": _strategies_of(reg, info.name),
                "accelerators": sorted(
                    a for a, s in reg.accelerators.items() if s.plugin == info.name
                ),
                "cluster_environments": sorted(
                    n for n, e in reg.cluster_envs.items() if getattr(e, "plugin", "") == info.name
                ),
            }
        )
    errors = [{"plugin": e.plugin, "error": e.error} for e in reg.errors]
    if as_json:
        _emit_json({"plugins": rows, "errors": errors})
        return
    t = _table("aios plugins", ["plugin", "version", "provides", "hooks"])
    for r in rows:
        provides = ", ".join(
            [
                *(f"backend:{b}" for b in r["backends"]),
                *(f"accelerator:{a}" for a in r["accelerators"]),
                *(f"strategy:{s['name']}({_targets(s)})" for s in r["strategies"]),
                *(f"cluster-env:{e}" for e in r["cluster_environments"]),
                *(f"cloud:{c}" for c in r["clouds"]),
            ]
        )
        t.add_row(
            r["name"],
            r["version"],
            provides or "-",
            ", ".join(h.removeprefix("aios_") for h in r["hooks"]),
        )
    _console().print(t)
    for e in errors:
        click.echo(f'error: plugin "{e["plugin"]}": {e["error"]}')


def _strategies_of(reg: Any, plugin: str) -> list[dict[str, Any]]:
    """The strategies ``plugin`` registered, each with the backends/accelerators it runs on."""
    out = []
    for name in sorted(reg.strategies):
        for spec in reg.strategies[name]:
            if spec.plugin == plugin:
                out.append(
                    {
                        "name": name,
                        "backends": list(spec.backends),
                        "accelerators": list(spec.accelerators),
                    }
                )
    return out


def _targets(strategy: dict[str, Any]) -> str:
    parts = [
        *strategy["backends"],
        *("any accelerator" if a == "*" else f"{a} accelerator" for a in strategy["accelerators"]),
    ]
    return " ".join(parts) or "-"


# ------------------------------------------------------------------------------ devices


def _fmt_bytes(n: int | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.0f} PiB"


def _reports(backend: str | None) -> list[Any]:
    reg = _registry()
    names = (
        [reg.backend(backend).name]
        if backend
        else sorted(reg.backends, key=lambda n: -reg.backends[n].priority)
    )
    out = []
    for name in names:
        try:
            rep = reg.discover_devices(name, None)
        except PluginError as exc:  # a plugin's discovery raised or hung: named, never fatal
            rep = DeviceReport(name, "?", False, reason=f"discovery failed: {exc.message}")
        except AiosError:
            raise
        except Exception as exc:  # noqa: BLE001 - one backend's failure never hides the others
            rep = DeviceReport(
                name, "?", False, reason=f"discovery failed: {type(exc).__name__}: {exc}"
            )
        if rep is None:
            avail = reg.probe(name)
            rep = DeviceReport(
                name, "?", bool(avail), reason=avail.reason or "plugin reports no discovery"
            )
        out.append(rep)
    return out


@click.command()
@click.option("--backend", default=None, help="Only this backend.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def devices(backend: str | None, as_json: bool) -> None:
    """Show what each backend finds on this machine: device kind, count, memory, topology."""
    reps = _reports(backend)
    if as_json:
        _emit_json([r.to_dict() for r in reps])
        return
    _error_lines(_registry())
    t = _table(
        "aios devices", ["backend", "available", "kind", "count", "memory", "topology / reason"]
    )
    for r in reps:
        mem = {_fmt_bytes(d.memory_bytes) for d in r.devices} or {"-"}
        topo = ", ".join(
            f"{k}={v}" for k, v in r.topology.items() if not isinstance(v, (list, dict))
        )
        t.add_row(
            r.backend,
            "yes" if r.available else "no",
            r.kind,
            str(r.count),
            "/".join(sorted(mem)),
            topo if r.available else (r.reason or topo),
        )
    con = _console()
    con.print(t)
    for r in reps:
        for k, v in r.topology.items():
            if isinstance(v, list) and v and isinstance(v[0], list):  # a matrix (e.g. NVLink)
                con.print(f"[bold]{r.backend} {k}[/bold]")
                for row in v:
                    con.print("  " + "  ".join(f"{c:>5}" for c in row))
        for note in r.notes:
            con.print(f"{r.backend}: {note}")


# ------------------------------------------------------------------------------ env


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def env(as_json: bool) -> None:
    """Versions and settings for bug reports. Secret values are redacted."""
    import os

    reg = _registry()
    info: dict[str, Any] = {"aios-core": __version__}
    for plugin, result, exc in reg.call_all("aios_env_info"):
        if exc is not None:
            info[f"{plugin}.error"] = f"{type(exc).__name__}: {exc}"
        elif result:
            info.update(result)
    info["plugins"] = {p.name: p.version for p in reg.plugins.values()}
    prefixes = (
        "AIOS_",
        "PJRT_",
        "XLA_",
        "TPU_",
        "NEURON_",
        "CUDA_",
        "NCCL_",
        "FI_",
        "OMP_",
        "WANDB_",
        "GOOGLE_",
        "AWS_",
        "CLOUDSDK_",
        "MASTER_",
        "LOCAL_",
        "RANK",
        "WORLD_SIZE",
    )
    envs = {
        k: ("***" if is_secret(k) else v)
        for k, v in sorted(os.environ.items())
        if k.startswith(prefixes)
    }
    info["env"] = envs
    info = redact(info)
    if as_json:
        _emit_json(info)
        return
    for k, v in info.items():
        if isinstance(v, dict):
            click.echo(f"{k}:")
            for k2, v2 in v.items():
                click.echo(f"  {k2}: {v2}")
        else:
            click.echo(f"{k}: {v}")
