"""What exists in (moto's) AWS for a cluster: for tests asserting that nothing is left behind."""

from __future__ import annotations

from typing import Any

CLUSTER_TAG = "aios:cluster"


def tagged(ec2: Any, name: str, proxy: Any = None) -> dict[str, list[str]]:
    """Resources tagged ``aios:cluster=name`` (instances not terminated; placement groups from
    the EC2 proxy, which serves them)."""
    f = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [name]}]
    insts = [
        i
        for r in ec2.describe_instances(Filters=f)["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    out = {
        "instances": [i["InstanceId"] for i in insts],
        "security_groups": [
            g["GroupId"] for g in ec2.describe_security_groups(Filters=f)["SecurityGroups"]
        ],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=f)["KeyPairs"]],
        "addresses": [a["AllocationId"] for a in ec2.describe_addresses(Filters=f)["Addresses"]],
        "volumes": [
            v["VolumeId"]
            for v in ec2.describe_volumes(Filters=f)["Volumes"]
            if v["State"] != "deleted"
        ],
        "network_interfaces": [
            n["NetworkInterfaceId"]
            for n in ec2.describe_network_interfaces(Filters=f)["NetworkInterfaces"]
        ],
        "placement_groups": [],
    }
    if proxy is not None:
        out["placement_groups"] = [
            g.name for g in proxy.placement_groups.values() if g.tags.get(CLUSTER_TAG) == name
        ]
    return out


def leftovers(ec2: Any, name: str, proxy: Any = None) -> dict[str, list[str]]:
    return {k: v for k, v in tagged(ec2, name, proxy).items() if v}
