"""An HTTP proxy in front of moto's EC2 Query API (listens on 127.0.0.1).

* Forwards every request to moto unchanged and relays the answer.
* :meth:`Ec2Proxy.inject` makes chosen calls fail with a real EC2 error document (``<Response>
  <Errors><Error><Code>InsufficientInstanceCapacity</Code>...``) and the HTTP status AWS uses
  (500 for server-side capacity errors, which botocore retries like AWS's, 400/403 for client
  errors), optionally only for chosen availability zones or instance types and a limited number
  of times. Capacity is per instance type and zone: spot capacity of one type may end
  (``InsufficientInstanceCapacity`` for ``RunInstances`` of that type, "AWS does not currently
  have enough available capacity", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html#troubleshooting-launch-capacity)
  while another type launches in the same zone.
* Records the parameters of every call (:attr:`calls`) so tests check what went over the wire.
* Enforces an Elastic IP quota (:attr:`Ec2Proxy.address_limit`, EC2's default is 5 per
  region): ``AllocateAddress`` beyond it answers ``AddressLimitExceeded`` as EC2 does.
* Serves ``DescribeCapacityReservations`` (moto has none) from :attr:`Ec2Proxy.capacity_reservations`
  (id -> zone, instance type, ``default`` or ``capacity-block`` type, state, ``count``: its
  ``TotalInstanceCount``) and refuses a
  ``RunInstances`` that targets an unknown reservation, another zone or another type, as EC2 does.
* Serves ``CreatePlacementGroup`` / ``DescribePlacementGroups`` / ``DeletePlacementGroup``, which
  moto does not implement, with EC2's semantics (duplicate names, unknown names, tag filters,
  refusing ``RunInstances`` into an unknown group).

Rules of the real EC2 that moto does not enforce, each beside its documentation:

* **EFA needs a self-referencing egress rule** (:meth:`_efa_group_problem`): "the security group
  must allow all inbound and outbound traffic to and from the security group itself"
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security). EFA
  traffic is not IP, so the default ``0.0.0.0/0`` egress rule does not carry it; EC2 itself
  launches such hosts and NCCL then hangs at its first collective ("Unresponsive receiver").
  The stand-in answers the multi-node EFA ``RunInstances`` with an error instead of a hang.
* **Eventual consistency** (:attr:`Ec2Proxy.not_found_calls`): right after ``RunInstances``
  the new instance ids may be unknown to other calls, which answer
  ``InvalidInstanceID.NotFound``; "this does not mean the instance does not exist", and a
  NotFound from ``TerminateInstances`` does not mean it is terminated
  (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html). With
  ``not_found_calls = K`` the first ``K`` calls naming a new instance id (``DescribeInstances``,
  ``CreateTags``, ``TerminateInstances``...) answer NotFound, deterministically.
* **Instance-role credentials carry the role's rights** (:meth:`Ec2Proxy.role_credentials_for`):
  a host gets credentials from its metadata service only when an instance profile is attached
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html#instance-metadata-security-credentials),
  and a call signed with them passes only when the role's policy allows its action
  (``UnauthorizedOperation`` otherwise, as EC2 answers; policy conditions are not evaluated).
  Calls signed with any other key (the user's own) pass as before.
* **Capacity Blocks have dates and end early** (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html):
  a block (``type: capacity-block``, with ``start``/``end`` epoch seconds; default: started an
  hour ago, ending in a day) is ``scheduled`` before its start, ``active`` until its end,
  ``expired`` after, on the proxy's :attr:`Ec2Proxy.clock`; ``DescribeCapacityReservations``
  returns ``StartDate``/``EndDate``/``State``; ``RunInstances`` into a block that is not active is
  refused; and "thirty minutes before the reservation expires, we begin to terminate any
  instances that are still running in the Capacity Block": :meth:`Ec2Proxy.reap` (run by a
  background thread and before each call) terminates them at ``end - 1800``, with no IMDS
  ``spot/instance-action`` (only an EventBridge event 40 minutes before, which hosts do not see).
* **No placement group of your own with a Capacity Block**: "there is no need to use a cluster
  placement group with a Capacity Block" (same page); an added group can leave reserved
  instances unusable (eksctl-io/eksctl#7949) and AWS ParallelCluster refuses the combination
  (aws/aws-parallelcluster#6311). ``RunInstances`` into a block with ``Placement.GroupName``
  (other than a group the reservation itself was made in) is refused.
* **Capacity Block offerings and their fees**
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeCapacityBlockOfferings.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html): moto has no
  ``DescribeCapacityBlockOfferings``; the proxy serves :attr:`Ec2Proxy.capacity_block_offerings`
  (instance type, count, zone, ``start``/``end`` epoch seconds, ``fee``, ``currency``) with
  EC2's rules: ``CapacityDurationHours`` is required and must be whole days up to 14 days, then
  whole weeks up to 182 days ("1-day increments up to 14 days, and in 7-day increments up to 182
  days"); ``InstanceType`` and ``InstanceCount`` go together, a block holds 1 to 64 instances;
  the answer lists at most 6 offerings of that type and count, starting no earlier than
  ``StartDateRange`` and ending no later than ``EndDateRange``, whose length is within a day of
  the duration asked (blocks all end at 11:30 UTC, so EC2 offers the closest lengths), each with
  its ``UpfrontFee`` (a decimal string: the whole block's price, paid when bought) and
  ``CurrencyCode``.
* **Capacity reservations in a cluster placement group**: a reservation created in a cluster
  placement group (``placement_group`` in :attr:`capacity_reservations`) carries its group's ARN
  (``PlacementGroupArn``) and takes only launches into that group
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cr-cpg.html).
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

from aios_cloud_aws.ec2params import allowed

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"


@dataclass
class Rule:
    action: str
    code: str
    message: str
    status: int = 500
    zones: set[str] | None = None
    times: int | None = None
    hits: int = 0
    instance_types: set[str] | None = None


@dataclass
class PlacementGroup:
    name: str
    strategy: str
    group_id: str
    tags: dict[str, str] = field(default_factory=dict)


class Ec2Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlparse(upstream)
        self.rules: list[Rule] = []
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.placement_groups: dict[str, PlacementGroup] = {}
        self.address_limit: int | None = None
        self.capacity_reservations: dict[str, dict[str, str]] = {}
        # what DescribeCapacityBlockOfferings offers: dicts of instance_type, count, zone,
        # start, end (epoch seconds), fee (USD for the whole block), currency
        self.capacity_block_offerings: list[dict[str, Any]] = []
        self.not_found_calls = 0  # eventual consistency: NotFound for this many calls per new id
        self.clock: Any = time.time  # wall clock of the capacity blocks' dates (tests inject one)
        self.block_instances: dict[str, set[str]] = {}  # block id -> instance ids launched into it
        self.reaped: list[
            tuple[str, float]
        ] = []  # (instance id, clock) terminated at a block's end
        self._fresh: dict[str, int] = {}  # new instance id -> NotFound answers left
        self.grants: dict[str, list[dict[str, Any]]] = {}  # role access key -> policy documents
        self.lock = threading.Lock()
        self._subnet_zone: dict[str, str] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                proxy._handle(self)

            do_GET = do_POST  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, daemon=True, name="aios-ec2-proxy"
        )

    # ------------------------------------------------------------------ control
    def start(self) -> Ec2Proxy:
        self._thread.start()
        self._reaper_stop = threading.Event()

        def reaper() -> None:
            while not self._reaper_stop.wait(0.2):
                try:
                    self.reap()
                except Exception:  # noqa: BLE001 - moto going away at shutdown
                    pass

        threading.Thread(target=reaper, daemon=True, name="aios-ec2-block-reaper").start()
        return self

    # ------------------------------------------------------------------ capacity blocks
    BLOCK_RECLAIM_S = 1800  # instances are terminated from 30 minutes before a block's end

    def block_dates(self, r: dict[str, Any]) -> tuple[float, float]:
        now = self.clock()
        return float(r.get("start", now - 3600)), float(r.get("end", now + 86400))

    def block_state(self, r: dict[str, Any]) -> str:
        if r.get("type") != "capacity-block":
            return str(r.get("state", "active"))
        start, end = self.block_dates(r)
        now = self.clock()
        return "scheduled" if now < start else ("active" if now < end else "expired")

    def reap(self) -> list[str]:
        """Terminate every instance still running in a Capacity Block whose end is 30 minutes
        away or less (EC2 "begins to terminate" them then). Returns the ids terminated now."""
        now = self.clock()
        due: list[str] = []
        with self.lock:
            for cr, ids in self.block_instances.items():
                r = self.capacity_reservations.get(cr)
                if r is None or not ids:
                    continue
                _, end = self.block_dates(r)
                if now >= end - self.BLOCK_RECLAIM_S:
                    due.extend(sorted(ids))
                    ids.clear()
        if due:
            q = {"Action": "TerminateInstances", "Version": "2016-11-15"}
            q.update({f"InstanceId.{i + 1}": iid for i, iid in enumerate(due)})
            self._ec2_query(q)
            with self.lock:
                self.reaped.extend((iid, now) for iid in due)
        return due

    def stop(self) -> None:
        if hasattr(self, "_reaper_stop"):
            self._reaper_stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Ec2Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(
        self,
        action: str,
        code: str,
        message: str = "",
        status: int = 500,
        zones: list[str] | None = None,
        times: int | None = None,
        instance_types: list[str] | None = None,
    ) -> Rule:
        """Answer ``action`` (``*``: any) with ``code``; only in ``zones``, for calls naming one
        of ``instance_types`` (``InstanceType``) and ``times`` times when given."""
        rule = Rule(
            action,
            code,
            message or f"injected {code}",
            status,
            set(zones) if zones else None,
            times,
            instance_types=set(instance_types) if instance_types else None,
        )
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
            self.calls.clear()
            self.placement_groups.clear()
            self.address_limit = None
            self.capacity_reservations.clear()
            self.capacity_block_offerings.clear()
            self.block_instances.clear()
            self.reaped.clear()
            self.clock = time.time
            self.not_found_calls = 0
            self._fresh.clear()
            self.grants.clear()

    def called(self, action: str) -> list[dict[str, str]]:
        return [p for a, p in self.calls if a == action]

    # ------------------------------------------------------------------ handling
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        params = {
            k: v[-1]
            for k, v in urllib.parse.parse_qs(body.decode(), keep_blank_values=True).items()
        }
        action = params.get("Action", "")
        with self.lock:
            self.calls.append((action, params))
        if action.startswith("Describe"):
            self.reap()  # what is due at a block's end has happened before anyone looks
        denied = self._denied(h.headers.get("Authorization", ""), action)
        if denied:
            return self._send(h, 403, _error("UnauthorizedOperation", denied))
        rule = self._match(action, params)
        if rule is not None:
            return self._send(h, rule.status, _error(rule.code, rule.message))
        if action == "AllocateAddress" and self.address_limit is not None:
            doc = self._ec2_query({"Action": "DescribeAddresses", "Version": "2016-11-15"})
            if doc.count(b"<allocationId>") >= self.address_limit:
                return self._send(
                    h,
                    400,
                    _error(
                        "AddressLimitExceeded", "The maximum number of addresses has been reached."
                    ),
                )
        if action == "DescribeCapacityBlockOfferings":
            code, answer = self._DescribeCapacityBlockOfferings(params)
            return self._send(h, code, answer)
        if action == "DescribeCapacityReservations":
            return self._send(h, *self._DescribeCapacityReservations(params))
        if action == "RunInstances" and params.get(
            "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"
        ):
            problem = self._reserved_launch_problem(params)
            if problem is not None:
                return self._send(h, 400, problem)
        if action in ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"):
            status, doc = getattr(self, "_" + action)(params)
            return self._send(h, status, doc)
        if action == "RunInstances":
            problem = self._efa_group_problem(params)
            if problem:
                return self._send(h, 400, _error("InvalidParameterCombination", problem))
        stale = self._not_yet_visible(action, params)
        if stale:
            return self._send(
                h,
                400,
                _error("InvalidInstanceID.NotFound", f"The instance ID '{stale}' does not exist"),
            )
        if action == "RunInstances" and params.get("Placement.GroupName"):
            if params["Placement.GroupName"] not in self.placement_groups:
                return self._send(
                    h,
                    400,
                    _error(
                        "InvalidPlacementGroup.Unknown",
                        f"The Placement Group '{params['Placement.GroupName']}' is unknown.",
                    ),
                )
        status, data = self._forward(h, body)
        if action == "RunInstances" and status == 200:
            self._after_run_instances(params, data)

    def _DescribeCapacityReservations(self, params: dict[str, str]) -> tuple[int, str]:  # noqa: N802
        """The reservations asked for (all without ids); an unknown id is refused."""
        ids = [v for k, v in params.items() if k.startswith("CapacityReservationId.")]
        unknown = [i for i in ids if i not in self.capacity_reservations]
        if unknown:
            return (
                400,
                _error(
                    "InvalidCapacityReservationId.NotFound",
                    f"The capacity reservation ID '{unknown[0]}' does not exist",
                ),
            )
        items = "".join(
            f"<item><capacityReservationId>{escape(i)}</capacityReservationId><availabilityZone>{escape(r['zone'])}</availabilityZone>"
            f"<instanceType>{escape(r['instance_type'])}</instanceType>"
            f"<reservationType>{escape(r.get('type', 'default'))}</reservationType>"
            + (
                f"<totalInstanceCount>{int(r['count'])}</totalInstanceCount>"
                if r.get("count")
                else ""
            )
            + f"<state>{escape(self.block_state(r))}</state>"
            + (
                f"<startDate>{_iso(self.block_dates(r)[0])}</startDate>"
                f"<endDate>{_iso(self.block_dates(r)[1])}</endDate>"
                "<endDateType>limited</endDateType>"
                if r.get("type") == "capacity-block"
                else ""
            )
            + (
                f"<placementGroupArn>arn:aws:ec2:us-east-1:123456789012:placement-group/"
                f"{escape(r['placement_group'])}</placementGroupArn>"
                if r.get("placement_group")
                else ""
            )
            + "</item>"
            for i, r in self.capacity_reservations.items()
            if not ids or i in ids
        )
        return (
            200,
            _doc(
                "DescribeCapacityReservationsResponse",
                f"<capacityReservationSet>{items}</capacityReservationSet>",
            ),
        )

    def _reserved_launch_problem(self, params: dict[str, str]) -> str | None:
        """Why EC2 refuses a RunInstances into a capacity reservation (the error document),
        or None."""
        cr = params[
            "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"
        ]
        r = self.capacity_reservations.get(cr)
        if r is None:
            return _error(
                "InvalidCapacityReservationId.NotFound",
                f"The capacity reservation ID '{cr}' does not exist",
            )
        if (
            r["zone"] != params.get("Placement.AvailabilityZone")
            or r["instance_type"] != params.get("InstanceType")
            or (
                r.get("placement_group")
                and r["placement_group"] != params.get("Placement.GroupName")
            )
        ):
            return _error(
                "ReservationCapacityExceeded",
                f"The requested instances do not match capacity reservation {cr}",
            )
        if (r.get("type") == "capacity-block") != (
            params.get("InstanceMarketOptions.MarketType") == "capacity-block"
        ):
            return _error(
                "InvalidParameterCombination",
                "Capacity Blocks need MarketType capacity-block",
            )
        if r.get("type") == "capacity-block":
            state = self.block_state(r)
            if state != "active":
                return _error(
                    "InvalidCapacityReservationId.NotActive",
                    f"Capacity Reservation {cr} is {state}: instances launch into a "
                    "Capacity Block only while it is active",
                )
            if params.get("Placement.GroupName") and params["Placement.GroupName"] != r.get(
                "placement_group"
            ):
                return _error(
                    "InvalidParameterCombination",
                    f"Capacity Block {cr} is already placed for low latency: launch "
                    "without a placement group of your own",
                )
        return None

    def _after_run_instances(self, params: dict[str, str], data: bytes) -> None:
        """Note what a RunInstances launched: the instances of a Capacity Block (ended at its
        end), and those the next describes do not see yet."""
        block = params.get(
            "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"
        )
        if block:
            import xml.etree.ElementTree as ET

            launched = {
                el.text
                for el in ET.fromstring(data).iter()
                if el.tag.endswith("instanceId") and el.text
            }
            r = self.capacity_reservations.get(block) or {}
            if r.get("type") == "capacity-block":
                with self.lock:
                    self.block_instances.setdefault(block, set()).update(launched)
        if self.not_found_calls:
            import xml.etree.ElementTree as ET

            launched = {
                el.text
                for el in ET.fromstring(data).iter()
                if el.tag.endswith("instanceId") and el.text
            }
            with self.lock:
                for iid in launched:
                    self._fresh[iid] = self.not_found_calls

    def _denied(self, authorization: str, action: str) -> str | None:
        """Why a call signed with instance-role credentials may not run ``action``, or None."""
        import re

        m = re.search(r"Credential=([^/,\s]+)/", authorization)
        docs = self.grants.get(m.group(1)) if m else None
        if docs is None or allowed(docs, f"ec2:{action}"):
            return None
        return f"You are not authorized to perform this operation (ec2:{action})."

    def role_credentials_for(self, instance_id: str) -> dict[str, str] | None:
        """What the instance's metadata service serves at
        ``iam/security-credentials/ROLE``: credentials of the role of its instance profile
        (the proxy then allows exactly that role's actions for them), or None without a
        profile."""
        import datetime
        import json
        import secrets
        import xml.etree.ElementTree as ET

        import boto3

        doc = ET.fromstring(
            self._ec2_query(
                {
                    "Action": "DescribeInstances",
                    "Version": "2016-11-15",
                    "InstanceId.1": instance_id,
                }
            )
        )
        arn = next(
            (e.findtext("{*}arn") for e in doc.iter() if e.tag.endswith("iamInstanceProfile")), None
        )
        if not arn:
            # a profile attached to the running instance (AssociateIamInstanceProfile): EC2
            # serves its role's credentials from then on; moto keeps it only as an association
            # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/attach-iam-role.html
            assoc = ET.fromstring(
                self._ec2_query(
                    {
                        "Action": "DescribeIamInstanceProfileAssociations",
                        "Version": "2016-11-15",
                        "Filter.1.Name": "instance-id",
                        "Filter.1.Value.1": instance_id,
                    }
                )
            )
            arn = next(
                (
                    e.findtext("{*}arn")
                    for e in assoc.iter()
                    if e.tag.endswith("iamInstanceProfile") and e.findtext("{*}arn")
                ),
                None,
            )
        if not arn:
            return None
        iam = boto3.client(
            "iam",
            region_name="us-east-1",
            endpoint_url=f"http://{self.upstream.hostname}:{self.upstream.port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        prof = iam.get_instance_profile(InstanceProfileName=arn.rsplit("/", 1)[-1])
        roles = prof["InstanceProfile"]["Roles"]
        if not roles:
            return None
        docs = []
        for pn in iam.list_role_policies(RoleName=roles[0]["RoleName"])["PolicyNames"]:
            d = iam.get_role_policy(RoleName=roles[0]["RoleName"], PolicyName=pn)["PolicyDocument"]
            docs.append(d if isinstance(d, dict) else json.loads(d))
        key = "ASIA" + secrets.token_hex(8).upper()
        with self.lock:
            self.grants[key] = docs
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6)
        return {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": key,
            "SecretAccessKey": secrets.token_hex(20),
            "Token": secrets.token_hex(32),
            "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "RoleName": roles[0]["RoleName"],
        }

    def _not_yet_visible(self, action: str, params: dict[str, str]) -> str | None:
        """The first new instance id of this call EC2 would not know yet (eventual consistency)."""
        if action == "RunInstances":
            return None
        named = [v for k, v in params.items() if k.startswith(("InstanceId.", "ResourceId."))]
        with self.lock:
            for iid in named:
                if self._fresh.get(iid, 0) > 0:
                    self._fresh[iid] -= 1
                    return iid
        return None

    def _efa_group_problem(self, params: dict[str, str]) -> str | None:
        """Why a multi-node EFA launch would hang, or None (see the module docstring)."""
        efa = any(
            k.startswith("NetworkInterface.")
            and k.endswith(".InterfaceType")
            and v.startswith("efa")
            for k, v in params.items()
        )
        if not efa or int(params.get("MinCount", "1")) < 2:
            return None
        import xml.etree.ElementTree as ET

        groups = sorted(
            {
                v
                for k, v in params.items()
                if k.startswith("NetworkInterface.") and ".SecurityGroupId." in k
            }
        )
        query = {"Action": "DescribeSecurityGroups", "Version": "2016-11-15"}
        query.update({f"GroupId.{i}": g for i, g in enumerate(groups, 1)})
        doc = ET.fromstring(self._ec2_query(query))
        for el in doc.iter():  # moto's namespace differs from EC2's: match local names
            el.tag = el.tag.rsplit("}", 1)[-1]
        for sg in doc.iterfind(".//securityGroupInfo/item"):
            gid = sg.findtext("groupId")
            for direction in ("ipPermissions", "ipPermissionsEgress"):
                ok = any(
                    p.findtext("ipProtocol") == "-1"
                    and any(pair.findtext("groupId") == gid for pair in p.iterfind("groups/item"))
                    for p in sg.iterfind(f"{direction}/item")
                )
                if not ok:
                    way = "outbound to" if direction == "ipPermissionsEgress" else "inbound from"
                    return (
                        f"[stand-in for an EFA hang] security group {gid} allows no {way} itself: "
                        "EFA traffic between the instances needs all traffic in both directions "
                        "(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security)"
                    )
        return None

    def _zone(self, params: dict[str, str]) -> str | None:
        zone = params.get("Placement.AvailabilityZone")
        if zone:
            return zone
        subnet = params.get("NetworkInterface.1.SubnetId") or params.get("SubnetId")
        if subnet:
            if subnet not in self._subnet_zone:
                import xml.etree.ElementTree as ET

                doc = self._upstream(
                    urllib.parse.urlencode(
                        {"Action": "DescribeSubnets", "Version": "2016-11-15", "SubnetId.1": subnet}
                    ).encode()
                )[2]
                for el in ET.fromstring(doc).iter():
                    if el.tag.endswith("availabilityZone") and el.text:
                        self._subnet_zone[subnet] = el.text
                        break
            return self._subnet_zone.get(subnet)
        return None

    def _match(self, action: str, params: dict[str, str]) -> Rule | None:
        with self.lock:
            rules = list(self.rules)
        for rule in rules:
            if rule.action not in ("*", action):
                continue
            if rule.zones is not None and self._zone(params) not in rule.zones:
                continue
            if (
                rule.instance_types is not None
                and params.get("InstanceType") not in rule.instance_types
            ):
                continue
            with self.lock:
                if rule.times is not None and rule.hits >= rule.times:
                    continue
                rule.hits += 1
            return rule
        return None

    def _ec2_query(self, params: dict[str, str]) -> bytes:
        """An EC2 call of the proxy's own (moto routes by the credential scope's service)."""
        auth = (
            "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, "
            "SignedHeaders=host, Signature=0"
        )
        return self._upstream(urllib.parse.urlencode(params).encode(), {"Authorization": auth})[2]

    def _upstream(
        self, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=60
        )
        try:
            hdrs = {
                k: v
                for k, v in (headers or {}).items()
                if k.lower() not in ("host", "content-length", "connection")
            }
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
            conn.request("POST", "/", body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
        status, headers, data = self._upstream(body, dict(h.headers.items()))
        h.send_response(status)
        for k, v in headers:
            if k.lower() not in (
                "transfer-encoding",
                "connection",
                "content-length",
                "server",
                "date",
            ):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        return status, data

    def _send(self, h: BaseHTTPRequestHandler, status: int, doc: str) -> None:
        data = doc.encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/xml;charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    # ------------------------------------------------------------------ capacity block offerings
    MAX_BLOCK_INSTANCES = 64
    MAX_OFFERINGS = 6

    def _DescribeCapacityBlockOfferings(self, p: dict[str, str]) -> tuple[int, str]:  # noqa: N802
        """EC2's rules for the search (module docstring); the offerings that fit it."""
        hours_text = p.get("CapacityDurationHours")
        if not hours_text:
            return 400, _error(
                "MissingParameter",
                "The request must contain the parameter CapacityDurationHours",
            )
        hours = int(hours_text) if hours_text.isdigit() else -1
        if not (
            (24 <= hours <= 14 * 24 and hours % 24 == 0)
            or (14 * 24 < hours <= 182 * 24 and hours % (7 * 24) == 0)
        ):
            return 400, _error(
                "InvalidParameterValue",
                f"CapacityDurationHours {hours_text} is not valid: specify the duration in "
                "1-day increments up to 14 days, and in 7-day increments up to 182 days",
            )
        itype, count_text = p.get("InstanceType"), p.get("InstanceCount")
        if not itype or not count_text:
            missing = "InstanceType" if not itype else "InstanceCount"
            return 400, _error(
                "MissingParameter", f"The request must contain the parameter {missing}"
            )
        count = int(count_text) if count_text.isdigit() else 0
        if not 1 <= count <= self.MAX_BLOCK_INSTANCES:
            return 400, _error(
                "InvalidParameterValue",
                f"InstanceCount {count_text} is not valid: a Capacity Block holds 1 to "
                f"{self.MAX_BLOCK_INSTANCES} instances",
            )
        lo = _epoch(p.get("StartDateRange"))
        hi = _epoch(p.get("EndDateRange"))
        with self.lock:
            offers = list(self.capacity_block_offerings)
        fit = [
            o
            for o in offers
            if o["instance_type"] == itype
            and int(o["count"]) == count
            # EC2's timestamps are whole seconds (a query's fraction is not compared)
            and (lo is None or float(o["start"]) >= lo - 1)
            and (hi is None or float(o["end"]) <= hi + 1)
            and abs((float(o["end"]) - float(o["start"])) / 3600 - hours) < 24
        ]
        fit.sort(key=lambda o: (float(o["start"]), abs(float(o["end"]) - float(o["start"]))))
        items = "".join(
            "<item>"
            f"<capacityBlockOfferingId>{escape(o.get('id') or 'cb-' + uuid.uuid4().hex[:17])}"
            "</capacityBlockOfferingId>"
            f"<instanceType>{escape(o['instance_type'])}</instanceType>"
            f"<availabilityZone>{escape(o['zone'])}</availabilityZone>"
            f"<instanceCount>{int(o['count'])}</instanceCount>"
            f"<startDate>{_iso(float(o['start']))}</startDate>"
            f"<endDate>{_iso(float(o['end']))}</endDate>"
            f"<capacityBlockDurationHours>{int((float(o['end']) - float(o['start'])) // 3600)}"
            "</capacityBlockDurationHours>"
            f"<capacityBlockDurationMinutes>"
            f"{int((float(o['end']) - float(o['start'])) % 3600 // 60)}"
            "</capacityBlockDurationMinutes>"
            f"<upfrontFee>{float(o['fee']):.2f}</upfrontFee>"
            f"<currencyCode>{escape(o.get('currency', 'USD'))}</currencyCode>"
            "<tenancy>default</tenancy>"
            "</item>"
            for o in fit[: self.MAX_OFFERINGS]
        )
        return 200, _doc(
            "DescribeCapacityBlockOfferingsResponse",
            f"<capacityBlockOfferingSet>{items}</capacityBlockOfferingSet>",
        )

    # ------------------------------------------------------------------ placement groups
    def _CreatePlacementGroup(self, p: dict[str, str]) -> tuple[int, str]:  # noqa: N802
        name = p.get("GroupName", "")
        with self.lock:
            if name in self.placement_groups:
                return 400, _error(
                    "InvalidPlacementGroup.Duplicate",
                    f"The Placement Group '{name}' already exists.",
                )
            tags = _tags_from(p, "placement-group")
            pg = PlacementGroup(
                name, p.get("Strategy", "cluster"), "pg-" + uuid.uuid4().hex[:17], tags
            )
            self.placement_groups[name] = pg
        return 200, _doc(
            "CreatePlacementGroupResponse", f"<placementGroup>{_pg_xml(pg)}</placementGroup>"
        )

    def _DescribePlacementGroups(self, p: dict[str, str]) -> tuple[int, str]:  # noqa: N802
        names = [v for k, v in p.items() if k.startswith("GroupName.")]
        with self.lock:
            groups = list(self.placement_groups.values())
        for n in names:
            if n not in self.placement_groups:
                return 400, _error(
                    "InvalidPlacementGroup.Unknown", f"The Placement Group '{n}' is unknown."
                )
        if names:
            groups = [g for g in groups if g.name in names]
        for flt_name, values in _filters(p):
            if flt_name.startswith("tag:"):
                key = flt_name[4:]
                groups = [g for g in groups if g.tags.get(key) in values]
            elif flt_name == "group-name":
                groups = [g for g in groups if g.name in values]
        items = "".join(f"<item>{_pg_xml(g)}</item>" for g in groups)
        return 200, _doc(
            "DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>"
        )

    def _DeletePlacementGroup(self, p: dict[str, str]) -> tuple[int, str]:  # noqa: N802
        name = p.get("GroupName", "")
        with self.lock:
            if name not in self.placement_groups:
                return 400, _error(
                    "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
                )
            del self.placement_groups[name]
        return 200, _doc("DeletePlacementGroupResponse", "<return>true</return>")


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch))


def _epoch(text: str | None) -> float | None:
    """Epoch seconds of an ISO 8601 timestamp of a query (None when absent)."""
    if not text:
        return None
    from datetime import datetime, timezone

    d = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()


def _filters(p: dict[str, str]) -> list[tuple[str, list[str]]]:
    out = []
    i = 1
    while f"Filter.{i}.Name" in p:
        values = []
        j = 1
        while f"Filter.{i}.Value.{j}" in p:
            values.append(p[f"Filter.{i}.Value.{j}"])
            j += 1
        out.append((p[f"Filter.{i}.Name"], values))
        i += 1
    return out


def _tags_from(p: dict[str, str], resource_type: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    i = 1
    while f"TagSpecification.{i}.ResourceType" in p:
        if p[f"TagSpecification.{i}.ResourceType"] == resource_type:
            j = 1
            while f"TagSpecification.{i}.Tag.{j}.Key" in p:
                tags[p[f"TagSpecification.{i}.Tag.{j}.Key"]] = p.get(
                    f"TagSpecification.{i}.Tag.{j}.Value", ""
                )
                j += 1
        i += 1
    return tags


def _pg_xml(g: PlacementGroup) -> str:
    tags = "".join(
        f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in g.tags.items()
    )
    return (
        f"<groupName>{escape(g.name)}</groupName><state>available</state><strategy>{escape(g.strategy)}</strategy>"
        f"<groupId>{g.group_id}</groupId><tagSet>{tags}</tagSet>"
    )


def _doc(root: str, inner: str) -> str:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} '
        f'xmlns="{NS}"><requestId>{uuid.uuid4()}</requestId>{inner}</{root}>'
    )


def _error(code: str, message: str) -> str:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
        f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
