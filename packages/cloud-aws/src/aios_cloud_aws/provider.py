"""The AWS EC2 :class:`aios_cloud.CloudProvider`: GPU (P4d/P5/P5e) and Trainium (Trn1/Trn2).

A cluster is ``nodes`` instances launched in one ``RunInstances`` call (``MinCount == MaxCount``:
all or nothing) in one availability zone, with everything aios creates tagged
``aios:cluster=NAME``: instances, volumes, network interfaces, spot requests, the security group,
the key pair, the cluster placement group and Elastic IPs. :meth:`delete` finds all of it by tag,
so ``aios down`` works even without the local record, and a failed create calls it before
raising (nothing is left behind).

Zones: the core's failover (:func:`aios_cloud.failover.create_with_failover`) calls
:meth:`create` once per availability zone; EC2 capacity errors (``InsufficientInstanceCapacity``
...) become :class:`CapacityError` so it moves on to the next zone.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aios.contract import CLOUD_ENV
from aios_cloud.provider import (
    FAILED,
    HEALTHY,
    PENDING,
    PREEMPTED,
    READY,
    STARTING,
    STOPPED,
    STOPPING,
    TERMINATED,
    UNHEALTHY,
    UNKNOWN,
    CatalogEntry,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    FailureKind,
    NotOfferedError,
    check_requirements,
)

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.ec2params import (
    AGENT_ACTIONS,
    AUTOSTOP_PROFILE,
    EC2_TRUST,
    TAG_CLUSTER,
    TAG_NODE,
    agent_policy,
    allowed,
    allows_itself,
    needs_elastic_ips,
    resource_name,
    run_instances_params,
    security_group_egress,
    security_group_rules,
    tag_spec,
    use_efa,
    use_placement_group,
)
from aios_cloud_aws.errors import TransientAwsError, error_code, translate
from aios_cloud_aws.session import Clients, region_of_zone
from aios_cloud_aws.settings import (
    DLAMI_PYTHON,
    SPOT_WATCH_ENV,
    AwsSettings,
    neuron_ami_parameter,
    neuron_image,
    settings_from,
)


class ElasticIpQuotaError(CloudError):
    """The region's Elastic IP quota cannot cover the launch. Regional: no zone would do better,
    so the failover stops (fatal)."""


# tries of a call naming just-launched instances (eventual consistency), backoff 1x..32x the poll
NOT_FOUND_RETRIES = 7
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
SPOT_TERMINATION_CODES = {"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"}


class AwsProvider(CloudProvider):
    """EC2 provider. ``config``: the resolved aios config (its ``aws`` section is read)."""

    name = "aws"
    storage_scheme = "s3"
    cli = "aws"

    def __init__(
        self,
        config: Any = None,
        settings: AwsSettings | None = None,
        log: Callable[[str], None] | None = None,
        poll_interval: float = 2.0,
        retry_capacity_errors: bool = False,
    ) -> None:
        self.config = config
        self.settings = settings or settings_from(config)
        self.region = self.settings.region
        self.clients = Clients(self.settings)
        self.log = log or (lambda m: None)
        self.poll_interval = poll_interval
        # RunInstances goes through a client without botocore retries: EC2 answers capacity
        # errors with HTTP 500, which botocore would retry (with backoff) in a zone that has no
        # capacity; the core's failover moves on at once, and retries transient errors itself.
        self.retry_capacity_errors = retry_capacity_errors
        self.default_ssh_user = self.settings.ssh_user
        # Set by render_create (--dry-run): answer from recorded data, never call AWS.
        self.offline = False

    # ------------------------------------------------------------------ helpers
    def _region(self, zone: str | None = None, region: str | None = None) -> str:
        if region:
            return region
        if zone:
            return region_of_zone(zone)
        return self.region

    def ec2(self, region: str | None = None) -> Any:
        return self.clients.client("ec2", region or self.region)

    def _call(self, client: Any, op: str, **kwargs: Any) -> Any:
        """Call ``op`` and translate AWS errors into one-line aios errors."""
        method = getattr(client, _snake(op))
        try:
            return method(**kwargs)
        except Exception as exc:
            err = translate(exc, op, client.meta.service_model.service_name)
            if err is exc:
                raise
            raise err from exc

    def _run_instances(self, runner: Any, params: dict[str, Any]) -> Any:
        """RunInstances; a just-created instance profile is not visible to EC2 for a few seconds
        ("Invalid IAM Instance Profile name", IAM is eventually consistent:
        https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency),
        so that one error is retried with backoff, bounded."""
        for attempt in range(NOT_FOUND_RETRIES):
            try:
                return self._call(runner, "RunInstances", **params)
            except CloudError as exc:
                code = error_code(exc.__cause__) if exc.__cause__ else ""
                iam_lag = code == "InvalidParameterValue" and "iam" in str(exc).lower()
                if (
                    not iam_lag
                    or "IamInstanceProfile" not in params
                    or attempt == NOT_FOUND_RETRIES - 1
                ):
                    raise
                time.sleep(min(30.0, self.poll_interval * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _call_new(self, client: Any, op: str, **kwargs: Any) -> Any:
        """:meth:`_call` for instances just launched: EC2 is eventually consistent, and a new
        id may answer ``InvalidInstanceID.NotFound`` for a while; "this does not mean the
        instance does not exist" (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html).
        Retried with exponential backoff, bounded (:data:`NOT_FOUND_RETRIES` tries), then the
        error stands."""
        for attempt in range(NOT_FOUND_RETRIES):
            try:
                return self._call(client, op, **kwargs)
            except CloudError as exc:
                code = error_code(exc.__cause__) if exc.__cause__ else ""
                if code != "InvalidInstanceID.NotFound" or attempt == NOT_FOUND_RETRIES - 1:
                    raise
                delay = min(30.0, self.poll_interval * 2**attempt)
                self.log(f"{op}: EC2 does not see the new instances yet; retrying in {delay:g}s")
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ catalog
    def catalog(self) -> list[CatalogEntry]:
        out = []
        for t in cat.INSTANCE_TYPES.values():
            out.append(
                CatalogEntry(
                    cloud="aws",
                    accelerator=t.name,
                    devices=t.accelerators,
                    device_kind=t.accelerator,
                    memory_gb=t.accelerator_memory_gib,
                    hosts=1,
                    runtime=self.settings.gpu_ami_parameter
                    if t.backend == "cuda"
                    else self.settings.neuron_ami_parameter or neuron_ami_parameter(t.name),
                    on_demand_hourly=t.on_demand_hourly,
                    spot_hourly=t.spot_hourly,
                    peak_tflops=t.peak_bf16_tflops,
                    zones=t.regions,
                    backend=t.backend,
                    extra={
                        "vcpus": t.vcpus,
                        "ram_gib": t.memory_gib,
                        "efa_interfaces": t.efa_interfaces,
                        "network_gbps": t.network_gbps,
                        **({"neuron_cores": t.neuron_cores} if t.neuron_cores else {}),
                    },
                )
            )
        return out

    def entry(self, accelerator: str) -> CatalogEntry:
        cat.lookup(accelerator)  # the AWS wording for an unknown type
        return super().entry(accelerator)

    def zones(self, accelerator: str) -> list[str]:
        """Availability zones of the active region offering ``accelerator`` (live), in failover
        order: ``aws.zones`` when set, the zones of ``aws.subnet_ids``, else every offering zone."""
        itype = cat.lookup(accelerator, self.region)
        if self.settings.zones:
            return list(self.settings.zones)
        if self.offline:
            return cat.region_zones(self.region)
        ec2 = self.ec2()
        if self.settings.subnet_ids:
            subnets = self._call(ec2, "DescribeSubnets", SubnetIds=list(self.settings.subnet_ids))[
                "Subnets"
            ]
            by_id = {s["SubnetId"]: s["AvailabilityZone"] for s in subnets}
            return [by_id[s] for s in self.settings.subnet_ids if s in by_id]
        resp = self._call(
            ec2,
            "DescribeInstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [itype.name]}],
        )
        zones = sorted({o["Location"] for o in resp.get("InstanceTypeOfferings", [])})
        if not zones:
            raise cat.RegionUnavailable(
                f"no availability zone of {self.region} offers {accelerator} now",
                f"use --region with one of: {', '.join(r for r in itype.regions if r != self.region)}",
            )
        return zones

    # ------------------------------------------------------------------ validation
    def validate(self, request: ClusterRequest) -> ClusterRequest:
        region = (
            request.region
            or (region_of_zone(request.zone) if request.zone else None)
            or self.settings.region
        )
        self.region = region
        itype = cat.lookup(request.accelerator, region)
        if request.zone and region_of_zone(request.zone) != region:
            raise CloudError(
                f"zone {request.zone} is not in region {region}",
                f"use a zone of {region} (e.g. {region}a)",
            )
        if request.nodes < 1:
            raise CloudError(
                f"--nodes must be at least 1, not {request.nodes}", "pass --nodes 1 or more"
            )
        if request.queued or request.valid_after or request.valid_until:
            raise CloudError(
                "--queued/--valid-after/--valid-until are Cloud TPU queued resources; EC2 has none",
                "drop them; for reserved EC2 capacity pass --reservation (a capacity block or ODCR id)",
            )
        if (
            request.zone
            and region in cat.REGION_ZONES
            and request.zone not in cat.REGION_ZONES[region]
        ):
            raise CloudError(
                f"zone {request.zone} does not exist in {region}",
                f"use one of: {', '.join(cat.REGION_ZONES[region])}",
            )
        reservation = request.extra.get("reservation")
        if reservation:
            kind, _, rid = reservation.rpartition(":")
            if not rid.startswith("cr-") or kind not in ("", "block"):
                raise CloudError(
                    f"--reservation {reservation} is not a capacity reservation id",
                    "pass cr-... (an On-Demand Capacity Reservation) or block:cr-... (a Capacity Block for ML)",
                )
            if request.spot:
                raise CloudError(
                    "--spot and --reservation contradict each other (reserved capacity is not spot)",
                    "pass only one",
                )
        if request.disk_gb is not None and request.disk_gb < 8:
            raise CloudError(
                f"--disk-gb {request.disk_gb} is too small for the root volume",
                "pass at least 8 (default: aws.disk_gb)",
            )
        if self.settings.efa == "on" and not itype.efa_capable:
            raise CloudError(
                f"{itype.name} has no EFA interfaces",
                "set aws.efa=auto or off, or pick an EFA type (p4d/p5/trn1.32xlarge/trn2)",
            )
        if request.spot and itype.spot_hourly is None:
            self.log(
                f"note: no recorded spot price for {itype.name}; it is mostly sold through capacity blocks"
            )
        image = self.settings.ami or (
            request.image if request.image and request.image.startswith("ami-") else None
        )
        ssh_user = self.settings.ssh_user if request.ssh_user in ("", "aios") else request.ssh_user
        return replace(
            request,
            region=region,
            image=image,
            ssh_user=ssh_user,
            disk_gb=request.disk_gb or self.settings.disk_gb,
        )

    # ------------------------------------------------------------------ AMI
    def ami_source(self, accelerator: str) -> tuple[str, str]:
        """Where the image of ``accelerator`` comes from: ``("ssm", PARAMETER)`` (a public SSM
        parameter AWS keeps pointing at the newest DLAMI) or ``("name", FILTER)`` (the newest
        Amazon-owned image whose name matches, through DescribeImages). The Neuron version sets
        name their DLAMI: since Neuron 2.32 the venv the plan runs ships only in the separate
        torch-neuronx DLAMI, not in the multi-framework one an SSM parameter names
        (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/dlami/index.html)."""
        itype = cat.lookup(accelerator)
        if itype.backend != "neuron":
            return "ssm", self.settings.gpu_ami_parameter
        if self.settings.neuron_ami_parameter:
            return "ssm", self.settings.neuron_ami_parameter
        image = neuron_image(itype.name)
        if image.get("ami_name_filter"):
            return "name", image["ami_name_filter"]
        return "ssm", neuron_ami_parameter(itype.name)

    def ami_parameter(self, accelerator: str) -> str:
        """The SSM parameter or the image name filter of :meth:`ami_source`."""
        return self.ami_source(accelerator)[1]

    def resolve_ami(
        self, accelerator: str, region: str, image: str | None = None
    ) -> tuple[str, str]:
        """``(ami_id, source)``: a user AMI, else the DLAMI id read from the public SSM parameter
        or found by name (the newest available Amazon-owned image)."""
        if image:
            return image, "user AMI"
        kind, name = self.ami_source(accelerator)
        if kind == "name":
            ec2 = self.ec2(region)
            images = self._call(
                ec2,
                "DescribeImages",
                Owners=["amazon"],
                Filters=[
                    {"Name": "name", "Values": [name]},
                    {"Name": "state", "Values": ["available"]},
                ],
            ).get("Images", [])
            if not images:
                raise CloudError(
                    f"no Amazon image named '{name}' in {region}",
                    "set aws.ami to a Neuron DLAMI id of this region (one that ships the venv "
                    f"{self.python(accelerator)} runs from)",
                )
            newest = max(images, key=lambda i: str(i.get("CreationDate", "")))
            return newest["ImageId"], f"newest Amazon image named {name}: {newest.get('Name')}"
        ssm = self.clients.client("ssm", region)
        value = self._call(ssm, "GetParameter", Name=name)["Parameter"]["Value"]
        return value, f"SSM {name}"

    def _root_device(self, ec2: Any, ami: str) -> str:
        images = self._call(ec2, "DescribeImages", ImageIds=[ami]).get("Images", [])
        if not images:
            raise CloudError(
                f"AMI {ami} is not available in this region",
                "set aws.ami to an AMI of this region, or unset it to use the DLAMI",
            )
        return images[0].get("RootDeviceName") or "/dev/sda1"

    # ------------------------------------------------------------------ create
    def create(self, request: ClusterRequest) -> ClusterInfo:
        request = request if request.region else self.validate(request)
        region = self._region(request.zone, request.region)
        itype = cat.lookup(request.accelerator, region)
        ec2 = self.ec2(region)
        zone = request.zone or self.zones(request.accelerator)[0]
        existing = self._instances(ec2, request.name)
        if any(i["State"]["Name"] != "shutting-down" for i in existing):
            raise CloudError(
                f"cluster {request.name} already has instances in {region}",
                f"use it, or `aios down {request.name}` first",
            )
        rid = (request.extra.get("reservation") or "").rpartition(":")[2]
        cr_group = None
        if rid:
            crs = self._call(ec2, "DescribeCapacityReservations", CapacityReservationIds=[rid]).get(
                "CapacityReservations", []
            )
            cr = crs[0] if crs else {}
            if cr.get("AvailabilityZone") != zone:
                raise NotOfferedError(
                    f"capacity reservation {rid} is in {cr.get('AvailabilityZone')}, not {zone}",
                    f"pass --zone {cr.get('AvailabilityZone')}",
                )
            if cr.get("InstanceType") != itype.name:
                raise CloudError(
                    f"capacity reservation {rid} is for {cr.get('InstanceType')}, not {itype.name}",
                    f"pass -a {cr.get('InstanceType')}",
                )
            if (cr.get("ReservationType") == "capacity-block") != request.extra[
                "reservation"
            ].startswith("block:"):
                want = "block:" + rid if cr.get("ReservationType") == "capacity-block" else rid
                raise CloudError(
                    f"capacity reservation {rid} is a {cr.get('ReservationType') or 'default'} reservation",
                    f"pass --reservation {want}",
                )
            if cr.get("PlacementGroupArn"):
                cr_group = cr["PlacementGroupArn"].rsplit("/", 1)[-1]
        try:
            ami, source = self.resolve_ami(request.accelerator, region, request.image)
            self.log(f"{request.name}: AMI {ami} ({source})")
            root = self._root_device(ec2, ami)
            self._check_instance_profile(region)
            key_name = self._ensure_key_pair(ec2, request)
            subnet_id, vpc_id = self._subnet(ec2, zone)
            group_ids = self._ensure_security_group(ec2, request.name, vpc_id, request.labels)
            if self.settings.security_group_ids and use_efa(self.settings, itype, request.nodes):
                self._check_efa_groups(ec2, group_ids)
            pg = None
            if cr_group:
                # a reservation made in a cluster placement group takes launches into that
                # group only (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cr-cpg.html)
                pg = cr_group
            elif use_placement_group(self.settings, itype, request.nodes):
                pg = self._ensure_placement_group(ec2, request.name, request.labels)
            # the very plan --dry-run prints, with the ids resolved
            params = self.plan_create(
                request,
                zone,
                resolved={
                    "image": ami,
                    "root_device": root,
                    "subnet_id": subnet_id,
                    "group_ids": group_ids,
                    "key_name": key_name,
                    "placement_group": pg,
                    "client_token": f"aios-{request.name}-{zone}-{uuid.uuid4().hex[:12]}",
                },
            )["run_instances"]
            eips: list[str] = []
            if needs_elastic_ips(self.settings, itype, request.nodes):
                # before any instance is launched: the Elastic IP quota is regional, so running
                # out must stop the launch here, not after paying for instances in every zone
                eips = self._allocate_elastic_ips(
                    ec2, request.name, request.nodes, request.labels, region
                )
            self.log(
                f"{request.name}: RunInstances {request.nodes} x {itype.name} in "
                f"{zone}{' (spot)' if request.spot else ''}"
            )
            runner = (
                ec2
                if self.retry_capacity_errors
                else self.clients.client("ec2", region, max_attempts=1)
            )
            resp = self._run_instances(runner, params)
            instances = sorted(resp["Instances"], key=lambda i: i.get("AmiLaunchIndex", 0))
            for idx, inst in enumerate(instances):
                self._call_new(
                    ec2,
                    "CreateTags",
                    Resources=[inst["InstanceId"]],
                    Tags=[{"Key": TAG_NODE, "Value": str(idx)}],
                )
            ids = [i["InstanceId"] for i in instances]
            self._wait_state(ec2, ids, "running", self.settings.launch_timeout)
            if eips:
                self._attach_elastic_ips(ec2, ids, eips)
            info = self.describe(request.name, zone)
            if info is None:  # pragma: no cover - just launched
                raise CloudError(
                    f"cluster {request.name} vanished right after launch", "retry the launch"
                )
            return info
        except BaseException as exc:
            self.log(
                f"{request.name}: launch in {zone} failed ({_first_line(exc)}); removing what was created"
            )
            try:
                self.delete(request.name, zone)
            except Exception as cleanup_exc:  # noqa: BLE001 - report the original error
                self.log(f"{request.name}: cleanup failed: {_first_line(cleanup_exc)}")
            raise

    # ------------------------------------------------------------------ autostop rights
    def prepare_autostop(
        self, request: ClusterRequest, action: str, dry_run: bool = False
    ) -> ClusterRequest:
        """The agent stops/deletes the cluster with the instance profile's credentials. With
        ``aws.iam_instance_profile`` set, its role must allow what the agent calls (checked in
        IAM, exit 2 naming what is missing); unset, aios creates (once per account) and attaches
        :data:`AUTOSTOP_PROFILE` with exactly those rights. Before anything is billed."""
        prof = self.settings.iam_instance_profile
        if prof:
            if not dry_run:
                self._require_agent_rights(
                    prof,
                    action,
                    "the cluster",
                    "add them to its role (on resources tagged aios:cluster), or unset "
                    f"aws.iam_instance_profile to let aios create '{AUTOSTOP_PROFILE}'",
                )
            return request
        if not dry_run:
            self._ensure_agent_profile()
        return replace(request, extra={**request.extra, "instance_profile": AUTOSTOP_PROFILE})

    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        """A cluster launched without ``--autostop`` has no instance profile (or the user's):
        its instances get the one :meth:`prepare_autostop` would have given them, attached to
        the running instances (``AssociateIamInstanceProfile``), before the agent is installed.
        An instance that already carries a profile keeps it (replacing it would take the user's
        own rights away): its role must allow the agent's calls, or this names what is missing."""
        ec2 = self.ec2(self._region(zone))
        ids = [
            i["InstanceId"] for i in self._instances(ec2, name, ["pending", "running", "stopped"])
        ]
        if not ids:
            raise CloudError(f"cluster {name} has no instances", f"aios status {name} --refresh")
        # the associations EC2 knows (a profile given at launch is one too)
        held: dict[str, str] = {}
        for a in self._call(
            ec2,
            "DescribeIamInstanceProfileAssociations",
            Filters=[{"Name": "instance-id", "Values": ids}],
        ).get("IamInstanceProfileAssociations", []):
            if a.get("State") in ("associating", "associated"):
                held[a["InstanceId"]] = a["IamInstanceProfile"]["Arn"].rsplit("/", 1)[-1]
        for prof in sorted(set(held.values())):
            self._require_agent_rights(
                prof,
                action,
                name,
                "add them to its role (on resources tagged aios:cluster), then run "
                "`aios autostop` again",
            )
        bare = [i for i in ids if i not in held]
        if not bare:
            return
        req = self.prepare_autostop(ClusterRequest(name=name, accelerator="", zone=zone), action)
        prof = self.settings.iam_instance_profile or req.extra.get("instance_profile")
        assert prof
        spec = {"Arn": prof} if prof.startswith("arn:") else {"Name": prof}
        for iid in bare:
            for attempt in range(NOT_FOUND_RETRIES):  # a new profile: IAM is eventually consistent
                try:
                    self._call(
                        ec2, "AssociateIamInstanceProfile", IamInstanceProfile=spec, InstanceId=iid
                    )
                    break
                except CloudError as exc:
                    code = error_code(exc.__cause__) if exc.__cause__ else ""
                    if code != "InvalidParameterValue" or attempt == NOT_FOUND_RETRIES - 1:
                        raise
                    time.sleep(min(30.0, self.poll_interval * 2**attempt))
        self.log(
            f"{name}: instance profile {prof.rsplit('/', 1)[-1]} attached to {len(bare)} "
            f"instance(s): the autostop agent may {action} the cluster"
        )

    def _require_agent_rights(self, prof: str, action: str, what: str, fix: str) -> None:
        """Instance profile ``prof``'s role must allow every call the agent makes to ``action``
        ``what``, read from IAM; else one line naming what is missing."""
        docs = self._profile_policies(prof)
        missing = [a for a in AGENT_ACTIONS[action] if not allowed(docs, a)]
        if missing:
            raise CloudError(
                f"the autostop agent could not {action} {what}: instance profile '{prof}' does "
                f"not allow {', '.join(missing)}",
                fix,
            )

    def _iam_fix(self) -> str:
        return (
            f"ask an admin to create instance profile {AUTOSTOP_PROFILE} (the IAM commands of "
            "`aios launch --autostop N ... --dry-run`) or to grant you iam:CreateRole, "
            "iam:PutRolePolicy, iam:CreateInstanceProfile, iam:AddRoleToInstanceProfile and "
            "iam:PassRole; or set aws.iam_instance_profile to a profile that may stop/terminate "
            "the cluster"
        )

    def _ensure_agent_profile(self) -> None:
        iam = self.clients.client("iam", self.region)
        try:
            try:
                roles = iam.get_instance_profile(InstanceProfileName=AUTOSTOP_PROFILE)[
                    "InstanceProfile"
                ]["Roles"]
            except Exception as exc:
                if error_code(exc) != "NoSuchEntity":
                    raise
                roles = None
            if roles is None:
                self.log(f"creating IAM instance profile {AUTOSTOP_PROFILE} for the autostop agent")
                try:
                    iam.create_role(
                        RoleName=AUTOSTOP_PROFILE,
                        AssumeRolePolicyDocument=json.dumps(EC2_TRUST),
                        Description="aios autostop agent: stops/deletes its own aios cluster",
                        Tags=[{"Key": "aios:managed-by", "Value": "aios"}],
                    )
                except Exception as exc:
                    if error_code(exc) != "EntityAlreadyExists":
                        raise
                iam.create_instance_profile(InstanceProfileName=AUTOSTOP_PROFILE)
                roles = []
            if not any(r.get("RoleName") == AUTOSTOP_PROFILE for r in roles):
                iam.add_role_to_instance_profile(
                    InstanceProfileName=AUTOSTOP_PROFILE, RoleName=AUTOSTOP_PROFILE
                )
            # always (re)written: the rights follow what this aios version's agent calls
            iam.put_role_policy(
                RoleName=AUTOSTOP_PROFILE,
                PolicyName="aios-agent",
                PolicyDocument=json.dumps(agent_policy()),
            )
        except Exception as exc:
            code = error_code(exc)
            if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
                raise CloudError(
                    f"aios may not create the IAM instance profile the autostop agent needs "
                    f"({code})",
                    self._iam_fix(),
                ) from None
            raise translate(exc, "CreateInstanceProfile", "iam") from exc

    def _profile_policies(self, prof: str) -> list[dict[str, Any]]:
        """The policy documents of the roles of instance profile ``prof``."""
        iam = self.clients.client("iam", self.region)
        name = prof.rsplit("/", 1)[-1]
        try:
            roles = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
            docs: list[dict[str, Any]] = []
            for role in roles:
                rn = role["RoleName"]
                for pn in iam.list_role_policies(RoleName=rn)["PolicyNames"]:
                    docs.append(
                        _doc(iam.get_role_policy(RoleName=rn, PolicyName=pn)["PolicyDocument"])
                    )
                for ap in iam.list_attached_role_policies(RoleName=rn)["AttachedPolicies"]:
                    pol = iam.get_policy(PolicyArn=ap["PolicyArn"])["Policy"]
                    ver = iam.get_policy_version(
                        PolicyArn=ap["PolicyArn"], VersionId=pol["DefaultVersionId"]
                    )
                    docs.append(_doc(ver["PolicyVersion"]["Document"]))
            return docs
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise CloudError(
                    f"IAM instance profile '{name}' does not exist",
                    f"create it, or unset aws.iam_instance_profile to let aios create "
                    f"'{AUTOSTOP_PROFILE}'",
                ) from None
            raise translate(exc, "GetInstanceProfile", "iam") from exc

    def _check_instance_profile(self, region: str) -> None:
        prof = self.settings.iam_instance_profile
        if not prof or prof.startswith("arn:"):
            return
        iam = self.clients.client("iam", region)
        try:
            iam.get_instance_profile(InstanceProfileName=prof)
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise CloudError(
                    f"IAM instance profile '{prof}' does not exist",
                    "create it (`aws iam create-instance-profile`) with a role that can "
                    "read/write your S3 bucket, or unset aws.iam_instance_profile",
                ) from None
            raise translate(exc, "GetInstanceProfile", "iam") from exc

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
                    _ignore_missing(lambda a=a: self._call(ec2, "ReleaseAddress", AllocationId=a))
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

    def _wait_state(
        self, ec2: Any, ids: list[str], target: str, timeout: float
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            insts = [
                i
                for r in self._call_new(ec2, "DescribeInstances", InstanceIds=ids)["Reservations"]
                for i in r["Instances"]
            ]
            states = {i["State"]["Name"] for i in insts}
            if states == {target}:
                return insts
            if target == "running" and states & {"shutting-down", "terminated"}:
                reasons = {i.get("StateReason", {}).get("Code", "") for i in insts}
                if reasons & SPOT_TERMINATION_CODES or any("Spot" in r for r in reasons):
                    from aios_cloud.provider import CapacityError

                    raise CapacityError(
                        "spot capacity was reclaimed while the instances booted",
                        "aios tries the next availability zone",
                    )
                raise CloudError(
                    "instances terminated while booting "
                    f"({', '.join(sorted(r for r in reasons if r)) or 'no reason given'})",
                    "check the AMI and the account's EC2 console for the reason",
                )
            if time.monotonic() > deadline:
                raise TransientAwsError(
                    f"instances did not reach {target} within {timeout:.0f}s (now: {', '.join(sorted(states))})",
                    "retry, or raise aws.launch_timeout",
                )
            time.sleep(self.poll_interval)

    # ------------------------------------------------------------------ describe / list
    def _instances(
        self, ec2: Any, cluster: str | None, states: list[str] | None = None
    ) -> list[dict[str, Any]]:
        filters = [{"Name": "instance-state-name", "Values": states or LIVE_STATES}]
        filters.append(
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}
            if cluster
            else {"Name": "tag-key", "Values": [TAG_CLUSTER]}
        )
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Filters": filters}
            if token:
                kwargs["NextToken"] = token
            resp = self._call(ec2, "DescribeInstances", **kwargs)
            for r in resp.get("Reservations", []):
                for i in r["Instances"]:
                    i.setdefault("ReservationId", r.get("ReservationId"))
                    out.append(i)
            token = resp.get("NextToken")
            if not token:
                return out

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        ec2 = self.ec2(self._region(zone))
        insts = self._instances(ec2, name, [*LIVE_STATES, "terminated"])
        if not insts:
            return None
        # Terminated instances stay visible for a while: only the newest launch (one
        # RunInstances call = one reservation) describes the cluster now.
        newest = max(
            insts, key=lambda i: (str(i.get("LaunchTime", "")), i.get("ReservationId") or "")
        )
        insts = [i for i in insts if i.get("ReservationId") == newest.get("ReservationId")]
        live = [i for i in insts if i["State"]["Name"] != "terminated"]
        spot_lost = [
            i
            for i in insts
            if i["State"]["Name"] in ("shutting-down", "terminated")
            and i.get("StateReason", {}).get("Code") in SPOT_TERMINATION_CODES
        ]
        if not live and not spot_lost:
            return None
        return self._info(name, live or spot_lost, preempted=bool(spot_lost), ec2=ec2)

    def _info(
        self, name: str, insts: list[dict[str, Any]], preempted: bool, ec2: Any | None = None
    ) -> ClusterInfo:
        insts = sorted(insts, key=_node_index)
        states = {i["State"]["Name"] for i in insts}
        if preempted:
            state = PREEMPTED
        elif states == {"running"}:
            state = READY
        elif "pending" in states:
            state = (
                PENDING
                if states <= {"pending", "running"} and "running" not in states
                else STARTING
            )
        elif "stopping" in states:
            state = STOPPING
        elif states == {"stopped"}:
            state = STOPPED
        elif states & {"shutting-down", "terminated"}:
            state = TERMINATED if states <= {"shutting-down", "terminated"} else FAILED
        else:
            state = UNKNOWN
        first = insts[0]
        tagmap = _tags(first)
        itype = first["InstanceType"]
        key = self.settings.ssh_private_key
        hosts = []
        for i in insts:
            private = i.get("PrivateIpAddress")
            public = i.get("PublicIpAddress")
            ip = private if (self.settings.use_private_ip or not public) else public
            if not ip:
                continue
            hosts.append(
                ClusterHost(
                    worker_id=_node_index(i),
                    ip=ip,
                    internal_ip=private,
                    ssh_user=self.settings.ssh_user,
                    ssh_key=key,
                    port=22,
                    instance_id=i["InstanceId"],
                )
            )
        health, detail = (UNKNOWN, "")
        if state == READY and ec2 is not None:
            health, detail = self._health(ec2, [i["InstanceId"] for i in insts])
        spot = any(i.get("InstanceLifecycle") == "spot" for i in insts)
        launch = min((i.get("LaunchTime") for i in insts if i.get("LaunchTime")), default=None)
        return ClusterInfo(
            name=name,
            cloud="aws",
            zone=first.get("Placement", {}).get("AvailabilityZone"),
            accelerator=itype,
            state=state,
            health=health,
            health_detail=detail,
            spot=spot,
            hosts=hosts,
            runtime=first.get("ImageId"),
            labels={k: v for k, v in tagmap.items() if not k.startswith("aios:") and k != "Name"},
            created=launch.isoformat()
            if hasattr(launch, "isoformat")
            else (str(launch) if launch else None),
            raw={
                "instances": [
                    {
                        "id": i["InstanceId"],
                        "state": i["State"]["Name"],
                        "zone": i.get("Placement", {}).get("AvailabilityZone"),
                        "private_ip": i.get("PrivateIpAddress"),
                        "public_ip": i.get("PublicIpAddress"),
                        "lifecycle": i.get("InstanceLifecycle", "on-demand"),
                        "state_reason": i.get("StateReason", {}).get("Code"),
                    }
                    for i in insts
                ],
                "region": region_of_zone(first["Placement"]["AvailabilityZone"])
                if first.get("Placement", {}).get("AvailabilityZone")
                else self.region,
            },
        )

    def _health(self, ec2: Any, ids: list[str]) -> tuple[str, str]:
        try:
            resp = ec2.describe_instance_status(InstanceIds=ids, IncludeAllInstances=True)
        except Exception:  # noqa: BLE001 - health is best effort
            return UNKNOWN, ""
        bad = []
        for s in resp.get("InstanceStatuses", []):
            for kind in ("InstanceStatus", "SystemStatus"):
                status = s.get(kind, {}).get("Status")
                if status == "impaired":
                    bad.append(f"{s['InstanceId']} {kind} impaired")
        if bad:
            return UNHEALTHY, "; ".join(bad)
        return HEALTHY, ""

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        ec2 = self.ec2(self._region(zone))
        groups: dict[str, list[dict[str, Any]]] = {}
        for inst in self._instances(ec2, None):
            groups.setdefault(_tags(inst).get(TAG_CLUSTER, "?"), []).append(inst)
        return [
            self._info(n, insts, preempted=False, ec2=None) for n, insts in sorted(groups.items())
        ]

    # ------------------------------------------------------------------ start / stop / delete
    def _ids(self, ec2: Any, name: str) -> list[str]:
        from aios_cloud.provider import ClusterNotFound

        insts = self._instances(ec2, name)
        if not insts:
            raise ClusterNotFound(
                f"no instances of cluster {name} in {self.region}",
                "check the name with `aios status`, or pass the right --region",
            )
        return [i["InstanceId"] for i in insts]

    def stop(self, name: str, zone: str | None) -> None:
        ec2 = self.ec2(self._region(zone))
        insts = self._instances(ec2, name)
        if any(i.get("InstanceLifecycle") == "spot" for i in insts):
            raise CloudError(
                f"cluster {name} runs on one-time spot instances, which cannot be stopped",
                f"use `aios down {name}` (a managed run relaunches it)",
            )
        ids = self._ids(ec2, name)
        self._call(ec2, "StopInstances", InstanceIds=ids)
        self._wait_state(ec2, ids, "stopped", self.settings.launch_timeout)

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        ec2 = self.ec2(self._region(zone))
        ids = self._ids(ec2, name)
        self._call(ec2, "StartInstances", InstanceIds=ids)
        self._wait_state(ec2, ids, "running", self.settings.launch_timeout)
        info = self.describe(name, zone)
        assert info is not None
        return info

    def delete(self, name: str, zone: str | None) -> None:
        """Remove everything tagged ``aios:cluster=name`` in the region. Idempotent."""
        ec2 = self.ec2(self._region(zone))
        cluster_filter = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [name]}]
        insts = self._instances(ec2, name)
        spot_requests = [
            i["SpotInstanceRequestId"] for i in insts if i.get("SpotInstanceRequestId")
        ]
        if spot_requests:
            _ignore_missing(
                lambda: self._call(
                    ec2, "CancelSpotInstanceRequests", SpotInstanceRequestIds=spot_requests
                )
            )
        ids = [i["InstanceId"] for i in insts]
        if ids:
            self.log(f"{name}: terminating {len(ids)} instance(s)")
            self._terminate(ec2, ids)
            self._wait_state(ec2, ids, "terminated", self.settings.launch_timeout)
        for addr in self._call(ec2, "DescribeAddresses", Filters=cluster_filter).get(
            "Addresses", []
        ):
            if addr.get("AssociationId"):
                _ignore_missing(
                    lambda a=addr: self._call(
                        ec2, "DisassociateAddress", AssociationId=a["AssociationId"]
                    )
                )
            _ignore_missing(
                lambda a=addr: self._call(ec2, "ReleaseAddress", AllocationId=a["AllocationId"])
            )
        for eni in self._call(
            ec2,
            "DescribeNetworkInterfaces",
            Filters=[*cluster_filter, {"Name": "status", "Values": ["available"]}],
        ).get("NetworkInterfaces", []):
            _ignore_missing(
                lambda e=eni: self._call(
                    ec2, "DeleteNetworkInterface", NetworkInterfaceId=e["NetworkInterfaceId"]
                )
            )
        for vol in self._call(
            ec2,
            "DescribeVolumes",
            Filters=[*cluster_filter, {"Name": "status", "Values": ["available"]}],
        ).get("Volumes", []):
            _ignore_missing(lambda v=vol: self._call(ec2, "DeleteVolume", VolumeId=v["VolumeId"]))
        for pg in self._call(ec2, "DescribePlacementGroups", Filters=cluster_filter).get(
            "PlacementGroups", []
        ):
            _ignore_missing(
                lambda p=pg: self._call(ec2, "DeletePlacementGroup", GroupName=p["GroupName"])
            )
        for sg in self._call(ec2, "DescribeSecurityGroups", Filters=cluster_filter).get(
            "SecurityGroups", []
        ):
            self._delete_security_group(ec2, sg["GroupId"])
        for kp in self._call(ec2, "DescribeKeyPairs", Filters=cluster_filter).get("KeyPairs", []):
            _ignore_missing(lambda k=kp: self._call(ec2, "DeleteKeyPair", KeyName=k["KeyName"]))

    def _terminate(self, ec2: Any, ids: list[str]) -> None:
        """TerminateInstances. Its ``InvalidInstanceID.NotFound`` "does not mean the instance
        was or will be terminated" (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html):
        DescribeInstances confirms; instances still live are terminated again (bounded
        backoff), so none is left billing."""
        for attempt in range(NOT_FOUND_RETRIES):
            try:
                self._call(ec2, "TerminateInstances", InstanceIds=ids)
                return
            except CloudError as exc:
                code = error_code(exc.__cause__) if exc.__cause__ else ""
                if code != "InvalidInstanceID.NotFound" or attempt == NOT_FOUND_RETRIES - 1:
                    raise
            live = {
                i["InstanceId"]
                for i in self._instances(
                    ec2, None, [s for s in LIVE_STATES if s != "shutting-down"]
                )
            }
            ids = [i for i in ids if i in live]
            if not ids:
                return
            delay = min(30.0, self.poll_interval * 2**attempt)
            self.log(
                f"TerminateInstances: EC2 answered NotFound for live instances; retrying in {delay:g}s"
            )
            time.sleep(delay)

    def _delete_security_group(self, ec2: Any, gid: str, timeout: float = 120.0) -> None:
        """Security groups stay in use until the terminated instances' interfaces are released
        (``DependencyViolation``); retry for a while."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ec2.delete_security_group(GroupId=gid)
                return
            except Exception as exc:
                code = error_code(exc)
                if code.startswith("InvalidGroup"):
                    return
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    raise translate(exc, "DeleteSecurityGroup") from exc
                time.sleep(self.poll_interval)

    # ------------------------------------------------------------------ hosts / runtime
    def python(self, accelerator: str, backend: str | None = None) -> str:
        if self.settings.python:
            return self.settings.python
        backend = backend or self.backend_for(accelerator)
        if backend == "neuron":
            return neuron_image(accelerator)["python"]
        return DLAMI_PYTHON.get(backend, "python3")

    def setup_commands(self, accelerator: str, requirements: list[str]) -> list[str]:
        import shlex

        py = shlex.quote(self.python(accelerator))
        lines = [f"{py} -m pip install --quiet --upgrade pip"]
        aios_deps = [r for r in self.settings.aios_requirements if r]
        check_requirements(aios_deps, "aios_requirements")
        check_requirements(requirements)
        if aios_deps:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in aios_deps)
            )
        if requirements:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in requirements)
            )
        return lines

    def remote_env(self, info: ClusterInfo) -> dict[str, str]:
        """Region and the spot watcher switch for the hosts; credentials never travel (the hosts
        use their instance profile for S3)."""
        # only reserved AIOS_RUN_* names: any other AIOS_ name is parsed as a config key on the
        # hosts, and an `aws` key is an error there when the image's aios lacks this plugin
        region = info.raw.get("region") or (region_of_zone(info.zone) if info.zone else self.region)
        env = {"AWS_DEFAULT_REGION": region, CLOUD_ENV: "aws"}
        if info.spot:
            env[SPOT_WATCH_ENV] = "1"
        return env

    def classify_error(self, exc: BaseException) -> FailureKind:
        if isinstance(exc, TransientAwsError):
            return "transient"
        return super().classify_error(exc)

    def zone_region(self, zone: str) -> str:
        return region_of_zone(zone)

    def controller_settings(self) -> dict[str, Any]:
        d = self.settings.model_dump(exclude_none=True)
        d.pop("profile", None)  # the controller host uses its own instance profile
        d.update(self.agent_settings())
        return d

    def agent_settings(self) -> dict[str, Any]:
        # on the hosts: the instance profile's credentials (it needs ec2:StopInstances /
        # ec2:TerminateInstances on instances tagged aios:cluster)
        return {"region": self.region}

    def host_checks(self, accelerator: str, nodes: int) -> list[str]:
        """A multi-node EFA launch checks on every host, before training, that libfabric's EFA
        provider is usable (NCCL's aws-ofi-nccl and the Neuron collectives go through it);
        without it they fall back to TCP sockets at a fraction of the bandwidth, or fail."""
        itype = cat.lookup(accelerator)
        if not (self.settings.efa_check and use_efa(self.settings, itype, nodes)):
            return []
        path = "PATH=/opt/amazon/efa/bin:$PATH"
        return [
            f'{path} fi_info -p efa -t FI_EP_RDM >/dev/null 2>&1 || {{ echo "[aios] EFA is not usable on $(hostname): '
            f"'fi_info -p efa -t FI_EP_RDM' found no EFA provider ({itype.name} x{nodes} "
            "needs it for NCCL/Neuron collectives); "
            f'use an EFA-enabled AMI (the DLAMI) or set aws.efa=off" >&2; exit 1; }}'
        ]

    def check_storage(
        self, url: str, env_names: tuple[str, ...] | list[str] | set[str] = ()
    ) -> None:
        forwarded = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(
            env_names
        )  # the user's explicit choice
        if url.startswith("s3://") and not self.settings.iam_instance_profile and not forwarded:
            bucket = url[5:].split("/", 1)[0]
            raise CloudError(
                f"the hosts would have no credentials to write {url}: aws.iam_instance_profile is not set",
                f"set aws.iam_instance_profile to an instance profile whose role can read/write s3://{bucket} "
                "(aios never copies your keys to the hosts)",
            )

    def describe_credentials(self) -> str:
        return self.clients.credentials_source()

    # ------------------------------------------------------------------ dry run
    def plan_create(
        self,
        request: ClusterRequest,
        zone: str | None = None,
        resolved: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What :meth:`create` sends. Without ``resolved`` (``--dry-run``) ids not known yet
        appear as ``<...>`` placeholders; :meth:`create` passes the resolved ids and sends
        ``run_instances`` of this very plan."""
        request = self.validate(request) if not request.region else request
        region = request.region or self.region
        itype = cat.lookup(request.accelerator, region)
        zone = (
            zone
            or request.zone
            or (self.settings.zones[0] if self.settings.zones else f"{region}a")
        )
        r = resolved or {}
        pg = (
            r["placement_group"]
            if "placement_group" in r
            else (
                resource_name(request.name)
                if use_placement_group(self.settings, itype, request.nodes)
                else None
            )
        )
        sg = (
            r.get("group_ids")
            or list(self.settings.security_group_ids)
            or [f"<sg:{resource_name(request.name)}>"]
        )
        ami_kind, source = self.ami_source(request.accelerator)
        image = (
            r.get("image")
            or request.image
            or (f"<ssm:{source}>" if ami_kind == "ssm" else f"<newest amazon AMI named {source}>")
        )
        kind, _, rid = (request.extra.get("reservation") or "").rpartition(":")
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
            "hourly_usd": round((itype.hourly(request.spot) or 0.0) * request.nodes, 4)
            if itype.hourly(request.spot) is not None
            else None,
            "run_instances": params,
            "security_group_rules": None
            if self.settings.security_group_ids
            else security_group_rules(sg[0], self.settings.ssh_cidr),
        }

    def render_create(self, request: ClusterRequest) -> list[CloudCommand]:
        self.offline = True
        plan = self.plan_create(request)
        region = plan["region"]
        name = request.name
        cmds: list[CloudCommand] = []
        if request.extra.get("instance_profile") == AUTOSTOP_PROFILE:
            role = AUTOSTOP_PROFILE
            cmds += [
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


# ---------------------------------------------------------------------------------- helpers


def _snake(op: str) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


def _tags(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def _node_index(inst: dict[str, Any]) -> int:
    v = _tags(inst).get(TAG_NODE)
    return int(v) if v and v.isdigit() else int(inst.get("AmiLaunchIndex", 0))


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _doc(doc: Any) -> dict[str, Any]:
    """A policy document as boto3 returns it (a dict, or URL-encoded JSON)."""
    if isinstance(doc, dict):
        return doc
    import urllib.parse

    return json.loads(urllib.parse.unquote(str(doc)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _ignore_missing(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except CloudError as exc:
        code = error_code(exc.__cause__) if exc.__cause__ else ""
        if code.endswith(("NotFound", ".NotFound")) or "NotFound" in code:
            return
        raise


__all__ = ["AwsProvider"]
