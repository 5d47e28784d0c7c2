"""Installed-package detection: the PyPI placeholders (recorded metadata of the real 2022 wheels),
the two runtimes, version consistency; and what the probe, strategy, doctor and env say."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aios.errors import BackendUnavailable, ConfigError
from aios_backend_neuron import packages
from aios_backend_neuron.components import probe
from aios_backend_neuron.packages import INSTALL_LINE, detect, placeholder_message
from aios_backend_neuron.plugin import aios_env_info
from aios_backend_neuron.strategy import active_runtime, make_strategy


def test_install_line_names_the_neuron_index():
    assert INSTALL_LINE == (
        "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com "
        "torch-neuronx neuronx-cc neuronx-distributed"
    )


def test_nothing_installed_here():
    sw = detect()
    assert not sw.torch_neuronx.installed and sw.runtime() is None and sw.placeholders == []
    assert sw.runtime_label() == "none"


def test_placeholders_detected_from_metadata(neuron_site):
    neuron_site("placeholders")
    sw = detect()
    assert [(d.name, d.version) for d in sw.placeholders] == [
        ("torch-neuronx", "1.0"),
        ("neuronx-cc", "1.0.post1"),
        ("neuronx-distributed", "0.1"),
    ]
    assert sw.runtime() is None
    msg, fix = placeholder_message(sw)
    assert msg == (
        "torch-neuronx 1.0, neuronx-cc 1.0.post1, neuronx-distributed 0.1 from PyPI are placeholders "
        '("WRONG PACKAGE"), not the AWS Neuron SDK'
    )
    assert (
        fix
        == f"run: pip uninstall -y torch-neuronx neuronx-cc neuronx-distributed && {INSTALL_LINE}"
    )


def test_placeholder_detected_without_the_marker_text(tmp_path, monkeypatch):
    # a placeholder whose description was stripped: still recognised by name+version and files
    site = tmp_path / "site"
    d = site / "torch_neuronx-1.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 1.0\n\n")
    (d / "RECORD").write_text("torch_neuronx/__init__.py,sha256=x,119\n")
    monkeypatch.setenv(packages.PATH_ENV, str(site))
    assert detect().torch_neuronx.placeholder


def test_placeholder_probe_strategy_and_doctor(neuron_site, fake_neuron_ls, config):
    neuron_site("placeholders")
    fake_neuron_ls("trn1.2xlarge")
    avail = probe()
    assert not avail.available
    assert avail.reason.startswith(
        "torch-neuronx 1.0, neuronx-cc 1.0.post1, neuronx-distributed 0.1 from PyPI are placeholders"
    )
    assert INSTALL_LINE in avail.reason
    with pytest.raises(BackendUnavailable) as e:
        make_strategy(config())
    assert "placeholders" in str(e.value) and INSTALL_LINE in str(e.value)
    from aios_backend_neuron.doctor import checks

    fails = {c.name: c for c in checks(config()) if c.status == "fail"}
    assert "Neuron packages from the Neuron index" in fails
    assert INSTALL_LINE in fails["Neuron packages from the Neuron index"].fix


def test_xla_runtime_release(neuron_site):
    neuron_site("xla")
    sw = detect()
    assert sw.torch_neuronx.real and sw.runtime() == "xla"
    assert sw.runtime_label().startswith("xla (torch-neuronx 2.9.0.2.11.19912 on torch_xla")
    assert "PJRT_DEVICE=NEURON" in sw.runtime_label()


def test_native_runtime_release(neuron_site):
    neuron_site("native")
    sw = detect()
    assert sw.runtime() == "native"
    assert (
        sw.runtime_label()
        == "native (TorchNeuron 2.14.3.0, device neuron, process group backend neuron)"
    )


def test_version_mismatch_reported(neuron_site):
    neuron_site("xla", torch_neuronx="2.5.1.2.4.0")
    sw = detect()
    problems = sw.version_problems()
    assert problems and problems[0].startswith(
        "torch-neuronx 2.5.1.2.4.0 is built for torch 2.5, but torch "
    )


def test_runtime_config_override_conflicts(neuron_site, config):
    from aios.types import LaunchRequest
    from aios_backend_neuron.launch import build_plan

    neuron_site("xla")
    assert active_runtime(config("neuron.runtime=native")) == "native"
    # planning for this machine with the wrong runtime forced is an error naming both
    with pytest.raises(
        ConfigError,
        match="neuron.runtime=native but the installed torch-neuronx 2.9.0.2.11.19912 is the xla runtime",
    ):
        from aios_backend_neuron.launch import resolve_runtime
        from aios_backend_neuron.settings import NeuronSettings

        resolve_runtime(NeuronSettings(runtime="native"), detect(), None, local=True)
    # off-instance planning is not constrained by what is installed here
    plan = build_plan(
        config("neuron.instance_type=trn2.48xlarge", "neuron.runtime=native"), LaunchRequest("t.py")
    )
    assert "PJRT_DEVICE" not in plan.hosts[0].env


def test_native_with_tp_is_a_clear_error(neuron_site, config):
    neuron_site("native")
    with pytest.raises(
        ConfigError, match="neuronx-distributed, which runs on the XLA-based torch-neuronx"
    ):
        make_strategy(config("neuron.tp_degree=2"))


def test_tp_without_nxd_installed(neuron_site, config):
    neuron_site("xla", neuronx_distributed=None)
    with pytest.raises(
        BackendUnavailable, match="need neuronx-distributed, which is not installed"
    ):
        make_strategy(config("neuron.tp_degree=2"))


def test_strategy_without_torch_neuronx(config):
    with pytest.raises(BackendUnavailable, match="torch-neuronx is not installed"):
        make_strategy(config())


def test_env_info_says_which_runtime(neuron_site):
    neuron_site("native")
    info = aios_env_info()
    assert info["neuron.runtime"].startswith("native (TorchNeuron 2.14.3.0")
    assert info["torch-neuronx"] == "2.14.3.0"
    assert info["neuronx-distributed"] == "not installed"


def test_aios_env_cli_with_placeholders(neuron_site):
    neuron_site("placeholders")
    out = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "env", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["torch-neuronx"] == "1.0 (PyPI placeholder!)"
    assert info["neuron.runtime"] == "none"


def test_probe_without_devices(no_neuron_ls):
    avail = probe()
    assert not avail.available and avail.reason.startswith(
        "no Neuron devices here (/dev/neuron* absent"
    )


def test_probe_available_for_planning_only(no_neuron_ls, neuron_site, config, monkeypatch):
    neuron_site("placeholders")  # what is installed here does not matter for a remote plan
    cfg = config("neuron.instance_type=trn2.48xlarge")
    avail = probe(cfg)
    assert (
        avail.available
        and avail.reason == "no Neuron devices on this machine; planning for trn2.48xlarge"
    )
    assert (
        not probe().available
    )  # nothing is remembered from an earlier resolve: only the config given counts
    from aios.plugins.registry import get_registry

    reg = (
        get_registry()
    )  # the registry hands the resolved config to the probe (aios-run, aios.init)
    assert reg.select("neuron", config=cfg).name == "neuron"
    with pytest.raises(BackendUnavailable, match="are placeholders"):
        reg.require(
            "neuron"
        )  # without the config nothing is planned: what is installed here counts
    monkeypatch.setenv(
        "AIOS_NEURON__INSTANCE_TYPE", "trn1.32xlarge"
    )  # no config (aios devices): the env layer
    assert probe().reason.endswith("planning for trn1.32xlarge")
    monkeypatch.delenv("AIOS_NEURON__INSTANCE_TYPE")
    assert not probe().available


def test_probe_devices_but_no_torch_neuronx(fake_neuron_ls):
    fake_neuron_ls("trn1.32xlarge")
    avail = probe()
    assert not avail.available
    assert (
        avail.reason
        == "torch-neuronx is not installed (it comes from the AWS Neuron pip index, not PyPI)"
    )


def test_probe_available(fake_neuron_ls, neuron_site):
    fake_neuron_ls("trn2.48xlarge")
    neuron_site("native")
    assert probe().available


def test_requested_backend_unavailable_is_an_error(no_neuron_ls):
    from aios.plugins.registry import Registry

    reg = Registry()
    with pytest.raises(BackendUnavailable) as e:
        reg.require("neuron")
    assert str(e.value).startswith("backend 'neuron' is not available here: no Neuron devices here")
    assert "pip.repos.neuron.amazonaws.com" in str(e.value)
