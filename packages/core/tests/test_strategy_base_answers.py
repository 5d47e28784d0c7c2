"""The :class:`aios.strategies.base.Strategy` base answers what the runtime asks of any strategy
(issue 33): the data-parallel rank and size (``rt.dp_rank``/``rt.dp_size`` come from the
strategy's ``data_rank``/``data_world``, whatever its class) and whether the plain optimizer
step applies (``Strategy.plain_step``); the runtime asks no ``isinstance`` of a strategy class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from aios.config.schema import resolve  # noqa: E402
from aios.plugins.registry import get_registry  # noqa: E402
from aios.runtime import Runtime  # noqa: E402
from aios.strategies.base import Strategy  # noqa: E402
from aios.strategies.ddp import DDPStrategy  # noqa: E402
from aios.strategies.precision import Precision  # noqa: E402


class ModelParallel(Strategy):
    """A non-DDP strategy with a model-parallel dimension: ranks 2 and 3 of 4 read batch 1."""

    name = "mp-test"

    def setup_environment(self) -> None:
        self.rank, self.world_size, self.device = 3, 4, torch.device("cpu")

    @property
    def data_rank(self) -> int:
        return self.rank // 2

    @property
    def data_world(self) -> int:
        return self.world_size // 2

    def setup_module(self, module: Any, precision: Precision) -> Any:
        return module

    def optimizer_step(self, optimizer: Any, precision: Precision) -> bool:
        return precision.step(optimizer)


class PlainButNotDDP(ModelParallel):
    @property
    def plain_step(self) -> bool:
        return True


class OwnStep(DDPStrategy):
    def optimizer_step(self, optimizer: Any, precision: Precision) -> bool:
        return precision.step(optimizer)


def _runtime(strategy: Strategy, tmp_path: Path) -> Runtime:
    cfg = resolve(None, [f"logging.run_dir={tmp_path}"], {}, environ={})
    strategy.config = cfg
    strategy.setup_environment()
    return Runtime(cfg, "cpu", strategy, Precision("cpu"), registry=get_registry())


def test_dp_rank_and_size_come_from_any_strategy(tmp_path: Path) -> None:
    rt = _runtime(ModelParallel(resolve(None, [], {}, environ={})), tmp_path)
    assert (rt.rank, rt.world_size) == (3, 4)
    assert (rt.dp_rank, rt.dp_size) == (1, 2)


def test_the_plain_step_is_the_strategys_answer(tmp_path: Path) -> None:
    cfg = resolve(None, [], {}, environ={})
    assert DDPStrategy(cfg).plain_step and not OwnStep(cfg).plain_step
    assert not ModelParallel(cfg).plain_step and PlainButNotDDP(cfg).plain_step
    assert _runtime(PlainButNotDDP(cfg), tmp_path)._direct_step
    assert not _runtime(OwnStep(cfg), tmp_path / "b")._direct_step


def test_the_runtime_asks_no_strategy_class() -> None:
    import aios.runtime as runtime_mod

    src = Path(runtime_mod.__file__).read_text()
    assert "DDPStrategy" not in src
