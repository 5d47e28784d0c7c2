"""The DDP strategy with 2 processes over gloo, launched by aios-run: collectives, rank
sharding, the DDP wrapper (gradient averaging, attribute forwarding) and no_sync accumulation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "ddp_checks.py"


def test_runtime_ddp_two_processes(tmp_path, free_port):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {"AIOS_LOGGING__RUN_DIR": str(tmp_path / "runs"), "AIOS_LOGGING__TENSORBOARD": "false"}
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from aios.cli.run import main; main()",
            "--nprocs",
            "2",
            "--master-port",
            str(port),
            str(SCRIPT),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert (
            f"[rank{rank}]:ok identity rank={rank} local={rank} world=2 main={rank == 0} device=cpu"
            in r.stdout
        )
        for check in (
            "all_reduce",
            "all_gather",
            "objects",
            "any_rank",
            "sharding",
            "ddp",
            "no_sync",
        ):
            assert f"[rank{rank}]:ok {check}" in r.stdout, r.stdout
