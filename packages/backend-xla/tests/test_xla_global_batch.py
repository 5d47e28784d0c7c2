"""The core README's batch arithmetic (``global_batch`` / ``micro_batch`` -> ``grad_accum``) on
the path it exists for: ``aios-run --backend xla`` on the real torch_xla (XLA:CPU), a user's
script launched through the console script as printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = """
import json
import aios, torch

rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(ds, batch_size=rt.config.micro_batch, shuffle=True)
model, opt, loader = rt.setup(model, opt, loader)
for x, y in loader:
    rt.backward(torch.nn.functional.mse_loss(model(x), y))
    rt.step(opt)
print("RESULT " + json.dumps({
    "grad_accum": rt.config.grad_accum,
    "data_world": rt.strategy.data_world,
    "device": str(rt.device),
    "steps": rt.global_step,
}), flush=True)
"""


def _aios_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("aios-run")
    if not exe.exists():
        pytest.fail(f"needs the aios-run console script next to {sys.executable}")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "XLA_", "TPU_"))}
    env.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", AIOS_LOGGING__TENSORBOARD="false")
    return subprocess.run(
        [str(exe), "--backend", "xla", "xla.allow_cpu=true", *args, "train.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


def test_global_and_micro_batch_derive_grad_accum_on_xla_cpu(tmp_path):
    p = _aios_run(tmp_path, "global_batch=16", "micro_batch=8")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line.split(" ", 1)[1])
    # one XLA:CPU process: 16 / (8 x 1 data rank) = 2 micro-batches per optimizer step
    assert out["device"].startswith("xla:") and out["data_world"] == 1
    assert out["grad_accum"] == 2
    # 64 samples in micro-batches of 8 = 8 micro-batches, 2 per step: 4 optimizer steps
    assert out["steps"] == 4


def test_a_global_batch_that_does_not_divide_is_one_line(tmp_path):
    p = _aios_run(tmp_path, "global_batch=12", "micro_batch=8")
    assert p.returncode != 0
    assert "global_batch=12 is not a multiple of micro_batch=8 x 1 data-parallel ranks" in p.stderr
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
