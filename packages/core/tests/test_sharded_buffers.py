"""Buffers under the sharded strategies follow DDP's rule: rank 0's are the model's. BatchNorm
with different data on each of 2 ranks (real aios-run, gloo): after training every rank has rank
0's running statistics, the checkpoint keeps them, and after a resume every rank has them (before
the fix each rank kept its own and the checkpoint kept rank 1's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "bn_buffers.py"


def _run(tmp: Path, port: int, strategy: str, phase: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        "2",
        "--master-port",
        str(port),
        f"strategy={strategy}",
        f"checkpoint.dir={tmp / 'ckpt'}",
        str(SCRIPT),
        str(tmp),
        phase,
        "3",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("strategy", ["fsdp", "hsdp"])
def test_buffers_are_rank0s_after_training_save_and_resume(
    tmp_path: Path, free_port, strategy: str
) -> None:
    _run(tmp_path, free_port(), strategy, "train")
    trained = [torch.load(tmp_path / f"train-rank{r}.pt") for r in range(2)]
    # the ranks saw different data, so their own statistics would differ widely
    assert trained[0]["running_mean"].abs().max() > 0
    for k in trained[0]:
        assert torch.equal(trained[1][k], trained[0][k]), f"{k}: rank 1 kept its own"
    _run(tmp_path, free_port(), strategy, "resumed")
    for r in range(2):
        resumed = torch.load(tmp_path / f"resumed-rank{r}.pt")
        for k in trained[0]:
            assert torch.equal(resumed[k], trained[0][k]), f"rank {r} {k} is not rank 0's"
