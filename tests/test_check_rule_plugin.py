"""A plugin outside the aios tree (tests/plugins/check-rule: one file), installed with pip,
adds an `aios check` rule through `aios_check_rules`: `aios check` run as a command reports it
beside core's findings, and the rule passes the rule contract kit."""

from __future__ import annotations

import json

import pytest
from aios.testing.check_rule_contract import prove


@pytest.fixture(scope="module")
def rule_site(install_plugin, root):
    target = install_plugin(root / "tests" / "plugins" / "check-rule")
    assert list(target.glob("aios_check_no_cuda_graphs-0.1.0.dist-info"))
    return target


def test_aios_check_reports_the_plugin_rule(aios_cli, rule_site, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\ng = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    y = model(x)\n"
    )
    r = aios_cli("check", str(script), pythonpath=[rule_site])
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    ours = [ln for ln in lines if " XCG001 " in ln]
    assert len(ours) == 1 and ours[0].startswith(f"{script}:3:6 XCG001 "), r.stdout
    assert 'mode="reduce-overhead"' in ours[0] and "breaks on cpu, xla, tpu, neuron" in ours[0]
    assert any(" AIOS109 " in ln for ln in lines)  # core's rules still run, first
    doc = json.loads(aios_cli("check", "--json", str(script), pythonpath=[rule_site]).stdout)
    assert {"path": str(script), "line": 3, "code": "XCG001", "level": "error"}.items() <= next(
        f for f in doc["findings"] if f["code"] == "XCG001"
    ).items()
    # without the plugin: no such finding
    assert " XCG001 " not in aios_cli("check", str(script)).stdout


def test_the_plugin_rule_passes_the_contract_kit(rule_site, monkeypatch):
    monkeypatch.syspath_prepend(str(rule_site))
    from aios_check_no_cuda_graphs import CudaGraphs

    prove(CudaGraphs)
