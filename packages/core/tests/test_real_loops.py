"""Habits of real training loops, on 2 processes over gloo: one model under every strategy
when each rank seeds differently before building it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPTS = Path(__file__).parent / "scripts"


def aios_run(tmp: Path, *args: str, timeout: int = 300, env: dict[str, str] | None = None):
    from aios.testing.strategy_contract import free_port

    full = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    full.update({"AIOS_LOGGING__TENSORBOARD": "false", "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [sys.executable, "-c", "from aios.cli.run import main; main()"]
        + [f"master_port={free_port()}", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp,
        timeout=timeout,
    )


def _rank0_model_output() -> float:
    import torch

    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        return float(model(torch.linspace(-1, 1, 16).view(2, 8)).double().square().sum())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "hsdp"])
def test_per_rank_seeds_give_one_model_under_every_strategy(tmp_path, strategy):
    """nanoGPT seeds ``1337 + rank`` before building the model: every strategy must train rank
    0's model (DDP broadcasts it; the sharded strategies broadcast before sharding), never a
    patchwork of each rank's own initialisation."""
    r = aios_run(tmp_path, "--nprocs", "2", f"strategy={strategy}", str(SCRIPTS / "init_probe.py"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = [float(v) for v in re.findall(rf"probe {strategy}: ([0-9.]+)", r.stdout)]
    assert len(found) == 2, r.stdout
    want = _rank0_model_output()
    for got in found:  # tp sums partial products in another order: float32 rounding only
        assert got == pytest.approx(want, rel=1e-6), (found, want)
