"""Cloud TPU VMs and pod slices through the Cloud TPU API v2 (``google-cloud-tpu``, REST).

* create: a node (on demand or spot) or a queued resource (waits for capacity, optional time
  window), with aios's SSH public key in the ``ssh-keys`` metadata and ``aios-cluster`` labels;
* describe / list / start / stop / delete (a queued resource is deleted with ``force``, which
  takes its node with it);
* runtime version per generation from :mod:`aios_backend_xla.topology` (v6e ``v2-alpha-tpuv6e``,
  v5e ``v2-alpha-tpuv5-lite``, v5p ``v2-alpha-tpuv5``, v4 ``tpu-ubuntu2204-base``);
* errors classified for the core's zone failover: ``RESOURCE_EXHAUSTED`` without "quota" is a
  stockout, with "quota" a quota error, ``UNAVAILABLE``/``INTERNAL``/``DEADLINE_EXCEEDED``
  transient;
* credentials from Application Default Credentials, else ``gcloud auth print-access-token``;
  nothing secret is stored; ``gcp.credentials=anonymous`` for local test services.

Every method has a ``gcloud`` rendering for ``--dry-run``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from aios.errors import AiosError
from aios_cloud.provider import (
    DELETING,
    FAILED,
    HEALTHY,
    MAINTENANCE,
    PENDING,
    PREEMPTED,
    QUEUED,
    READY,
    STARTING,
    STOPPED,
    STOPPING,
    TERMINATED,
    UNHEALTHY,
    UNKNOWN,
    CapacityError,
    CatalogEntry,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    CredentialsError,
    FailureKind,
    NotOfferedError,
    QuotaError,
    check_requirements,
)

from aios_cloud_gcp import catalog as _catalog
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


class GcpProvider(CloudProvider):
    name = "gcp"
    storage_scheme = "gs"
    cli = "gcloud"

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

    # -------------------------------------------------------------- catalog
    def catalog(self) -> list[CatalogEntry]:
        return _catalog.catalog(self.settings)

    def entry(self, accelerator: str) -> CatalogEntry:
        try:
            return _catalog.entry_for(accelerator, self.settings)
        except AiosError as exc:
            raise CloudError(
                f"unknown accelerator '{accelerator}' for cloud gcp ({exc.message})",
                "pick one from `aios catalog --cloud gcp` (e.g. v4-16, v5litepod-8, v6e-4)",
            ) from None

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        entry = self.entry(request.accelerator)
        if _catalog.generation(entry.accelerator) in _catalog.GKE_ONLY:
            raise CloudError(
                f"{entry.accelerator}: TPU7x is served through GKE (and Compute Engine) only, not "
                "the Cloud TPU API aios uses for --cloud gcp",
                f"run it on a GKE cluster with a tpu7x node pool: aios launch --cloud k8s -a "
                f"{entry.accelerator} ... (https://cloud.google.com/tpu/docs/tpu7x)",
            )
        zone = request.zone or self.settings.zone
        if zone and entry.zones and zone not in entry.zones:
            raise CloudError(
                f"zone '{zone}' does not offer {entry.accelerator}",
                f"use one of: {', '.join(entry.zones)}",
            )
        if request.region:
            in_region = [z for z in entry.zones if self.zone_region(z) == request.region]
            if zone and self.zone_region(zone) != request.region:
                if request.zone:
                    raise CloudError(
                        f"zone '{zone}' is not in region {request.region}",
                        f"drop --zone or --region, or use one of: {', '.join(in_region) or 'none there'}",
                    )
                zone = None  # gcp.zone is only a default
            if not in_region:
                regions = sorted({self.zone_region(z) for z in entry.zones})
                raise CloudError(
                    f"region {request.region} offers no {entry.accelerator}",
                    f"use one of: {', '.join(regions)}",
                )
            zone = zone or in_region[0]
        if request.nodes != 1:
            raise CloudError(
                f"--nodes {request.nodes}: multislice TPU clusters are not supported",
                "use one larger slice (e.g. v4-32 instead of 2 x v4-16)",
            )
        if request.extra.get("reservation") and request.spot:
            raise CloudError(
                "--spot and --reservation contradict each other (reserved capacity is not spot)",
                "pass only one",
            )
        if request.disk_gb is not None:
            raise CloudError(
                "--disk-gb does not apply to TPU VMs (fixed boot disk)",
                "drop --disk-gb; keep data on gs:// buckets",
            )
        # a relative time is made absolute once, here: every zone the failover tries (and a
        # managed recreate) then queues against the same deadline, not a fresh "+6h" each
        now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
        whens = {}
        for what, value in (
            ("--valid-after", request.valid_after),
            ("--valid-until", request.valid_until),
        ):
            if value:
                kind, v = _parse_when(value, what)
                value = _rfc3339(now + _dt.timedelta(seconds=v) if kind == "duration" else v)
            whens[what] = value
        request = replace(
            request, valid_after=whens["--valid-after"], valid_until=whens["--valid-until"]
        )
        labels = {
            k.lower(): re.sub(r"[^a-z0-9_-]", "-", str(v).lower())[:63]
            for k, v in request.labels.items()
        }
        return replace(
            request,
            accelerator=entry.accelerator,
            zone=zone or (entry.zones[0] if entry.zones else None),
            image=request.image or entry.runtime,
            project=self.project(request.project),
            labels=labels,
        )

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

    # -------------------------------------------------------------- the create plan
    def plan_create(self, request: ClusterRequest) -> CreatePlan:
        """The one REST body :meth:`create` sends and :meth:`render_create` prints as ``gcloud``
        (so the dry run shows exactly what a launch sends)."""
        project = self.project(request.project)
        zone = request.zone or "-"
        parent = f"projects/{project}/locations/{zone}"
        node: dict[str, Any] = {
            "acceleratorType": request.accelerator,
            "runtimeVersion": request.image or self.entry(request.accelerator).runtime,
            "networkConfig": {"enableExternalIps": not self.settings.use_internal_ip},
        }
        if request.labels:
            node["labels"] = dict(sorted(request.labels.items()))
        key = request.ssh_public_key or PUBLIC_KEY_PLACEHOLDER
        if self.settings.os_login:
            # the key lives in the user's OS Login profile (imported by prepare); ssh-keys
            # metadata is ignored where OS Login is enforced
            node["metadata"] = {"enable-oslogin": "TRUE"}
        else:
            node["metadata"] = {"ssh-keys": f"{request.ssh_user}:{key}"}
        if self.settings.network:
            node["networkConfig"]["network"] = self.settings.network
        if self.settings.subnetwork:
            node["networkConfig"]["subnetwork"] = self.settings.subnetwork
        if self.settings.service_account:
            node["serviceAccount"] = {
                "email": self.settings.service_account,
                "scope": [CLOUD_PLATFORM_SCOPE],
            }
        reservation = request.extra.get("reservation")
        if not request.queued:
            sched = {}
            if request.spot:
                sched["spot"] = True
            if reservation:
                sched["reserved"] = True
            if sched:
                node["schedulingConfig"] = sched
            return CreatePlan("node", project, zone, request.name, node)
        body: dict[str, Any] = {
            "tpu": {"nodeSpec": [{"parent": parent, "nodeId": request.name, "node": node}]}
        }
        if request.spot:
            body["spot"] = {}
        if reservation:
            body["reservationName"] = (
                reservation
                if reservation.startswith("projects/")
                else f"projects/{project}/locations/{zone}/reservations/{reservation}"
            )
        policy: dict[str, Any] = {}
        whens = {
            f: _parse_when(t, f"--{f.replace('A', '-a').replace('U', '-u')}")
            for f, t in (("validAfter", request.valid_after), ("validUntil", request.valid_until))
            if t
        }
        if len(whens) == 2:
            # after and until share one oneof in the API: both together are an interval
            now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
            ends = [
                now + _dt.timedelta(seconds=v) if k == "duration" else v
                for k, v in (whens["validAfter"], whens["validUntil"])
            ]
            policy["validInterval"] = {"startTime": _rfc3339(ends[0]), "endTime": _rfc3339(ends[1])}
        for field_, (kind, value) in whens.items() if len(whens) == 1 else ():
            policy[f"{field_}Duration" if kind == "duration" else f"{field_}Time"] = (
                f"{value}s" if kind == "duration" else _rfc3339(value)
            )
        if policy:
            body["queueingPolicy"] = policy
        return CreatePlan("queued", project, zone, request.name, body)

    # -------------------------------------------------------------- OS Login
    def os_login_account(self) -> str:
        if self.settings.os_login_user:
            return self.settings.os_login_user
        email = getattr(self._credentials(), "service_account_email", None)
        if not email or email == "default":
            raise CloudError(
                "gcp.os_login is on but the account is unknown",
                "set gcp.os_login_user to your account email",
            )
        return email

    def prepare(self, request: ClusterRequest) -> ClusterRequest:
        """With ``gcp.os_login``: import aios's public key into the account's OS Login profile
        (``users.importSshPublicKey``) and log in as the profile's POSIX user."""
        if not self.settings.os_login:
            return request
        if not request.ssh_public_key:
            raise CloudError(
                "no SSH public key to import into OS Login",
                "let aios create its key (aios launch does)",
            )
        import urllib.parse

        from google.auth.transport.requests import AuthorizedSession

        account = self.os_login_account()
        url = (
            f"{self.settings.os_login_endpoint.rstrip('/')}/v1/users/{urllib.parse.quote(account)}:importSshPublicKey"
            f"?projectId={urllib.parse.quote(self.project(request.project))}"
        )
        session = AuthorizedSession(self._credentials())
        try:
            r = session.post(url, json={"key": request.ssh_public_key}, timeout=60)
        except Exception as exc:  # noqa: BLE001
            raise TransientCloudError(
                f"OS Login: {type(exc).__name__}: {exc}", "check the network"
            ) from None
        if r.status_code != 200:
            msg = (
                r.json().get("error", {}).get("message", r.text[:200])
                if r.headers.get("content-type", "").startswith("application/json")
                else r.text[:200]
            )
            raise CloudError(
                f"OS Login refused the key for {account} ({r.status_code}): {msg}",
                "check the account has roles/compute.osAdminLogin (or osLogin) on the project",
            )
        accounts = (r.json().get("loginProfile") or {}).get("posixAccounts") or []
        user = next((a.get("username") for a in accounts if a.get("primary")), None) or (
            accounts[0].get("username") if accounts else None
        )
        if not user:
            raise CloudError(
                f"the OS Login profile of {account} has no POSIX account",
                "log in once with `gcloud compute ssh` to create it",
            )
        return replace(request, ssh_user=user)

    # -------------------------------------------------------------- lifecycle
    def create(self, request: ClusterRequest) -> ClusterInfo:
        from google.cloud import tpu_v2

        client = self.client()
        plan = self.plan_create(request)
        if PUBLIC_KEY_PLACEHOLDER in json.dumps(plan.body):
            del plan.node[
                "metadata"
            ]  # no key to install (API-level use); the dry run shows the placeholder
        parent = plan.parent
        what = f"create {request.accelerator} '{request.name}' in {request.zone}"
        try:
            if plan.kind == "queued":
                qr = tpu_v2.QueuedResource.from_json(json.dumps(plan.body))
                op = client.create_queued_resource(
                    parent=parent, queued_resource_id=request.name, queued_resource=qr
                )
                self._wait(op, what)
                self._wait_queued(f"{parent}/queuedResources/{request.name}", what, request)
            else:
                op = client.create_node(
                    parent=parent,
                    node_id=request.name,
                    node=tpu_v2.Node.from_json(json.dumps(plan.body)),
                )
                self._wait(op, what)
            got = client.get_node(name=f"{parent}/nodes/{request.name}")
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        info = self._info(got, request.zone)
        if info.state != READY:
            raise CloudError(
                f"{what}: node is {info.state} after creation",
                "see `aios status --refresh`; delete it with `aios down`",
            )
        return info

    def queue_deadline(self, request: ClusterRequest, now: float | None = None) -> float:
        """Seconds to wait for a queued resource: until ``--valid-until`` (plus a grace for the
        API to mark it FAILED), else ``gcp.queue_timeout``."""
        now = time.time() if now is None else now
        if not request.valid_until:
            return self.settings.queue_timeout
        kind, value = _parse_when(request.valid_until, "--valid-until")
        until = value if kind == "duration" else value.timestamp() - now
        return max(0.0, until) + self.settings.queue_grace

    def _wait_queued(self, qr_name: str, what: str, request: ClusterRequest) -> None:
        """Wait until the queued resource is ACTIVE. A transient API error while waiting never
        gives up the queue position: it is retried until the deadline."""
        client = self.client()
        budget = self.queue_deadline(request)
        deadline = time.monotonic() + budget
        transient = 0
        while True:
            try:
                qr = client.get_queued_resource(name=qr_name)
                transient = 0
            except Exception as exc:  # noqa: BLE001 - mapped
                mapped = self._map(exc, what)
                if not isinstance(mapped, TransientCloudError) or time.monotonic() > deadline:
                    raise mapped from None
                transient += 1
                time.sleep(min(60.0, self.settings.poll_interval * 2 ** min(transient, 6)))
                continue
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            if state == "ACTIVE":
                return
            if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
                detail = ""
                with _SuppressAll():
                    detail = qr.state.failed_data.error.message
                raise CapacityError(
                    f"{what}: queued resource {state.lower()}{': ' + detail if detail else ''}",
                    "retry later or widen --valid-until",
                )
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{what}: queued resource still {state} after {budget:.0f}s",
                    "widen --valid-until (or gcp.queue_timeout)",
                )
            time.sleep(self.settings.poll_interval)

    def _info(self, node: Any, zone: str | None) -> ClusterInfo:
        state_name = node.state.name if hasattr(node.state, "name") else str(node.state)
        health_name = node.health.name if hasattr(node.health, "name") else str(node.health)
        if health_name == "HEALTHY":
            health = HEALTHY
        elif health_name == "UNHEALTHY_MAINTENANCE":
            health = MAINTENANCE  # resumes by itself
        elif health_name.startswith("UNHEALTHY") or health_name == "TIMEOUT":
            health = UNHEALTHY
        else:
            health = UNKNOWN
        hosts = []
        for i, ep in enumerate(node.network_endpoints):
            external = ep.access_config.external_ip if ep.access_config else ""
            ip = ep.ip_address if self.settings.use_internal_ip or not external else external
            hosts.append(
                ClusterHost(
                    worker_id=i,
                    ip=ip,
                    internal_ip=ep.ip_address or None,
                    ssh_user=self.settings.ssh_user,
                )
            )
        name = node.name.rsplit("/", 1)[-1]
        zone = zone if zone and zone != "-" else node.name.split("/locations/")[1].split("/")[0]
        return ClusterInfo(
            name=name,
            cloud="gcp",
            zone=zone,
            accelerator=node.accelerator_type,
            state=_STATE.get(state_name, UNKNOWN),
            health=health,
            health_detail=health_name
            if health in (UNHEALTHY, MAINTENANCE)
            else (node.health_description or ""),
            spot=bool(
                node.scheduling_config
                and (node.scheduling_config.spot or node.scheduling_config.preemptible)
            ),
            hosts=hosts,
            runtime=node.runtime_version,
            labels=dict(node.labels),
            created=str(node.create_time) if node.create_time else None,
            raw={
                "state": state_name,
                "health": health_name,
                "queued_resource": node.queued_resource or None,
            },
        )

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        from google.api_core import exceptions as gex

        client = self.client()
        try:
            return self._info(client.get_node(name=self._node_name(name, zone)), zone)
        except gex.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, f"describe {name}") from None
        try:  # a queued resource still waiting has no node yet
            qr = client.get_queued_resource(name=f"{self._parent(zone)}/queuedResources/{name}")
        except gex.NotFound:
            return None
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, f"describe {name}") from None
        state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
        return ClusterInfo(
            name=name,
            cloud="gcp",
            zone=zone,
            accelerator="",
            state=QUEUED if state in _QR_WAITING else FAILED,
            raw={"queued_resource_state": state},
        )

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        client = self.client()
        try:
            nodes = list(client.list_nodes(parent=self._parent(zone)))
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, "list TPU nodes") from None
        out = [self._info(n, None) for n in nodes if "aios-cluster" in n.labels]
        have = {c.name for c in out}
        try:
            qrs = list(client.list_queued_resources(parent=self._parent(zone)))
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, "list queued resources") from None
        for qr in qrs:  # still waiting: no node yet, the labels are in its node spec
            specs = list(qr.tpu.node_spec) if qr.tpu else []
            if not specs or "aios-cluster" not in specs[0].node.labels:
                continue
            name = qr.name.rsplit("/", 1)[-1]
            if name in have:
                continue
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            qzone = qr.name.split("/locations/")[1].split("/")[0]
            out.append(
                ClusterInfo(
                    name=name,
                    cloud="gcp",
                    zone=qzone,
                    accelerator=specs[0].node.accelerator_type,
                    state=QUEUED if state in _QR_WAITING else FAILED,
                    spot=bool(qr.spot),
                    labels=dict(specs[0].node.labels),
                    raw={"queued_resource_state": state},
                )
            )
        return out

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        client = self.client()
        what = f"start {name}"
        try:
            self._wait(client.start_node(request={"name": self._node_name(name, zone)}), what)
            info = self._info(client.get_node(name=self._node_name(name, zone)), zone)
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        return info

    # -------------------------------------------------------------- autostop rights
    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        """``aios autostop NAME MIN`` later: a TPU VM's service account cannot be changed on a
        running node, so its rights are checked as at launch (:meth:`prepare_autostop`), and a
        missing grant is one line, exit 2, before the agent is installed."""
        self.prepare_autostop(ClusterRequest(name=name, accelerator="", zone=zone), action)

    def prepare_autostop(
        self, request: ClusterRequest, action: str, dry_run: bool = False
    ) -> ClusterRequest:
        """The agent stops/deletes the slice as the TPU VM's service account (``gcp.service_account``,
        else the project's default compute service account). Organisations often strip that
        account of its default Editor role, so its roles are read from the project's IAM policy
        (Cloud Resource Manager ``getIamPolicy``) before anything is created: missing TPU rights
        are one line, exit 2, naming the grant; a policy aios may not read, or a custom role, is a
        note naming the same grant."""
        if dry_run:
            return request
        project = self.project(request.project)
        need = AGENT_PERMISSIONS[action]
        try:
            sa = self.settings.service_account or (
                f"{self._crm('GET', project)['projectNumber']}-compute@developer.gserviceaccount.com"
            )
            policy = self._crm("POST", f"{project}:getIamPolicy")
        except CloudError as exc:
            sa = self.settings.service_account or "the default compute service account"
            print(
                f"[aios] note: cannot check that {sa} may {action} the slice ({exc.message}); "
                f"the autostop agent needs {', '.join(need)}",
                file=sys.stderr,
            )
            return request
        member = f"serviceAccount:{sa}"
        roles = {b["role"] for b in policy.get("bindings", []) if member in b.get("members", [])}
        missing = [p for p in need if not has_permission(roles, p)]
        grant = (
            f"gcloud projects add-iam-policy-binding {project} --member={member} "
            "--role=roles/tpu.admin"
        )
        if missing and set(roles) - set(ROLE_PERMISSIONS):
            print(
                f"[aios] note: {sa} has roles aios cannot read ({', '.join(sorted(roles))}); the "
                f"autostop agent needs {', '.join(need)} (`{grant}` grants them)",
                file=sys.stderr,
            )
        elif missing:
            raise CloudError(
                f"the autostop agent could not {action} the slice: service account {sa} lacks "
                f"{', '.join(missing)}",
                f"grant them (`{grant}`), or set gcp.service_account to an account that has them",
            )
        return request

    def _crm(self, method: str, path: str) -> dict[str, Any]:
        """A Cloud Resource Manager v1 ``projects`` call (the local test service serves it at
        ``gcp.endpoint``)."""
        from google.auth.transport.requests import AuthorizedSession

        base = self.settings.endpoint or "https://cloudresourcemanager.googleapis.com"
        try:
            r = AuthorizedSession(self._credentials()).request(
                method,
                f"{base.rstrip('/')}/v1/projects/{path}",
                json={} if method == "POST" else None,
                timeout=30,
            )
        except Exception as exc:  # noqa: BLE001 - one line
            raise CloudError(f"Cloud Resource Manager: {type(exc).__name__}", "") from None
        if r.status_code != 200:
            msg = (r.json().get("error") or {}).get("message", r.text[:200]) if r.content else ""
            raise CloudError(f"Cloud Resource Manager {r.status_code}: {msg}", "")
        return dict(r.json())

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        if spot:
            return super().stop_refusal(spot, accelerator)
        if accelerator and self.entry(accelerator).hosts > 1:
            # "This operation is only available with single TPU nodes"
            # (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/stop)
            return f"{accelerator} is a multi-host slice, which Cloud TPU cannot stop, only delete"
        return None

    def stop(self, name: str, zone: str | None) -> None:
        client = self.client()
        what = f"stop {name}"
        info = self.describe(name, zone)
        why = self.stop_refusal(info.spot, info.accelerator) if info is not None else None
        if why:
            raise CloudError(
                f"cannot stop {name}: {why}",
                f"delete it with `aios down {name}` (a managed run recreates it), or use "
                "--autostop N --autodown to delete it when idle",
            )
        try:
            self._wait(client.stop_node(request={"name": self._node_name(name, zone)}), what)
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None

    def delete(self, name: str, zone: str | None) -> None:
        from google.api_core import exceptions as gex
        from google.cloud import tpu_v2

        client = self.client()
        what = f"delete {name}"
        try:
            try:
                op = client.delete_queued_resource(
                    request=tpu_v2.DeleteQueuedResourceRequest(
                        name=f"{self._parent(zone)}/queuedResources/{name}", force=True
                    )
                )
                self._wait(op, what)
            except gex.NotFound:
                pass
            try:
                self._wait(client.delete_node(name=self._node_name(name, zone)), what)
            except gex.NotFound:
                pass
            except CloudError as exc:
                if "not found" not in str(exc).lower():
                    raise
        except gex.NotFound:
            return
        except AiosError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None

    def repair(self, info: ClusterInfo) -> str:
        why = self.stop_refusal(info.spot, info.accelerator)
        if why:
            raise CloudError(f"{info.name} cannot be stopped and restarted: {why}", "recreate it")
        return super().repair(info)

    def zone_region(self, zone: str) -> str:
        return zone.rsplit("-", 1)[0]

    def controller_settings(self) -> dict[str, Any]:
        d = self.settings.model_dump(exclude_none=True)
        d.update(self.agent_settings())
        return d

    def agent_settings(self) -> dict[str, Any]:
        s = self.settings
        out: dict[str, Any] = {"project": self.project(), "poll_interval": s.poll_interval}
        endpoint = s.agent_endpoint or s.endpoint
        if endpoint:
            out["endpoint"] = endpoint
        # on a TPU VM: its service account (ADC through the metadata server); a local test
        # service takes anonymous calls
        out["credentials"] = "anonymous" if s.credentials == "anonymous" else "adc"
        return out

    # -------------------------------------------------------------- runtime on the hosts
    def python(self, accelerator: str, backend: str | None = None) -> str:
        """``python3`` of the TPU VM image for torch_xla; for TorchTPU (``--backend tpu``) the
        venv :meth:`setup_commands` makes, since the image's Python is 3.10 and torch_tpu has
        cp311/cp312 wheels only."""
        if (backend or self.backend_for(accelerator)) == "tpu":
            return f"{TORCH_TPU_VENV}/bin/python"
        return "python3"

    def setup_commands(
        self, accelerator: str, requirements: list[str], backend: str | None = None
    ) -> list[str]:
        lines = ["python3 -m pip install --quiet --upgrade pip"]
        py = "python3"
        if (backend or self.backend_for(accelerator)) == "tpu":
            # TorchTPU: the torch / torch_tpu / libtpu set of aios.versions (one fact, one place);
            # torch_xla is not installed (it would pin another torch). The runtime images are
            # Ubuntu 22.04 with Python 3.10 and torch_tpu ships cp311/cp312 wheels only, so it
            # goes into a Python 3.12 venv made by uv, which downloads a managed CPython
            # (https://docs.astral.sh/uv/concepts/python-versions/#automatic-python-downloads);
            # never into the image's python3.
            from aios.versions import STACKS

            py = f"{TORCH_TPU_VENV}/bin/python"
            install = STACKS["torch_tpu"][0].install
            lines += [
                "python3 -m pip install --quiet uv",
                f"python3 -m uv venv --allow-existing --seed --python {TORCH_TPU_PYTHON} "
                f"{TORCH_TPU_VENV}",
                f"{py} -m pip install --quiet " + install.removeprefix("pip install "),
            ]
        else:
            v = self.settings.torch_version
            minor = ".".join(v.split(".")[:2])
            finds = " ".join(f"-f {u}" for u in LIBTPU_INDEXES)
            # torch and torch_xla must match; torch_xla[tpu] pins the matching libtpu wheel.
            lines.append(
                f"python3 -m pip install --quiet 'torch~={minor}.0' 'torch_xla[tpu]~={minor}.0' {finds}"
            )
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
        # PJRT_DEVICE and the per-host worker env come from backend-xla's launch plan; this is
        # what only the cloud side knows.
        return {"TPU_ACCELERATOR_TYPE": info.accelerator} if info.accelerator else {}

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> list[CloudCommand]:
        plan = self.plan_create(request)
        pre = []
        if self.settings.os_login:
            pre.append(
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "os-login",
                        "ssh-keys",
                        "add",
                        "--key-file=<aios public key file>",
                        f"--project={plan.project}",
                    ],
                    "OS Login: log in as the profile's POSIX user",
                )
            )
        if plan.kind == "queued":
            return [
                *pre,
                CloudCommand(plan.gcloud_argv(), "queued resource: waits for capacity"),
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "queued-resources",
                        "describe",
                        request.name,
                        f"--project={plan.project}",
                        f"--zone={plan.zone}",
                    ],
                    "poll until ACTIVE",
                ),
            ]
        return [*pre, CloudCommand(plan.gcloud_argv())]

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        project = self.project()
        if action == "list":
            return [
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "tpu-vm",
                        "list",
                        f"--project={project}",
                        f"--zone={zone or '-'}",
                        "--filter=labels.aios-cluster:*",
                    ]
                )
            ]
        argv = [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            action,
            name,
            f"--project={project}",
            f"--zone={zone}",
        ]
        if action == "delete":
            return [
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "queued-resources",
                        "delete",
                        name,
                        f"--project={project}",
                        f"--zone={zone}",
                        "--force",
                        "--quiet",
                    ],
                    "if it was queued",
                ),
                CloudCommand([*argv, "--quiet"]),
            ]
        return [CloudCommand(argv)]


class _SuppressAll:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
