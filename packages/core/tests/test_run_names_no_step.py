"""A run that exits 0 without a single training step says so in one line (issue 34 item 4):
a script that gates itself out after aios.init ("Unable to locate sufficient 4 gpus") trained
nothing; a script that trained is not told so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GATED = """\
import sys
import aios, torch

rt = aios.init()
if torch.cuda.device_count() < 4 and sys.argv[1] == "gate":
    print("Unable to locate sufficient 4 gpus", flush=True)
    sys.exit(0)
model = rt.setup(torch.nn.Linear(2, 1))
rt.backward(model(torch.ones(1, 2)).sum())
"""

SAID = "without a single training step"


def _run(tmp_path: Path, arg: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(GATED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"), AIOS_LOGGING__TENSORBOARD="false")
    return subprocess.run(
        [sys.executable, "train.py", arg],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_that_gates_itself_out_says_it_trained_nothing(tmp_path: Path) -> None:
    p = _run(tmp_path, "gate")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(SAID) == 1, p.stderr


def test_a_run_that_trained_is_not_told_so(tmp_path: Path) -> None:
    p = _run(tmp_path, "train")
    assert p.returncode == 0, p.stderr
    assert SAID not in p.stderr
