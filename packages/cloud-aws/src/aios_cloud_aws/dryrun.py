"""Dry-run rendering: the plan a create follows, and the ``aws`` commands equivalent to each
step, printed by ``--dry-run`` (no AWS call)."""

from __future__ import annotations

import shlex
from typing import Any

from aios_cloud.provider.data import CloudCommand, ClusterRequest
from aios_cloud.provider.errors import CloudError

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.base import _json
from aios_cloud_aws.ec2params import (
    AUTOSTOP_PROFILE,
    EC2_TRUST,
    TAG_BLOCK,
    TAG_BLOCK_END,
    TAG_CLUSTER,
    agent_policy,
    needs_elastic_ips,
    resource_name,
    run_instances_params,
    security_group_egress,
    security_group_rules,
    tag_spec,
    use_placement_group,
)
from aios_cloud_aws.iam import AwsIam


class AwsDryRun(AwsIam):
    """The EC2 provider's dry-run rendering."""

    # ------------------------------------------------------------------ dry run
    def plan_create(
        self,
        request: ClusterRequest,
        zone: str | None = None,
        resolved: dict[str, Any] | None = None,
        itype: cat.InstanceType | None = None,
    ) -> dict[str, Any]:
        """What :meth:`create` sends. Without ``resolved`` (``--dry-run``) ids not known yet
        appear as ``<...>`` placeholders; :meth:`create` passes the resolved ids and sends
        ``run_instances`` of this very plan (and the catalog entry it looked up)."""
        request = self.validate(request) if not request.region else request
        region = request.region or self.region
        itype = itype or cat.lookup(request.accelerator, region)
        zone = (
            zone
            or request.zone
            or (self.settings.zones[0] if self.settings.zones else f"{region}a")
        )
        r = resolved or {}
        kind, _, rid = (request.extra.get("reservation") or "").rpartition(":")
        pg = (
            r["placement_group"]
            if "placement_group" in r
            else (
                resource_name(request.name)
                if use_placement_group(self.settings, itype, request.nodes, kind == "block")
                else None
            )
        )
        sg = (
            r.get("group_ids")
            or list(self.settings.security_group_ids)
            or [f"<sg:{resource_name(request.name)}>"]
        )
        ami_kind, source = self.ami_source(itype)
        image = (
            r.get("image")
            or request.image
            or (f"<ssm:{source}>" if ami_kind == "ssm" else f"<newest amazon AMI named {source}>")
        )
        params = run_instances_params(
            reservation=rid or None,
            capacity_block=kind == "block",
            cluster=request.name,
            itype=itype,
            nodes=request.nodes,
            zone=zone,
            image_id=image,
            root_device=r.get("root_device", "/dev/sda1"),
            subnet_id=r.get("subnet_id")
            or (
                self.settings.subnet_ids[0]
                if self.settings.subnet_ids
                else f"<default subnet of {zone}>"
            ),
            group_ids=sg,
            key_name=r.get("key_name") or self.settings.key_name or resource_name(request.name),
            settings=self.settings,
            spot=request.spot,
            placement_group=pg,
            labels=request.labels,
            disk_gb=request.disk_gb,
            client_token=r.get("client_token"),
            instance_profile=request.extra.get("instance_profile"),
        )
        if kind == "block":
            # the block's id and end on every instance: `aios status` shows the end and each
            # host's ranks get the reclaim time as their deadline (remote_env)
            end = r.get("block_end") or "<the block's EndDate>"
            params["TagSpecifications"][0]["Tags"] += [
                {"Key": TAG_BLOCK, "Value": rid},
                {"Key": TAG_BLOCK_END, "Value": end},
            ]
        return {
            "region": region,
            "zone": zone,
            "instance_type": itype.name,
            "nodes": request.nodes,
            "spot": request.spot,
            "ami": request.image
            or (
                {"ssm_parameter": source}
                if ami_kind == "ssm"
                else {"name": source, "owner": "amazon"}
            ),
            "placement_group": pg,
            "efa_interfaces_per_node": sum(
                1 for n in params["NetworkInterfaces"] if "efa" in n.get("InterfaceType", "")
            ),
            "elastic_ips": needs_elastic_ips(self.settings, itype, request.nodes),
            # a Capacity Block is paid upfront when bought (DescribeCapacityBlockOfferings
            # UpfrontFee), not by the hour: no on-demand price for it
            "hourly_usd": round((itype.hourly(request.spot) or 0.0) * request.nodes, 4)
            if itype.hourly(request.spot) is not None and kind != "block"
            else None,
            "price": "the Capacity Block's upfront fee (paid when bought)"
            if kind == "block"
            else ("unknown price" if itype.hourly(request.spot) is None else "hourly"),
            "run_instances": params,
            "security_group_rules": None
            if self.settings.security_group_ids
            else security_group_rules(sg[0], self.settings.ssh_cidr),
        }

    def render_create(self, request: ClusterRequest) -> list[CloudCommand]:
        """The ``aws`` commands :meth:`create` is equivalent to, in its order: the autostop
        agent's IAM role, the AMI, the network (key pair, security group, placement group,
        Elastic IPs), then the instances."""
        self.offline = True
        plan = self.plan_create(request)
        return [
            *self._render_iam(request, plan),
            *self._render_ami(request, plan),
            *self._render_network(request, plan),
            *self._render_instances(request, plan),
        ]

    def _render_iam(self, request: ClusterRequest, plan: dict[str, Any]) -> list[CloudCommand]:
        """The autostop agent's role and instance profile (once per account)."""
        cmds: list[CloudCommand] = []
        if request.extra.get("instance_profile") == AUTOSTOP_PROFILE:
            role = AUTOSTOP_PROFILE
            return [
                CloudCommand(
                    [
                        "aws",
                        "iam",
                        "create-role",
                        "--role-name",
                        role,
                        "--assume-role-policy-document",
                        _json(EC2_TRUST),
                    ],
                    "once per account: the autostop agent's role (skipped when it exists)",
                ),
                CloudCommand(
                    [
                        "aws",
                        "iam",
                        "put-role-policy",
                        "--role-name",
                        role,
                        "--policy-name",
                        "aios-agent",
                        "--policy-document",
                        _json(agent_policy()),
                    ],
                    "exactly what the agent calls to stop/delete its cluster",
                ),
                CloudCommand(
                    ["aws", "iam", "create-instance-profile", "--instance-profile-name", role]
                ),
                CloudCommand(
                    [
                        "aws",
                        "iam",
                        "add-role-to-instance-profile",
                        "--instance-profile-name",
                        role,
                        "--role-name",
                        role,
                    ]
                ),
            ]
        return cmds

    def _render_ami(self, request: ClusterRequest, plan: dict[str, Any]) -> list[CloudCommand]:
        """Where the AMI id comes from (SSM parameter or the newest image of a name)."""
        region = plan["region"]
        cmds: list[CloudCommand] = []
        if not request.image and "name" in plan["ami"]:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "describe-images",
                        "--region",
                        region,
                        "--owners",
                        "amazon",
                        "--filters",
                        f"Name=name,Values={plan['ami']['name']}",
                        "Name=state,Values=available",
                        "--query",
                        "sort_by(Images,&CreationDate)[-1].ImageId",
                        "--output",
                        "text",
                    ],
                    "DLAMI id: the newest image of that name",
                )
            )
        elif not request.image:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ssm",
                        "get-parameter",
                        "--region",
                        region,
                        "--name",
                        plan["ami"]["ssm_parameter"],
                        "--query",
                        "Parameter.Value",
                        "--output",
                        "text",
                    ],
                    "DLAMI id",
                )
            )
        return cmds

    def _render_network(self, request: ClusterRequest, plan: dict[str, Any]) -> list[CloudCommand]:
        """The key pair and the security group, then :meth:`_render_placement`."""
        region, name = plan["region"], request.name
        cmds: list[CloudCommand] = []
        if not self.settings.key_name:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "import-key-pair",
                        "--region",
                        region,
                        "--key-name",
                        resource_name(name),
                        "--public-key-material",
                        "fileb://<aios public key>",
                        "--tag-specifications",
                        _json([tag_spec("key-pair", name, request.labels)]),
                    ],
                    "the aios SSH public key",
                )
            )
        if not self.settings.security_group_ids:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "create-security-group",
                        "--region",
                        region,
                        "--group-name",
                        resource_name(name),
                        "--description",
                        f"aios cluster {name}",
                        "--vpc-id",
                        "<default VPC>",
                        "--tag-specifications",
                        _json([tag_spec("security-group", name, request.labels)]),
                    ]
                )
            )
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "authorize-security-group-ingress",
                        "--region",
                        region,
                        "--group-id",
                        f"<sg:{resource_name(name)}>",
                        "--ip-permissions",
                        _json(plan["security_group_rules"]),
                    ],
                    "ssh in; all traffic between the hosts",
                )
            )
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "authorize-security-group-egress",
                        "--region",
                        region,
                        "--group-id",
                        f"<sg:{resource_name(name)}>",
                        "--ip-permissions",
                        _json(security_group_egress(f"<sg:{resource_name(name)}>")),
                    ],
                    "all traffic to the hosts themselves: EFA needs it both ways",
                )
            )
        return cmds + self._render_placement(request, plan)

    def _render_placement(
        self, request: ClusterRequest, plan: dict[str, Any]
    ) -> list[CloudCommand]:
        """The Capacity Block's dates, the reservation's placement group, the cluster placement
        group and the Elastic IPs."""
        region, name = plan["region"], request.name
        cmds: list[CloudCommand] = []
        block_kind, _, block_id = (request.extra.get("reservation") or "").rpartition(":")
        if block_kind == "block":
            margin = self.settings.capacity_block_margin
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "describe-capacity-reservations",
                        "--region",
                        region,
                        "--capacity-reservation-ids",
                        block_id,
                        "--query",
                        "CapacityReservations[0].[State,StartDate,EndDate]",
                        "--output",
                        "text",
                    ],
                    "the Capacity Block's dates: it must be active (--valid-after waits for a "
                    "scheduled one); EC2 terminates its instances from EndDate - 30 min, with no "
                    "spot notice, so every rank gets AIOS_RUN_DEADLINE = EndDate - 30 min - "
                    f"{margin:g} s (aws.capacity_block_margin) and the run commits its emergency "
                    "checkpoint before then; no placement group (the block is already placed)",
                )
            )
        if plan["placement_group"] and request.extra.get("reservation"):
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "describe-capacity-reservations",
                        "--region",
                        region,
                        "--capacity-reservation-ids",
                        plan["run_instances"]["CapacityReservationSpecification"][
                            "CapacityReservationTarget"
                        ]["CapacityReservationId"],
                        "--query",
                        "CapacityReservations[0].PlacementGroupArn",
                        "--output",
                        "text",
                    ],
                    "a reservation in a cluster placement group: launch into its group, not a new one",
                )
            )
        if plan["placement_group"]:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "create-placement-group",
                        "--region",
                        region,
                        "--group-name",
                        plan["placement_group"],
                        "--strategy",
                        "cluster",
                        "--tag-specifications",
                        _json([tag_spec("placement-group", name, request.labels)]),
                    ]
                )
            )
        if plan["elastic_ips"]:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "allocate-address",
                        "--region",
                        region,
                        "--domain",
                        "vpc",
                        "--tag-specifications",
                        _json([tag_spec("elastic-ip", name, request.labels)]),
                    ],
                    f"x{plan['nodes']}, before any instance: multi-card EFA hosts get no automatic public IP",
                )
            )
        return cmds

    def _render_instances(
        self, request: ClusterRequest, plan: dict[str, Any]
    ) -> list[CloudCommand]:
        """RunInstances (all or nothing), then the Elastic IPs' association."""
        region = plan["region"]
        cmds: list[CloudCommand] = []
        cmds.append(
            CloudCommand(
                [
                    "aws",
                    "ec2",
                    "run-instances",
                    "--region",
                    region,
                    "--cli-input-json",
                    _json(plan["run_instances"]),
                ],
                f"{plan['nodes']} x {plan['instance_type']} in {plan['zone']}; next zones on "
                "InsufficientInstanceCapacity",
            )
        )
        if plan["elastic_ips"]:
            cmds.append(
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "associate-address",
                        "--region",
                        region,
                        "--allocation-id",
                        "<each allocated address>",
                        "--network-interface-id",
                        "<primary interface of each instance>",
                    ]
                )
            )
        return cmds

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        region = self._region(zone)
        filt = [f"Name=tag:{TAG_CLUSTER},Values={name}"]
        live = "Name=instance-state-name,Values=pending,running,stopping,stopped"
        ids = (
            "$(aws ec2 describe-instances --region {r} --filters {t} {live} --query "
            "'Reservations[].Instances[].InstanceId' "
            "--output text)"
        ).format(r=region, t=shlex.quote(f"Name=tag:{TAG_CLUSTER},Values={name}"), live=live)
        if action in ("describe", "status", "list"):
            f = filt if action != "list" else [f"Name=tag-key,Values={TAG_CLUSTER}"]
            return [
                CloudCommand(
                    ["aws", "ec2", "describe-instances", "--region", region, "--filters", *f]
                )
            ]
        if action == "stop":
            return [
                CloudCommand(
                    ["aws", "ec2", "stop-instances", "--region", region, "--instance-ids", ids],
                    shell_args=(6,),
                )
            ]
        if action == "start":
            return [
                CloudCommand(
                    ["aws", "ec2", "start-instances", "--region", region, "--instance-ids", ids],
                    shell_args=(6,),
                )
            ]
        if action in ("delete", "down"):
            return [
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "terminate-instances",
                        "--region",
                        region,
                        "--instance-ids",
                        ids,
                    ],
                    shell_args=(6,),
                ),
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "release-address",
                        "--region",
                        region,
                        "--allocation-id",
                        "<each tagged Elastic IP>",
                    ]
                ),
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "delete-placement-group",
                        "--region",
                        region,
                        "--group-name",
                        resource_name(name),
                    ]
                ),
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "delete-security-group",
                        "--region",
                        region,
                        "--group-id",
                        f"<sg:{resource_name(name)}>",
                    ]
                ),
                CloudCommand(
                    [
                        "aws",
                        "ec2",
                        "delete-key-pair",
                        "--region",
                        region,
                        "--key-name",
                        resource_name(name),
                    ]
                ),
            ]
        raise CloudError(f"unknown action '{action}'", "use describe, start, stop, delete or list")
