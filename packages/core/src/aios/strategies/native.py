"""The native strategy family's factories (``StrategySpec.factory(config, accelerator,
backend)``): the built-in plugin names them as :class:`aios.types.Lazy` targets, so loading it
imports no strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aios.strategies.ddp import DDPStrategy
from aios.strategies.fsdp import FSDPStrategy, HSDPStrategy, TPStrategy

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator


def ddp(config: AiosConfig, accelerator: Accelerator | None, backend: str) -> DDPStrategy:
    return DDPStrategy(config, accelerator)


def fsdp(config: AiosConfig, accelerator: Accelerator | None, backend: str) -> FSDPStrategy:
    return FSDPStrategy(config, accelerator)


def tp(config: AiosConfig, accelerator: Accelerator | None, backend: str) -> TPStrategy:
    return TPStrategy(config, accelerator)


def hsdp(config: AiosConfig, accelerator: Accelerator | None, backend: str) -> HSDPStrategy:
    return HSDPStrategy(config, accelerator)
