"""No false alarms from the run (issue 34 item 4): a plain torchrun script that joined its
process group is never called "independent copies", after a restart too (torch's elastic agent
bootstraps each new attempt's ranks on a fresh store, which ends with them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_script_that_joined_after_a_restart_is_not_called_a_copy(
    tmp_path: Path, free_port
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable,
        "-c",
        "from aios.cli.run import main; main()",
        "--nprocs",
        "2",
        "--max-restarts",
        "1",
        "--master-port",
        str(free_port()),
        str(SCRIPTS / "joins_after_restart.py"),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "restart 1/1" in out and out.count("sum 2.0") == 2, out
    assert "independent cop" not in out, out
