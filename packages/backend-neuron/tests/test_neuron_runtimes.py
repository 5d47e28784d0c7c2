"""TorchNeuron as the default Neuron runtime on Trn2/Trn3, the XLA runtime kept for Trn1 (Neuron
<= 2.29 pinned), the version sets checked on every worker, core's native strategies over the
neuron accelerator, and the bad-input errors. Discovery through the recorded ``neuron-ls`` seam."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from aios.errors import ConfigError
from aios.plugins.versions import VersionMismatch
from aios.types import LaunchRequest
from aios_backend_neuron.launch import build_plan
from aios_backend_neuron.strategy import make_native_strategy, make_strategy


def test_trn2_plans_torchneuron_by_default(config, no_neuron_ls):
    plan = build_plan(
        config("neuron.instance_type=trn2.48xlarge"), LaunchRequest("train.py"), python="py"
    )
    env = plan.hosts[0].env
    assert "PJRT_DEVICE" not in env and plan.world_size == 64
    assert any("runtime: native (planned: TorchNeuron" in n for n in plan.notes)


def test_trn1_plans_the_xla_runtime_with_the_pin_stated(config, no_neuron_ls):
    plan = build_plan(
        config("neuron.instance_type=trn1.32xlarge"), LaunchRequest("train.py"), python="py"
    )
    assert plan.hosts[0].env["PJRT_DEVICE"] == "NEURON"
    assert any("Neuron <= 2.29 pinned" in n for n in plan.notes)


def test_discovered_trn2_through_recorded_neuron_ls_plans_native(config, fake_neuron_ls):
    fake_neuron_ls("trn2.48xlarge")
    plan = build_plan(config(), LaunchRequest("train.py"), python="py")
    assert "PJRT_DEVICE" not in plan.hosts[0].env and plan.hosts[0].nprocs == 64


def test_discovered_trn1_refuses_torchneuron(config, fake_neuron_ls):
    fake_neuron_ls("trn1.32xlarge")
    with pytest.raises(ConfigError) as ei:
        build_plan(config("neuron.runtime=native"), LaunchRequest("train.py"), python="py")
    assert ei.value.one_line() == (
        "the native TorchNeuron runtime supports Trn2 and Trn3, not trn1.32xlarge; set neuron.runtime=xla for Trn1: "
        "Trn1 trains on the XLA runtime only with Neuron <= 2.29 pinned (torch-neuronx 2.9.0.2.29.*, torch 2.9)"
    )


def _aios_run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "NEURON_"))}
    keep = [
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if p and not os.path.exists(os.path.join(p, "neuron-ls"))
    ]
    env["PATH"] = os.pathsep.join(keep)
    script = tmp_path / "train.py"
    script.write_text("")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "neuron",
            "--dry-run",
            *args,
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["neuron.instance_type=trn1.32xlarge", "neuron.runtime=native"],
            "not trn1.32xlarge; set neuron.runtime=xla",
        ),
        (
            ["neuron.instance_type=trn2.48xlarge", "--precision", "fp16-mixed"],
            "fp16-mixed is not supported on Trainium",
        ),
    ],
)
def test_bad_input_is_exit_2_one_line(tmp_path, args, needle):
    out = _aios_run(args, tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr


def test_worker_version_check_names_host_installed_and_expected(neuron_site, config, monkeypatch):
    neuron_site(
        "native", torch_neuronx="2.14.3.0"
    )  # TorchNeuron for torch 2.14, with this env's torch
    import importlib.metadata as md

    torch_version = md.version("torch")
    if torch_version.startswith("2.14."):
        pytest.skip("this environment has torch 2.14: no mismatch to show")
    import socket

    with pytest.raises(VersionMismatch) as ei:
        make_strategy(config())
    line = ei.value.one_line()
    assert line.startswith(
        f"{socket.gethostname()}: torch {torch_version} is installed, Neuron 2.33 TorchNeuron needs torch==2.14.*"
    )
    assert "expected Neuron 2.33 TorchNeuron" in line and "\n" not in line


def test_xla_runtime_fsdp_is_refused(neuron_site, config):
    neuron_site("xla")
    with pytest.raises(ConfigError, match="strategy 'fsdp' needs TorchNeuron"):
        make_native_strategy(config("neuron.runtime=xla"), "fsdp")


@pytest.mark.parametrize(
    "name,cls", [("fsdp", "FSDPStrategy"), ("tp", "TPStrategy"), ("hsdp", "HSDPStrategy")]
)
def test_native_runtime_uses_cores_native_strategies(neuron_site, config, monkeypatch, name, cls):
    neuron_site("native")
    monkeypatch.setattr(
        "aios_backend_neuron.strategy.check_versions", lambda *a, **k: None
    )  # torch 2.14 is not installed here
    from aios.strategies import fsdp

    s = make_native_strategy(config(), name)
    assert type(s) is getattr(fsdp, cls)
    acc = s.accelerator
    assert (
        acc.name,
        acc.device_type,
        acc.dist_backend,
        acc.compile_backend,
        acc.autocast_dtype,
        acc.supports_fp16,
    ) == ("neuron", "neuron", "neuron", "neuron", "bfloat16", False)


def test_registry_offers_native_strategies_and_the_neuron_accelerator():
    from aios.plugins.registry import get_registry, reset_registry

    reset_registry()
    reg = get_registry()
    assert "neuron" in reg.accelerators
    assert {"ddp", "nxd", "fsdp", "tp", "hsdp"} <= set(reg.strategies_for(reg.backends["neuron"]))


def test_doctor_states_the_trn1_pin_and_version_set(neuron_site, config):
    from aios_backend_neuron.doctor import checks

    neuron_site("xla", torch_neuronx="2.9.0.2.29.4000")
    out = {c.name: c for c in checks(config())}
    assert "Neuron <= 2.29 pinned" in out["XLA runtime (Trn1)"].message
    vs = out["version set"]
    assert vs.status in ("pass", "fail")
    if vs.status == "fail":  # torch/torch-xla of this environment are not 2.9
        assert "Neuron 2.29 torch-neuronx on XLA" in vs.message and "pip install" in vs.fix
