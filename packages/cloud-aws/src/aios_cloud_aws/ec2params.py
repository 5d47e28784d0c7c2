"""The EC2 API requests aios sends, built in one place for both :meth:`AwsProvider.create` and
``--dry-run`` (so the plan shows exactly what a launch would send). No boto3 import.
"""

from __future__ import annotations

from typing import Any

from aios_cloud_aws.catalog import InstanceType
from aios_cloud_aws.settings import AwsSettings

TAG_CLUSTER = "aios:cluster"
TAG_NODE = "aios:node"
TAG_MANAGED = "aios:managed-by"


def resource_name(cluster: str) -> str:
    """Name of the security group, key pair and placement group aios creates for ``cluster``."""
    return cluster if cluster.startswith("aios-") else f"aios-{cluster}"


def tags(cluster: str, labels: dict[str, str] | None = None, **extra: str) -> list[dict[str, str]]:
    out = {
        TAG_CLUSTER: cluster,
        TAG_MANAGED: "aios",
        **{k: str(v) for k, v in (labels or {}).items()},
        **extra,
    }
    return [{"Key": k, "Value": v} for k, v in out.items()]


def tag_spec(
    resource_type: str, cluster: str, labels: dict[str, str] | None = None, **extra: str
) -> dict[str, Any]:
    return {"ResourceType": resource_type, "Tags": tags(cluster, labels, **extra)}


def use_efa(settings: AwsSettings, itype: InstanceType, nodes: int) -> bool:
    if settings.efa == "off":
        return False
    if settings.efa == "on":
        return True
    return nodes > 1 and itype.efa_capable


#: EC2 begins to terminate a Capacity Block's instances this long before its end
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html)
BLOCK_RECLAIM_S = 1800
TAG_BLOCK = "aios:capacity-block"
TAG_BLOCK_END = "aios:capacity-block-end"


def use_placement_group(
    settings: AwsSettings, itype: InstanceType, nodes: int, capacity_block: bool = False
) -> bool:
    """Whether aios creates a cluster placement group. Never with a Capacity Block: "there is no
    need to use a cluster placement group with a Capacity Block" (its instances are already
    placed together, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html);
    an added group can leave reserved instances unusable (eksctl-io/eksctl#7949)."""
    if capacity_block:
        return False
    if settings.placement_group == "auto":
        return nodes > 1 and itype.efa_capable
    return bool(settings.placement_group)


def network_interfaces(
    settings: AwsSettings, itype: InstanceType, nodes: int, subnet_id: str, group_ids: list[str]
) -> list[dict[str, Any]]:
    """The layout of the current AWS guide for instances with several network cards
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): an ENA
    primary interface (card 0, device 0), an EFA-only interface on card 0 at device 1, and one
    EFA-only interface at device 0 on every further card: ``efa_interfaces`` EFA devices and one
    ENA (p5/p5e: 32, trn2.48xlarge: 16, trn1.32xlarge: 8, p4d: 4). A single interface gets a
    public IP unless ``aws.use_private_ip``; several cannot (EC2 rule), so those hosts get an
    Elastic IP."""
    efa = use_efa(settings, itype, nodes)
    first: dict[str, Any] = {
        "DeviceIndex": 0,
        "NetworkCardIndex": 0,
        "SubnetId": subnet_id,
        "Groups": list(group_ids),
        "DeleteOnTermination": True,
    }
    out = [first]
    if efa:
        for card in range(max(1, itype.efa_interfaces)):
            out.append(
                {
                    "DeviceIndex": 1 if card == 0 else 0,
                    "NetworkCardIndex": card,
                    "SubnetId": subnet_id,
                    "Groups": list(group_ids),
                    "DeleteOnTermination": True,
                    "InterfaceType": settings.efa_secondary_type,
                }
            )
    if len(out) == 1 and not settings.use_private_ip:
        first["AssociatePublicIpAddress"] = True
    return out


def needs_elastic_ips(settings: AwsSettings, itype: InstanceType, nodes: int) -> bool:
    return (
        not settings.use_private_ip and len(network_interfaces(settings, itype, nodes, "-", [])) > 1
    )


def run_instances_params(
    *,
    cluster: str,
    itype: InstanceType,
    nodes: int,
    zone: str,
    image_id: str,
    root_device: str,
    subnet_id: str,
    group_ids: list[str],
    key_name: str,
    settings: AwsSettings,
    spot: bool,
    placement_group: str | None,
    labels: dict[str, str] | None = None,
    client_token: str | None = None,
    disk_gb: int | None = None,
    reservation: str | None = None,
    capacity_block: bool = False,
    instance_profile: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``ec2.run_instances``: all ``nodes`` in one call with
    ``MinCount == MaxCount`` (all or nothing), IMDSv2 required, everything tagged."""
    params: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": itype.name,
        "MinCount": nodes,
        "MaxCount": nodes,
        "KeyName": key_name,
        "NetworkInterfaces": network_interfaces(settings, itype, nodes, subnet_id, group_ids),
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {
                    "VolumeSize": int(disk_gb or settings.disk_gb),
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ],
        "Placement": {
            "AvailabilityZone": zone,
            **({"GroupName": placement_group} if placement_group else {}),
        },
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 2,
        },
        "TagSpecifications": [
            tag_spec("instance", cluster, labels, Name=f"aios-{cluster}"),
            tag_spec("volume", cluster, labels),
            tag_spec("network-interface", cluster, labels),
        ],
    }
    if spot:
        spot_options: dict[str, Any] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        if settings.spot_max_price:
            spot_options["MaxPrice"] = f"{settings.spot_max_price:.4f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot_options}
        params["TagSpecifications"].append(tag_spec("spot-instances-request", cluster, labels))
    if reservation:
        # an On-Demand Capacity Reservation (ODCR) or a Capacity Block for ML: launch into it only
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": reservation}
        }
        if capacity_block:
            params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    profile = settings.iam_instance_profile or instance_profile
    if profile:
        key = "Arn" if profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: profile}
    if client_token:
        params["ClientToken"] = client_token[:64]
    return params


def security_group_egress(group_id: str) -> list[dict[str, Any]]:
    """All traffic to the group itself. EFA needs it in both directions, and EFA traffic is not
    IP, so the default ``0.0.0.0/0`` egress rule does not carry it: without this rule a
    multi-node EFA job hangs at its first collective
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security)."""
    return [
        {
            "IpProtocol": "-1",
            "UserIdGroupPairs": [
                {"GroupId": group_id, "Description": "aios cluster-internal (EFA/NCCL/rendezvous)"}
            ],
        }
    ]


def allows_itself(group: dict[str, Any]) -> list[str]:
    """The directions (``inbound``, ``outbound``) in which a described security group lacks an
    all-traffic rule to itself (EFA needs both; see :func:`security_group_egress`)."""
    gid = group["GroupId"]
    missing = []
    for way, key in (("inbound", "IpPermissions"), ("outbound", "IpPermissionsEgress")):
        if not any(
            p.get("IpProtocol") == "-1"
            and any(g.get("GroupId") == gid for g in p.get("UserIdGroupPairs", []))
            for p in group.get(key, [])
        ):
            missing.append(way)
    return missing


def security_group_rules(group_id: str, ssh_cidr: str) -> list[dict[str, Any]]:
    """SSH from ``ssh_cidr``; all traffic between the cluster's hosts (EFA, NCCL, rendezvous)."""
    return [
        {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [{"CidrIp": ssh_cidr, "Description": "aios ssh"}],
        },
        {
            "IpProtocol": "-1",
            "UserIdGroupPairs": [
                {"GroupId": group_id, "Description": "aios cluster-internal (EFA/NCCL/rendezvous)"}
            ],
        },
    ]


# ---------------------------------------------------------------------------- autostop rights
# The autostop agent on the head host stops or deletes its own cluster with the credentials of
# the instance profile (https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_use_switch-role-ec2.html):
# without one it has none, and its calls fail forever while the cluster bills on. aios
# provisions this profile (SkyPilot does the same) with exactly the calls the agent makes
# (:meth:`AwsProvider.stop` / :meth:`AwsProvider.delete`; actions as named in
# https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html); the
# changing ones only on resources tagged aios:cluster.
AUTOSTOP_PROFILE = "aios-autostop"
AGENT_DESCRIBE = [
    "ec2:DescribeInstances",
    "ec2:DescribeAddresses",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVolumes",
    "ec2:DescribePlacementGroups",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeKeyPairs",
]
AGENT_CHANGE = [
    "ec2:StopInstances",
    "ec2:TerminateInstances",
    "ec2:CancelSpotInstanceRequests",
    "ec2:DisassociateAddress",
    "ec2:ReleaseAddress",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteVolume",
    "ec2:DeletePlacementGroup",
    "ec2:DeleteSecurityGroup",
    "ec2:DeleteKeyPair",
]
# what each agent action calls (stop: describe + stop; down: everything delete() removes)
AGENT_ACTIONS = {
    "stop": ["ec2:DescribeInstances", "ec2:StopInstances"],
    "down": [a for a in AGENT_DESCRIBE + AGENT_CHANGE if a != "ec2:StopInstances"],
}
EC2_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def agent_policy() -> dict[str, Any]:
    """The role policy of :data:`AUTOSTOP_PROFILE`: describe anywhere (EC2's Describe calls take
    no resource conditions), change only what carries the aios:cluster tag."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AiosAgentDescribe",
                "Effect": "Allow",
                "Action": AGENT_DESCRIBE,
                "Resource": "*",
            },
            {
                "Sid": "AiosAgentStopDelete",
                "Effect": "Allow",
                "Action": AGENT_CHANGE,
                "Resource": "*",
                "Condition": {"StringLike": {f"ec2:ResourceTag/{TAG_CLUSTER}": "*"}},
            },
        ],
    }


def allowed(policies: list[dict[str, Any]], action: str) -> bool:
    """Whether any Allow statement of ``policies`` names ``action`` (wildcards as IAM reads
    them: ``ec2:*``, ``ec2:Stop*``). Conditions and Deny are not evaluated."""
    import fnmatch

    for doc in policies:
        stmts = doc.get("Statement", [])
        for st in stmts if isinstance(stmts, list) else [stmts]:
            if st.get("Effect") != "Allow":
                continue
            acts = st.get("Action", [])
            for a in [acts] if isinstance(acts, str) else acts:
                if fnmatch.fnmatchcase(action.lower(), a.lower()):
                    return True
    return False
