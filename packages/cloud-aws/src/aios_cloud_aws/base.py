"""What every part of the EC2 provider shares: the clients, the call wrapper that turns AWS
errors into one-line aios errors, the region, and the instances of a cluster by tag."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aios_cloud.features import (
    AUTOSTOP,
    CONTROLLER,
    COST_LIMIT,
    DISK,
    IMAGE,
    LABELS,
    PROJECT,
    QUEUED,
    REGION,
    RESERVATION,
    SETUP,
    SPOT,
    SSH_LOGIN,
    ZONE,
)
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.errors import CloudError

from aios_cloud_aws.ec2params import (
    TAG_CLUSTER,
    TAG_NODE,
)
from aios_cloud_aws.errors import error_code, translate
from aios_cloud_aws.session import Clients, region_of_zone
from aios_cloud_aws.settings import (
    AwsSettings,
    settings_from,
)


class ElasticIpQuotaError(CloudError):
    """The region's Elastic IP quota cannot cover the launch. Regional: no zone would do better,
    so the failover stops (fatal)."""


# tries of a call naming just-launched instances (eventual consistency), backoff 1x..32x the poll
NOT_FOUND_RETRIES = 7
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
SPOT_TERMINATION_CODES = {"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"}


class AwsBase(CloudProvider):
    """EC2 provider. ``config``: the resolved aios config (its ``aws`` section is read)."""

    name = "aws"
    storage_scheme = "s3"
    cli = "aws"
    # queued resources are Cloud TPU's; the account is the AWS profile's
    features = frozenset(
        {SPOT, RESERVATION, IMAGE, DISK, REGION, ZONE, SSH_LOGIN, SETUP}
        | {AUTOSTOP, COST_LIMIT, LABELS, CONTROLLER}
    )
    feature_hints = {
        QUEUED: "for reserved EC2 capacity pass --reservation (a capacity block or ODCR id)",
        PROJECT: "the AWS profile chooses the account (aws.profile, AIOS_AWS__PROFILE)",
    }

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

    def zone_region(self, zone: str) -> str:
        return region_of_zone(zone)

    def describe_credentials(self) -> str:
        return self.clients.credentials_source()


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


__all__ = ["AwsBase", "ElasticIpQuotaError"]
