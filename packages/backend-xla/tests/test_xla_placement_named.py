"""Under ``aios-run --backend xla`` (XLA:CPU) a script that leaves its model and inputs on the
host CPU trains there while the XLA device idles: the run names it in one line, with the
``file:line`` of the script's ``rt.backward``, within its first step (issue 34 item 4)."""

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


def test_a_model_left_on_the_host_is_named_within_the_first_step(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("aios-run")
    if not exe.exists():
        pytest.fail(f"needs the aios-run console script next to {sys.executable}")
    (tmp_path / "train.py").write_text(SCRIPT)
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
    named = [ln for ln in out.splitlines() if "the loss was computed on cpu" in ln]
    assert len(named) == 1, out[-3000:]
    assert "train.py:8: the loss was computed on cpu, but this rank's device is xla:0" in named[0]
    assert "parameter 'weight' is on cpu" not in named[0]  # the model was never set up
