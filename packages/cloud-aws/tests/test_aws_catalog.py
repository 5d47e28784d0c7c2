"""The instance catalog, `aios catalog` / `aios cost`, and plugin hygiene (fast import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aios_cloud_aws import catalog as cat
from aios_cloud_aws.provider import AwsProvider

EXPECTED = {
    # name: (backend, accelerators, HBM GiB/device, vCPU, RAM GiB, EFA interfaces)
    "p4d.24xlarge": ("cuda", 8, 40, 96, 1152, 4),
    "p5.48xlarge": ("cuda", 8, 80, 192, 2048, 32),
    "p5e.48xlarge": ("cuda", 8, 141, 192, 2048, 32),
    "trn1.2xlarge": ("neuron", 1, 32, 8, 32, 0),
    "trn1.32xlarge": ("neuron", 16, 32, 128, 512, 8),
    "trn2.48xlarge": ("neuron", 16, 96, 192, 2048, 16),
    "p5en.48xlarge": ("cuda", 8, 141, 192, 2048, 16),
    "p6-b200.48xlarge": ("cuda", 8, 179, 192, 2048, 8),
    "p6-b300.48xlarge": ("cuda", 8, 268, 192, 4096, 16),
    "trn2u.48xlarge": ("neuron", 16, 96, 192, 2048, 16),
}


def test_catalog_contents():
    assert sorted(cat.INSTANCE_TYPES) == sorted(EXPECTED)
    for name, (backend, n, hbm, vcpu, ram, efa) in EXPECTED.items():
        t = cat.INSTANCE_TYPES[name]
        assert (
            t.backend,
            t.accelerators,
            t.accelerator_memory_gib,
            t.vcpus,
            t.memory_gib,
            t.efa_interfaces,
        ) == (backend, n, hbm, vcpu, ram, efa), name
        if t.on_demand_hourly is not None:  # no recorded price: "unknown price", never a refusal
            assert t.on_demand_hourly > 0 and (
                t.spot_hourly is None or t.spot_hourly < t.on_demand_hourly
            )
        assert t.regions and t.price_region in t.regions
        assert t.to_dict()["prices_recorded"] == cat.PRICES_RECORDED
    assert cat.INSTANCE_TYPES["trn1.32xlarge"].neuron_cores == 32
    # per-device bf16 peaks: A100 312, H100/H200 989, Trainium 190, Trainium2 667
    assert cat.INSTANCE_TYPES["p5.48xlarge"].peak_bf16_tflops == 8 * 989
    assert cat.INSTANCE_TYPES["trn2.48xlarge"].peak_bf16_tflops == 16 * 667


def test_provider_catalog_entries_match():
    entries = {e.accelerator: e for e in AwsProvider().catalog()}
    e = entries["p5.48xlarge"]
    assert (e.cloud, e.devices, e.memory_gb, e.backend, e.on_demand_hourly, e.spot_hourly) == (
        "aws",
        8,
        80,
        "cuda",
        55.04,
        31.46,
    )
    assert "us-east-1" in e.zones and entries["trn2.48xlarge"].zones == ("us-east-2", "us-west-2")
    assert AwsProvider().backend_for("trn1.32xlarge") == "neuron"


def _aios(*args, tmp_path):
    env = {**os.environ, "AIOS_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_aios_catalog_and_cost_cli(tmp_path):
    r = _aios("catalog", "--cloud", "aws", "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["accelerator"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(EXPECTED) and rows["trn1.32xlarge"]["on_demand_hourly"] == 21.50
    r = _aios(
        "cost",
        "--cloud",
        "aws",
        "-a",
        "p4d.24xlarge",
        "--hours",
        "10",
        "--nodes",
        "2",
        "--json",
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    text = json.dumps(data)
    assert "439.2" in text  # 10 h x 2 nodes x $21.96
    r = _aios("cost", "--cloud", "aws", "-a", "p5.47xlarge", "--hours", "1", tmp_path=tmp_path)
    assert r.returncode == 2 and "'p5.47xlarge'" in r.stderr and r.stderr.count("\n") == 1


def test_plugin_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import aios_cloud_aws.plugin; "
        "print(round(time.perf_counter() - t, 3), *[m in sys.modules for m in ('boto3', 'botocore', 's3fs', 'torch')])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    parts = r.stdout.split()
    assert parts[1:] == ["False", "False", "False", "False"]


def test_registry_sees_the_plugin():
    from aios.plugins.registry import get_registry, reset_registry

    reset_registry()
    reg = get_registry()
    assert "aios-cloud-aws" in reg.plugins and not [
        e for e in reg.errors if e.plugin == "aios-cloud-aws"
    ]
    assert (
        reg.clouds["aws"].plugin == "aios-cloud-aws"
        and reg.storage["s3"].plugin == "aios-cloud-aws"
    )
    assert reg.config_sections["aws"][0] == "aios-cloud-aws"


def test_aws_section_validation_is_one_line():
    from aios.config.schema import resolve
    from aios.errors import ConfigError

    cfg = resolve(
        overrides=["aws.region=us-west-2", "aws.zones=[us-west-2b, us-west-2c]"],
        environ={},
        check_backend=False,
    )
    assert cfg.aws.region == "us-west-2" and cfg.aws.zones == ["us-west-2b", "us-west-2c"]
    with pytest.raises(ConfigError) as ei:
        resolve(overrides=["aws.efa=maybe"], environ={}, check_backend=False)
    assert "aws.efa" in str(ei.value) and "auto" in str(ei.value)
    with pytest.raises(ConfigError, match="unknown config key 'aws.secret_access_key'"):
        resolve(overrides=["aws.secret_access_key=abc"], environ={}, check_backend=False)


def test_aios_catalog_shows_vcpu_ram_and_efa(tmp_path):
    r = _aios("catalog", "--cloud", "aws", "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["accelerator"]: row for row in json.loads(r.stdout)}
    for name, (_backend, _n, _hbm, vcpu, ram, efa) in EXPECTED.items():
        x = rows[name]["extra"]
        assert (x["vcpus"], x["ram_gib"], x["efa_interfaces"]) == (vcpu, ram, efa), name
    assert rows["trn1.32xlarge"]["extra"]["neuron_cores"] == 32
    env_cols = {"COLUMNS": "400"}
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "catalog", "--cloud", "aws"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(tmp_path / "home"), **env_cols},
    )
    assert r.returncode == 0, r.stderr
    line = {ln.split("│")[2].strip(): ln for ln in r.stdout.splitlines() if ln.count("│") > 3}
    assert "192 vCPU, 2048 GiB RAM, 32 EFA" in line["p5.48xlarge"]
    assert "8 vCPU, 32 GiB RAM, no EFA" in line["trn1.2xlarge"]


def test_the_tables_facts_agree_with_ec2s_own_description(aws):
    """The table only fills in facts; EC2's DescribeInstanceTypes (moto ships AWS's own instance
    type data) must agree on devices, vCPUs and the EFA layout of every listed type."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws.proxy.endpoint)
    described = {
        d["InstanceType"]: d
        for d in ec2.describe_instance_types(InstanceTypes=sorted(cat.INSTANCE_TYPES))[
            "InstanceTypes"
        ]
    }
    assert sorted(described) == sorted(cat.INSTANCE_TYPES)
    for name, t in cat.INSTANCE_TYPES.items():
        live = cat.from_describe(described[name])
        assert (live.accelerators, live.vcpus, live.efa_interfaces) == (
            t.accelerators,
            t.vcpus,
            t.efa_interfaces,
        ), name
    cat.LIVE.clear()
