"""Dry-run plans for p5.48xlarge x2 and trn1.32xlarge x2, checked field by field; no AWS call
(the endpoint points at a closed port) and no secret in the output."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from aios.plugins.versions import STACKS
from aios_cloud.provider.data import ClusterRequest
from aios_cloud_aws.provider import AwsProvider
from aios_cloud_aws.settings import GPU_AMI_PARAMETER, AwsSettings

# Trn1 trains on the neuron-xla set (Neuron 2.29, the last with XLA training): its DLAMI and venv
TRN1_IMAGE = STACKS["neuron-xla"][0].image
TRN1_PYTHON = TRN1_IMAGE["python"]

SECRET = "aiosDryRunSecretValue0123456789"
TOKEN = "aiosDryRunSessionToken9876543210"


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    """Credentials present (they must not leak), but any AWS call would fail."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIADRYRUN0000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    return tmp_path


def _nics(params):
    return params["NetworkInterfaces"]


def test_plan_p5_two_nodes_spot(offline_env):
    p = AwsProvider(settings=AwsSettings())
    plan = p.plan_create(
        ClusterRequest(
            name="gpt",
            accelerator="p5.48xlarge",
            nodes=2,
            spot=True,
            region="us-east-1",
            zone="us-east-1d",
        )
    )
    assert plan["region"] == "us-east-1" and plan["zone"] == "us-east-1d"
    assert plan["instance_type"] == "p5.48xlarge" and plan["nodes"] == 2 and plan["spot"] is True
    assert plan["ami"] == {"ssm_parameter": GPU_AMI_PARAMETER}
    assert plan["placement_group"] == "aios-gpt"
    assert plan["efa_interfaces_per_node"] == 32
    assert plan["elastic_ips"] is True
    assert plan["hourly_usd"] == pytest.approx(2 * 31.46)
    run = plan["run_instances"]
    assert run["InstanceType"] == "p5.48xlarge" and run["MinCount"] == 2 and run["MaxCount"] == 2
    assert run["ImageId"] == f"<ssm:{GPU_AMI_PARAMETER}>"
    assert run["KeyName"] == "aios-gpt"
    assert run["Placement"] == {"AvailabilityZone": "us-east-1d", "GroupName": "aios-gpt"}
    assert run["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    assert run["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpEndpoint": "enabled",
        "HttpPutResponseHopLimit": 2,
    }
    assert run["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/sda1",
            "Ebs": {"VolumeSize": 512, "VolumeType": "gp3", "DeleteOnTermination": True},
        }
    ]
    nics = _nics(run)
    # the current AWS guide: one ENA primary (card 0, device 0), EFA-only on card 0 device 1 and
    # on device 0 of every further card: 32 EFA devices and one ENA on a p5.48xlarge
    assert len(nics) == 33
    assert nics[0] == {
        "DeviceIndex": 0,
        "NetworkCardIndex": 0,
        "SubnetId": "<default subnet of us-east-1d>",
        "Groups": ["<sg:aios-gpt>"],
        "DeleteOnTermination": True,
    }
    assert [n["NetworkCardIndex"] for n in nics[1:]] == list(range(32))
    assert [n["DeviceIndex"] for n in nics[1:]] == [1] + [0] * 31
    assert all(n["InterfaceType"] == "efa-only" for n in nics[1:])
    assert not any("AssociatePublicIpAddress" in n for n in nics)
    kinds = [t["ResourceType"] for t in run["TagSpecifications"]]
    assert kinds == ["instance", "volume", "network-interface", "spot-instances-request"]
    for spec in run["TagSpecifications"]:
        tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
        assert tags["aios:cluster"] == "gpt" and tags["aios:managed-by"] == "aios"
    assert "IamInstanceProfile" not in run and "ClientToken" not in run
    rules = plan["security_group_rules"]
    assert rules[0]["FromPort"] == 22 and rules[0]["IpRanges"][0]["CidrIp"] == "0.0.0.0/0"
    assert rules[1] == {
        "IpProtocol": "-1",
        "UserIdGroupPairs": [
            {
                "GroupId": "<sg:aios-gpt>",
                "Description": "aios cluster-internal (EFA/NCCL/rendezvous)",
            }
        ],
    }


def test_plan_trn1_two_nodes_on_demand(offline_env):
    p = AwsProvider(
        settings=AwsSettings(iam_instance_profile="aios-s3", disk_gb=1024, spot_max_price=9.0)
    )
    plan = p.plan_create(
        ClusterRequest(name="llama", accelerator="trn1.32xlarge", nodes=2, region="us-west-2")
    )
    assert plan["region"] == "us-west-2" and plan["zone"] == "us-west-2a"
    # the newest Amazon image of the version set's name, not the "latest" parameter (PyTorch
    # 2.9 Neuron DLAMIs were published through Neuron 2.31 only)
    assert plan["ami"] == {"name": TRN1_IMAGE["ami_name_filter"], "owner": "amazon"}
    assert (
        plan["placement_group"] == "aios-llama"
        and plan["efa_interfaces_per_node"] == 8
        and plan["elastic_ips"] is True
    )
    assert plan["hourly_usd"] == pytest.approx(2 * 21.50)
    run = plan["run_instances"]
    assert run["InstanceType"] == "trn1.32xlarge" and run["MinCount"] == run["MaxCount"] == 2
    assert "InstanceMarketOptions" not in run  # on demand (spot_max_price only applies to spot)
    assert run["IamInstanceProfile"] == {"Name": "aios-s3"}
    assert run["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 1024
    assert [n["NetworkCardIndex"] for n in _nics(run)] == [0, *range(8)]
    assert (
        "InterfaceType" not in _nics(run)[0]
        and sum(n.get("InterfaceType") == "efa-only" for n in _nics(run)) == 8
    )
    assert [t["ResourceType"] for t in run["TagSpecifications"]] == [
        "instance",
        "volume",
        "network-interface",
    ]
    spot = p.plan_create(
        ClusterRequest(
            name="llama", accelerator="trn1.32xlarge", nodes=2, region="us-west-2", spot=True
        )
    )
    assert spot["run_instances"]["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "9.0000"


def test_plan_single_node_has_no_efa_no_placement_group(offline_env):
    p = AwsProvider(settings=AwsSettings())
    plan = p.plan_create(
        ClusterRequest(name="solo", accelerator="p4d.24xlarge", region="us-east-1")
    )
    run = plan["run_instances"]
    assert plan["placement_group"] is None and "GroupName" not in run["Placement"]
    assert len(run["NetworkInterfaces"]) == 1 and "InterfaceType" not in run["NetworkInterfaces"][0]
    assert (
        run["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is True
        and plan["elastic_ips"] is False
    )
    private = AwsProvider(settings=AwsSettings(use_private_ip=True, efa="on")).plan_create(
        ClusterRequest(name="solo", accelerator="p4d.24xlarge", region="us-east-1")
    )
    assert (
        len(private["run_instances"]["NetworkInterfaces"]) == 5 and private["elastic_ips"] is False
    )


def _dry_run(tmp: Path, *args: str, config: str | None = None) -> str:
    (tmp / "train.py").write_text("print('train')\n")
    argv = [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "aws", "--dry-run", *args]
    if config:
        (tmp / "aios.yaml").write_text(config)
        argv += ["--config", str(tmp / "aios.yaml")]
    argv += ["train.py", "--", "--steps", "10"]
    r = subprocess.run(
        argv, cwd=tmp, capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert SECRET not in out and TOKEN not in out and "AKIADRYRUN" not in out
    return r.stdout


def _run_instances(out: str) -> dict:
    line = next(ln for ln in out.splitlines() if ln.startswith("aws ec2 run-instances"))
    argv = shlex.split(line.split("  # ")[0])
    return json.loads(argv[argv.index("--cli-input-json") + 1])


def _worker_lines(out: str) -> list[list[str]]:
    lines = [ln for ln in out.splitlines() if ln.startswith("(worker ")]
    return [shlex.split(ln.split(") ", 1)[1].split(" && ", 1)[1]) for ln in lines]


def _env_and_cmd(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    i = 0
    while "=" in argv[i] and not argv[i].startswith("-"):
        k, _, v = argv[i].partition("=")
        env[k] = v
        i += 1
    return env, argv[i:]


def test_cli_dry_run_p5_x2(offline_env):
    out = _dry_run(
        offline_env,
        "-a",
        "p5.48xlarge",
        "--nodes",
        "2",
        "--spot",
        "--region",
        "us-east-1",
        "--name",
        "gpt",
    )
    assert f"aws ssm get-parameter --region us-east-1 --name {GPU_AMI_PARAMETER}" in out
    assert (
        "aws ec2 create-placement-group --region us-east-1 --group-name aios-gpt --strategy cluster"
        in out
    )
    run = _run_instances(out)
    assert (
        run["InstanceType"] == "p5.48xlarge"
        and run["MinCount"] == 2
        and len(run["NetworkInterfaces"]) == 33
    )
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    workers = _worker_lines(out)
    assert len(workers) == 2
    for argv in workers:
        env, cmd = _env_and_cmd(argv)
        assert env["AIOS_RUN_BACKEND"] == "cuda"
        assert (
            env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        )  # backend-cuda's EFA preset for P5
        assert (
            cmd[0] == "/opt/pytorch/bin/python3"
        )  # the DLAMI's torch interpreter, not a bare python3
        assert cmd[1:4] == ["-m", "torch.distributed.run", "--nnodes"] and cmd[4] == "2"
        assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
        assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
        assert cmd[cmd.index("--rdzv-endpoint") + 1] == "<worker-0-internal-ip>:29500"
        assert cmd[-3:] == ["train.py", "--steps", "10"]


def test_g5_and_p5_plans_get_the_fabric_of_their_generation_not_the_laptops(
    offline_env, monkeypatch
):
    """AWS: RDMA read on Nitro v4 and later; g5 is Nitro v3, p5 v5. libfabric aborts with
    FI_EFA_USE_DEVICE_RDMA=1 on a device without RDMA read. The variables are decided for the
    instance type, in the plan the laptop prints; the laptop's own devices play no part (here
    it has an EFA device: backend-cuda's local detection would have found it)."""
    sysfs = offline_env / "sys-infiniband"
    (sysfs / "rdmap0s6").mkdir(parents=True)
    hook = offline_env / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import aios_backend_cuda.launch as L\nL.INFINIBAND_SYSFS = {str(sysfs)!r}\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(hook))

    def fabric(itype):
        out = _dry_run(offline_env, "-a", itype, "--nodes", "2", "--region", "us-east-1")
        envs = [_env_and_cmd(argv)[0] for argv in _worker_lines(out)]
        assert len(envs) == 2
        return [{k: v for k, v in e.items() if k.startswith(("FI_", "NCCL_NET"))} for e in envs]

    for env in fabric("g5.48xlarge"):
        assert env == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    for env in fabric("p5.48xlarge"):
        assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        assert env["NCCL_NET_GDR_LEVEL"] == "PHB"


def test_cli_dry_run_python_flag_overrides_the_provider_interpreter(offline_env):
    out = _dry_run(
        offline_env,
        "-a",
        "p5.48xlarge",
        "--region",
        "us-east-1",
        "--name",
        "gpt",
        "--python",
        "/usr/bin/python3.11",
    )
    for argv in _worker_lines(out):
        assert _env_and_cmd(argv)[1][0] == "/usr/bin/python3.11"


def test_cli_dry_run_trn1_x2_with_s3_compile_cache(offline_env):
    cfg = "neuron:\n  compile_cache: s3://ckpt-bucket/neuron-cache\naws:\n  iam_instance_profile: aios-s3\n"
    out = _dry_run(
        offline_env,
        "-a",
        "trn1.32xlarge",
        "--nodes",
        "2",
        "--region",
        "us-east-1",
        "--name",
        "llama",
        "--checkpoint-dir",
        "s3://ckpt-bucket/run1",
        config=cfg,
    )
    assert "aws ec2 describe-images" in out and "--owners amazon" in out
    assert f"Name=name,Values={TRN1_IMAGE['ami_name_filter']}" in out and "Ubuntu 24.04" in out
    run = _run_instances(out)
    assert (
        run["InstanceType"] == "trn1.32xlarge"
        and run["MinCount"] == 2
        and len(run["NetworkInterfaces"]) == 9
    )
    assert run["IamInstanceProfile"] == {"Name": "aios-s3"}
    assert "InstanceMarketOptions" not in run
    assert f"{TRN1_PYTHON} -m pip install" in out and "pytorch_2_8" not in out
    workers = _worker_lines(out)
    assert len(workers) == 2
    for argv in workers:
        env, cmd = _env_and_cmd(argv)
        assert env["AIOS_RUN_BACKEND"] == "neuron"
        assert cmd[0] == TRN1_PYTHON
        assert env["NEURON_RT_ROOT_COMM_ID"].startswith("<worker-0-internal-ip>:")
        assert env["NEURON_COMPILE_CACHE_URL"] == "s3://ckpt-bucket/neuron-cache"
        assert env["AIOS_CHECKPOINT__DIR"] == "s3://ckpt-bucket/run1"
        assert env["FI_PROVIDER"] == "efa"
        assert cmd[cmd.index("--nproc-per-node") + 1] == "32"
        assert cmd[cmd.index("--nnodes") + 1] == "2"
        assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"


def test_dry_run_never_imports_boto3(offline_env):
    code = (
        "import sys; from aios_cloud.provider import ClusterRequest; from aios_cloud_aws.provider import AwsProvider; "
        "p = AwsProvider(); p.render_create(p.validate(ClusterRequest(name='x', accelerator='p5.48xlarge', nodes=2))); "
        "p.catalog(); print('boto3' in sys.modules, 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_render_down_and_remote_env_have_no_secrets(offline_env):
    from aios_cloud.provider.data import ClusterInfo

    p = AwsProvider(settings=AwsSettings())
    down = [c.shell() for c in p.render("delete", "gpt", "us-east-1d")]
    assert down[0].startswith("aws ec2 terminate-instances --region us-east-1")
    assert "Name=tag:aios:cluster,Values=gpt" in down[0]
    assert any("delete-security-group" in c for c in down) and any(
        "delete-key-pair" in c for c in down
    )
    assert any("delete-placement-group" in c for c in down) and any(
        "release-address" in c for c in down
    )
    info = ClusterInfo(
        name="gpt",
        cloud="aws",
        zone="us-east-1d",
        accelerator="p5.48xlarge",
        spot=True,
        raw={"region": "us-east-1"},
    )
    env = p.remote_env(info)
    assert env == {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AIOS_RUN_CLOUD": "aws",
        "AIOS_RUN_SPOT_WATCH": "1",
    }
    assert not any(
        k.startswith("AIOS_") and not k.startswith(("AIOS_RUN_", "AIOS_AWS__")) for k in env
    )
    info.spot = False
    assert "AIOS_RUN_SPOT_WATCH" not in p.remote_env(info)
    setup = p.setup_commands("trn1.32xlarge", ["datasets==3.0"])
    assert setup[0].startswith(f"{TRN1_PYTHON} -m pip")
    assert setup[-1].endswith(" datasets==3.0") and len(setup) == 2
    assert not any(
        "aios" in line.split("pip install", 1)[-1] for line in setup
    )  # aios comes with the code
    assert (
        AwsProvider(settings=AwsSettings(python="/usr/bin/python3.11"))
        .setup_commands("p5.48xlarge", [])[0]
        .startswith("/usr/bin/python3.11 ")
    )
    with pytest.raises(Exception, match="unknown action"):
        p.render("explode", "gpt", None)


def test_neuron_image_facts_come_from_aios_versions(offline_env):
    """One fact, one place: the Neuron DLAMI's SSM parameter and venv python are the version
    set's (Trn1: neuron-xla, Neuron 2.29; Trn2: neuron, TorchNeuron), on Ubuntu 24.04."""
    p = AwsProvider(settings=AwsSettings())
    trn2 = STACKS["neuron"][0].image
    assert p.ami_source("trn1.32xlarge") == ("name", TRN1_IMAGE["ami_name_filter"])
    assert p.ami_source("trn2.48xlarge") == ("name", trn2["ami_name_filter"])
    assert p.python("trn1.32xlarge") == TRN1_PYTHON
    assert p.python("trn2.48xlarge") == trn2["python"]
    for itype in ("trn1.32xlarge", "trn2.48xlarge"):
        assert "Ubuntu 24.04" in p.ami_parameter(itype) and "22.04" not in p.ami_parameter(itype)
        assert p.setup_commands(itype, [])[0].startswith(p.python(itype) + " -m pip")
    # an explicit setting still wins
    own = AwsProvider(settings=AwsSettings(neuron_ami_parameter="/my/param"))
    assert own.ami_parameter("trn2.48xlarge") == "/my/param"


def test_cli_dry_run_capacity_block_x2_has_no_placement_group_and_shows_the_end(offline_env):
    """Capacity Blocks: no placement group of aios's own ("there is no need to use a cluster
    placement group with a Capacity Block"), and the block's end handling: EC2 terminates its
    instances from EndDate - 30 min with no spot notice
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html)."""
    out = _dry_run(
        offline_env,
        *("-a", "p5.48xlarge", "--reservation", "block:cr-0123456789abcdef0", "--nodes", "2"),
        *("--region", "us-east-1", "--name", "blk"),
    )
    assert "create-placement-group" not in out
    # billed as the block's upfront fee, paid when bought: never priced as on-demand hours
    (price,) = [ln for ln in out.splitlines() if ln.startswith("# price:")]
    assert "in Capacity Block cr-0123456789abcdef0: an upfront fee for the whole term" in price
    assert "not billed by the hour" in price and "not the on-demand $110.08/h" in price
    assert "--reservation block` shows what EC2 asks" in price
    line = next(ln for ln in out.splitlines() if "describe-capacity-reservations" in ln)
    assert "--capacity-reservation-ids cr-0123456789abcdef0" in line
    assert "CapacityReservations[0].[State,StartDate,EndDate]" in line
    assert "EndDate - 30 min" in line and "AIOS_RUN_DEADLINE" in line
    run = _run_instances(out)
    assert run["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert "GroupName" not in run["Placement"]
    tags = {t["Key"]: t["Value"] for t in run["TagSpecifications"][0]["Tags"]}
    assert tags["aios:capacity-block"] == "cr-0123456789abcdef0"


@pytest.mark.parametrize(
    "itype,efa", [("p5en.48xlarge", 16), ("p6-b200.48xlarge", 8), ("p6-b300.48xlarge", 16)]
)
def test_cli_dry_run_current_gpu_families_plan(offline_env, itype, efa):
    out = _dry_run(offline_env, "-a", itype, "--nodes", "2", "--region", "us-east-1")
    run = _run_instances(out)
    assert run["InstanceType"] == itype
    assert sum(1 for n in run["NetworkInterfaces"] if "efa" in n.get("InterfaceType", "")) == efa
