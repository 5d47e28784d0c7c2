"""The strategy contract kit (aios.testing.strategy_contract) run against the native strategies
on CPU over gloo."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from aios.testing.strategy_contract import StrategyContract


class TestDDPContract(StrategyContract):
    strategy = "ddp"


class TestFSDPContract(StrategyContract):
    strategy = "fsdp"
    overrides = ["fsdp.wrap=[Block]"]


class TestFSDPOptionsContract(StrategyContract):
    """FSDP2 with activation checkpointing per block and CPU offload of shards, gradients and
    optimizer state."""

    strategy = "fsdp"
    overrides = [
        "fsdp.wrap=[Block]",
        "fsdp.activation_checkpointing=true",
        "fsdp.cpu_offload=true",
        "fsdp.reshard_after_forward=false",
    ]


class TestTPContract(StrategyContract):
    """Tensor parallel over both processes: one data replica (data_world 1), each block's
    linears split column- then row-wise."""

    strategy = "tp"
    overrides = ["mesh.tp=2", "mesh.tp_plan=__main__:tp_plan"]


class TestHSDPContract(StrategyContract):
    """HSDP: two replica groups of one shard each on two processes (data_world 2)."""

    strategy = "hsdp"
    overrides = ["fsdp.wrap=[Block]", "mesh.replicate=2"]
