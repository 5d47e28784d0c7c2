"""What one attempt of a run leaves in its record (rank 0): what it runs on at the start, its
wall-clock marks for the goodput account, the metric loggers (with the run's goodput at the
end), and where its record and checkpoints went."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aios.config.redact import redact_url
from aios.runrecord import goodput
from aios.runrecord.records import RunRecord, StepTimer, launch_time, versions

if TYPE_CHECKING:
    from aios.checkpoint.manager import CheckpointManager
    from aios.plugins.registry import Registry
    from aios.strategies.base import Strategy
    from aios.strategies.precision import Precision


def write_start(
    record: RunRecord,
    config: Any,
    backend: str,
    strategy: Strategy,
    precision: Precision,
    registry: Registry | None,
) -> None:
    """The config and what this attempt runs on (backend, strategy, precision, world, device,
    versions, the devices the backend found) into the record, status ``running``."""
    record.write_config(config)
    record.diag.update(
        {
            "backend": backend,
            "strategy": type(strategy).__name__,
            "precision": precision.name,
            "world_size": int(strategy.world_size),
            "device": str(strategy.device),
            "versions": versions(),
        }
    )
    try:
        rep = registry.discover_devices(backend, config) if registry else None
        if rep is not None:
            record.diag["devices"] = rep.to_dict()
    except Exception as exc:  # noqa: BLE001
        record.diag["devices"] = {"error": str(exc)}
    record.write_diagnostics(status="running")


def marks(record: RunRecord, timer: StepTimer, step: int, ck: CheckpointManager) -> dict[str, Any]:
    """This attempt's wall-clock marks for the goodput account (:mod:`aios.runrecord.goodput`)."""
    off = time.time() - time.perf_counter()  # the step stamps are perf_counter readings
    st = timer.stamps
    timer.first_step_s  # noqa: B018 - fixes the first stamp while it is still kept
    first = timer.first
    return {
        "launched": launch_time(record.started),
        "started": record.started,
        "first_step": None if first is None else first + off,
        "last_step": st[-1] + off if st else None,
        "start_step": ck.loaded_step or 0,
        "last_step_index": step,
        "committed_step": ck.committed_step,
    }


def build_loggers(specs: Mapping[str, Any], config: Any, run_dir: str) -> list[Any]:
    """The metric loggers the plugins registered and the config enables; one that fails to
    build is named in a warning and left out (a logger never stops training)."""
    loggers: list[Any] = []
    for name, spec in specs.items():
        try:
            if spec.enabled(config):
                loggers.append(spec.factory(config, run_dir))
        except Exception as exc:  # noqa: BLE001 - a logger must never stop training
            warnings.warn(
                f"aios: logger {name!r} disabled: {type(exc).__name__}: {exc}", stacklevel=4
            )
    return loggers


def log(loggers: list[Any], values: dict[str, Any], step: int) -> None:
    """``values`` to every logger; one that fails is named in a warning."""
    for lg in loggers:
        try:
            lg.log(values, step)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"aios: logger {getattr(lg, 'name', lg)!r} failed: {exc}", stacklevel=3)


def log_goodput(run_dir: str, loggers: list[Any], step: int) -> None:
    """The run's goodput account (every attempt so far) to the metric loggers
    (TensorBoard): ``goodput/fraction``, ``goodput/productive_s``, ``badput/<cause>_s``."""
    try:
        r = goodput.account(goodput.read_attempts(run_dir))
    except Exception:  # noqa: BLE001 - an account must never fail the run's end
        return
    if r.wall_s <= 0:
        return
    values = {"goodput/fraction": r.goodput, "goodput/productive_s": r.seconds["productive"]}
    values.update({f"badput/{k}_s": v for k, v in r.badput.items()})
    for lg in loggers:
        with contextlib.suppress(Exception):
            lg.log(values, step)


def print_locations(run_dir: str, checkpoint_dir: str | None) -> None:
    """Where this run's record and checkpoints went: one line each, at the end."""
    with contextlib.suppress(Exception):
        ckpt = checkpoint_dir or "none (set checkpoint.dir to keep them)"
        print(f"aios: run record: {run_dir}", file=sys.stderr, flush=True)
        print(f"aios: checkpoints: {redact_url(ckpt)}", file=sys.stderr, flush=True)
