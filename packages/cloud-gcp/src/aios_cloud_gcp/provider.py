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
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import replace
from typing import Any

from aios.cloud.provider import (
    DELETING,
    FAILED,
    HEALTHY,
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
    QuotaError,
)
from aios.errors import AiosError
from aios_cloud_gcp import catalog as _catalog
from aios_cloud_gcp.settings import GcpSettings


class TransientCloudError(CloudError):
    """The API was briefly unavailable; the failover loop retries the same zone."""


_STATE = {
    "CREATING": PENDING, "READY": READY, "RESTARTING": PENDING, "REIMAGING": PENDING,
    "DELETING": DELETING, "REPAIRING": PENDING, "STOPPED": STOPPED, "STOPPING": STOPPING,
    "STARTING": STARTING, "PREEMPTED": PREEMPTED, "TERMINATED": TERMINATED,
}
_QR_WAITING = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES", "STATE_UNSPECIFIED")
LIBTPU_INDEXES = ("https://storage.googleapis.com/libtpu-releases/index.html", "https://storage.googleapis.com/libtpu-wheels/index.html")


def _parse_when(text: str, what: str) -> tuple[str, Any]:
    """``+2h`` / ``+90m`` / ``+3600s`` -> ("duration", seconds); RFC 3339 -> ("time", datetime)."""
    m = re.fullmatch(r"\+(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return "duration", int(float(m.group(1)) * mult)
    try:
        t = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CloudError(f"{what} '{text}' is neither +DURATION nor an RFC 3339 time", f"write e.g. {what} +6h or {what} 2026-01-02T03:04:05Z") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return "time", t


class GcpProvider(CloudProvider):
    name = "gcp"
    storage_scheme = "gs"
    cli = "gcloud"

    def __init__(self, config: Any = None) -> None:
        section = config.section("gcp") if config is not None and hasattr(config, "section") else None
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
        p = self.settings.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
        if not p and shutil.which("gcloud"):
            try:
                r = subprocess.run(["gcloud", "config", "get-value", "project"], capture_output=True, text=True, timeout=20)
                p = r.stdout.strip() or None
            except (OSError, subprocess.TimeoutExpired):
                p = None
        if not p:
            raise CloudError("no GCP project is set", "pass --project, set gcp.project in the config (AIOS_GCP__PROJECT), or export GOOGLE_CLOUD_PROJECT")
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
                creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
                return creds
            except DefaultCredentialsError as exc:
                problems.append(f"ADC: {str(exc).splitlines()[0][:120]}")
        if mode in ("auto", "gcloud"):
            gcloud = shutil.which("gcloud")
            if gcloud:
                r = subprocess.run([gcloud, "auth", "print-access-token"], capture_output=True, text=True, timeout=30)
                if r.returncode == 0 and r.stdout.strip():
                    from google.oauth2.credentials import Credentials

                    return Credentials(token=r.stdout.strip())
                problems.append("gcloud: not logged in")
            else:
                problems.append("gcloud: not installed")
        raise CredentialsError(f"no Google Cloud credentials found ({'; '.join(problems)})",
                               "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a key file")

    def describe_credentials(self) -> str:
        creds = self._credentials()
        return type(creds).__module__.split(".")[-1] + "." + type(creds).__name__

    def client(self) -> Any:
        if self._client is None:
            from google.cloud import tpu_v2

            opts = {"api_endpoint": self.settings.endpoint} if self.settings.endpoint else None
            self._client = tpu_v2.TpuClient(credentials=self._credentials(), transport="rest", client_options=opts)
        return self._client

    # -------------------------------------------------------------- catalog
    def catalog(self) -> list[CatalogEntry]:
        return _catalog.catalog(self.settings)

    def entry(self, accelerator: str) -> CatalogEntry:
        try:
            return _catalog.entry_for(accelerator, self.settings)
        except AiosError as exc:
            raise CloudError(f"unknown accelerator '{accelerator}' for cloud gcp ({exc.message})",
                             "pick one from `aios catalog --cloud gcp` (e.g. v4-16, v5litepod-8, v6e-4)") from None

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        entry = self.entry(request.accelerator)
        zone = request.zone or self.settings.zone
        if zone and entry.zones and zone not in entry.zones:
            raise CloudError(f"zone '{zone}' does not offer {entry.accelerator}", f"use one of: {', '.join(entry.zones)}")
        if request.nodes != 1:
            raise CloudError(f"--nodes {request.nodes}: multislice TPU clusters are not supported", "use one larger slice (e.g. v4-32 instead of 2 x v4-16)")
        if request.disk_gb is not None:
            raise CloudError("--disk-gb does not apply to TPU VMs (fixed boot disk)", "drop --disk-gb; keep data on gs:// buckets")
        for what, value in (("--valid-after", request.valid_after), ("--valid-until", request.valid_until)):
            if value:
                _parse_when(value, what)
        labels = {k.lower(): re.sub(r"[^a-z0-9_-]", "-", str(v).lower())[:63] for k, v in request.labels.items()}
        return replace(request, accelerator=entry.accelerator, zone=zone or (entry.zones[0] if entry.zones else None),
                       image=request.image or entry.runtime, project=self.project(request.project), labels=labels)

    # -------------------------------------------------------------- errors
    def _map(self, exc: BaseException, what: str) -> BaseException:
        from google.api_core import exceptions as gex

        msg = getattr(exc, "message", None) or str(exc)
        msg = re.sub(r"^(GET|POST|DELETE|PATCH|PUT) \S+: ", "", " ".join(str(msg).split()))[:300]
        exhausted = isinstance(exc, (gex.ResourceExhausted, gex.TooManyRequests)) or "RESOURCE_EXHAUSTED" in msg
        if exhausted and "quota" in msg.lower():
            return QuotaError(f"{what}: quota exceeded: {msg}", "request more TPU quota, or try another zone/type")
        # ResourceExhausted subclasses TooManyRequests; a bare 429 is rate limiting (transient)
        if exhausted and (type(exc) is not gex.TooManyRequests or "capacity" in msg.lower()):
            return CapacityError(f"{what}: no capacity: {msg}", "try another zone, --queued, or later")
        if isinstance(exc, (gex.ServiceUnavailable, gex.InternalServerError, gex.DeadlineExceeded, gex.TooManyRequests)):
            return TransientCloudError(f"{what}: {msg}", "retry")
        if isinstance(exc, (gex.Unauthenticated, gex.PermissionDenied)):
            return CredentialsError(f"{what}: permission denied: {msg}", "check the account has roles/tpu.admin on the project (`gcloud auth list`)")
        if isinstance(exc, gex.AlreadyExists):
            return CloudError(f"{what}: already exists: {msg}", "pick another --name or `aios down NAME`")
        if isinstance(exc, gex.GoogleAPICallError):
            return CloudError(f"{what}: {msg}", "see the message; rerun with --debug for details")
        if isinstance(exc, AiosError):
            return exc
        if isinstance(exc, (ConnectionError, OSError)) or type(exc).__module__.startswith(("requests", "urllib3")):
            return TransientCloudError(f"{what}: {type(exc).__name__}: {msg}", "check the network and the API endpoint")
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
                raise CloudError(f"{what}: timed out after {timeout or self.settings.create_timeout:.0f}s", "check the console; raise gcp.create_timeout")
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

    # -------------------------------------------------------------- lifecycle
    def _node(self, request: ClusterRequest) -> Any:
        from google.cloud import tpu_v2

        metadata = {}
        if request.ssh_public_key:
            metadata["ssh-keys"] = f"{request.ssh_user}:{request.ssh_public_key}"
        net = tpu_v2.NetworkConfig(enable_external_ips=not self.settings.use_internal_ip)
        if self.settings.network:
            net.network = self.settings.network
        if self.settings.subnetwork:
            net.subnetwork = self.settings.subnetwork
        node = tpu_v2.Node(
            accelerator_type=request.accelerator, runtime_version=request.image or self.entry(request.accelerator).runtime,
            labels=dict(request.labels), metadata=metadata, network_config=net,
            description=f"aios cluster {request.name}",
        )
        if request.spot and not request.queued:
            node.scheduling_config = tpu_v2.SchedulingConfig(spot=True)
        if self.settings.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=self.settings.service_account)
        return node

    def create(self, request: ClusterRequest) -> ClusterInfo:
        from google.cloud import tpu_v2

        client = self.client()
        parent = self._parent(request.zone, request.project)
        node = self._node(request)
        what = f"create {request.accelerator} '{request.name}' in {request.zone}"
        try:
            if request.queued:
                qr = tpu_v2.QueuedResource(
                    tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=request.name, node=node)]),
                )
                if request.spot:
                    qr.spot = tpu_v2.QueuedResource.Spot()
                policy = self._queueing_policy(request)
                if policy is not None:
                    qr.queueing_policy = policy
                op = client.create_queued_resource(parent=parent, queued_resource_id=request.name, queued_resource=qr)
                self._wait(op, what)
                self._wait_queued(f"{parent}/queuedResources/{request.name}", what)
            else:
                op = client.create_node(parent=parent, node_id=request.name, node=node)
                self._wait(op, what)
            got = client.get_node(name=f"{parent}/nodes/{request.name}")
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        info = self._info(got, request.zone)
        if info.state != READY:
            raise CloudError(f"{what}: node is {info.state} after creation", "see `aios status --refresh`; delete it with `aios down`")
        return info

    def _queueing_policy(self, request: ClusterRequest) -> Any:
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2, timestamp_pb2

        if not (request.valid_after or request.valid_until):
            return None
        pol = tpu_v2.QueuedResource.QueueingPolicy()
        for field_, text in (("valid_after", request.valid_after), ("valid_until", request.valid_until)):
            if not text:
                continue
            kind, value = _parse_when(text, f"--{field_.replace('_', '-')}")
            if kind == "duration":
                setattr(pol, f"{field_}_duration", duration_pb2.Duration(seconds=value))
            else:
                ts = timestamp_pb2.Timestamp()
                ts.FromDatetime(value.astimezone(_dt.timezone.utc).replace(tzinfo=None))
                setattr(pol, f"{field_}_time", ts)
        return pol

    def _wait_queued(self, qr_name: str, what: str) -> None:
        client = self.client()
        deadline = time.monotonic() + self.settings.create_timeout
        while True:
            qr = client.get_queued_resource(name=qr_name)
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            if state == "ACTIVE":
                return
            if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
                detail = ""
                with _suppress():
                    detail = qr.state.failed_data.error.message
                raise CapacityError(f"{what}: queued resource {state.lower()}{': ' + detail if detail else ''}", "retry later or widen --valid-until")
            if time.monotonic() > deadline:
                raise CloudError(f"{what}: queued resource still {state} after {self.settings.create_timeout:.0f}s", "widen gcp.create_timeout or --valid-until")
            time.sleep(self.settings.poll_interval)

    def _info(self, node: Any, zone: str | None) -> ClusterInfo:
        state_name = node.state.name if hasattr(node.state, "name") else str(node.state)
        health_name = node.health.name if hasattr(node.health, "name") else str(node.health)
        if health_name == "HEALTHY":
            health = HEALTHY
        elif health_name.startswith("UNHEALTHY") or health_name == "TIMEOUT":
            health = UNHEALTHY
        else:
            health = UNKNOWN
        hosts = []
        for i, ep in enumerate(node.network_endpoints):
            external = ep.access_config.external_ip if ep.access_config else ""
            ip = ep.ip_address if self.settings.use_internal_ip or not external else external
            hosts.append(ClusterHost(worker_id=i, ip=ip, internal_ip=ep.ip_address or None, ssh_user=self.settings.ssh_user))
        name = node.name.rsplit("/", 1)[-1]
        zone = zone if zone and zone != "-" else node.name.split("/locations/")[1].split("/")[0]
        return ClusterInfo(
            name=name, cloud="gcp", zone=zone, accelerator=node.accelerator_type, state=_STATE.get(state_name, UNKNOWN),
            health=health, health_detail=health_name if health == UNHEALTHY else (node.health_description or ""),
            spot=bool(node.scheduling_config and (node.scheduling_config.spot or node.scheduling_config.preemptible)),
            hosts=hosts, runtime=node.runtime_version, labels=dict(node.labels),
            created=str(node.create_time) if node.create_time else None,
            raw={"state": state_name, "health": health_name, "queued_resource": node.queued_resource or None},
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
        return ClusterInfo(name=name, cloud="gcp", zone=zone, accelerator="", state=QUEUED if state in _QR_WAITING else FAILED,
                           raw={"queued_resource_state": state})

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        client = self.client()
        try:
            nodes = list(client.list_nodes(parent=self._parent(zone)))
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, "list TPU nodes") from None
        return [self._info(n, None) for n in nodes if "aios-cluster" in n.labels]

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        client = self.client()
        what = f"start {name}"
        try:
            self._wait(client.start_node(request={"name": self._node_name(name, zone)}), what)
            info = self._info(client.get_node(name=self._node_name(name, zone)), zone)
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        return info

    def stop(self, name: str, zone: str | None) -> None:
        client = self.client()
        what = f"stop {name}"
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
                op = client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(
                    name=f"{self._parent(zone)}/queuedResources/{name}", force=True))
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

    # -------------------------------------------------------------- runtime on the hosts
    def setup_commands(self, accelerator: str, requirements: list[str]) -> list[str]:
        v = self.settings.torch_version
        minor = ".".join(v.split(".")[:2])
        finds = " ".join(f"-f {u}" for u in LIBTPU_INDEXES)
        lines = [
            "python3 -m pip install --quiet --upgrade pip",
            # torch and torch_xla must match; torch_xla[tpu] pins the matching libtpu wheel.
            f"python3 -m pip install --quiet 'torch~={minor}.0' 'torch_xla[tpu]~={minor}.0' {finds}",
        ]
        aios_deps = [r for r in self.settings.aios_requirements if r]
        if aios_deps:
            lines.append("python3 -m pip install --quiet " + " ".join(shlex.quote(r) for r in aios_deps))
        if requirements:
            lines.append("python3 -m pip install --quiet " + " ".join(shlex.quote(r) for r in requirements))
        return lines

    def remote_env(self, info: ClusterInfo) -> dict[str, str]:
        # PJRT_DEVICE and the per-host worker env come from backend-xla's launch plan; this is
        # what only the cloud side knows.
        return {"TPU_ACCELERATOR_TYPE": info.accelerator} if info.accelerator else {}

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> list[CloudCommand]:
        project = self.project(request.project)
        labels = ",".join(f"{k}={v}" for k, v in sorted(request.labels.items()))
        key = "ssh-keys=" + request.ssh_user + ":<aios public key>"
        if request.queued:
            argv = ["gcloud", "compute", "tpus", "queued-resources", "create", request.name, f"--node-id={request.name}",
                    f"--project={project}", f"--zone={request.zone}", f"--accelerator-type={request.accelerator}",
                    f"--runtime-version={request.image}"]
            if request.spot:
                argv.append("--spot")
            for field_, text in (("valid-after", request.valid_after), ("valid-until", request.valid_until)):
                if text:
                    kind, value = _parse_when(text, f"--{field_}")
                    argv.append(f"--{field_}-duration={value}s" if kind == "duration" else f"--{field_}-time={value.isoformat()}")
            return [CloudCommand(argv, "queued resource: waits for capacity"),
                    CloudCommand(["gcloud", "compute", "tpus", "queued-resources", "describe", request.name, f"--project={project}", f"--zone={request.zone}"], "poll until ACTIVE")]
        argv = ["gcloud", "compute", "tpus", "tpu-vm", "create", request.name, f"--project={project}", f"--zone={request.zone}",
                f"--accelerator-type={request.accelerator}", f"--version={request.image}"]
        if request.spot:
            argv.append("--spot")
        if labels:
            argv.append(f"--labels={labels}")
        argv.append(f"--metadata={key}")
        if self.settings.use_internal_ip:
            argv.append("--internal-ips")
        return [CloudCommand(argv)]

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        project = self.project()
        if action == "list":
            return [CloudCommand(["gcloud", "compute", "tpus", "tpu-vm", "list", f"--project={project}", f"--zone={zone or '-'}", "--filter=labels.aios-cluster:*"])]
        argv = ["gcloud", "compute", "tpus", "tpu-vm", action, name, f"--project={project}", f"--zone={zone}"]
        if action == "delete":
            return [CloudCommand(["gcloud", "compute", "tpus", "queued-resources", "delete", name, f"--project={project}", f"--zone={zone}", "--force", "--quiet"], "if it was queued"),
                    CloudCommand([*argv, "--quiet"])]
        return [CloudCommand(argv)]


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
