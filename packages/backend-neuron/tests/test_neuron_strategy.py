"""Strategy selection and the NxD mapping (pure python), plus hardware-only checks (``neuron``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.errors import ConfigError
from aios_backend_neuron.settings import settings_of
from aios_backend_neuron.strategy import nxd_config_kwargs, uses_nxd


def test_nxd_config_from_aios_config(config):
    cfg = config(
        "neuron.tp_degree=8",
        "neuron.pp_degree=4",
        "neuron.pp_microbatches=8",
        "neuron.zero1=true",
        "grad_clip=1.5",
        "precision=bf16-true",
    )
    assert nxd_config_kwargs(settings_of(cfg), cfg) == {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 4,
        "optimizer_config": {"zero_one_enabled": True, "grad_clipping": True, "max_grad_norm": 1.5},
        "mixed_precision_config": {
            "use_master_weights": True,
            "use_fp32_grad_acc": True,
            "use_master_weights_in_ckpt": False,
        },
        "pipeline_config": {"num_microbatches": 8},
    }


def test_nxd_config_defaults(config):
    cfg = config("neuron.tp_degree=2")
    kw = nxd_config_kwargs(settings_of(cfg), cfg)
    assert kw["optimizer_config"] == {
        "zero_one_enabled": False,
        "grad_clipping": False,
        "max_grad_norm": 1.0,
    }
    assert kw["mixed_precision_config"]["use_master_weights"] is False
    assert "pipeline_config" not in kw


def test_when_nxd_is_used(config):
    assert not uses_nxd(settings_of(config()), config())
    for o in ("neuron.tp_degree=2", "neuron.pp_degree=2", "neuron.zero1=true", "strategy=nxd"):
        assert uses_nxd(settings_of(config(o)), config(o)), o


def test_deepspeed_strategy_refused(neuron_site, config):
    from aios.plugins.registry import get_registry

    neuron_site("xla")
    reg = get_registry()
    # fsdp/tp/hsdp are registered for neuron (TorchNeuron); on the XLA runtime their factory refuses them
    for name in ("deepspeed", "spmd"):
        with pytest.raises(
            ConfigError,
            match=f"strategy '{name}' is not available on the neuron backend; strategies on neuron: "
            "auto, ddp, fsdp, hsdp, nxd, tp",
        ):
            reg.strategy_spec(name, reg.backends["neuron"])


@pytest.mark.xla
def test_xla_strategy_is_backend_xla_subclass(neuron_site, config, monkeypatch):
    """The XLA-based runtime reuses backend-xla's step semantics (subclass, not a copy)."""
    from aios_backend_neuron.strategy import make_strategy
    from aios_backend_neuron.xla_strategy import NeuronNxDStrategy, NeuronXlaStrategy
    from aios_backend_xla.strategy import XlaStrategy

    neuron_site("xla")
    s = make_strategy(config())
    assert type(s) is NeuronXlaStrategy and isinstance(s, XlaStrategy) and s.pjrt_device == "NEURON"
    assert type(make_strategy(config("neuron.tp_degree=2"))) is NeuronNxDStrategy
    monkeypatch.setenv("AIOS_TEST_NEURON_ON_XLA_CPU", "1")
    assert make_strategy(config()).pjrt_device == "CPU"


@pytest.mark.xla
def test_optimizer_built_before_setup_and_tied_weights_survive(fake_neuron_ls, tmp_path):
    """On XLA a plain module.to(device) makes new Parameters; the strategy keeps the user's
    optimizer and tied weights pointing at the device tensors (real torch_xla, XLA:CPU)."""
    fake_neuron_ls("trn1.2xlarge")
    code = r"""
import torch, aios
rt = aios.init(config={"backend": "neuron", "logging": {"progress": False, "tensorboard": False, "run_dir": RUN}})
m = torch.nn.Module(); m.emb = torch.nn.Embedding(10, 4); m.head = torch.nn.Linear(4, 10, bias=False)
m.head.weight = m.emb.weight
opt = torch.optim.SGD(m.parameters(), lr=0.5)
m, opt = rt.setup(m, opt)
assert m.head.weight is m.emb.weight, "tie broken"
assert opt.param_groups[0]["params"][0] is m.emb.weight, "optimizer holds stale params"
assert m.emb.weight.device.type == "xla"
before = m.emb.weight.detach().cpu().clone()
x = torch.arange(4, device=rt.device)
rt.backward(m.head(m.emb(x)).pow(2).mean()); rt.step(opt)
assert not torch.equal(before, m.emb.weight.detach().cpu()), "the step changed nothing"
print("ok", type(rt.strategy).__name__, rt.device)
""".replace("RUN", repr(str(tmp_path / "runs")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "NEURON_", "PJRT_"))}
    env["AIOS_TEST_NEURON_ON_XLA_CPU"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:3] == ["ok", "NeuronXlaStrategy", "xla:0"]


@pytest.mark.neuron
def test_real_trainium_devices_match_neuron_ls():
    from aios_backend_neuron.components import device_report, probe
    from aios_backend_neuron.discovery import run_neuron_ls

    res = run_neuron_ls()
    assert res.topology is not None, res.error
    assert probe().available
    rep = device_report(None)
    assert rep.available and rep.count == len(res.topology.core_ids)


@pytest.mark.neuron
def test_real_trainium_trains_the_example(tmp_path):
    exe = Path(sys.executable).with_name("aios-run")
    example = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
    out = subprocess.run(
        [
            str(exe),
            "--backend",
            "neuron",
            "--nprocs",
            "2",
            f"checkpoint.dir={tmp_path / 'ck'}",
            f"logging.run_dir={tmp_path / 'runs'}",
            "precision=bf16-mixed",
            str(example),
            "--steps",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "GPT_SAMPLE": "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gpt: done 50 steps" in out.stdout + out.stderr


def test_worker_env_matches_the_plan(config):
    """A worker started without aios-run (plain python) gets the same Neuron variables the
    launch plan would set; variables already set by the launcher win."""
    from aios.types import LaunchRequest
    from aios_backend_neuron.launch import build_plan
    from aios_backend_neuron.xla_strategy import NeuronXlaStrategy

    cfg = config(
        "neuron.instance_type=trn2.48xlarge",
        "neuron.model_type=transformer",
        "precision=bf16-true",
        "neuron.logical_nc_config=2",
        "neuron.env={NEURON_RT_LOG_LEVEL: WARN}",
    )
    env = NeuronXlaStrategy(cfg).neuron_env()
    plan_env = build_plan(cfg, LaunchRequest("t.py")).hosts[0].env
    for k, v in env.items():
        assert plan_env[k] == v, k
    assert env["NEURON_CC_FLAGS"] == "--target trn2 --model-type transformer"
    assert env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1" and env["NEURON_RT_LOG_LEVEL"] == "WARN"
    from unittest import mock

    with mock.patch.dict(os.environ, {"NEURON_CC_FLAGS": "--optlevel=1", "PJRT_DEVICE": "NEURON"}):
        NeuronXlaStrategy(cfg).prepare_env()
        assert os.environ["NEURON_CC_FLAGS"] == "--optlevel=1"  # the launcher's value wins
        assert os.environ["NEURON_COMPILE_CACHE_URL"] == "/var/tmp/neuron-compile-cache"
    assert "NEURON_COMPILE_CACHE_URL" not in os.environ


def test_wrong_pjrt_device_is_refused(config):
    from unittest import mock

    from aios_backend_neuron.xla_strategy import NeuronXlaStrategy

    with mock.patch.dict(os.environ, {"PJRT_DEVICE": "TPU"}):
        with pytest.raises(
            ConfigError, match="PJRT_DEVICE=TPU but the neuron-xla backend was set up for NEURON"
        ):
            NeuronXlaStrategy(config()).prepare_env()
