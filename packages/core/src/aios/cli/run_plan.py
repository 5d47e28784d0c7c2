"""``aios-run``'s arguments and plan: ``key=value`` overrides and the script, the config and the
backend's plan, what can be checked before anything starts (script, rendezvous port, checkpoint
dir), the defaults a scheduler's job gives, and the ``--dry-run`` print. No torch."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

import click

from aios.checkpoint import CheckpointStore
from aios.config.schema import resolve
from aios.environments.base import detect
from aios.errors import LaunchError
from aios.launcher.ports import free_port, is_local, port_free
from aios.plugins.registry import get_registry
from aios.resilience.preflight import needs_checkpoint_dir
from aios.types import LaunchRequest


def split_argv(argv: tuple[str, ...], module: str | None) -> tuple[list[str], str, list[str]]:
    """``key=value`` overrides, then the script, then its arguments."""
    overrides: list[str] = []
    items = list(argv)
    if module:
        return (
            [a for a in items if "=" in a and not a.startswith("-")],
            module,
            [a for a in items if not ("=" in a and not a.startswith("-"))],
        )
    while (
        items and "=" in items[0] and not items[0].startswith("-") and not os.path.exists(items[0])
    ):
        overrides.append(items.pop(0))
    if not items:
        raise LaunchError(
            "no training script given", "usage: aios-run [OPTIONS] [key=value ...] SCRIPT [ARGS...]"
        )
    return overrides, items[0], items[1:]


def _refuse_saves_without_dir(script: str) -> None:
    """A script that saves into ``checkpoint.dir`` (``rt.save_best``, ``rt.save()``) with none
    set: refused before anything starts, not after its first epoch."""
    try:
        with open(script, encoding="utf-8") as f:
            found = needs_checkpoint_dir(f.read())
    except (OSError, UnicodeDecodeError):
        return
    if found is not None:
        line, call = found
        raise LaunchError(
            f"{script}:{line} calls {call}, which writes into checkpoint.dir, but none is set",
            f"pass checkpoint.dir=PATH before the script (aios-run checkpoint.dir=ckpt {script})",
        )


def _misplaced_overrides(cfg: Any, args: list[str]) -> list[str]:
    """The script's arguments that read like aios-run's own ``key=value`` options (a top-level
    aios setting, e.g. ``strategy=fsdp``, ``checkpoint.dir=ckpt``)."""
    fields = set(type(cfg).model_fields)
    out = []
    for a in args:
        key, eq, _ = a.partition("=")
        if eq and not a.startswith("-") and key.split(".", 1)[0] in fields:
            out.append(a)
    return out


def check_checkpoint_dir(cfg: Any) -> None:
    """Writable, and its newest complete checkpoint (if any) is intact (sizes vs marker)."""
    if not cfg.checkpoint.dir:
        return

    store = CheckpointStore(cfg.checkpoint.dir, keep=cfg.checkpoint.keep)
    store.check_writable()
    if cfg.checkpoint.resume:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            info = store.latest(warn=False)
        if info is not None:
            store.verify(info)


#: the launch's master port is aios's choice (the default, one local node): another run that
#: takes it between the check and the store's bind is answered with another free port
PORT_IS_OURS = False


def build_plan(
    script: str,
    args: list[str],
    overrides: list[str],
    flags: dict[str, Any],
    config_file: str | None,
    module: bool = False,
    check: bool = True,
) -> tuple[Any, Any, Any, list[str]]:
    """``(config, backend spec, plan, notes)``; raises :class:`AiosError` for bad input."""

    cfg = resolve(config_file, overrides, flags)
    if not module and not os.path.isfile(script):
        hint = (
            "check the path"
            if not os.path.exists(script)
            else "pass a Python file, or use -m for a module"
        )
        raise LaunchError(f"script '{script}' not found", hint)
    reg = get_registry()
    spec = reg.select(cfg.backend, config=cfg)
    if not module and not cfg.checkpoint.dir:
        _refuse_saves_without_dir(script)
    notes: list[str] = []
    misplaced = _misplaced_overrides(cfg, args)
    if misplaced:
        name = script if module else os.path.basename(script)
        notes.append(
            f"{' '.join(misplaced)} after the script go{'es' if len(misplaced) == 1 else ''} to "
            f"{name}'s own arguments, not to aios-run; to set aios options, put them before the "
            f"script (aios-run {' '.join(misplaced)} {name} ...)"
        )
    updates: dict[str, Any] = {"backend": spec.name}
    cfg = cfg.model_copy(update=updates)
    cfg.model_fields_set.add("backend")
    request = LaunchRequest(script=script, args=list(args), module=module)
    plan = reg.launch_plan(spec.name, cfg, request)
    if plan is None:
        raise LaunchError(
            f"backend '{spec.name}' has no launch plan",
            f"reinstall the plugin that provides it ({spec.plugin})",
        )
    global PORT_IS_OURS
    PORT_IS_OURS = (
        "master_port" not in cfg.model_fields_set and cfg.nnodes == 1 and is_local(cfg.master_addr)
    )
    if check and plan.launcher != "direct" and cfg.node_rank == 0 and is_local(cfg.master_addr):
        if not port_free(cfg.master_addr, cfg.master_port):
            explicit = "master_port" in cfg.model_fields_set
            if explicit or cfg.nnodes > 1:
                raise LaunchError(
                    f"port {cfg.master_port} on {cfg.master_addr} is in use (another run, or a stale process)",
                    f"pass a free port, e.g. --master-port {free_port(cfg.master_addr)}",
                )
            port = free_port(cfg.master_addr)
            notes.append(f"default port {cfg.master_port} is in use; using {port}")
            cfg = cfg.model_copy(update={"master_port": port})
            plan = reg.launch_plan(spec.name, cfg, request)
    return cfg, spec, plan, notes


def print_plan(
    cfg: Any, spec: Any, plan: Any, env: dict[str, str], notes: list[str], as_json: bool
) -> None:
    devices = None
    try:
        rep = get_registry().discover_devices(spec.name, cfg)
        devices = rep.to_dict() if rep is not None else None
    except Exception as exc:  # noqa: BLE001
        devices = {"error": str(exc)}
    data = plan.to_dict()
    for h in data["hosts"]:
        h["env"] = {**h["env"], **env}
        if plan.launcher == "direct":
            h["ranks"] = []  # one process, started as it is: no RANK/WORLD_SIZE/MASTER_* set
        h["shell"] = " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in sorted(h["env"].items())),
                *map(shlex.quote, h["command"]),
            ]
        )
    out = {
        "backend": spec.name,
        "plugin": spec.plugin,
        "launcher": plan.launcher,
        "world_size": plan.world_size,
        "devices": devices,
        "config": cfg.redacted_dict(),
        "hosts": data["hosts"],
        "notes": [*plan.notes, *notes],
    }
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    dev = (
        f"{devices.get('count')} x {devices.get('kind')}"
        if isinstance(devices, dict) and "count" in devices
        else "unknown"
    )
    click.echo(f"backend:    {spec.name} (plugin {spec.plugin or '?'})")
    click.echo(f"devices:    {dev}")
    click.echo(
        f"launcher:   {plan.launcher}, world size {plan.world_size}, precision {cfg.precision}"
    )
    for h in data["hosts"]:
        click.echo(f"host {h['host']['address']}: {h['nprocs']} process(es)")
        if plan.launcher == "direct":
            click.echo("  rank 0: one process (no RANK, WORLD_SIZE or MASTER_* variables are set)")
        for r in h["ranks"]:
            click.echo(
                "  rank " + r.get("RANK", "?") + ": " + " ".join(f"{k}={v}" for k, v in r.items())
            )
        click.echo(
            "  env:     " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(h["env"].items()))
        )
        click.echo("  command: " + " ".join(shlex.quote(c) for c in h["command"]))
    for n in out["notes"]:
        click.echo(f"note: {n}")


def scheduler_defaults(
    flags: dict[str, Any], overrides: list[str], config_file: str | None
) -> None:
    """Inside a scheduler's job (Slurm step, Kubernetes indexed Job/JobSet; see
    :mod:`aios.environments.base`), default nnodes, node rank, master address/port from it. Explicit
    flags and config win; an explicit nnodes/node rank that contradicts the scheduler is a
    one-line error. When the scheduler started one process per rank (``srun
    --ntasks-per-node=N``), this process runs the script directly as that rank."""
    info = detect(None, get_registry())
    if info.name in ("local", "torchelastic"):
        return

    cfg = resolve(config_file, overrides, {k: v for k, v in flags.items() if v is not None})
    per_rank = info.rank is not None and info.world_size is not None
    want: dict[str, Any] = {
        "nnodes": 1 if per_rank else info.nnodes,
        "node_rank": 0 if per_rank else info.node_rank,
        "master_addr": info.master_addr,
    }
    if info.master_port is not None:
        want["master_port"] = info.master_port
    if per_rank:
        want["nprocs"] = 1
    for key, value in want.items():
        if key in cfg.model_fields_set:
            if key in ("nnodes", "node_rank", "nprocs") and getattr(cfg, key) != value:
                raise LaunchError(
                    f"{key}={getattr(cfg, key)} contradicts the {info.name} job ({key} {value} there)",
                    f"drop {key} from the flags/config, or change the {info.name} job's size",
                )
            continue
        flags[key] = value
    if per_rank:
        os.environ.update(
            {
                "RANK": str(info.rank),
                "WORLD_SIZE": str(info.world_size),
                "LOCAL_RANK": str(info.local_rank or 0),
                "LOCAL_WORLD_SIZE": str(info.local_world_size or 1),
                "GROUP_RANK": str(info.node_rank),
                "MASTER_ADDR": str(
                    cfg.master_addr if "master_addr" in cfg.model_fields_set else info.master_addr
                ),
                "MASTER_PORT": str(
                    cfg.master_port
                    if "master_port" in cfg.model_fields_set or info.master_port is None
                    else info.master_port
                ),
            }
        )
    elif info.nnodes > 1 and "rdzv_backend" not in cfg.launch.model_fields_set:
        # the scheduler fixed the node ranks: keep them (c10d would assign its own)
        flags["launch"] = {**(flags.get("launch") or {}), "rdzv_backend": "static"}


def int_or_str(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v
