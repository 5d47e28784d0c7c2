"""Discovery from recorded ``neuron-ls --json-output`` captures, through the neuron-ls seam."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.errors import ConfigError
from aios_backend_neuron.components import device_report
from aios_backend_neuron.discovery import (
    NeuronLsError,
    format_core_list,
    parse_core_list,
    parse_neuron_ls,
    run_neuron_ls,
    visible_core_ids,
)

GIB = 1024**3
FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(instance: str) -> list[dict]:
    return json.loads((FIXTURES / f"neuron_ls_{instance}.json").read_text())


@pytest.mark.parametrize(
    "instance, devices, per_device, logical, physical, lnc, mem",
    [
        ("trn1.2xlarge", 1, 2, 2, 2, 1, 32 * GIB),
        ("trn1.32xlarge", 16, 2, 32, 32, 1, 32 * GIB),
        ("trn2.48xlarge", 16, 4, 64, 128, 2, 96 * GIB),
    ],
)
def test_recorded_captures_parse(instance, devices, per_device, logical, physical, lnc, mem):
    topo = parse_neuron_ls(load_fixture(instance))
    assert topo.instance_type == instance
    assert len(topo.devices) == devices
    assert topo.cores_per_device == per_device
    assert topo.logical_cores == logical
    assert topo.physical_cores == physical
    assert topo.lnc == lnc
    assert {d.memory_bytes for d in topo.devices} == {mem}
    assert topo.core_ids == list(range(logical))


def test_legacy_capture_without_instance_fields():
    # the exact shape older tools print on trn1.2xlarge: no instance_type, numa_node a string
    row = {
        "neuron_device": 0,
        "bdf": "0000:00:1e.0",
        "cpu_affinity": "0-7",
        "numa_node": "-1",
        "connected_to": None,
        "nc_count": 2,
        "memory_size": 34359738368,
        "neuroncore_ids": [0, 1],
        "neuron_processes": [],
    }
    topo = parse_neuron_ls([row])
    assert topo.instance_type is None and topo.lnc == 1
    assert topo.devices[0].numa_node == -1 and topo.devices[0].connected_to == []
    assert topo.core_ids == [0, 1]


def test_trn2_topology_links_and_numa():
    topo = parse_neuron_ls(load_fixture("trn2.48xlarge"))
    assert topo.devices[0].connected_to == [12, 3, 4, 1]
    assert topo.devices[0].bdf == "0000:cc:00.0"
    assert topo.devices[5].numa_node == 0 and topo.devices[0].numa_node == 1


def test_logical_core_config_renumbers_cores():
    topo = parse_neuron_ls(load_fixture("trn2.48xlarge")).with_lnc(1)
    assert topo.lnc == 1 and topo.logical_cores == 128 and topo.cores_per_device == 8
    assert topo.devices[1].core_ids == list(range(8, 16))


def test_lnc_that_does_not_divide_is_an_error():
    topo = parse_neuron_ls(
        [{**load_fixture("trn1.2xlarge")[0], "nc_count": 3, "neuroncore_ids": [0, 1, 2]}]
    )
    with pytest.raises(ConfigError, match="logical core config 2 does not divide the 3 physical"):
        topo.with_lnc(2)


@pytest.mark.parametrize(
    "text, cores", [("0-3,8", [0, 1, 2, 3, 8]), ("5", [5]), ("8, 0-1", [0, 1, 8])]
)
def test_core_list_syntax(text, cores):
    assert parse_core_list(text) == cores


@pytest.mark.parametrize(
    "bad, why",
    [
        ("3-1", "backwards"),
        ("a", "not a core id"),
        ("0,,1", "empty item"),
        ("0-1,1", "twice"),
        ("", "empty"),
        ("1-x", "not a range"),
    ],
)
def test_core_list_errors(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_core_list(bad)


def test_core_list_roundtrip():
    assert format_core_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"


def test_visible_cores_honoured_and_checked():
    topo = parse_neuron_ls(load_fixture("trn1.32xlarge"))
    assert visible_core_ids(topo, "0-3,8", "NEURON_RT_VISIBLE_CORES") == [0, 1, 2, 3, 8]
    assert visible_core_ids(topo, None, "x") == list(range(32))
    with pytest.raises(ConfigError) as e:
        visible_core_ids(topo, "30-33", "NEURON_RT_VISIBLE_CORES")
    assert str(e.value) == (
        "NEURON_RT_VISIBLE_CORES names NeuronCores 32-33, but this instance has logical cores "
        "0-31 (LNC=1); pick cores within 0-31"
    )


def test_bad_payload_shapes():
    with pytest.raises(NeuronLsError, match="expected a list"):
        parse_neuron_ls("nope")
    with pytest.raises(NeuronLsError, match="lacks 'neuron_device'"):
        parse_neuron_ls([{"nc_count": 2}])
    with pytest.raises(NeuronLsError, match="no device list"):
        parse_neuron_ls({"instance_type": "trn1.2xlarge"})


# ------------------------------------------------------------------------------ the seam


def test_seam_runs_neuron_ls(fake_neuron_ls):
    tool = fake_neuron_ls("trn1.32xlarge")
    res = run_neuron_ls()
    assert res.path == str(tool) and res.error == ""
    assert res.topology.logical_cores == 32 and res.topology.instance_type == "trn1.32xlarge"


def test_seam_falls_back_to_output_format_json(fake_neuron_ls):
    fake_neuron_ls("trn2.48xlarge", mode="output-format")
    res = run_neuron_ls()
    assert res.error == ""
    assert (
        res.topology.instance_type == "trn2.48xlarge"
        and res.topology.logical_cores == 64
        and res.topology.lnc == 2
    )


def test_seam_reports_missing_driver(fake_neuron_ls):
    fake_neuron_ls("trn1.2xlarge", mode="no-driver")
    res = run_neuron_ls()
    assert res.topology is None and res.error.startswith("no Neuron devices: ")
    assert "failed to discover Neuron devices" in res.error


def test_seam_reports_garbage(fake_neuron_ls):
    fake_neuron_ls("trn1.2xlarge", mode="garbage")
    res = run_neuron_ls()
    assert res.topology is None and "invalid JSON" in res.error


def test_seam_without_tool(no_neuron_ls):
    res = run_neuron_ls()
    assert res.topology is None and "neuron-ls not found" in res.error


# ------------------------------------------------------------------------------ aios devices


def test_device_report_trn2(fake_neuron_ls, config):
    fake_neuron_ls("trn2.48xlarge")
    rep = device_report(config())
    assert rep.count == 64
    assert rep.kind == "NeuronCore-v3 (logical, LNC=2)"
    assert rep.topology["physical_cores"] == 128 and rep.topology["neuron_devices"] == 16
    assert rep.devices[5].memory_bytes == 24 * GIB  # 96 GiB device HBM shared by 4 logical cores
    assert rep.devices[5].extra["device"] == 1
    assert not rep.available and "torch-neuronx is not installed" in rep.reason


def test_device_report_visible_cores_env(fake_neuron_ls, config, monkeypatch):
    fake_neuron_ls("trn1.32xlarge")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-3,8")
    rep = device_report(config())
    assert [d.index for d in rep.devices] == [0, 1, 2, 3, 8]
    assert rep.topology["visible_cores"] == "0-3,8"
    assert any("5 of 32 logical cores visible" in n for n in rep.notes)


def test_device_report_lnc_from_config(fake_neuron_ls, config):
    fake_neuron_ls("trn2.48xlarge")
    rep = device_report(config("neuron.logical_nc_config=1"))
    assert rep.count == 128 and rep.kind == "NeuronCore-v3"


def test_device_report_off_instance_uses_catalog(no_neuron_ls, config):
    rep = device_report(config("neuron.instance_type=trn1.32xlarge"))
    assert rep.count == 32 and not rep.available
    assert rep.topology["source"] == "catalog"


def test_aios_devices_cli_json_without_torch(fake_neuron_ls):
    fake_neuron_ls("trn1.2xlarge")
    code = (
        "import sys\n"
        "sys.argv = ['aios', 'devices', '--backend', 'neuron', '--json']\n"
        "from aios.cli.main import cli\n"
        "try:\n    cli()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'aios devices imported torch'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (rep,) = json.loads(out.stdout)
    assert rep["backend"] == "neuron" and rep["count"] == 2
    assert rep["topology"]["instance_type"] == "trn1.2xlarge" and rep["kind"] == "NeuronCore-v2"
