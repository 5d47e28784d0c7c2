"""Acceptance: examples/gpt.py, unchanged, trains on XLA:CPU through `aios-run --backend xla`
(with the opt-in) to the CPU backend's loss, with a fixed number of compilations."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytestmark = [pytest.mark.xla, pytest.mark.slow]

GPT = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
DONE = re.compile(r"train loss ([0-9.]+), val loss ([0-9.]+)")


def _run(tmp_path: Path, backend: str, *overrides: str) -> tuple[float, float, Path]:
    cwd = tmp_path / backend
    cwd.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "PJRT_", "XLA_", "TPU_"))
    }
    env.update(GPT_SAMPLE="0", AIOS_TEST_DMI_PRODUCT="/nonexistent")
    cmd = [
        *python("-c", "from aios.cli.run import main; main()"),
        "--backend",
        backend,
        "checkpoint.resume=false",
        "logging.progress=false",
        *overrides,
        str(GPT),
        "--steps",
        "40",
        "--eval-every",
        "10",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=1200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    m = DONE.search(p.stdout)
    assert m, p.stdout[-2000:]
    assert "RecompileWarning" not in p.stderr
    return float(m.group(1)), float(m.group(2)), cwd


@pytest.mark.skipif(not GPT.exists(), reason="examples/gpt.py is not in this checkout")
def test_gpt_example_on_xla_cpu_matches_cpu_with_fixed_compilations(tmp_path):
    cpu_train, cpu_val, _ = _run(tmp_path, "cpu")
    xla_train, xla_val, cwd = _run(tmp_path, "xla", "xla.allow_cpu=true")
    assert xla_train == pytest.approx(cpu_train, rel=2e-3)
    assert xla_val == pytest.approx(cpu_val, rel=2e-3)
    diag = json.loads(next((cwd / "runs").glob("*/diagnostics.json")).read_text())
    guard = diag["backend_metrics"]["compile_guard"]
    assert guard["recompiles_after_warmup"] == 0
    # the train step (steps 1-2), then the first logging read and evaluation (before step 11);
    # nothing compiles over the remaining 29 steps and 3 evaluations
    assert max(int(s) for s in guard["compiles_by_step"]) <= 11
    assert guard["compiles"] == sum(guard["compiles_by_step"].values())
