"""Instance lifecycle: create (one all-or-nothing ``RunInstances``), describe/list, health,
stop/start and delete by tag (as ``sky/provision/aws/instance.py``)."""

from __future__ import annotations

import builtins
import time
import uuid
from datetime import datetime
from functools import partial
from typing import Any

from aios_cloud.provider.data import ClusterHost, ClusterInfo, ClusterRequest
from aios_cloud.provider.errors import CapacityError, CloudError, ClusterNotFound, NotOfferedError
from aios_cloud.provider.states import (
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
)

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.base import (
    LIVE_STATES,
    NOT_FOUND_RETRIES,
    SPOT_TERMINATION_CODES,
    _first_line,
    _ignore_missing,
    _node_index,
    _tags,
)
from aios_cloud_aws.dryrun import AwsDryRun
from aios_cloud_aws.ec2params import (
    BLOCK_RECLAIM_S,
    TAG_BLOCK,
    TAG_BLOCK_END,
    TAG_CLUSTER,
    TAG_NODE,
    needs_elastic_ips,
    use_efa,
    use_placement_group,
)
from aios_cloud_aws.ec2time import epoch as _epoch
from aios_cloud_aws.ec2time import iso as _iso
from aios_cloud_aws.errors import TransientAwsError, error_code, translate
from aios_cloud_aws.session import region_of_zone


class AwsInstances(AwsDryRun):
    """The EC2 provider's instance lifecycle."""

    #: wall clock for Capacity Block dates (tests inject the EC2 stand-in's)
    clock: Any = staticmethod(time.time)

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
        cr_group, block_end = self._reservation(ec2, request, zone, itype)
        try:
            ami, source = self.resolve_ami(itype, region, request.image)
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
            elif use_placement_group(self.settings, itype, request.nodes, block_end is not None):
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
                    **({"block_end": _iso(block_end)} if block_end is not None else {}),
                    "client_token": f"aios-{request.name}-{zone}-{uuid.uuid4().hex[:12]}",
                },
                itype=itype,
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

    def _reservation(
        self, ec2: Any, request: ClusterRequest, zone: str, itype: Any
    ) -> tuple[str | None, float | None]:
        """``--reservation`` checked against the zone and the instance type: the placement group
        the reservation was made in, and a Capacity Block's end (epoch seconds)."""
        rid = (request.extra.get("reservation") or "").rpartition(":")[2]
        cr_group = None
        block_end: float | None = None
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
            if cr.get("ReservationType") == "capacity-block":
                cr = self._active_block(ec2, rid, cr, request)
                block_end = _epoch(cr.get("EndDate"))
                self._say_block_fee(request)
        return cr_group, block_end

    def _active_block(
        self, ec2: Any, rid: str, cr: dict[str, Any], request: ClusterRequest
    ) -> dict[str, Any]:
        """The Capacity Block ``rid`` once it is active (``cr``: its description). A scheduled
        block is waited for when ``--valid-after`` says so, else refused in one line; an expired
        block, or one whose reclaim (end minus 30 minutes) is less than a margin away, is
        refused (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html)."""
        now = self.clock()
        state = cr.get("State")
        start, end = _epoch(cr.get("StartDate")), _epoch(cr.get("EndDate"))
        if state == "scheduled" and start is not None:
            if not request.valid_after:
                raise CloudError(
                    f"capacity block {rid} is scheduled: it starts at {_iso(start)}",
                    f"launch after {_iso(start)}, or pass --valid-after {_iso(start)} to wait for it",
                )
            self.log(
                f"{request.name}: capacity block {rid} starts at {_iso(start)}: waiting for it"
            )
            deadline = start + self.settings.launch_timeout
            while state == "scheduled" and self.clock() < deadline:
                time.sleep(min(30.0, max(0.5, start - self.clock())))
                cr = self._call(ec2, "DescribeCapacityReservations", CapacityReservationIds=[rid])[
                    "CapacityReservations"
                ][0]
                state = cr.get("State")
            now = self.clock()
        if state != "active":
            raise CloudError(
                f"capacity block {rid} is {state or 'in an unknown state'}, not active",
                "pass the id of an active Capacity Block (aws ec2 describe-capacity-reservations)",
            )
        if end is not None:
            reclaim = end - BLOCK_RECLAIM_S
            margin = self.settings.capacity_block_margin
            if reclaim - margin <= now:
                raise CloudError(
                    f"capacity block {rid} ends at {_iso(end)}: EC2 terminates its instances from "
                    f"{_iso(reclaim)}, less than aws.capacity_block_margin ({margin:g}s) from now",
                    "use a block with more time left",
                )
            self.log(
                f"{request.name}: capacity block {rid} ends at {_iso(end)}; EC2 terminates its "
                f"instances from {_iso(reclaim)}: the run's emergency checkpoint is due by "
                f"{_iso(reclaim - margin)}"
            )
        return cr

    def _say_block_fee(self, request: ClusterRequest) -> None:
        """The launch plan's price of a Capacity Block: its upfront fee (and per hour) where EC2
        tells it, never the on-demand price; a lookup that fails only says so."""
        try:
            prices = self.reservation_prices(request, live=True)
        except Exception as exc:  # noqa: BLE001 - the price is information: the launch goes on
            self.log(
                f"{request.name}: the Capacity Block's fee is not known here "
                f"({_first_line(exc)}); it was paid when the block was bought"
            )
            return
        for p in prices:
            self.log(f"{request.name}: price: {p.line()}")

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
            and (
                i.get("StateReason", {}).get("Code") in SPOT_TERMINATION_CODES
                or _block_reclaimed(i, self.clock())
            )
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
        times = [i["LaunchTime"] for i in insts if i.get("LaunchTime")]
        launch = min(times) if times else None
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
            if isinstance(launch, datetime)
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
                **_block_raw(tagmap),
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
    def _ids(self, ec2: Any, name: str) -> builtins.list[str]:
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
                    partial(
                        self._call, ec2, "DisassociateAddress", AssociationId=addr["AssociationId"]
                    )
                )
            _ignore_missing(
                partial(self._call, ec2, "ReleaseAddress", AllocationId=addr["AllocationId"])
            )
        for eni in self._call(
            ec2,
            "DescribeNetworkInterfaces",
            Filters=[*cluster_filter, {"Name": "status", "Values": ["available"]}],
        ).get("NetworkInterfaces", []):
            _ignore_missing(
                partial(
                    self._call,
                    ec2,
                    "DeleteNetworkInterface",
                    NetworkInterfaceId=eni["NetworkInterfaceId"],
                )
            )
        for vol in self._call(
            ec2,
            "DescribeVolumes",
            Filters=[*cluster_filter, {"Name": "status", "Values": ["available"]}],
        ).get("Volumes", []):
            _ignore_missing(partial(self._call, ec2, "DeleteVolume", VolumeId=vol["VolumeId"]))
        for pg in self._call(ec2, "DescribePlacementGroups", Filters=cluster_filter).get(
            "PlacementGroups", []
        ):
            _ignore_missing(
                partial(self._call, ec2, "DeletePlacementGroup", GroupName=pg["GroupName"])
            )
        for sg in self._call(ec2, "DescribeSecurityGroups", Filters=cluster_filter).get(
            "SecurityGroups", []
        ):
            self._delete_security_group(ec2, sg["GroupId"])
        for kp in self._call(ec2, "DescribeKeyPairs", Filters=cluster_filter).get("KeyPairs", []):
            _ignore_missing(partial(self._call, ec2, "DeleteKeyPair", KeyName=kp["KeyName"]))

    def _terminate(self, ec2: Any, ids: builtins.list[str]) -> None:
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


def _block_reclaimed(inst: dict[str, Any], now: float) -> bool:
    """The instance ran in a Capacity Block whose reclaim time has come: EC2 ended it, as it
    ends spot capacity (a managed run recovers; nothing failed)."""
    end = _epoch(_tags(inst).get(TAG_BLOCK_END))
    return end is not None and now >= end - BLOCK_RECLAIM_S


def _block_raw(tagmap: dict[str, str]) -> dict[str, Any]:
    """The Capacity Block a cluster runs in (from its instances' tags), for ``aios status`` and
    the hosts' deadline."""
    rid, end = tagmap.get(TAG_BLOCK), _epoch(tagmap.get(TAG_BLOCK_END))
    if not rid or end is None:
        return {}
    return {
        "capacity_block": {
            "id": rid,
            "end": _iso(end),
            "terminates_from": _iso(end - BLOCK_RECLAIM_S),
        }
    }
