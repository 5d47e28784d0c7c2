"""A third-party plugin outside aios's packages (tests/plugins/aios-ext-demo, installed with pip)
adds a checkpoint format, a notice source and a cloud with its declared features, each in one
file, through the hooks (issue 33), and each is used by a real run or command:

* a training run hears the demo platform's reclaim notice (``aios_preemption_watchers``), writes
  its emergency checkpoint with the demo format and exits 75; a fresh run resumes it, reading
  the checkpoint with the format its marker names, found through
  ``aios_register_checkpoint_formats``;
* ``aios launch --cloud demo`` refuses an option whose feature the cloud does not declare in the
  one refusal shape, and renders a dry run with the options it declares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

TRAIN = """
import os
import time

import aios
import torch

rt = aios.init()
rt.checkpointer.format = rt.checkpointer.formats["demo-pickle"].factory()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
print("resumed at", rt.resume(), flush=True)
while rt.global_step < 4:
    rt.backward(model(torch.ones(2, 4)).sum())
    rt.step(opt)
    if rt.global_step == 1 and os.environ.get("DEMO_RECLAIM_FILE"):
        while not rt.should_stop:  # where the run stops does not depend on the machine's speed
            time.sleep(0.01)
print("done at", rt.global_step, flush=True)
"""


@pytest.fixture(scope="module")
def demo_site(install_plugin, root: Path) -> Path:
    target = install_plugin(root / "tests/plugins/aios-ext-demo")
    return target


def _env(site: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "DEMO_"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "AIOS_HOME": str(tmp_path / "aios-home"),
            "AIOS_CHECKPOINT__DIR": str(tmp_path / "ck"),
            "AIOS_LOGGING__RUN_DIR": str(tmp_path / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "COLUMNS": "200",
            **extra,
        }
    )
    return env


def test_a_run_hears_the_plugins_notice_and_resumes_with_its_format(
    demo_site: Path, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    reclaim = tmp_path / "reclaim"
    reclaim.write_text("")  # the platform announced before the run started
    first = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=_env(demo_site, tmp_path, DEMO_RECLAIM_FILE=str(reclaim)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 75, first.stdout + first.stderr
    said = first.stdout + first.stderr
    assert "aios: preemption (demo-reclaim: the demo platform reclaims this host" in said
    (ckpt,) = sorted((tmp_path / "ck").glob("ckpt-*"))
    marker = json.loads((ckpt / "aios-checkpoint.json").read_text())
    assert marker["checkpoint_format"] == "demo-pickle" and "demo-state.pt" in marker["files"]
    second = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=_env(demo_site, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    step = marker["step"]
    assert f"resumed at {step}" in second.stdout and "done at 4" in second.stdout


def test_the_plugins_cloud_refuses_what_it_does_not_declare(
    demo_site: Path, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("")
    base = [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "demo", "-a", "cpu"]
    base += ["--workdir", str(tmp_path), "--dry-run"]
    env = _env(demo_site, tmp_path)
    r = subprocess.run(
        [*base, "--spot", "train.py"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "aios: error: --spot is not supported by --cloud demo (spot capacity); drop --spot"
    ]
    r = subprocess.run(
        [*base, "--label", "team=ml", "--no-setup", "train.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo-cli create" in r.stdout and "--label=team=ml" in r.stdout
