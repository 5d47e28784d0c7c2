"""Rules of the real EC2 that moto does not enforce, enforced by the EC2 stand-in
(:mod:`aios_cloud_aws.testing.ec2proxy`, each rule with its documentation link there): EFA's
self-referencing egress rule, eventual consistency after RunInstances, capacity reservations in
a cluster placement group."""

from __future__ import annotations

from aios_cloud.failover import create_with_failover
from aios_cloud.provider import READY, ClusterRequest
from aios_cloud_aws.testing.inventory import leftovers


def _egress_to_self(aws, gid):
    sg = aws.ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0]
    return [
        p
        for p in sg["IpPermissionsEgress"]
        if p["IpProtocol"] == "-1" and any(g["GroupId"] == gid for g in p["UserIdGroupPairs"])
    ]


def test_multinode_efa_group_allows_all_traffic_to_itself_both_ways(aws, make_provider, pubkey):
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="efa", accelerator="p5.48xlarge", nodes=2, zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    info = p.create(req)  # the stand-in refuses a multi-node EFA launch without the egress rule
    assert info.state == READY
    (gid,) = {v for k, v in aws.proxy.called("RunInstances")[0].items() if ".SecurityGroupId." in k}
    assert _egress_to_self(aws, gid)
    p.delete("efa", None)
    assert leftovers(aws.ec2, "efa", aws.proxy) == {}


def test_dry_run_shows_the_egress_rule(make_provider):
    p = make_provider()
    cmds = [
        c.shell()
        for c in p.render_create(ClusterRequest(name="efa", accelerator="p5.48xlarge", nodes=2))
    ]
    egress = [c for c in cmds if "authorize-security-group-egress" in c]
    assert (
        len(egress) == 1
        and '"GroupId":"<sg:aios-efa>"' in egress[0]
        and '"IpProtocol":"-1"' in egress[0]
    )


def test_user_security_group_without_egress_to_itself_is_refused_before_launch(
    aws, make_provider, pubkey
):
    vpc = aws.ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    gid = aws.ec2.create_security_group(GroupName="mine", Description="x", VpcId=vpc)["GroupId"]
    aws.ec2.authorize_security_group_ingress(
        GroupId=gid, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}]
    )
    p = make_provider(security_group_ids=[gid])
    req = p.validate(
        ClusterRequest(
            name="mine",
            accelerator="p4d.24xlarge",
            nodes=2,
            zone="us-east-1a",
            ssh_public_key=pubkey,
        )
    )
    import pytest
    from aios_cloud.provider import CloudError

    with pytest.raises(CloudError) as ei:
        p.create(req)
    assert gid in str(ei.value) and "authorize-security-group-egress" in ei.value.fix
    assert not aws.proxy.called("RunInstances")


def test_new_instances_not_yet_visible_are_retried_not_fatal(aws, make_provider, pubkey):
    aws.proxy.not_found_calls = 3  # EC2 answers NotFound for a new id a few times
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="ec",
            accelerator="trn1.32xlarge",
            nodes=2,
            zone="us-east-1a",
            ssh_public_key=pubkey,
        )
    )
    info = p.create(req)
    assert info.state == READY and [h.worker_id for h in info.hosts] == [0, 1]
    assert len(aws.proxy.called("RunInstances")) == 1  # no relaunch, no orphan
    p.delete("ec", None)
    assert leftovers(aws.ec2, "ec", aws.proxy) == {}


def test_not_found_at_terminate_is_confirmed_by_describe(aws, make_provider, pubkey):
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="tn", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    p.create(req)
    aws.proxy.inject(
        "TerminateInstances", "InvalidInstanceID.NotFound", "does not exist", status=400, times=2
    )
    p.delete("tn", None)
    assert len(aws.proxy.called("TerminateInstances")) == 3  # retried until EC2 took it
    assert leftovers(aws.ec2, "tn", aws.proxy) == {}


def test_failover_goes_on_after_not_found_in_a_zone(aws, make_provider, pubkey):
    aws.proxy.inject(
        "RunInstances", "InsufficientInstanceCapacity", "no capacity", zones=["us-east-1a"]
    )
    aws.proxy.not_found_calls = 2
    p = make_provider(zones=["us-east-1a", "us-east-1b"])
    req = p.validate(ClusterRequest(name="fo2", accelerator="trn1.2xlarge", ssh_public_key=pubkey))
    res = create_with_failover(p, req, p.zones(req.accelerator), sleep=lambda s: None)
    assert res.zone == "us-east-1b" and res.info.state == READY
    p.delete("fo2", None)


def test_reservation_in_a_cluster_placement_group_launches_into_that_group(
    aws, make_provider, pubkey
):
    # the reservation's group was created by its owner, not by aios
    from aios_cloud_aws.testing.ec2proxy import PlacementGroup

    aws.proxy.placement_groups["team-cpg"] = PlacementGroup("team-cpg", "cluster", "pg-0team")
    aws.proxy.capacity_reservations["cr-0cpg"] = {
        "zone": "us-east-1b",
        "instance_type": "p5.48xlarge",
        "type": "default",
        "placement_group": "team-cpg",
    }
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="cpg",
            accelerator="p5.48xlarge",
            nodes=2,
            zone="us-east-1b",
            ssh_public_key=pubkey,
            extra={"reservation": "cr-0cpg"},
        )
    )
    info = p.create(req)
    assert info.state == READY
    (run,) = aws.proxy.called("RunInstances")
    assert run["Placement.GroupName"] == "team-cpg"
    assert not aws.proxy.called("CreatePlacementGroup")
    p.delete("cpg", None)
    assert "team-cpg" in aws.proxy.placement_groups  # not aios's: never deleted
