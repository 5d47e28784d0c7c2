"""Network set-up for a cluster: the key pair, the subnet, the security group (EFA rules), the
cluster placement group and Elastic IPs (as ``sky/provision/aws/config.py``)."""

from __future__ import annotations

from functools import partial
from typing import Any

from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError

from aios_cloud_aws.base import ElasticIpQuotaError, _ignore_missing, _json
from aios_cloud_aws.ec2params import (
    TAG_CLUSTER,
    allows_itself,
    resource_name,
    security_group_egress,
    security_group_rules,
    tag_spec,
)
from aios_cloud_aws.errors import error_code, translate
from aios_cloud_aws.offerings import AwsOfferings


class AwsNetwork(AwsOfferings):
    """The EC2 provider's network set-up."""

    def _ensure_key_pair(self, ec2: Any, request: ClusterRequest) -> str:
        if self.settings.key_name:
            found = self._call(
                ec2,
                "DescribeKeyPairs",
                Filters=[{"Name": "key-name", "Values": [self.settings.key_name]}],
            )["KeyPairs"]
            if not found:
                raise CloudError(
                    f"key pair '{self.settings.key_name}' does not exist in {self.region}",
                    "create or import it in this region, or unset aws.key_name to let aios import its own key",
                )
            return self.settings.key_name
        if not request.ssh_public_key:
            raise CloudError(
                "no SSH public key to install on the hosts",
                "set aws.key_name to an existing key pair, or let aios create its key (aios launch does)",
            )
        name = resource_name(request.name)
        mine = self._call(
            ec2,
            "DescribeKeyPairs",
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [request.name]}],
        )["KeyPairs"]
        for kp in mine:  # re-import: the local key may have changed since the last launch
            self._call(ec2, "DeleteKeyPair", KeyName=kp["KeyName"])
        self._call(
            ec2,
            "ImportKeyPair",
            KeyName=name,
            PublicKeyMaterial=request.ssh_public_key.strip().encode(),
            TagSpecifications=[tag_spec("key-pair", request.name, request.labels)],
        )
        return name

    def _subnet(self, ec2: Any, zone: str) -> tuple[str, str]:
        if self.settings.subnet_ids:
            subnets = self._call(ec2, "DescribeSubnets", SubnetIds=list(self.settings.subnet_ids))[
                "Subnets"
            ]
            for s in subnets:
                if s["AvailabilityZone"] == zone:
                    return s["SubnetId"], s["VpcId"]
            raise CloudError(
                f"none of aws.subnet_ids is in {zone}",
                "add a subnet of that zone to aws.subnet_ids, or set aws.zones",
            )
        subnets = self._call(
            ec2,
            "DescribeSubnets",
            Filters=[
                {"Name": "availability-zone", "Values": [zone]},
                {"Name": "default-for-az", "Values": ["true"]},
            ],
        )["Subnets"]
        if not subnets:
            raise CloudError(
                f"{zone} has no default subnet",
                "create a default VPC (`aws ec2 create-default-vpc`) or set aws.subnet_ids",
            )
        return subnets[0]["SubnetId"], subnets[0]["VpcId"]

    def _ensure_security_group(
        self, ec2: Any, cluster: str, vpc_id: str, labels: dict[str, str]
    ) -> list[str]:
        if self.settings.security_group_ids:
            return list(self.settings.security_group_ids)
        name = resource_name(cluster)
        found = self._call(
            ec2,
            "DescribeSecurityGroups",
            Filters=[
                {"Name": "group-name", "Values": [name]},
                {"Name": "vpc-id", "Values": [vpc_id]},
            ],
        )["SecurityGroups"]
        if found:
            return [found[0]["GroupId"]]
        gid = self._call(
            ec2,
            "CreateSecurityGroup",
            GroupName=name,
            VpcId=vpc_id,
            Description=f"aios cluster {cluster}: ssh in, all traffic between its hosts",
            TagSpecifications=[tag_spec("security-group", cluster, labels)],
        )["GroupId"]
        self._call(
            ec2,
            "AuthorizeSecurityGroupIngress",
            GroupId=gid,
            IpPermissions=security_group_rules(gid, self.settings.ssh_cidr),
        )
        self._call(
            ec2,
            "AuthorizeSecurityGroupEgress",
            GroupId=gid,
            IpPermissions=security_group_egress(gid),
        )
        return [gid]

    def _check_efa_groups(self, ec2: Any, group_ids: list[str]) -> None:
        """A multi-node EFA launch into the user's own security groups: each must allow all
        traffic to and from itself, or the job hangs at its first collective
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security)."""
        groups = self._call(ec2, "DescribeSecurityGroups", GroupIds=list(group_ids))
        for g in groups["SecurityGroups"]:
            missing = allows_itself(g)
            if missing:
                gid = g["GroupId"]
                fix = (
                    f"aws ec2 authorize-security-group-egress --group-id {gid} --ip-permissions "
                    f"'{_json(security_group_egress(gid))}'"
                    if missing == ["outbound"]
                    else f"allow all traffic to and from {gid} itself (ingress and egress)"
                )
                raise CloudError(
                    f"security group {gid} allows no {' and no '.join(missing)} traffic to itself; "
                    "EFA needs both, or the multi-node job hangs at its first collective",
                    f"run `{fix}`, or unset aws.security_group_ids to let aios create the group",
                )

    def _ensure_placement_group(self, ec2: Any, cluster: str, labels: dict[str, str]) -> str:
        name = resource_name(cluster)
        try:
            found = ec2.describe_placement_groups(GroupNames=[name]).get("PlacementGroups", [])
        except Exception as exc:
            if not error_code(exc).startswith("InvalidPlacementGroup"):
                raise translate(exc, "DescribePlacementGroups") from exc
            found = []
        if not found:
            self._call(
                ec2,
                "CreatePlacementGroup",
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[tag_spec("placement-group", cluster, labels)],
            )
        return name

    def _allocate_elastic_ips(
        self, ec2: Any, cluster: str, n: int, labels: dict[str, str], region: str
    ) -> list[str]:
        got: list[str] = []
        for _ in range(n):
            try:
                alloc = ec2.allocate_address(
                    Domain="vpc", TagSpecifications=[tag_spec("elastic-ip", cluster, labels)]
                )
            except Exception as exc:
                if error_code(exc) != "AddressLimitExceeded":
                    raise translate(exc, "AllocateAddress") from exc
                for a in got:
                    _ignore_missing(partial(self._call, ec2, "ReleaseAddress", AllocationId=a))
                raise ElasticIpQuotaError(
                    f"the Elastic IP quota of {region} is used up (AddressLimitExceeded): {n} "
                    "nodes with several network "
                    f"cards need {n} Elastic IPs (one each), {len(got)} could be allocated",
                    "request more 'EC2-VPC Elastic IPs' (quota L-0263D0A3) in Service Quotas, "
                    "release unused addresses, "
                    "or set aws.use_private_ip=true (from inside the VPC)",
                ) from None
            got.append(alloc["AllocationId"])
        return got

    def _attach_elastic_ips(self, ec2: Any, ids: list[str], allocations: list[str]) -> None:
        reservations = self._call_new(ec2, "DescribeInstances", InstanceIds=ids)["Reservations"]
        insts = sorted(
            (i for r in reservations for i in r["Instances"]),
            key=lambda i: ids.index(i["InstanceId"]),
        )
        for inst, alloc in zip(insts, allocations, strict=False):
            primary = next(
                (
                    n
                    for n in inst.get("NetworkInterfaces", [])
                    if n.get("Attachment", {}).get("DeviceIndex", 0) == 0
                    and n.get("Attachment", {}).get("NetworkCardIndex", 0) == 0
                ),
                None,
            )
            kwargs: dict[str, Any] = {"AllocationId": alloc}
            if primary:
                kwargs["NetworkInterfaceId"] = primary["NetworkInterfaceId"]
            else:
                kwargs["InstanceId"] = inst["InstanceId"]
            self._call(ec2, "AssociateAddress", **kwargs)
