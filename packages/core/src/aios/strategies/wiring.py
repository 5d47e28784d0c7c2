"""The parts a runtime runs on, made from the plugin registry it is handed: the strategy and
precision of the selected backend (:func:`build`), the strategy a script's own parallelized
model asks for (:func:`adopt`), the preemption watchers of the plugins, ``grad_accum`` derived
from ``global_batch`` and ``micro_batch`` (:func:`derive_grad_accum`), and the seed the script
gave torch before :func:`aios.init` (:func:`script_seed`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aios.errors import ConfigError
from aios.strategies.base import Strategy
from aios.strategies.precision import Precision

if TYPE_CHECKING:
    from aios.plugins.registry import Registry
    from aios.types import BackendSpec, StrategySpec

#: the seed of torch's default CPU generator in a process nobody seeded (older torch; newer
#: torch draws a 64-bit seed from the OS at start)
_TORCH_DEFAULT_SEED = 67280421310721


def script_seed() -> int | None:
    """The seed the script gave torch before :func:`aios.init` (``torch.manual_seed(n)``, as
    every training script's ``--seed``), if any. An unseeded process has torch's fixed default
    seed or a 64-bit one drawn from the OS; one below 2**32 was set by the script (the chance
    that the OS drew it is 1 in 2**32)."""
    import torch

    seed = int(torch.initial_seed())
    return None if seed == _TORCH_DEFAULT_SEED or seed >= 2**32 else seed


def from_rank0(strategy: Any, message: str, fix: str) -> ConfigError:
    """A config error every rank finds alike: rank 0 prints it, the others stop quietly."""
    err = ConfigError(message, fix)
    if int(getattr(strategy, "rank", 0) or 0) != 0:
        err.quiet = True  # type: ignore[attr-defined]  # read by the excepthook
    return err


def derive_grad_accum(cfg: Any, strategy: Strategy) -> None:
    """``grad_accum`` from ``global_batch`` and ``micro_batch`` once the number of data-parallel
    ranks is known: ``global_batch / (micro_batch x data ranks)``, exact or a one-line error
    (raised in :func:`aios.init`, before the script builds its model; every rank finds the same,
    so rank 0 says it and the others stop quietly). A run resumed at another shape keeps its
    global batch this way: ``grad_accum`` follows the new data-parallel size."""
    g, m = cfg.global_batch, cfg.micro_batch
    if g is None and m is None:
        return
    if g is None or m is None:
        raise from_rank0(
            strategy,
            f"{'micro_batch' if g is None else 'global_batch'} is set without "
            f"{'global_batch' if g is None else 'micro_batch'}",
            "set both (grad_accum is derived from them), or neither and set grad_accum",
        )
    ranks = int(strategy.data_world)
    per_step = m * ranks
    if g % per_step:
        raise from_rank0(
            strategy,
            f"global_batch={g} is not a multiple of micro_batch={m} x {ranks} data-parallel "
            f"ranks = {per_step}",
            f"make global_batch a multiple of {per_step}, or change micro_batch or the process count",
        )
    accum = g // per_step
    if "grad_accum" in cfg.model_fields_set and cfg.grad_accum != accum:
        raise from_rank0(
            strategy,
            f"grad_accum={cfg.grad_accum} contradicts global_batch={g} / (micro_batch={m} x "
            f"{ranks} ranks) = {accum}",
            "set grad_accum, or global_batch and micro_batch, not both",
        )
    cfg.grad_accum = accum


@dataclass
class Parts:
    """What :func:`build` made: the backend's spec, its strategy (environment not set up yet)
    with its spec and accelerator."""

    backend: BackendSpec
    strategy: Strategy
    strategy_spec: StrategySpec
    accelerator: Any


def build(reg: Registry, cfg: Any, requested: str) -> Parts:
    """The backend ``requested`` (``auto``: the highest-priority available) and its strategy."""
    spec = reg.select(requested, config=cfg)
    strategy, strategy_spec, accel = reg.make_strategy(cfg, spec)
    return Parts(spec, strategy, strategy_spec, accel)


def precision_for(reg: Registry, cfg: Any, parts: Parts) -> Precision:
    """The precision of the strategy's (or backend's) plugin, for the strategy's device type."""
    accel, strategy = parts.accelerator, parts.strategy
    device_type = accel.device_type if accel is not None else strategy.autocast_device_type
    return reg.make_precision(cfg, parts.backend, parts.strategy_spec, accel, device_type)


def preemption_watchers(reg: Registry, cfg: Any) -> list[Any]:
    """The watchers every plugin provides (``aios_preemption_watchers``); a plugin that fails
    to provide them is named in a warning."""
    watchers: list[Any] = []
    for plugin, result, exc in reg.call_all("aios_preemption_watchers", config=cfg):
        if exc is not None:
            warnings.warn(
                f"aios: plugin {plugin!r} failed to provide preemption watchers: {exc}",
                stacklevel=3,
            )
        elif result:
            watchers.extend(result)
    return watchers


def adopt(
    reg: Registry, cfg: Any, backend_name: str, old: Strategy, name: str
) -> tuple[Strategy, Precision]:
    """The registered strategy ``name`` with its precision, on the process group and accelerator
    of ``old`` (set up; ``old`` is torn down): what ``strategy=auto`` takes when the script
    parallelized its first model itself (:meth:`aios.strategies.base.Strategy.adopts`)."""
    backend = reg.backends[backend_name]
    spec = reg.strategy_spec(name, backend)
    new = spec.factory(cfg, old.accelerator, backend_name)
    new.setup_environment()
    accel = old.accelerator
    device_type = accel.device_type if accel is not None else new.autocast_device_type
    precision = reg.make_precision(cfg, backend, spec, accel, device_type)
    old.teardown()
    return new, precision
