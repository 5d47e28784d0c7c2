"""Core's strategy contract kit (aios.testing.strategy_contract) run against the XLA strategy on
the real torch_xla (XLA:CPU): the members the runtime and the checkpointing read (data rank and
world, the batch arithmetic, the checkpoint format, a resume in a new process) and the step
semantics, exactly as for the native strategies."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from aios.testing.strategy_contract import StrategyContract

pytestmark = pytest.mark.xla


class TestXlaStrategyContract(StrategyContract):
    backend = "xla"
    strategy = "ddp"
    nprocs = 1  # XLA:CPU: one process (one CPU device)
    overrides = ["xla.allow_cpu=true"]
    env = {"AIOS_TEST_DMI_PRODUCT": "/nonexistent"}
    timeout = 900
