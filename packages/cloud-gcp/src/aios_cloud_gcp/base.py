"""What every part of the Cloud TPU provider shares: the project, credentials, the TPU client,
error mapping and waiting on operations."""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from aios.errors import AiosError
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
from aios_cloud.provider.errors import (
    CapacityError,
    CloudError,
    CredentialsError,
    FailureKind,
    NotOfferedError,
    QuotaError,
)
from aios_cloud.provider.states import (
    DELETING,
    PENDING,
    PREEMPTED,
    READY,
    STARTING,
    STOPPED,
    STOPPING,
    TERMINATED,
)

from aios_cloud_gcp.settings import GcpSettings

PUBLIC_KEY_PLACEHOLDER = "<aios public key>"
# what the autostop agent calls (GcpProvider.stop / delete) as IAM permissions
# (https://cloud.google.com/iam/docs/roles-permissions/tpu)
AGENT_PERMISSIONS = {
    "stop": ["tpu.nodes.get", "tpu.nodes.stop", "tpu.operations.get"],
    "down": [
        "tpu.nodes.get",
        "tpu.nodes.delete",
        "tpu.queuedResources.delete",
        "tpu.operations.get",
    ],
}
# TPU permissions of the predefined roles aios can judge
ROLE_PERMISSIONS: dict[str, set[str]] = {
    "roles/owner": {"tpu.*"},
    "roles/editor": {"tpu.*"},
    "roles/tpu.admin": {"tpu.*"},
    "roles/tpu.viewer": {
        "tpu.nodes.get",
        "tpu.nodes.list",
        "tpu.operations.get",
        "tpu.operations.list",
    },
}


def has_permission(roles: set[str], permission: str) -> bool:
    import fnmatch

    return any(
        fnmatch.fnmatchcase(permission, g) for r in roles for g in ROLE_PERMISSIONS.get(r, ())
    )


# TorchTPU's interpreter on the TPU VMs (its wheels are cp311/cp312; the images have 3.10)
TORCH_TPU_PYTHON = "3.12"
TORCH_TPU_VENV = "~/.aios/torch-tpu-venv"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass
class CreatePlan:
    """What :meth:`GcpProvider.create` sends: the REST body of a Node (``kind="node"``) or a
    QueuedResource (``kind="queued"``). ``gcloud_argv`` renders the same body as gcloud."""

    kind: str
    project: str
    zone: str
    name: str
    body: dict[str, Any]

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def node(self) -> dict[str, Any]:
        return self.body if self.kind == "node" else self.body["tpu"]["nodeSpec"][0]["node"]

    def gcloud_argv(self) -> list[str]:
        n = self.node
        if self.kind == "queued":
            argv = [
                "gcloud",
                "compute",
                "tpus",
                "queued-resources",
                "create",
                self.name,
                f"--node-id={self.name}",
                f"--project={self.project}",
                f"--zone={self.zone}",
                f"--accelerator-type={n['acceleratorType']}",
                f"--runtime-version={n['runtimeVersion']}",
            ]
            if "spot" in self.body:
                argv.append("--spot")
            if self.body.get("reservationName"):
                argv.append(f"--reservation={self.body['reservationName']}")
            for key, value in (self.body.get("queueingPolicy") or {}).items():
                if key == "validInterval":
                    argv += [
                        f"--valid-after-time={value['startTime']}",
                        f"--valid-until-time={value['endTime']}",
                    ]
                    continue
                flag = re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), key)
                argv.append(f"--{flag}={value}")
        else:
            argv = [
                "gcloud",
                "compute",
                "tpus",
                "tpu-vm",
                "create",
                self.name,
                f"--project={self.project}",
                f"--zone={self.zone}",
                f"--accelerator-type={n['acceleratorType']}",
                f"--version={n['runtimeVersion']}",
            ]
            sched = n.get("schedulingConfig") or {}
            if sched.get("spot"):
                argv.append("--spot")
            if sched.get("reserved"):
                argv.append("--reserved")
        if n.get("labels"):
            argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in n["labels"].items()))
        if n.get("metadata"):
            argv.append("--metadata=" + ",".join(f"{k}={v}" for k, v in n["metadata"].items()))
        net = n.get("networkConfig") or {}
        if net.get("network"):
            argv.append(f"--network={net['network']}")
        if net.get("subnetwork"):
            argv.append(f"--subnetwork={net['subnetwork']}")
        if n.get("serviceAccount"):
            argv.append(f"--service-account={n['serviceAccount']['email']}")
            argv.append("--scopes=" + ",".join(n["serviceAccount"]["scope"]))
        if not net.get("enableExternalIps", True):
            argv.append("--internal-ips")
        return argv


class TransientCloudError(CloudError):
    """The API was briefly unavailable; the failover loop retries the same zone."""


_STATE = {
    "CREATING": PENDING,
    "READY": READY,
    "RESTARTING": PENDING,
    "REIMAGING": PENDING,
    "DELETING": DELETING,
    "REPAIRING": PENDING,
    "STOPPED": STOPPED,
    "STOPPING": STOPPING,
    "STARTING": STARTING,
    "PREEMPTED": PREEMPTED,
    "TERMINATED": TERMINATED,
}
_NOT_OFFERED = re.compile(
    r"not (?:available|supported|offered) in (?:the )?zone|invalid accelerator "
    r"type|accelerator type .* is not available|"
    r"does not (?:support|offer) .*accelerator",
    re.IGNORECASE,
)
_QR_WAITING = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES", "STATE_UNSPECIFIED")
LIBTPU_INDEXES = (
    "https://storage.googleapis.com/libtpu-releases/index.html",
    "https://storage.googleapis.com/libtpu-wheels/index.html",
)


def _rfc3339(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_when(text: str, what: str) -> tuple[str, Any]:
    """``+2h`` / ``+90m`` / ``+3600s`` -> ("duration", seconds); RFC 3339 -> ("time", datetime)."""
    m = re.fullmatch(r"\+(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return "duration", int(float(m.group(1)) * mult)
    try:
        t = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CloudError(
            f"{what} '{text}' is neither +DURATION nor an RFC 3339 time",
            f"write e.g. {what} +6h or {what} 2026-01-02T03:04:05Z",
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return "time", t


class GcpBase(CloudProvider):
    name = "gcp"
    storage_scheme = "gs"
    cli = "gcloud"
    # a TPU VM's boot disk is fixed: no --disk-gb
    features = frozenset(
        {SPOT, QUEUED, RESERVATION, IMAGE, PROJECT, REGION, ZONE, SSH_LOGIN, SETUP}
        | {AUTOSTOP, COST_LIMIT, LABELS, CONTROLLER}
    )
    feature_hints = {DISK: "a TPU VM's boot disk is fixed; keep data on gs:// buckets"}

    def __init__(self, config: Any = None) -> None:
        section = (
            config.section("gcp") if config is not None and hasattr(config, "section") else None
        )
        self.settings: GcpSettings = section if section is not None else GcpSettings()
        self.default_ssh_user = self.settings.ssh_user
        self._client: Any = None
        self._project: str | None = None

    # -------------------------------------------------------------- setup
    def project(self, request_project: str | None = None) -> str:
        if request_project:
            return request_project
        if self._project:
            return self._project
        p = (
            self.settings.project
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or os.environ.get("CLOUDSDK_CORE_PROJECT")
        )
        if not p and shutil.which("gcloud"):
            try:
                r = subprocess.run(
                    ["gcloud", "config", "get-value", "project"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                p = r.stdout.strip() or None
            except (OSError, subprocess.TimeoutExpired):
                p = None
        if not p:
            raise CloudError(
                "no GCP project is set",
                "pass --project, set gcp.project in the config (AIOS_GCP__PROJECT), or export GOOGLE_CLOUD_PROJECT",
            )
        self._project = p
        return p

    def _credentials(self) -> Any:
        mode = self.settings.credentials
        if mode == "anonymous":
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        problems = []
        if mode in ("auto", "adc"):
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                creds, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
                return creds
            except DefaultCredentialsError as exc:
                problems.append(f"ADC: {str(exc).splitlines()[0][:120]}")
        if mode in ("auto", "gcloud"):
            gcloud = shutil.which("gcloud")
            if gcloud:
                r = subprocess.run(
                    [gcloud, "auth", "print-access-token"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                if r.returncode == 0 and r.stdout.strip():
                    from google.oauth2.credentials import Credentials

                    return Credentials(token=r.stdout.strip())
                problems.append("gcloud: not logged in")
            else:
                problems.append("gcloud: not installed")
        raise CredentialsError(
            f"no Google Cloud credentials found ({'; '.join(problems)})",
            "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a key file",
        )

    def describe_credentials(self) -> str:
        creds = self._credentials()
        return type(creds).__module__.split(".")[-1] + "." + type(creds).__name__

    def client(self) -> Any:
        if self._client is None:
            from google.cloud import tpu_v2

            opts = {"api_endpoint": self.settings.endpoint} if self.settings.endpoint else None
            self._client = tpu_v2.TpuClient(
                credentials=self._credentials(), transport="rest", client_options=opts
            )
        return self._client

    # -------------------------------------------------------------- errors
    def _map(self, exc: BaseException, what: str) -> BaseException:
        from google.api_core import exceptions as gex

        msg = getattr(exc, "message", None) or str(exc)
        msg = re.sub(r"^(GET|POST|DELETE|PATCH|PUT) \S+: ", "", " ".join(str(msg).split()))[:300]
        low = msg.lower()
        exhausted = (
            isinstance(exc, (gex.ResourceExhausted, gex.TooManyRequests))
            or "RESOURCE_EXHAUSTED" in msg
        )
        # What SkyPilot (and experience) fail over on: the zone does not offer the type; a spot
        # node PREEMPTED while it was created (code 3); reserved capacity used up (code 9).
        if isinstance(exc, gex.BadRequest) and not isinstance(exc, gex.FailedPrecondition):
            if "preempted" in low:
                return CapacityError(
                    f"{what}: preempted while being created: {msg}",
                    "try another zone, --queued, or later",
                )
            if _NOT_OFFERED.search(msg):
                return NotOfferedError(
                    f"{what}: the zone does not offer the type: {msg}",
                    "pick a zone from `aios catalog --cloud gcp`",
                )
        if (
            isinstance(exc, gex.FailedPrecondition)
            and "capacity" in low
            and ("insufficient" in low or "reserv" in low)
        ):
            return CapacityError(
                f"{what}: no reserved capacity: {msg}", "try another zone or drop --reservation"
            )
        if exhausted and "quota" in msg.lower():
            return QuotaError(
                f"{what}: quota exceeded: {msg}", "request more TPU quota, or try another zone/type"
            )
        # ResourceExhausted subclasses TooManyRequests; a bare 429 is rate limiting (transient)
        if exhausted and (type(exc) is not gex.TooManyRequests or "capacity" in msg.lower()):
            return CapacityError(
                f"{what}: no capacity: {msg}", "try another zone, --queued, or later"
            )
        if isinstance(
            exc,
            (
                gex.ServiceUnavailable,
                gex.InternalServerError,
                gex.DeadlineExceeded,
                gex.TooManyRequests,
            ),
        ):
            return TransientCloudError(f"{what}: {msg}", "retry")
        if isinstance(exc, (gex.Unauthenticated, gex.PermissionDenied)):
            return CredentialsError(
                f"{what}: permission denied: {msg}",
                "check the account has roles/tpu.admin on the project (`gcloud auth list`)",
            )
        if isinstance(exc, gex.AlreadyExists):
            return CloudError(
                f"{what}: already exists: {msg}", "pick another --name or `aios down NAME`"
            )
        if isinstance(exc, gex.GoogleAPICallError):
            return CloudError(f"{what}: {msg}", "see the message; rerun with --debug for details")
        if isinstance(exc, AiosError):
            return exc
        if isinstance(exc, (ConnectionError, OSError)) or type(exc).__module__.startswith(
            ("requests", "urllib3")
        ):
            return TransientCloudError(
                f"{what}: {type(exc).__name__}: {msg}", "check the network and the API endpoint"
            )
        return exc

    def classify_error(self, exc: BaseException) -> FailureKind:
        if isinstance(exc, TransientCloudError):
            return "transient"
        return super().classify_error(exc)

    def _wait(self, op: Any, what: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.settings.create_timeout)
        while True:
            try:
                if op.done():
                    break
            except Exception as exc:  # noqa: BLE001 - mapped
                mapped = self._map(exc, what)
                if not isinstance(mapped, TransientCloudError):
                    raise mapped from None
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{what}: timed out after {timeout or self.settings.create_timeout:.0f}s",
                    "check the console; raise gcp.create_timeout",
                )
            time.sleep(self.settings.poll_interval)
        try:
            return op.result()
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None

    # -------------------------------------------------------------- paths
    def _parent(self, zone: str | None, project: str | None = None) -> str:
        return f"projects/{self.project(project)}/locations/{zone or '-'}"

    def _node_name(self, name: str, zone: str | None) -> str:
        return f"{self._parent(zone)}/nodes/{name}"

    def zone_region(self, zone: str) -> str:
        return zone.rsplit("-", 1)[0]


class _SuppressAll:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
