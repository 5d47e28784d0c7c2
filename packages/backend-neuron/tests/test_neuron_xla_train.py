"""The example's step path under the Neuron backend, on the real torch_xla (XLA:CPU).

torch-neuronx up to the torch 2.9 line is torch_xla with the Neuron PJRT plugin, so the Neuron
step is torch_xla's step with ``PJRT_DEVICE=NEURON``. Without Trainium, ``PJRT_DEVICE=CPU``
stands in for ``NEURON`` (opt-in: ``AIOS_TEST_NEURON_ON_XLA_CPU=1``) and discovery runs against a
recorded trn1.2xlarge ``neuron-ls`` capture through the stand-in tool on ``PATH``. Everything
else is real: ``aios-run --backend neuron`` (plan, env, launch), ``aios.init`` selecting the
neuron backend, ``NeuronXlaStrategy`` (backend-xla's ``XlaStrategy`` subclassed), precision
and checkpoints. The loss must match the CPU backend's on the same script and seed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
DONE = re.compile(r"gpt: done (\d+) steps .*train loss ([0-9.]+), val loss ([0-9.]+)")
ARGS = ["--steps", "24", "--eval-every", "24", "--eval-batches", "4", "--batch-size", "16"]

pytestmark = [pytest.mark.xla, pytest.mark.slow]


def _run(
    backend: str, tmp: Path, env: dict[str, str], *overrides: str
) -> tuple[int, float, float, str]:
    exe = Path(sys.executable).with_name("aios-run")
    if not EXAMPLE.exists() or not exe.exists():
        pytest.fail(f"needs {EXAMPLE} and aios-run next to {sys.executable}")
    cmd = [
        str(exe),
        "--backend",
        backend,
        "--nprocs",
        "1",
        f"checkpoint.dir={tmp / backend / 'ckpt'}",
        f"logging.run_dir={tmp / backend / 'runs'}",
        "logging.progress=false",
        "logging.tensorboard=false",
        *overrides,
        str(EXAMPLE),
        *ARGS,
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "GPT_SAMPLE": "0"}, timeout=900, cwd=tmp
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    m = DONE.search(text)
    assert m, text[-4000:]
    return int(m.group(1)), float(m.group(2)), float(m.group(3)), text


def test_gpt_on_neuron_xla_cpu_matches_cpu(tmp_path, fake_neuron_ls):
    fake_neuron_ls("trn1.2xlarge")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "NEURON_", "PJRT_", "XLA_"))
    }
    steps_c, train_c, val_c, _ = _run("cpu", tmp_path, base)
    neuron_env = {**base, "AIOS_TEST_NEURON_ON_XLA_CPU": "1"}
    steps_n, train_n, val_n, text = _run("neuron", tmp_path, neuron_env)
    assert steps_c == steps_n == 24
    assert "1 x xla:0 (neuron, fp32)" in text
    assert abs(train_n - train_c) < 2e-3, (train_n, train_c)
    assert abs(val_n - val_c) < 2e-3, (val_n, val_c)
    # the run record says which backend and strategy trained
    diags = list((tmp_path / "neuron" / "runs").rglob("diagnostics.json"))
    assert diags, "no diagnostics.json in the neuron run directory"
    d = json.loads(diags[0].read_text())
    assert d["backend"] == "neuron" and d["strategy"] == "NeuronXlaStrategy"
    bm = d["backend_metrics"]
    assert bm["strategy"] == "neuron-xla" and bm["pjrt_device"] == "CPU"
    assert bm["neuron"]["cc_flags"] == "--target trn1"  # from the discovered trn1.2xlarge
    assert bm["neuron"]["compile_cache"] == "/var/tmp/neuron-compile-cache"


def test_gpt_bf16_mixed_on_neuron_xla_cpu_matches_xla_autocast(tmp_path, fake_neuron_ls):
    """bf16 by autocast on the xla device (never XLA_USE_BF16): the Neuron path gives the same
    curve as the XLA backend's autocast. (Against eager CPU autocast only the fp32 run above is a
    fair comparison: which ops run in bf16 differs, and 24 steps of fast descent amplify it.)"""
    fake_neuron_ls("trn1.2xlarge")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "NEURON_", "PJRT_", "XLA_"))
    }
    _, train_x, val_x, _ = _run("xla", tmp_path, base, "precision=bf16-mixed", "xla.allow_cpu=true")
    _, train_n, val_n, text = _run(
        "neuron", tmp_path, {**base, "AIOS_TEST_NEURON_ON_XLA_CPU": "1"}, "precision=bf16-mixed"
    )
    assert "(neuron, bf16-mixed)" in text
    assert val_n == pytest.approx(val_x, rel=1e-3), (val_n, val_x)
    assert train_n == pytest.approx(train_x, rel=1e-3), (train_n, train_x)
    assert max(val_n, train_n) < 3.8  # trained: an untrained model sits at ln(64) = 4.16


def test_bf16_true_plan_reaches_the_worker_env(tmp_path, fake_neuron_ls):
    """bf16 weights: the plan switches on stochastic rounding and never sets XLA_USE_BF16."""
    fake_neuron_ls("trn1.2xlarge")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "NEURON_", "PJRT_", "XLA_"))
    }
    exe = Path(sys.executable).with_name("aios-run")
    plan = subprocess.run(
        [
            str(exe),
            "--backend",
            "neuron",
            "--nprocs",
            "1",
            "--precision",
            "bf16-true",
            "--dry-run",
            "--json",
            str(EXAMPLE),
        ],
        capture_output=True,
        text=True,
        env={**base, "AIOS_TEST_NEURON_ON_XLA_CPU": "1"},
        timeout=300,
        cwd=tmp_path,
    )
    assert plan.returncode == 0, plan.stderr
    out = json.loads(plan.stdout)
    host = out["hosts"][0]
    assert host["env"]["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1"
    assert host["env"]["PJRT_DEVICE"] == "CPU" and host["env"]["NEURON_CC_FLAGS"] == "--target trn1"
    assert "XLA_USE_BF16" not in host["env"]
    assert any("XLA:CPU stands in for NeuronCores" in n for n in out["notes"])
    assert (
        out["devices"]["count"] == 2
        and out["devices"]["topology"]["instance_type"] == "trn1.2xlarge"
    )
