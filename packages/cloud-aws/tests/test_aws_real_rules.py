"""Rules of the real EC2 that moto does not enforce, enforced by the EC2 stand-in
(:mod:`aios_cloud_aws.testing.ec2proxy`, each rule with its documentation link there): EFA's
self-referencing egress rule, eventual consistency after RunInstances, capacity reservations in
a cluster placement group."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aios_cloud.failover import create_with_failover
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError
from aios_cloud.provider.states import READY
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
    from aios_cloud.provider.errors import CloudError

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


@pytest.mark.parametrize("acc", ["trn2.48xlarge", "trn1.32xlarge", "p5.48xlarge"])
def test_the_image_launched_ships_the_python_the_plan_runs(aws, make_provider, pubkey, acc):
    from aios_cloud_aws.testing.moto import image_runs

    zone = "us-east-2a" if acc.startswith("trn2") else "us-east-1a"  # trn2: not in us-east-1
    if zone.startswith("us-east-2"):
        aws.publish("us-east-2")
    p = make_provider()
    req = p.validate(ClusterRequest(name="img", accelerator=acc, zone=zone, ssh_public_key=pubkey))
    p.create(req)
    (run,) = aws.proxy.called("RunInstances")
    name = next(n for n, i in aws.images.items() if i == run["ImageId"]).split(":", 1)[-1]
    assert image_runs(name, p.python(acc)) is None, image_runs(name, p.python(acc))
    p.delete("img", None)


def test_default_gpu_image_is_a_dlami_in_patch_support(aws, make_provider):
    import datetime

    from aios_cloud_aws.settings import GPU_AMI_PARAMETER
    from aios_cloud_aws.testing.moto import DLAMIS

    (facts,) = [f for f in DLAMIS.values() if f.get("ssm") == GPU_AMI_PARAMETER]
    until = facts["patch_support_until"]
    assert until is None or datetime.date.fromisoformat(until) > datetime.date.today()
    ami, source = make_provider().resolve_ami("p5.48xlarge", "us-east-1")
    assert ami == aws.gpu_ami and GPU_AMI_PARAMETER in source


def _on_the_host(monkeypatch, imds):
    """The head host's environment: no keys of the laptop, only the instance's metadata service."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint + "/")


@pytest.mark.parametrize("action", ["down", "stop"])
def test_autostop_agent_acts_with_the_instance_profile_aios_attaches(
    aws, make_provider, pubkey, monkeypatch, action
):
    from aios_cloud.agent import act
    from aios_cloud_aws.testing.imds import ImdsServer

    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="as", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    req = p.prepare_autostop(req, action)  # before anything is billed
    info = p.create(req)
    (run,) = aws.proxy.called("RunInstances")
    assert run["IamInstanceProfile.Name"] == "aios-autostop"
    iid = info.hosts[0].instance_id
    with ImdsServer(credentials=lambda: aws.proxy.role_credentials_for(iid)) as imds:
        _on_the_host(monkeypatch, imds)
        cfg = {"cloud": "aws", "cluster": "as", "zone": info.zone, "action": action}
        act({**cfg, "settings": p.agent_settings()}, lambda m: None)
    assert aws.proxy.grants  # the calls were signed with the role's credentials
    state = aws.ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == ("terminated" if action == "down" else "stopped")
    monkeypatch.undo()
    p.delete("as", None)
    assert leftovers(aws.ec2, "as", aws.proxy) == {}


def _s3_only_profile(aws, name: str) -> None:
    """The user's own instance profile ``name``: its role may use S3 and describe EC2, no more
    (what a data-loading role looks like)."""
    import json

    import boto3
    from aios_cloud_aws.ec2params import EC2_TRUST

    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=aws.endpoint)
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(EC2_TRUST))
    only_s3 = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*", "ec2:Describe*"], "Resource": "*"}],
    }
    iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(only_s3))
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)


def test_autostop_set_later_attaches_the_profile_to_the_running_instances(
    aws, make_provider, pubkey, monkeypatch
):
    """`aios autostop NAME MIN` on a cluster launched without --autostop: its instances have no
    instance profile, so the agent would have no credentials and never stop anything. The
    profile is attached to the running instances first, and the agent then acts with it; a
    second call finds it attached and attaches nothing."""
    from aios_cloud.agent import act
    from aios_cloud_aws.testing.imds import ImdsServer

    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="later", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    info = p.create(req)
    (run,) = aws.proxy.called("RunInstances")
    assert "IamInstanceProfile.Name" not in run
    iid = info.hosts[0].instance_id
    assert aws.proxy.role_credentials_for(iid) is None  # what the agent would have had
    p.grant_autostop("later", info.zone, "stop")
    assert len(aws.proxy.called("AssociateIamInstanceProfile")) == 1
    p.grant_autostop("later", info.zone, "stop")  # already attached: nothing more
    assert len(aws.proxy.called("AssociateIamInstanceProfile")) == 1
    with ImdsServer(credentials=lambda: aws.proxy.role_credentials_for(iid)) as imds:
        _on_the_host(monkeypatch, imds)
        cfg = {"cloud": "aws", "cluster": "later", "zone": info.zone, "action": "stop"}
        act({**cfg, "settings": p.agent_settings()}, lambda m: None)
    state = aws.ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == "stopped"
    monkeypatch.undo()
    p.delete("later", None)
    assert leftovers(aws.ec2, "later", aws.proxy) == {}


def test_autostop_set_later_keeps_the_users_profile_and_names_what_it_lacks(
    aws, make_provider, pubkey
):
    from aios_cloud.provider.errors import CloudError

    _s3_only_profile(aws, "data")
    p = make_provider(iam_instance_profile="data")
    req = p.validate(
        ClusterRequest(
            name="own", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    info = p.create(req)
    with pytest.raises(CloudError) as ei:
        p.grant_autostop("own", info.zone, "down")
    assert "'data' does not allow" in str(ei.value) and "ec2:TerminateInstances" in str(ei.value)
    assert not aws.proxy.called("AssociateIamInstanceProfile")  # the user's profile stays
    p.delete("own", None)


def test_a_role_without_the_agents_rights_is_refused_at_launch(aws, make_provider, pubkey):
    from aios_cloud.provider.errors import CloudError

    _s3_only_profile(aws, "s3only")
    p = make_provider(iam_instance_profile="s3only")
    req = p.validate(
        ClusterRequest(
            name="no", accelerator="trn1.2xlarge", zone="us-east-1a", ssh_public_key=pubkey
        )
    )
    with pytest.raises(CloudError) as ei:
        p.prepare_autostop(req, "stop")
    assert "ec2:StopInstances" in str(ei.value) and "s3only" in str(ei.value)
    assert "ec2:DescribeInstances" not in ei.value.message  # Describe* covers it
    assert not aws.proxy.called("RunInstances")


def test_dry_run_of_autostop_shows_the_instance_profile(make_provider):
    p = make_provider()
    req = p.prepare_autostop(
        p.validate(ClusterRequest(name="d", accelerator="p5.48xlarge")), "stop", dry_run=True
    )
    cmds = [c.shell() for c in p.render_create(req)]
    assert any(c.startswith("aws iam create-role --role-name aios-autostop") for c in cmds)
    assert any("ec2:StopInstances" in c and "put-role-policy" in c for c in cmds)
    run = next(c for c in cmds if "run-instances" in c)
    assert '"IamInstanceProfile":{"Name":"aios-autostop"}' in run


def _block(aws, rid: str, start: float, end: float, zone: str = "us-east-1b") -> None:
    aws.proxy.capacity_reservations[rid] = {
        "zone": zone,
        "instance_type": "p5.48xlarge",
        "type": "capacity-block",
        "start": start,
        "end": end,
    }


def test_capacity_block_two_nodes_get_no_placement_group_of_aios(aws, make_provider, pubkey):
    """https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html: "there is
    no need to use a cluster placement group with a Capacity Block"; the stand-in refuses one."""
    import time as _time

    import boto3
    from botocore.exceptions import ClientError

    now = _time.time()
    _block(aws, "cr-0blk2", now - 60, now + 86400)
    # the stand-in's rule, through the real client: a group of one's own with the block is refused
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws.proxy.endpoint)
    ec2.create_placement_group(GroupName="mine", Strategy="cluster")
    with pytest.raises(ClientError, match="without a placement group of your own"):
        ec2.run_instances(
            ImageId=aws.gpu_ami,
            InstanceType="p5.48xlarge",
            MinCount=2,
            MaxCount=2,
            Placement={"AvailabilityZone": "us-east-1b", "GroupName": "mine"},
            CapacityReservationSpecification={
                "CapacityReservationTarget": {"CapacityReservationId": "cr-0blk2"}
            },
            InstanceMarketOptions={"MarketType": "capacity-block"},
        )
    ec2.delete_placement_group(GroupName="mine")
    aws.proxy.calls.clear()
    p = make_provider()
    req = p.validate(
        ClusterRequest(
            name="blk2",
            accelerator="p5.48xlarge",
            nodes=2,
            zone="us-east-1b",
            ssh_public_key=pubkey,
            extra={"reservation": "block:cr-0blk2"},
        )
    )
    assert p.plan_create(req)["placement_group"] is None
    info = p.create(req)
    assert info.state == READY and len(info.hosts) == 2
    (run,) = aws.proxy.called("RunInstances")
    assert "Placement.GroupName" not in run and not aws.proxy.called("CreatePlacementGroup")
    p.delete("blk2", None)


def test_capacity_block_dates_state_and_reclaim(aws, make_provider, pubkey):
    """A block is launched into only while active, and EC2 terminates its instances from 30
    minutes before its end with no spot notice
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html): aios reads
    the dates at launch, refuses a block that is not active (one line), and hands every host the
    reclaim time minus aws.capacity_block_margin as the ranks' deadline."""
    import time as _time

    from aios.launcher.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV
    from aios_cloud.provider.states import PREEMPTED
    from aios_cloud_aws.instances import _epoch

    now = _time.time()
    _block(aws, "cr-0later", now + 7200, now + 7200 + 86400)
    _block(aws, "cr-0over", now - 86400, now - 60)
    _block(aws, "cr-0now", now - 60, now + 1800 + 3600)
    p = make_provider(capacity_block_margin=120)

    def req(rid: str, name: str) -> ClusterRequest:
        return p.validate(
            ClusterRequest(
                name=name,
                accelerator="p5.48xlarge",
                zone="us-east-1b",
                ssh_public_key=pubkey,
                extra={"reservation": f"block:{rid}"},
            )
        )

    with pytest.raises(CloudError, match=r"capacity block cr-0later is scheduled: it starts at"):
        p.create(req("cr-0later", "later"))
    with pytest.raises(CloudError, match=r"capacity block cr-0over is expired, not active"):
        p.create(req("cr-0over", "over"))
    assert not aws.proxy.called("RunInstances")  # nothing launched blindly
    info = p.create(req("cr-0now", "now"))
    ids = sorted(h.instance_id for h in info.hosts)
    block = info.raw["capacity_block"]
    assert block["id"] == "cr-0now"
    assert _epoch(block["terminates_from"]) == pytest.approx(now + 3600, abs=2)
    env = p.remote_env(info)
    assert env[DEADLINE_SOURCE_ENV] == "capacity-block"
    assert float(env[DEADLINE_ENV]) == pytest.approx(now + 3600 - 120, abs=2)
    # the stand-in reclaims at end - 30 min: the instances go, and aios sees capacity that ended
    aws.proxy.clock = p.clock = lambda: now + 3600 + 1
    info = p.describe("now", "us-east-1b")
    assert info is not None and info.state == PREEMPTED
    assert sorted(iid for iid, _ in aws.proxy.reaped) == ids
    p.delete("now", None)


def test_capacity_block_offerings_follow_ec2s_rules(aws):
    """https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html: a
    block's length is whole days up to 14 days, whole weeks up to 182 days; a block holds 1 to
    64 instances; each offer carries its UpfrontFee (the whole block, paid when bought)."""
    import time as _time

    import boto3
    from botocore.exceptions import ClientError

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws.proxy.endpoint)
    now = _time.time()
    aws.proxy.capacity_block_offerings += [
        _offer("us-east-1b", now + 86400, 48, 5000.0),
        _offer("us-east-1c", now + 2 * 86400, 48, 5200.0),
        _offer("us-east-1b", now + 86400, 21 * 24, 52000.0),
    ]
    ask = {"InstanceType": "p5.48xlarge", "InstanceCount": 2}
    for hours, count in ((36, 2), (15 * 24, 2), (190 * 24, 2), (48, 65), (48, 0)):
        with pytest.raises(ClientError, match="InvalidParameterValue"):
            ec2.describe_capacity_block_offerings(
                **{**ask, "InstanceCount": count}, CapacityDurationHours=hours
            )
    with pytest.raises(ClientError, match="MissingParameter"):
        ec2.describe_capacity_block_offerings(InstanceCount=2, CapacityDurationHours=48)
    got = ec2.describe_capacity_block_offerings(**ask, CapacityDurationHours=48)
    offers = got["CapacityBlockOfferings"]
    assert [(o["AvailabilityZone"], o["UpfrontFee"]) for o in offers] == [
        ("us-east-1b", "5000.00"),
        ("us-east-1c", "5200.00"),
    ]
    assert {o["CapacityBlockDurationHours"] for o in offers} == {48}
    assert {o["CurrencyCode"] for o in offers} == {"USD"}
    weeks = ec2.describe_capacity_block_offerings(**ask, CapacityDurationHours=21 * 24)
    assert [o["UpfrontFee"] for o in weeks["CapacityBlockOfferings"]] == ["52000.00"]


def _offer(zone: str, start: float, hours: int, fee: float) -> dict:
    return {
        "instance_type": "p5.48xlarge",
        "count": 2,
        "zone": zone,
        "start": start,
        "end": start + hours * 3600,
        "fee": fee,
        "currency": "USD",
    }


def test_capacity_block_is_priced_by_its_upfront_fee(aws, make_provider, pubkey, tmp_path):
    """A Capacity Block is billed as an upfront fee for its term, not by the hour
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html):
    `aios cost --reservation block --hours H` shows EC2's offers (DescribeCapacityBlockOfferings)
    with the fee per hour; `--reservation block:cr-...` that block's fee where EC2 still offers
    its dates, else says it is on the bill; the launch plan says the fee, not the on-demand
    price."""
    import json
    import os
    import subprocess
    import sys
    import time as _time

    now = _time.time()
    start = now + 3 * 86400
    aws.proxy.capacity_block_offerings += [
        _offer("us-east-1b", start, 48, 5000.0),
        _offer("us-east-1c", start + 86400, 48, 5200.0),
    ]

    def cost(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "aios.cli.main", "cost", "--cloud", "aws"]
            + ["-a", "p5.48xlarge", "--nodes", "2", *args],
            env={**os.environ, "AIOS_HOME": str(tmp_path / "home")},
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = cost("--hours", "48", "--reservation", "block", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["fee"], row["hours"], row["currency"]) for row in rows] == [
        (5000.0, 48.0, "USD"),
        (5200.0, 48.0, "USD"),
    ]
    assert rows[0]["hourly"] == pytest.approx(5000 / 48)
    assert rows[0]["on_demand_hourly_usd"] == pytest.approx(2 * 55.04)
    r = cost("--hours", "48", "--reservation", "block")
    assert r.returncode == 0, r.stderr
    assert "upfront fee 5,000.00 USD for 48 h = 104.17 USD/h" in r.stdout, r.stdout
    assert "would be $110.08/h" in r.stdout
    p = make_provider()

    def priced(reservation: str, hours: float | None = None) -> list:
        req = ClusterRequest("c", "p5.48xlarge", nodes=2, extra={"reservation": reservation})
        return p.reservation_prices(req, hours=hours)

    # EC2 sells whole days up to 14 days, whole weeks after: 36 h asks for 48
    assert [x.fee for x in priced("block", 36)] == [5000.0, 5200.0]
    with pytest.raises(CloudError, match="add --hours"):
        priced("block")
    assert priced("cr-0odcr") == []  # an On-Demand Capacity Reservation: billed by the hour
    # a block of one's own: its fee where EC2 offers its very dates, else on the bill
    aws.proxy.capacity_reservations["cr-0fee"] = {
        **{"zone": "us-east-1b", "instance_type": "p5.48xlarge", "type": "capacity-block"},
        **{"count": 2, "start": start, "end": start + 48 * 3600},
    }
    aws.proxy.capacity_reservations["cr-0gone"] = {
        **{"zone": "us-east-1b", "instance_type": "p5.48xlarge", "type": "capacity-block"},
        **{"count": 2, "start": now - 60, "end": now + 86400},
    }
    r = cost("--reservation", "block:cr-0fee")
    assert r.returncode == 0, r.stderr
    assert "Capacity Block cr-0fee (2 x p5.48xlarge in us-east-1b" in r.stdout
    assert "upfront fee 5,000.00 USD for 48 h = 104.17 USD/h" in r.stdout, r.stdout
    (gone,) = priced("block:cr-0gone")
    assert gone.fee is None and "fee is on your bill" in gone.line() and "USD/h" not in gone.line()
    # the launch into a block says its fee, never the on-demand price
    aws.proxy.capacity_block_offerings.append(_offer("us-east-1b", now - 60, 24, 2400.0))
    aws.proxy.capacity_reservations["cr-0run"] = {
        **{"zone": "us-east-1b", "instance_type": "p5.48xlarge", "type": "capacity-block"},
        **{"count": 2, "start": now - 60, "end": now - 60 + 24 * 3600},
    }
    lines: list[str] = []
    p.log = lines.append
    req = p.validate(
        ClusterRequest(
            name="fee",
            accelerator="p5.48xlarge",
            nodes=2,
            zone="us-east-1b",
            ssh_public_key=pubkey,
            extra={"reservation": "block:cr-0run"},
        )
    )
    p.create(req)
    price = [ln for ln in lines if "price:" in ln]
    assert price and "upfront fee 2,400.00 USD for 24 h = 100.00 USD/h" in price[0], lines
    assert not any("110.08" in ln or "on-demand" in ln for ln in lines)
    # the run's shapes (aios status: cost so far) at the block's fee per hour, or no price
    # where EC2 does not tell the fee; the catalog's on-demand price only without a block
    from aios_cloud.records import request_dict
    from aios_cloud.shapes import record_hourly
    from aios_cloud.store import ClusterRecord

    def rec(request: ClusterRequest) -> ClusterRecord:
        return ClusterRecord(
            "fee", "aws", "us-east-1b", "p5.48xlarge", False, READY, hosts=[{}, {}],
            request=request_dict(request),
        )  # fmt: skip

    assert record_hourly(p, rec(req)) == pytest.approx(100.0)
    gone_req = replace(req, extra={"reservation": "block:cr-0gone"})
    assert record_hourly(p, rec(gone_req)) is None
    assert record_hourly(p, rec(replace(req, extra={}))) == pytest.approx(2 * 55.04)
    p.delete("fee", None)
