"""Under ``aios-run --backend xla`` (XLA:CPU) a script that leaves its model and inputs on the
host CPU trains there while the XLA device idles, and a script that casts its model to float16
computes in a type XLA's devices have no speed for (TPUs, Trainium and XLA:CPU do bfloat16): the
run names each in one line, with the ``file:line`` of the script's ``rt.backward``, within its
first step (issue 34 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = """\
import aios, torch

rt = aios.init()
model = torch.nn.Linear(4, 1)  # never handed to rt.setup: it stays on the host
opt = rt.setup(torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(2):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    rt.backward(loss)
    rt.step(opt)
print("DONE", rt.device, flush=True)
"""


HALF = """\
import aios, torch

rt = aios.init()
model = rt.setup(torch.nn.Linear(4, 1).half())  # the script's own float16
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.ones(8, 4, dtype=torch.float16, device=rt.device)).pow(2).mean()
    rt.backward(loss)
    rt.step(opt)
print("DONE", rt.device, loss.dtype, flush=True)
"""


def _run(tmp_path: Path, script: str) -> str:
    exe = Path(sys.executable).with_name("aios-run")
    if not exe.exists():
        pytest.fail(f"needs the aios-run console script next to {sys.executable}")
    (tmp_path / "train.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "XLA_", "TPU_"))}
    env.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", AIOS_LOGGING__TENSORBOARD="false")
    p = subprocess.run(
        [str(exe), "--backend", "xla", "xla.allow_cpu=true", "train.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "DONE xla:0" in out
    return out


def test_a_model_left_on_the_host_is_named_within_the_first_step(tmp_path: Path) -> None:
    out = _run(tmp_path, SCRIPT)
    named = [ln for ln in out.splitlines() if "the loss was computed on cpu" in ln]
    assert len(named) == 1, out[-3000:]
    assert "train.py:8: the loss was computed on cpu, but this rank's device is xla:0" in named[0]
    assert "parameter 'weight' is on cpu" not in named[0]  # the model was never set up


def test_a_float16_model_on_xla_is_named_within_the_first_step(tmp_path: Path) -> None:
    out = _run(tmp_path, HALF)
    assert "torch.float16" in out  # it trained as the script asked: aios changed nothing
    named = [ln for ln in out.splitlines() if "the loss is float16" in ln]
    assert len(named) == 1, out[-3000:]
    assert named[0].startswith("aios: train.py:8: the loss is float16, but the xla backend on ")
    assert "PJRT_DEVICE=CPU has no float16 speed" in named[0]
    assert "precision=bf16-mixed" in named[0]
