"""Provisioning with the real boto3 against moto (server mode) behind the EC2 proxy."""

from __future__ import annotations

import pytest
from aios_cloud.failover import create_with_failover
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CapacityError, CloudError
from aios_cloud.provider.states import READY, STOPPED
from aios_cloud_aws.testing.inventory import leftovers
from aios_cloud_aws.testing.inventory import tagged as _tagged


def tagged(aws, name):
    return _tagged(aws.ec2, name, aws.proxy)


def nothing_left(aws, name):
    left = leftovers(aws.ec2, name, aws.proxy)
    assert left == {}, left
    return True


def test_single_node_uses_dlami_from_ssm_and_tags_everything(aws, make_provider, pubkey):
    p = make_provider()
    info = p.create(
        p.validate(
            ClusterRequest(
                name="one", accelerator="trn1.2xlarge", zone="us-east-1b", ssh_public_key=pubkey
            )
        )
    )
    assert info.state == READY and info.cloud == "aws" and info.zone == "us-east-1b"
    assert (
        len(info.hosts) == 1 and info.hosts[0].worker_id == 0 and info.hosts[0].ssh_user == "ubuntu"
    )
    (run,) = aws.proxy.called("RunInstances")
    assert (
        run["ImageId"] == aws.neuron_ami
    )  # read through ssm:GetParameter from the Neuron DLAMI parameter
    assert run["InstanceType"] == "trn1.2xlarge" and run["MinCount"] == run["MaxCount"] == "1"
    assert run["KeyName"] == "aios-one"
    assert run["MetadataOptions.HttpTokens"] == "required"
    assert run["NetworkInterface.1.AssociatePublicIpAddress"] == "true"
    assert "NetworkInterface.1.InterfaceType" not in run  # single node: no EFA
    assert "Placement.GroupName" not in run and "InstanceMarketOptions.MarketType" not in run
    assert (
        run["BlockDeviceMapping.1.DeviceName"] == "/dev/sda1"
        and run["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    )
    left = tagged(aws, "one")
    assert (
        len(left["instances"]) == 1
        and len(left["security_groups"]) == 1
        and left["key_pairs"] == ["aios-one"]
    )
    sg = aws.ec2.describe_security_groups(GroupIds=left["security_groups"])["SecurityGroups"][0]
    perms = sg["IpPermissions"]
    assert any(
        p_.get("FromPort") == 22 and p_["IpRanges"][0]["CidrIp"] == "0.0.0.0/0" for p_ in perms
    )
    assert any(
        p_["IpProtocol"] == "-1" and p_["UserIdGroupPairs"][0]["GroupId"] == sg["GroupId"]
        for p_ in perms
    )
    inst = aws.ec2.describe_instances(InstanceIds=left["instances"])["Reservations"][0][
        "Instances"
    ][0]
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert (
        tags["aios:cluster"] == "one"
        and tags["aios:node"] == "0"
        and tags["aios:managed-by"] == "aios"
    )
    p.delete("one", "us-east-1b")
    assert nothing_left(aws, "one")
    p.delete("one", "us-east-1b")  # idempotent


def test_multinode_spot_efa_placement_group_and_down_removes_all(aws, make_provider, pubkey):
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="big",
            accelerator="p5.48xlarge",
            nodes=2,
            spot=True,
            zone="us-east-1c",
            ssh_public_key=pubkey,
            labels={"team": "llm"},
        )
    )
    info = p.create(req)
    assert info.state == READY and info.spot and [h.worker_id for h in info.hosts] == [0, 1]
    assert all(h.internal_ip and h.ip for h in info.hosts)
    (run,) = aws.proxy.called("RunInstances")
    assert run["ImageId"] == aws.gpu_ami
    assert run["MinCount"] == run["MaxCount"] == "2"
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert (
        run["Placement.GroupName"] == "aios-big"
        and run["Placement.AvailabilityZone"] == "us-east-1c"
    )
    cards = sorted(
        int(k.split(".")[1])
        for k in run
        if k.startswith("NetworkInterface.") and k.endswith(".NetworkCardIndex")
    )
    assert (
        len(cards) == 33
    )  # an ENA primary and an EFA-only interface on every card of a p5.48xlarge
    assert (
        "NetworkInterface.1.InterfaceType" not in run
        and run["NetworkInterface.1.DeviceIndex"] == "0"
    )
    assert (
        run["NetworkInterface.2.InterfaceType"] == "efa-only"
        and run["NetworkInterface.2.DeviceIndex"] == "1"
    )
    assert run["NetworkInterface.2.NetworkCardIndex"] == "0"
    assert (
        run["NetworkInterface.3.InterfaceType"] == "efa-only"
        and run["NetworkInterface.3.DeviceIndex"] == "0"
    )
    assert run["NetworkInterface.33.NetworkCardIndex"] == "31"
    assert (
        "NetworkInterface.1.AssociatePublicIpAddress" not in run
    )  # not allowed with several interfaces
    types = {
        run[k] for k in run if k.startswith("TagSpecification.") and k.endswith(".ResourceType")
    }
    assert types == {"instance", "volume", "network-interface", "spot-instances-request"}
    (pg_call,) = aws.proxy.called("CreatePlacementGroup")
    assert pg_call["Strategy"] == "cluster"
    left = tagged(aws, "big")
    assert len(left["instances"]) == 2 and left["placement_groups"] == ["aios-big"]
    assert len(left["addresses"]) == 2  # one Elastic IP per multi-card host
    addrs = aws.ec2.describe_addresses(AllocationIds=left["addresses"])["Addresses"]
    assert all(a.get("AssociationId") for a in addrs)
    assert {h.ip for h in info.hosts} == {a["PublicIp"] for a in addrs}
    inst = aws.ec2.describe_instances(InstanceIds=left["instances"][:1])["Reservations"][0][
        "Instances"
    ][0]
    assert {t["Key"]: t["Value"] for t in inst["Tags"]}["team"] == "llm"
    assert info.labels == {"team": "llm"}

    # aios down: everything found by tag, even by a provider that never saw the launch
    make_provider().delete("big", None)
    assert nothing_left(aws, "big")


def test_capacity_errors_fail_over_to_next_zone(aws, make_provider, pubkey):
    aws.proxy.inject(
        "RunInstances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested.",
        zones=["us-east-1a", "us-east-1b"],
    )
    p = make_provider(zones=["us-east-1a", "us-east-1b", "us-east-1c"])
    req = p.validate(
        ClusterRequest(name="fo", accelerator="p4d.24xlarge", nodes=2, ssh_public_key=pubkey)
    )
    zones = p.zones(req.accelerator)
    assert zones == ["us-east-1a", "us-east-1b", "us-east-1c"]
    logs = []
    result = create_with_failover(p, req, zones, log=logs.append, sleep=lambda s: None)
    assert result.zone == "us-east-1c" and result.info.state == READY
    assert [(a.zone, a.kind) for a in result.attempts] == [
        ("us-east-1a", "stockout"),
        ("us-east-1b", "stockout"),
    ]
    tried = [c["Placement.AvailabilityZone"] for c in aws.proxy.called("RunInstances")]
    assert tried[-1] == "us-east-1c" and set(tried) == {"us-east-1a", "us-east-1b", "us-east-1c"}
    left = tagged(aws, "fo")
    assert (
        len(left["instances"]) == 2
        and len(left["security_groups"]) == 1
        and len(left["placement_groups"]) == 1
    )
    p.delete("fo", result.zone)
    assert nothing_left(aws, "fo")


def test_launch_failing_everywhere_leaves_nothing(aws, make_provider, pubkey):
    aws.proxy.inject("RunInstances", "InsufficientInstanceCapacity", "no capacity")
    p = make_provider(zones=["us-east-1a", "us-east-1d"])
    req = p.validate(
        ClusterRequest(
            name="none", accelerator="trn1.32xlarge", nodes=2, spot=True, ssh_public_key=pubkey
        )
    )
    with pytest.raises(CapacityError) as ei:
        create_with_failover(p, req, p.zones(req.accelerator), sleep=lambda s: None)
    line = ei.value.one_line()
    assert "\n" not in line and "us-east-1a (stockout)" in line and "us-east-1d (stockout)" in line
    # security group, key pair and placement group were created for each attempt, then removed
    assert (
        len(aws.proxy.called("CreateSecurityGroup")) == 2
        and len(aws.proxy.called("CreatePlacementGroup")) == 2
    )
    assert nothing_left(aws, "none")


def test_failure_after_instances_started_removes_them(aws, make_provider, pubkey):
    aws.proxy.inject(
        "AssociateAddress",
        "InvalidNetworkInterfaceID.NotFound",
        "The networkInterface ID 'eni-x' does not exist",
        status=400,
    )
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="half",
            accelerator="trn1.32xlarge",
            nodes=2,
            zone="us-east-1a",
            ssh_public_key=pubkey,
        )
    )
    with pytest.raises(CloudError) as ei:
        p.create(req)
    assert "InvalidNetworkInterfaceID" in str(ei.value)
    assert len(aws.proxy.called("RunInstances")) == 1 and aws.proxy.called("TerminateInstances")
    assert nothing_left(aws, "half")


def test_stop_start_on_demand_and_spot_cannot_stop(aws, make_provider, pubkey):
    p = make_provider()
    p.create(
        p.validate(
            ClusterRequest(
                name="od", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
            )
        )
    )
    p.stop("od", "us-east-1a")
    assert p.describe("od", "us-east-1a").state == STOPPED
    info = p.start("od", "us-east-1a")
    assert info.state == READY
    p.create(
        p.validate(
            ClusterRequest(
                name="sp",
                accelerator="trn1.2xlarge",
                zone="us-east-1a",
                spot=True,
                ssh_public_key=pubkey,
            )
        )
    )
    with pytest.raises(CloudError, match="cannot be stopped"):
        p.stop("sp", "us-east-1a")
    assert sorted(c.name for c in p.list()) == ["od", "sp"]
    for n in ("od", "sp"):
        p.delete(n, None)
        assert nothing_left(aws, n)
    assert p.describe("od", None) is None


def test_user_ami_key_pair_and_security_group_are_reused_not_deleted(aws, make_provider):
    vpc = aws.ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0][
        "VpcId"
    ]
    sg = aws.ec2.create_security_group(GroupName="mine", Description="user group", VpcId=vpc)[
        "GroupId"
    ]
    aws.ec2.create_key_pair(KeyName="my-key")
    p = make_provider(
        ami=aws.gpu_ami,
        key_name="my-key",
        ssh_private_key="/home/me/.ssh/my-key.pem",
        security_group_ids=[sg],
    )
    info = p.create(
        p.validate(ClusterRequest(name="reuse", accelerator="p4d.24xlarge", zone="us-east-1a"))
    )
    assert info.hosts[0].ssh_key == "/home/me/.ssh/my-key.pem"
    (run,) = aws.proxy.called("RunInstances")
    assert (
        run["KeyName"] == "my-key"
        and run["NetworkInterface.1.SecurityGroupId.1"] == sg
        and run["ImageId"] == aws.gpu_ami
    )
    assert not aws.proxy.called("CreateSecurityGroup") and not aws.proxy.called("ImportKeyPair")
    p.delete("reuse", None)
    assert nothing_left(aws, "reuse")
    assert aws.ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"]
    assert aws.ec2.describe_key_pairs(KeyNames=["my-key"])["KeyPairs"]


def test_instance_profile_checked_in_iam(aws, make_provider, pubkey):
    import boto3

    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=aws.endpoint)
    iam.create_instance_profile(InstanceProfileName="aios-nodes")
    p = make_provider(iam_instance_profile="aios-nodes")
    p.create(
        p.validate(
            ClusterRequest(
                name="prof", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
            )
        )
    )
    assert aws.proxy.called("RunInstances")[0]["IamInstanceProfile.Name"] == "aios-nodes"
    p.delete("prof", None)
    missing = make_provider(iam_instance_profile="nope")
    with pytest.raises(CloudError, match="instance profile 'nope' does not exist"):
        missing.create(
            missing.validate(
                ClusterRequest(
                    name="prof2",
                    accelerator="trn1.2xlarge",
                    zone="us-east-1a",
                    ssh_public_key=pubkey,
                )
            )
        )
    assert nothing_left(aws, "prof2")


def test_existing_cluster_name_is_refused(aws, make_provider, pubkey):
    p = make_provider()
    p.create(
        p.validate(
            ClusterRequest(
                name="dup", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
            )
        )
    )
    with pytest.raises(CloudError, match="already has instances"):
        p.create(
            p.validate(
                ClusterRequest(
                    name="dup", accelerator="trn1.2xlarge", zone="us-east-1b", ssh_public_key=pubkey
                )
            )
        )
    assert len(tagged(aws, "dup")["instances"]) == 1
    p.delete("dup", None)


def test_spot_reclaim_is_preempted_and_relaunch_is_ready(aws, make_provider, pubkey):
    from aios_cloud.provider.states import PREEMPTED
    from aios_cloud_aws.testing.moto import reclaim_spot

    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="sp2",
            accelerator="trn1.32xlarge",
            nodes=2,
            spot=True,
            zone="us-east-1a",
            ssh_public_key=pubkey,
        )
    )
    first = p.create(req)
    reclaim_spot([h.instance_id for h in first.hosts])
    info = p.describe("sp2", "us-east-1a")
    assert info is not None and info.state == PREEMPTED and info.preempted
    p.delete("sp2", "us-east-1a")  # what the managed recovery does before recreating
    again = p.create(req)
    # the reclaimed instances are still listed by EC2 (terminated); only the new launch counts
    info = p.describe("sp2", "us-east-1a")
    assert info.state == READY and not info.preempted
    assert {h.instance_id for h in info.hosts} == {h.instance_id for h in again.hosts}
    assert not {h.instance_id for h in info.hosts} & {h.instance_id for h in first.hosts}
    p.delete("sp2", None)
    assert nothing_left(aws, "sp2")
    assert p.describe("sp2", None) is None
