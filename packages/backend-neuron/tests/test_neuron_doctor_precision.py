"""``aios doctor --backend neuron``, precision policies, the ``neuron`` config section, and the
plugin's import cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from aios.check import rules_from
from aios.cli.main import cli
from aios.errors import ConfigError
from aios.plugins.registry import get_registry
from aios.strategies.precision import MixedPrecision, Precision, TruePrecision
from aios.testing.check_rule_contract import prove
from aios_backend_neuron.check_rules import NEURON_RULES
from aios_backend_neuron.components import backend_precision as _precision
from aios_backend_neuron.doctor import checks
from aios_backend_neuron.launch import script_notes
from click.testing import CliRunner


def _by_name(cs):
    return {c.name: c for c in cs}


def test_doctor_on_a_trn2_with_xla_release(fake_neuron_ls, neuron_site, config, monkeypatch):
    fake_neuron_ls("trn2.48xlarge")
    neuron_site("xla")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-7")
    cs = _by_name(checks(config()))
    assert cs["torch-neuronx"].status == "pass"
    assert cs["runtime"].message.startswith("xla (torch-neuronx 2.9.0.2.11.19912")
    assert cs["NeuronCores visible"].status == "pass"
    assert (
        cs["NeuronCores visible"].message
        == "8 logical cores (0-7) on 16 devices, LNC=2, trn2.48xlarge"
    )
    # the release is built for torch 2.9: consistent in the torch_xla env (torch 2.9), not in main (2.13)
    from importlib.metadata import version

    torch_29 = version("torch").startswith("2.9.")
    assert cs["versions consistent"].status == ("pass" if torch_29 else "fail")
    if not torch_29:
        assert cs["versions consistent"].message.startswith(
            "torch-neuronx 2.9.0.2.11.19912 is built for torch 2.9, but torch "
        )
    assert (
        cs["neuronx-cc compiler"].status == "fail"
    )  # metadata says installed, but no neuronx-cc command/module
    assert cs["neuronx-distributed"].status == "pass"


def test_doctor_flags_bad_settings(fake_neuron_ls, config, monkeypatch):
    fake_neuron_ls("trn1.32xlarge")
    monkeypatch.setenv("XLA_USE_BF16", "1")
    cs = checks(config("neuron.tp_degree=3", "precision=fp16-mixed"))
    fails = {c.name: c for c in cs if c.status == "fail"}
    assert (
        fails["removed bf16 switches"].message == "XLA_USE_BF16 is set (removed from torch-neuronx)"
    )
    assert fails["precision"].fix == "use precision=bf16-mixed or bf16-true"
    assert (
        fails["parallel degrees"].message
        == "neuron.tp_degree=3 does not divide the 32 NeuronCores per node"
    )
    assert (
        "neuronx-distributed is not installed but neuron.tp_degree/pp_degree/zero1 need it"
        in fails["neuronx-distributed"].message
    )


def test_doctor_without_devices(no_neuron_ls, config):
    cs = _by_name(checks(config()))
    assert (
        cs["NeuronCores visible"].status == "fail"
        and "neuron-ls not found" in cs["NeuronCores visible"].message
    )
    assert cs["torch-neuronx"].fix.startswith(
        "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com"
    )


def test_plain_doctor_skips_quietly_off_trainium(no_neuron_ls):
    (c,) = checks(None, explicit=False)
    assert c.status == "pass" and "skipped" in c.message


def test_doctor_cli_exit_and_lines(fake_neuron_ls, neuron_site):
    fake_neuron_ls("trn1.2xlarge")
    neuron_site("placeholders")
    out = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "doctor", "--backend", "neuron", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    rows = [r for r in json.loads(out.stdout) if r["backend"] == "neuron"]
    names = {r["name"]: r for r in rows}
    assert names["Neuron packages from the Neuron index"]["status"] == "fail"
    assert names["NeuronCores visible"]["status"] == "pass"


# ------------------------------------------------------------------------------ precision


def test_precision_policies(config):
    assert type(_precision("fp32", config(), None)) is Precision
    mixed = _precision("bf16-mixed", config(), None)
    assert (
        isinstance(mixed, MixedPrecision)
        and mixed.dtype_name == "bfloat16"
        and mixed.device_type == "xla"
    )
    assert isinstance(_precision("bf16-true", config(), None), TruePrecision)
    native = _precision("bf16-mixed", config("neuron.runtime=native"), None)
    assert native.device_type == "neuron"


def test_fp16_precision_refused(config):
    with pytest.raises(ConfigError) as e:
        _precision("fp16-mixed", config(), None)
    assert str(e.value).startswith(
        "precision fp16-mixed is not supported on Trainium (backend neuron); use precision=bf16-mixed"
    )


def test_removed_bf16_switch_refused(config, monkeypatch):
    monkeypatch.setenv("XLA_DOWNCAST_BF16", "1")
    with pytest.raises(ConfigError, match="XLA_DOWNCAST_BF16 is set"):
        _precision("bf16-mixed", config(), None)


# ------------------------------------------------------------------------------ config section


def test_config_section_from_every_layer(config, tmp_path):
    from aios.config.schema import resolve

    cfg = config(
        "neuron.tp_degree=8",
        "neuron.visible_cores='0-3,8'",
        "neuron.cc_flags=[--retry_failed_compilation]",
    )
    assert cfg.neuron.tp_degree == 8 and cfg.neuron.visible_cores == "0-3,8"
    assert cfg.neuron.cc_flags == ["--retry_failed_compilation"]
    cfg = resolve(
        environ={"AIOS_NEURON__PP_DEGREE": "2", "AIOS_NEURON__INSTANCE_TYPE": "TRN2.48xlarge"},
        check_backend=False,
    )
    assert cfg.neuron.pp_degree == 2 and cfg.neuron.instance_type == "trn2.48xlarge"
    f = tmp_path / "c.yaml"
    f.write_text(
        "neuron:\n  stochastic_rounding: true\n  precompile: true\n  compile_cache: s3://b/cache\n"
    )
    cfg = resolve(str(f), environ={}, check_backend=False)
    assert cfg.neuron.stochastic_rounding is True and cfg.neuron.compile_cache == "s3://b/cache"


@pytest.mark.parametrize(
    "override, message",
    [
        ("neuron.tp_degree=0", "invalid value 0 for 'neuron.tp_degree'"),
        ("neuron.visible_cores=3-1", "invalid value '3-1' for 'neuron.visible_cores'"),
        ("neuron.logical_nc_config=4", "invalid value 4 for 'neuron.logical_nc_config'"),
        (
            "neuron.runtime=cuda",
            "invalid value 'cuda' for 'neuron.runtime' (from override); choose one of: auto, xla, native",
        ),
        ("neuron.tp=2", "unknown config key 'neuron.tp'"),
        ("neuron.env={XLA_USE_BF16: '1'}", "XLA_USE_BF16 was removed from torch-neuronx"),
        ("neuron.env={HOME: /x}", "HOME is not a NEURON_/FI_/CCOM_/XLA_/MALLOC_ variable"),
    ],
)
def test_config_errors_are_one_line(config, override, message):
    with pytest.raises(ConfigError) as e:
        config(override)
    text = str(e.value)
    assert message in text and "\n" not in text


# ------------------------------------------------------------------------------ unsupported ops


def _neuron_findings(src: str, runtime: str = "xla") -> list[tuple[int, str]]:
    path = Path(tempfile.mkdtemp()) / "train.py"
    path.write_text(src)
    return [
        (int(n.split(" line ", 1)[1].split(":", 1)[0]), n.split(": ", 1)[1].split(" ", 1)[0])
        for n in script_notes(str(path), runtime)
    ]


def test_scan_flags_known_unsupported_things():
    src = (
        "import torch, bitsandbytes\n"
        "x = torch.ones(2, dtype=torch.float64)\n"
        "torch.cuda.synchronize()\n"
        "import os; os.environ['XLA_USE_BF16'] = '1'\n"
        "y = x.double()\n"
        "z = torch.view_as_complex(x)\n"
    )
    assert _neuron_findings(src) == [
        (1, "AIOS501"),  # bitsandbytes (core's rule)
        (2, "AIOS421"),  # float64 (this package's)
        (3, "AIOS104"),
        (4, "AIOS412"),
        (5, "AIOS421"),
        (6, "AIOS422"),
    ]
    assert _neuron_findings("m = torch.compile(m)\n", runtime="native") == []
    assert _neuron_findings("import torch\nm = torch.compile(m)\n") == [(2, "AIOS423")]
    (bad,) = script_notes(str(Path(tempfile.mkdtemp()) / "missing.py"), "xla") or ["none"]
    assert "cannot read" in bad


def test_scan_names_one_cause_once_leaves_harmless_cuda_calls_and_sees_env_writes():
    src = (
        "import os, torch\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "if torch.cuda.is_available():\n"
        "    torch.cuda.empty_cache()\n"
        "with torch.cuda.amp.autocast():\n"
        "    pass\n"
        "os.environ['RANK'] = str(comm.rank)\n"
        "os.environ['OMP_NUM_THREADS'] = '1'\n"
    )
    assert _neuron_findings(src) == [(5, "AIOS301"), (7, "AIOS210")]


@pytest.mark.parametrize("rule", NEURON_RULES, ids=lambda r: r.__name__)
def test_neuron_rules_pass_the_rule_contract(rule):
    prove(rule)


def test_aios_check_names_neuron_rules_through_the_hook(tmp_path):
    assert set(NEURON_RULES) <= set(rules_from(get_registry()))
    script = tmp_path / "t.py"
    script.write_text("import torch\nx = torch.zeros(2, dtype=torch.float64)\n")
    r = CliRunner().invoke(cli, ["check", "--backend", "neuron", str(script)])
    assert r.exit_code == 0 and f"{script}:2:" in r.stdout and "AIOS421" in r.stdout, r.output
    assert "(silently differs on neuron)" in r.stdout  # a warning: exit 0
    r = CliRunner().invoke(cli, ["check", "--backend", "cuda", str(script)])
    assert r.exit_code == 0 and r.stdout == "", r.output


# ------------------------------------------------------------------------------ plugin import cost


def test_plugin_imports_no_torch_and_registers():
    code = (
        "import sys\n"
        "import aios_backend_neuron.plugin\n"
        "from aios.plugins.registry import get_registry\n"
        "reg = get_registry()\n"
        "spec = reg.backends['neuron']\n"
        "assert spec.priority == 200 and spec.plugin == 'aios-backend-neuron', spec\n"
        "reg.probe('neuron')\n"
        "bad = [m for m in ('torch', 'torch_xla', 'torch_neuronx', 'neuronx_distributed', "
        "'boto3') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
