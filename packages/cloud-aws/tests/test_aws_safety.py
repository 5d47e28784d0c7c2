"""Issue 15 on AWS: Elastic IPs before instances, S3 credentials for managed runs, refused
options, printed commands that run as printed and equal what is sent, the EFA check, and
`aios down` without the local record. Real boto3 against moto behind the EC2 proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios_cloud.failover import create_with_failover
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError
from aios_cloud_aws.provider import AwsProvider, ElasticIpQuotaError
from aios_cloud_aws.settings import AwsSettings
from aios_cloud_aws.testing.inventory import leftovers


def test_elastic_ip_quota_stops_the_launch_before_any_instance(aws, make_provider, pubkey):
    """EC2's default of 5 Elastic IPs per region, 4 already in use: a 2-node p5 launch fails at
    once, in the first zone, naming the Elastic IP quota; no instance is ever launched and the
    user's own addresses are untouched."""
    aws.proxy.address_limit = 5
    mine = [aws.ec2.allocate_address(Domain="vpc")["AllocationId"] for _ in range(4)]
    p = make_provider(zones=["us-east-1a", "us-east-1b", "us-east-1c"])
    req = p.validate(
        ClusterRequest(name="eip", accelerator="p5.48xlarge", nodes=2, ssh_public_key=pubkey)
    )
    with pytest.raises(ElasticIpQuotaError) as ei:
        create_with_failover(p, req, p.zones(req.accelerator), sleep=lambda s: None)
    msg = str(ei.value)
    assert "Elastic IP quota of us-east-1" in msg and "L-0263D0A3" in msg and "vCPU" not in msg
    assert aws.proxy.called("RunInstances") == []  # nothing launched, in no zone
    assert {a["AllocationId"] for a in aws.ec2.describe_addresses()["Addresses"]} == set(mine)
    assert leftovers(aws.ec2, "eip", aws.proxy) == {}
    # with room for both, the addresses are taken before RunInstances and attached after it
    aws.ec2.release_address(AllocationId=mine[0])
    aws.proxy.calls.clear()
    info = p.create(
        p.validate(
            ClusterRequest(
                name="eip",
                accelerator="p5.48xlarge",
                nodes=2,
                zone="us-east-1a",
                ssh_public_key=pubkey,
            )
        )
    )
    actions = [
        a
        for a, _ in aws.proxy.calls
        if a in ("AllocateAddress", "RunInstances", "AssociateAddress")
    ]
    assert actions == [
        "AllocateAddress",
        "AllocateAddress",
        "RunInstances",
        "AssociateAddress",
        "AssociateAddress",
    ]
    assert len(info.hosts) == 2
    p.delete("eip", "us-east-1a")
    assert leftovers(aws.ec2, "eip", aws.proxy) == {}


def test_printed_run_instances_is_what_is_sent(aws, make_provider, pubkey):
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="same",
            accelerator="trn1.32xlarge",
            nodes=2,
            zone="us-east-1a",
            spot=True,
            ssh_public_key=pubkey,
            labels={"team": "ml"},
        )
    )
    printed = next(c for c in p.render_create(req) if c.argv[:3] == ["aws", "ec2", "run-instances"])
    plan = json.loads(printed.argv[printed.argv.index("--cli-input-json") + 1])
    p.offline = False
    p.create(req)
    (sent,) = aws.proxy.called("RunInstances")
    assert (
        sent["InstanceType"] == plan["InstanceType"]
        and int(sent["MinCount"]) == plan["MinCount"] == 2
    )
    nics = [
        k for k in sent if k.startswith("NetworkInterface.") and k.endswith(".NetworkCardIndex")
    ]
    assert len(nics) == len(plan["NetworkInterfaces"])
    for i, nic in enumerate(plan["NetworkInterfaces"], 1):
        assert sent[f"NetworkInterface.{i}.NetworkCardIndex"] == str(nic["NetworkCardIndex"])
        assert sent[f"NetworkInterface.{i}.DeviceIndex"] == str(nic["DeviceIndex"])
        assert sent.get(f"NetworkInterface.{i}.InterfaceType") == nic.get("InterfaceType")
    assert sent["InstanceMarketOptions.MarketType"] == plan["InstanceMarketOptions"]["MarketType"]
    assert sent["BlockDeviceMapping.1.Ebs.VolumeSize"] == str(
        plan["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"]
    )
    assert sent["MetadataOptions.HttpTokens"] == plan["MetadataOptions"]["HttpTokens"]
    sent_types = sorted(
        v
        for k, v in sent.items()
        if k.startswith("TagSpecification.") and k.endswith(".ResourceType")
    )
    assert sent_types == sorted(t["ResourceType"] for t in plan["TagSpecifications"])
    assert plan["KeyName"] == sent["KeyName"]  # the key pair name is known up front
    p.delete("same", "us-east-1a")


def _fake_aws_cli(tmp: Path) -> Path:
    """A stand-in for the `aws` CLI that answers describe-instances with two ids and records the
    arguments of every other call: the printed lines must run as they are printed."""
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "aws").write_text(
        "#!/bin/bash\n"
        'if [ "$2" = describe-instances ]; then echo "i-0aaa i-0bbb"; exit 0; fi\n'
        f'printf "%s\\n" "$@" > {tmp}/called-$2\n'
    )
    (bindir / "aws").chmod(0o755)
    return bindir


@pytest.mark.parametrize(
    "action,verb",
    [("stop", "stop-instances"), ("start", "start-instances"), ("delete", "terminate-instances")],
)
def test_printed_stop_start_down_run_as_printed(tmp_path, action, verb):
    p = AwsProvider(settings=AwsSettings())
    line = p.render(action, "gpt", "us-east-1d")[0].shell()
    bindir = _fake_aws_cli(tmp_path)
    r = subprocess.run(
        ["bash", "-c", line],
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    args = (tmp_path / f"called-{verb}").read_text().split()
    assert args[args.index("--instance-ids") + 1 :] == ["i-0aaa", "i-0bbb"]


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--queued"], "--queued is not supported by --cloud aws"),
        (["--queued", "--valid-until", "+6h"], "--queued is not supported by --cloud aws"),
        (["--zone", "us-east-1z"], "zone us-east-1z does not exist in us-east-1"),
        (["--disk-gb", "-5"], "--disk-gb must be a positive size"),
        (
            ["--max-restarts", "2", "--checkpoint-dir", "s3://bkt/run"],
            "no credentials to write s3://bkt/run",
        ),
        (["--instance-typo", "p5.48xlarge"], "no such option: --instance-typo"),
    ],
)
def test_aws_refuses_what_it_cannot_do(tmp_path, monkeypatch, args, expect):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any AWS call would fail
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print(1)\n")
    argv = [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "aws", "--spot"]
    argv += args if args[0] == "--instance-typo" else ["-a", "p5.48xlarge", *args]
    r = subprocess.run(
        [*argv, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_instance_type_flag_is_the_accelerator(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print(1)\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.main",
            "launch",
            "--cloud",
            "aws",
            "--instance-type",
            "p4d.24xlarge",
            "--region",
            "us-east-1",
            "--dry-run",
            "train.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert '"InstanceType":"p4d.24xlarge"' in r.stdout


def test_efa_is_verified_on_the_hosts_before_a_multinode_efa_job(tmp_path):
    p = AwsProvider(settings=AwsSettings())
    assert p.host_checks("p5.48xlarge", 1) == [] and p.host_checks("trn1.2xlarge", 1) == []
    (check,) = p.host_checks("p5.48xlarge", 2)
    assert AwsProvider(settings=AwsSettings(efa="off")).host_checks("p5.48xlarge", 2) == []
    # a host without a usable EFA provider: the check fails with one line naming the fix
    r = subprocess.run(
        ["bash", "-c", check],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "EFA is not usable" in r.stderr and "aws.efa=off" in r.stderr
    # where libfabric lists the EFA provider (the stand-in prints what `fi_info -p efa` prints)
    bindir = tmp_path / "efa" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "fi_info").write_text(
        '#!/bin/bash\n[ "$2" = efa ] && echo "provider: efa" && exit 0\nexit 1\n'
    )
    (bindir / "fi_info").chmod(0o755)
    r = subprocess.run(
        ["bash", "-c", check.replace("/opt/amazon/efa/bin", str(bindir))],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.main",
            "launch",
            "--cloud",
            "aws",
            "-a",
            "p5.48xlarge",
            "--nodes",
            "2",
            "--region",
            "us-east-1",
            "--dry-run",
            "train.py",
        ],
        cwd=_proj(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AIOS_HOME": str(tmp_path / "h"),
        },
    )
    assert out.returncode == 0, out.stderr
    assert "fi_info -p efa -t FI_EP_RDM" in out.stdout


def _proj(tmp: Path) -> Path:
    d = tmp / "proj"
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text("print(1)\n")
    return d


def test_down_finds_a_cluster_by_tag_without_the_local_record(aws, make_provider, pubkey, tmp_path):
    p = make_provider()
    p.create(
        p.validate(
            ClusterRequest(
                name="orphan", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
            )
        )
    )
    env = {
        **os.environ,
        "AIOS_HOME": str(tmp_path / "home"),
        "AIOS_PLUGINS": "aios-cloud-aws,aios-backend-neuron",
    }
    st = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "status", "--refresh", "--cloud", "aws", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert st.returncode == 0, st.stderr
    rows = json.loads(st.stdout)
    assert [r["name"] for r in rows] == ["orphan"] and "no local record" in rows[0]["state"]
    d = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "down", "orphan", "--cloud", "aws"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert d.returncode == 0, d.stderr
    assert leftovers(aws.ec2, "orphan", aws.proxy) == {}


def test_reserved_capacity_odcr_and_capacity_block(aws, make_provider, pubkey):
    aws.proxy.capacity_reservations["cr-0odcr"] = {
        "zone": "us-east-1b",
        "instance_type": "p4d.24xlarge",
        "type": "default",
    }
    aws.proxy.capacity_reservations["cr-0block"] = {
        "zone": "us-east-1c",
        "instance_type": "p5.48xlarge",
        "type": "capacity-block",
    }
    p = make_provider(zones=["us-east-1a", "us-east-1b", "us-east-1c"])
    req = p.validate(
        ClusterRequest(
            name="odcr",
            accelerator="p4d.24xlarge",
            ssh_public_key=pubkey,
            extra={"reservation": "cr-0odcr"},
        )
    )
    res = create_with_failover(p, req, p.zones(req.accelerator), sleep=lambda s: None)
    assert res.zone == "us-east-1b" and [(a.zone, a.kind) for a in res.attempts] == [
        ("us-east-1a", "unavailable")
    ]
    (run,) = aws.proxy.called("RunInstances")
    assert (
        run["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"]
        == "cr-0odcr"
    )
    assert "InstanceMarketOptions.MarketType" not in run
    printed = p.plan_create(req, "us-east-1b")["run_instances"]
    assert printed["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0odcr"}
    }
    p.delete("odcr", "us-east-1b")
    # a Capacity Block launches with MarketType capacity-block; naming it as an ODCR is an error that says so
    wrong = p.validate(
        ClusterRequest(
            name="blk",
            accelerator="p5.48xlarge",
            zone="us-east-1c",
            ssh_public_key=pubkey,
            extra={"reservation": "cr-0block"},
        )
    )
    with pytest.raises(CloudError, match="pass --reservation block:cr-0block"):
        p.create(wrong)
    blk = p.validate(
        ClusterRequest(
            name="blk",
            accelerator="p5.48xlarge",
            zone="us-east-1c",
            ssh_public_key=pubkey,
            extra={"reservation": "block:cr-0block"},
        )
    )
    p.create(blk)
    run = aws.proxy.called("RunInstances")[-1]
    assert run["InstanceMarketOptions.MarketType"] == "capacity-block"
    assert p.plan_create(blk)["run_instances"]["InstanceMarketOptions"] == {
        "MarketType": "capacity-block"
    }
    p.delete("blk", "us-east-1c")
    with pytest.raises(CloudError, match="--spot and --reservation contradict"):
        p.validate(
            ClusterRequest(
                name="x", accelerator="p5.48xlarge", spot=True, extra={"reservation": "cr-0odcr"}
            )
        )
    with pytest.raises(CloudError, match="is not a capacity reservation id"):
        p.validate(
            ClusterRequest(name="x", accelerator="p5.48xlarge", extra={"reservation": "r-123"})
        )
