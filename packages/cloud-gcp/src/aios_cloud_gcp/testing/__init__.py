"""A local Cloud TPU API v2 REST service for tests (the real ``google-cloud-tpu`` client talks
to it with ``transport="rest"``, anonymous credentials and ``api_endpoint=service.url``).

It implements what aios uses: ``nodes`` (create/get/list/delete/stop/start), ``queuedResources``
(create/get/list/delete with ``force``) and ``operations`` (get), with JSON bodies exactly as
the v2 REST API returns them. Machines behind nodes are real: pass ``machines`` (objects with
``ip``, ``internal_ip``, ``home``, ``start(new_host_key=True)``, ``stop()``, e.g.
:class:`aios_cloud.testing.sshd.SshdHost`) and the service starts/stops them as nodes are created,
started, stopped, preempted and deleted, installs the ``ssh-keys`` metadata into
``authorized_keys`` and wipes a machine's home when its node is deleted (a fresh disk).

Injections (what real Google Cloud does to you):

* :meth:`inject_stockout` ``(zone, count)``: the next creates in ``zone`` fail with
  ``RESOURCE_EXHAUSTED`` "no more capacity" (a queued resource waits instead);
* :meth:`inject_quota` ``(zone, count)``: the next creates fail with HTTP 429 quota exceeded;
* :meth:`inject_unavailable` ``(count)``: the next requests answer HTTP 503;
* :meth:`preempt` ``(name)``: the node goes ``PREEMPTED`` and its machines die;
* :meth:`set_health` ``(name, "UNHEALTHY_TENSORFLOW", sticky=False)``: a stop/start heals a
  non-sticky one; a sticky one needs a recreate.
* :meth:`maintenance` ``(name, seconds)``: health ``UNHEALTHY_MAINTENANCE`` that ends by itself.
* :meth:`schedule_maintenance` ``(name, window_start, metadata=None)``: an upcoming host
  maintenance, announced ahead on the hosts' metadata server (:class:`FakeMetadataServer`, key
  ``instance/upcoming-maintenance``, https://cloud.google.com/tpu/docs/view-maintenance-notifications);
  at the window's start every machine of the slice is stopped (a host event on one VM of a
  slice interrupts the entire slice, "Manage GKE node disruption for GPUs and TPUs") and the
  node reports ``UNHEALTHY_MAINTENANCE``.
* :meth:`inject_create_error` ``(zone, code, message, count)``: the next creates in ``zone``
  fail in their operation with that RPC code, as the real API does for a spot node
  ``PREEMPTED`` during creation (3) or used-up reserved capacity (9, "Insufficient reserved
  capacity").
* ``offered`` (zone -> generations): a create of a type the zone does not offer fails with
  ``INVALID_ARGUMENT`` "... is not available in zone ...".

Rules of the real Cloud TPU API, each beside its documentation:

* A spot node cannot be stopped (``stop`` answers ``INVALID_ARGUMENT``); it can only be deleted
  (https://cloud.google.com/tpu/docs/spot).
* Only single-host nodes can be stopped: ``nodes.stop`` "is only available with single TPU
  nodes" (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/stop);
  a multi-host slice answers ``INVALID_ARGUMENT`` and keeps running (and billing).
* Generations the TPU API does not serve: from TPU7x (Ironwood) on, new generations are served
  through GKE or Compute Engine only ("To use TPU7x, you can use Google Kubernetes Engine (GKE)
  or Compute Engine", https://cloud.google.com/tpu/docs/tpu7x); a create answers
  ``INVALID_ARGUMENT`` (:data:`NOT_SERVED`).
* A call from a TPU VM (the autostop agent) acts as the node's service account (the default
  compute service account unless the node names one) and passes only when the project's IAM
  policy (:attr:`FakeTpuService.iam_bindings`) gives that account the permission
  (``tpu.nodes.stop``, ``tpu.nodes.delete``, ...; ``PERMISSION_DENIED`` otherwise). The
  default compute service account starts with the Editor role, as Google grants it unless an
  organization policy turns that off (https://cloud.google.com/compute/docs/access/service-accounts#default_service_account);
  role contents per https://cloud.google.com/iam/docs/roles-permissions/tpu. Cloud Resource
  Manager's ``projects.get`` and ``projects.getIamPolicy`` (v1) are served for aios's check.
* :data:`REAL_ZONES`: the zones that offer each generation, from
  https://cloud.google.com/tpu/docs/regions-zones (pass ``offered=REAL_ZONES``).
* Host images (:data:`RUNTIME_IMAGES`): what a runtime version's VM image ships (Ubuntu 22.04,
  Python 3.10); :func:`check_setup` fails a setup on it as the image would.

``calls`` records ``(method, path)`` of every request; ``nodes``/``queued`` hold the state.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from aios_backend_xla.topology import parse_accelerator_type

if TYPE_CHECKING:
    from aios_cloud.testing.host import Host

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"

_STATUS = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


class ApiError(Exception):
    def __init__(self, code: int, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS.get(code, "UNKNOWN")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# Generations the Cloud TPU API does not serve (GKE / Compute Engine only):
# https://cloud.google.com/tpu/docs/tpu7x
NOT_SERVED = {"tpu7x"}

# Zones offering each generation (https://cloud.google.com/tpu/docs/regions-zones, checked
# 2026-11): v2-8 in us-central1-b/c/f, v2 pods in us-central1-a; v6e also in single-tenant
# zones us-east5-c, us-east4-a/b, us-west1-c.
REAL_ZONES_BY_GENERATION: dict[str, set[str]] = {
    "v2": {
        "us-central1-a",
        "us-central1-b",
        "us-central1-c",
        "us-central1-f",
        "europe-west4-a",
        "asia-east1-c",
    },
    "v3": {"us-central1-a", "us-central1-b", "us-central1-f", "europe-west4-a"},
    "v4": {"us-central2-b"},
    "v5e": {
        "us-central1-a",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
        "us-south1-a",
        "us-west1-c",
        "us-west4-a",
        "europe-west4-b",
        "asia-southeast1-b",
    },
    "v5p": {
        "us-central1-a",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
        "us-south1-a",
        "europe-west4-b",
    },
    "v6e": {
        "us-central1-b",
        "us-east1-d",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
        "us-east4-a",
        "us-east4-b",
        "us-west1-c",
        "europe-west4-a",
        "asia-northeast1-b",
    },
}
REAL_ZONES: dict[str, set[str]] = {}
for _gen, _zones in REAL_ZONES_BY_GENERATION.items():
    for _z in _zones:
        REAL_ZONES.setdefault(_z, set()).add(_gen)


# TPU permissions of the predefined roles: the provider's table
from aios_cloud_gcp.provider import ROLE_PERMISSIONS, has_permission  # noqa: E402,F401

PROJECT_NUMBER = "123456789012"


def hosts_for(accelerator: str) -> int:
    return parse_accelerator_type(accelerator).hosts


@dataclass
class _Op:
    name: str
    ready_at: float
    finish: Callable[[], tuple[dict | None, dict | None]]  # -> (response, error)
    done: bool = False
    response: dict | None = None
    error: dict | None = None

    def poll(self) -> dict:
        if not self.done and time.monotonic() >= self.ready_at:
            self.response, self.error = self.finish()
            self.done = True
        out: dict[str, Any] = {
            "name": self.name,
            "metadata": {"@type": META_TYPE, "verb": "create"},
            "done": self.done,
        }
        if self.done:
            if self.error:
                out["error"] = self.error
            else:
                out["response"] = self.response or {"@type": EMPTY_TYPE}
        return out


@dataclass
class _Node:
    name: str
    zone: str
    body: dict
    machines: list[Any] = field(default_factory=list)
    sticky_unhealthy: bool = False
    maintenance_until: float = 0.0


class FakeTpuService:
    """See the module docstring. Use as a context manager or call :meth:`start`/:meth:`stop`."""

    def __init__(
        self,
        machines: list[Any] | None = None,
        authorized_keys: str | Path | None = None,
        project: str = "aios-test",
        offered: dict[str, set[str]] | None = None,
        op_delay: float = 0.0,
        queue_delay: float = 0.2,
        host: str = "127.0.0.1",
    ) -> None:
        self.machines = list(machines or [])
        self.free = list(self.machines)
        self.authorized_keys = Path(authorized_keys) if authorized_keys else None
        self.project = project
        self.offered = offered  # zone -> generations offered; None: every zone offers everything
        self.op_delay = op_delay
        self.queue_delay = queue_delay
        self.host = host  # "0.0.0.0": the sshd hosts reach it too (the autostop agent calls it)
        self.nodes: dict[str, _Node] = {}
        self.queued: dict[str, dict] = {}
        self.ops: dict[str, _Op] = {}
        self.calls: list[tuple[str, str]] = []
        self.callers: list[tuple[str, str, str]] = []  # (method, path, client address)
        self.oslogin_keys: dict[str, list[str]] = {}  # account -> imported public keys
        self.stockouts: dict[str, int] = {}
        self.quotas: dict[str, int] = {}
        self.unavailable = 0
        self.create_errors: dict[str, list[tuple[int, str]]] = {}
        self.received: list[tuple[str, dict]] = []  # (path, body) of every create request
        self.project_number = PROJECT_NUMBER
        # role -> members of the project's IAM policy
        self.iam_bindings: dict[str, set[str]] = {
            "roles/editor": {f"serviceAccount:{self.default_service_account}"}
        }
        self._caller = threading.local()
        self.lock = threading.RLock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        for m in self.machines:
            with contextlib.suppress(Exception):
                m.stop()

    @property
    def default_service_account(self) -> str:
        return f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"

    def _vm_identity(self, caller: str | None) -> str | None:
        """The service account a call from ``caller`` acts as, when it comes from a node's VM."""
        if not caller:
            return None
        for node in self.nodes.values():
            ips = {
                ip
                for e in node.body.get("networkEndpoints") or []
                for ip in (e.get("ipAddress"), (e.get("accessConfig") or {}).get("externalIp"))
            }
            ips |= {getattr(m, a, None) for m in node.machines for a in ("ip", "internal_ip")}
            if caller in ips:
                sa = (node.body.get("serviceAccount") or {}).get("email")
                return sa or self.default_service_account
        return None

    def _authorize(self, permission: str) -> None:
        sa = self._vm_identity(getattr(self._caller, "ip", None))
        if sa is None:
            return  # the user's own credentials (the laptop)
        roles = {r for r, members in self.iam_bindings.items() if f"serviceAccount:{sa}" in members}
        if not has_permission(roles, permission):
            raise ApiError(
                403,
                f"Permission '{permission}' denied on resource (or it may not exist); the "
                f"caller is {sa}",
                "PERMISSION_DENIED",
            )

    # ------------------------------------------------------------------ server
    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeTpuService:
        svc = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                return json.loads(raw) if raw else {}

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                u = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                with svc.lock:
                    svc.callers.append((method, u.path, self.client_address[0]))
                svc._caller.ip = self.client_address[0]
                try:
                    body = self._body() if method in ("POST", "PATCH") else {}
                    code, obj = svc.dispatch(method, u.path, q, body)
                except ApiError as e:
                    code, obj = (
                        e.code,
                        {"error": {"code": e.code, "message": e.message, "status": e.status}},
                    )
                except Exception as e:  # noqa: BLE001 - a bug in the fake shows as a 500
                    code, obj = (
                        500,
                        {
                            "error": {
                                "code": 500,
                                "message": f"{type(e).__name__}: {e}",
                                "status": "INTERNAL",
                            }
                        },
                    )
                self._send(code, obj)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="fake-tpu", daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        for n in list(self.nodes.values()):
            self._release(n)

    def __enter__(self) -> FakeTpuService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ injections
    def inject_stockout(self, zone: str, count: int = 1) -> None:
        with self.lock:
            self.stockouts[zone] = self.stockouts.get(zone, 0) + count

    def inject_quota(self, zone: str, count: int = 1) -> None:
        with self.lock:
            self.quotas[zone] = self.quotas.get(zone, 0) + count

    def inject_create_error(self, zone: str, code: int, message: str, count: int = 1) -> None:
        with self.lock:
            self.create_errors.setdefault(zone, []).extend([(code, message)] * count)

    def maintenance(self, name: str, seconds: float) -> None:
        """Put the node in host maintenance; it reports HEALTHY again after ``seconds``."""
        with self.lock:
            n = self.node(name)
            n.body["health"] = "UNHEALTHY_MAINTENANCE"
            n.maintenance_until = time.monotonic() + seconds

    def schedule_maintenance(
        self,
        name: str,
        window_start: float,
        metadata: FakeMetadataServer | None = None,
        clock: Callable[[], float] = time.time,
        maintenance_type: str = "SCHEDULED",
    ) -> threading.Thread:
        """Announce host maintenance of ``name`` from ``window_start`` (epoch seconds) on
        ``metadata``, and interrupt the whole slice when the window opens."""
        if metadata is not None:
            metadata.announce(window_start, window_start + 3600, maintenance_type)

        def run() -> None:
            while clock() < window_start:
                time.sleep(min(0.1, max(0.0, window_start - clock())))
            with self.lock:
                n = self.node(name)
                n.body["health"] = "UNHEALTHY_MAINTENANCE"
                for m in n.machines:
                    m.stop()
            if metadata is not None:
                metadata.ongoing()

        t = threading.Thread(target=run, name="tpu-maintenance-window", daemon=True)
        t.start()
        return t

    def inject_unavailable(self, count: int = 1) -> None:
        with self.lock:
            self.unavailable += count

    def node(self, name: str) -> _Node:
        for n in self.nodes.values():
            if n.name.rsplit("/", 1)[-1] == name:
                return n
        raise KeyError(name)

    def preempt(self, name: str) -> None:
        with self.lock:
            n = self.node(name)
            n.body["state"] = "PREEMPTED"
            for m in n.machines:
                m.stop()

    def set_health(self, name: str, health: str, sticky: bool = False) -> None:
        with self.lock:
            n = self.node(name)
            n.body["health"] = health
            n.sticky_unhealthy = sticky and health != "HEALTHY"

    def count(self, method: str, fragment: str) -> int:
        return sum(1 for m, p in self.calls if m == method and fragment in p)

    # ------------------------------------------------------------------ machines
    def _take(self, n: int) -> list[Any] | None:
        if self.machines and len(self.free) < n:
            return None
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def _release(self, node: _Node) -> None:
        for m in node.machines:
            with contextlib.suppress(Exception):
                m.stop()
            # a machine without a home has no disk to wipe (never Path("") == the cwd)
            home = Path(m.home) if getattr(m, "home", None) else None
            if home is not None and home.is_dir():  # a deleted VM's disk is gone
                shutil.rmtree(home, ignore_errors=True)
                home.mkdir(parents=True, exist_ok=True)
            if m not in self.free:
                self.free.append(m)
        node.machines = []

    def _install_keys(self, body: dict) -> None:
        keys = (body.get("metadata") or {}).get("ssh-keys", "")
        if not self.authorized_keys or not keys:
            return
        have = self.authorized_keys.read_text() if self.authorized_keys.exists() else ""
        add = []
        for line in keys.splitlines():
            _user, _, key = line.partition(":")
            if key.strip() and key.strip() not in have:
                add.append(key.strip())
        if add:
            with open(self.authorized_keys, "a") as f:
                f.write("".join(k + "\n" for k in add))

    def _endpoints(self, machines: list[Any], count: int) -> list[dict]:
        if machines:
            return [
                {
                    "ipAddress": m.internal_ip or m.ip,
                    "port": 8470,
                    "accessConfig": {"externalIp": m.ip},
                }
                for m in machines
            ]
        return [
            {
                "ipAddress": f"10.130.0.{i + 2}",
                "port": 8470,
                "accessConfig": {"externalIp": f"203.0.113.{i + 2}"},
            }
            for i in range(count)
        ]

    def _boot(self, node: _Node) -> tuple[dict | None, dict | None]:
        """Bring a created node up, or fail it like a stockout."""
        with self.lock:
            zone = node.zone
            errors = self.create_errors.get(zone) or []
            if errors:
                code, message = errors.pop(0)
                node.body["state"] = "PREEMPTED" if "PREEMPTED" in message else "TERMINATED"
                return None, {"code": code, "message": message}
            if self.stockouts.get(zone, 0) > 0:
                self.stockouts[zone] -= 1
                node.body["state"] = "TERMINATED"
                return None, {
                    "code": 8,
                    "message": f'There is no more capacity in the zone "{zone}"; you can try in another '
                    "zone where Cloud TPU Nodes are offered (see "
                    "https://cloud.google.com/tpu/docs/regions) [EID: "
                    f"0x{uuid.uuid4().hex[:16]}]",
                }
            count = hosts_for(node.body["acceleratorType"])
            machines = self._take(count)
            if machines is None:
                node.body["state"] = "TERMINATED"
                return None, {
                    "code": 8,
                    "message": f'There is no more capacity in the zone "{zone}" (the test service has '
                    f"{len(self.free)} free machines, {count} needed)",
                }
            node.machines = machines
            self._install_keys(node.body)
            for m in machines:
                m.start(new_host_key=True)
            node.body["networkEndpoints"] = self._endpoints(machines, count)
            node.body["state"] = "READY"
            node.body["health"] = "HEALTHY"
            return {"@type": NODE_TYPE, **node.body}, None

    # ------------------------------------------------------------------ REST
    def _op(
        self,
        zone: str,
        finish: Callable[[], tuple[dict | None, dict | None]],
        delay: float | None = None,
    ) -> dict:
        name = (
            f"projects/{self.project}/locations/{zone}/operations/operation-{uuid.uuid4().hex[:12]}"
        )
        op = _Op(name, time.monotonic() + (self.op_delay if delay is None else delay), finish)
        self.ops[name] = op
        return op.poll()

    def dispatch(self, method: str, path: str, q: dict[str, str], body: dict) -> tuple[int, dict]:
        with self.lock:
            self.calls.append((method, path))
            if self.unavailable > 0:
                self.unavailable -= 1
                raise ApiError(503, "The service is currently unavailable.")
        parts = path.strip("/").split("/")
        if (
            len(parts) == 3
            and parts[0] == "v1"
            and parts[1] == "users"
            and parts[2].endswith(":importSshPublicKey")
            and method == "POST"
        ):
            return self._oslogin_import(parts[2].rsplit(":", 1)[0], q, body)
        if len(parts) == 3 and parts[:2] == ["v1", "projects"]:  # Cloud Resource Manager v1
            project, _, verb = parts[2].partition(":")
            if project != self.project:
                raise ApiError(403, f"The caller does not have permission on {project}")
            if method == "GET" and not verb:
                return 200, {"projectId": project, "projectNumber": self.project_number}
            if method == "POST" and verb == "getIamPolicy":
                return 200, {
                    "bindings": [
                        {"role": r, "members": sorted(m)} for r, m in self.iam_bindings.items() if m
                    ]
                }
        if len(parts) < 5 or parts[0] != "v2" or parts[1] != "projects" or parts[3] != "locations":
            raise ApiError(404, f"unknown path {path}")
        project, zone = parts[2], parts[4]
        if project != self.project:
            raise ApiError(404, f"Project '{project}' not found or permission denied.", "NOT_FOUND")
        rest = parts[5:]
        parent = f"projects/{project}/locations/{zone}"
        with self.lock:
            if rest and rest[0] == "operations" and len(rest) == 2 and method == "GET":
                op = self.ops.get(f"{parent}/operations/{rest[1]}")
                if op is None:
                    raise ApiError(404, "operation not found")
                return 200, op.poll()
            if rest and rest[0] == "nodes":
                return self._nodes(method, parent, zone, rest[1:], q, body)
            if rest and rest[0] == "queuedResources":
                return self._queued(method, parent, zone, rest[1:], q, body)
        raise ApiError(404, f"unknown path {path}")

    def _oslogin_import(self, account: str, q: dict[str, str], body: dict) -> tuple[int, dict]:
        """OS Login ``users.importSshPublicKey``: the key joins the account's profile; the POSIX
        username is the account with ``@`` and ``.`` turned into ``_`` (as Google derives it)."""
        from urllib.parse import unquote

        account = unquote(account)
        key = (body.get("key") or "").strip()
        if not key:
            raise ApiError(400, "key is required", "INVALID_ARGUMENT")
        with self.lock:
            self.oslogin_keys.setdefault(account, []).append(key)
        username = account.replace("@", "_").replace(".", "_")
        if self.authorized_keys is not None:
            have = self.authorized_keys.read_text() if self.authorized_keys.exists() else ""
            if key not in have:
                with open(self.authorized_keys, "a") as f:
                    f.write(key + "\n")
        return 200, {
            "loginProfile": {
                "name": account,
                "posixAccounts": [
                    {
                        "primary": True,
                        "username": username,
                        "uid": "1001",
                        "gid": "1001",
                        "homeDirectory": f"/home/{username}",
                        "operatingSystemType": "LINUX",
                        "accountId": q.get("projectId", ""),
                    }
                ],
            }
        }

    def _check_create(self, zone: str, accelerator: str) -> None:
        if self.quotas.get(zone, 0) > 0:
            self.quotas[zone] -= 1
            region = zone.rsplit("-", 1)[0]
            raise ApiError(
                429,
                f"Quota 'TPUV4PodPerProjectPerZoneForTPUAPI' exhausted. Limit 0 in region {region}",
                "RESOURCE_EXHAUSTED",
            )

        gen = parse_accelerator_type(accelerator).generation
        if gen in NOT_SERVED:
            raise ApiError(
                400,
                f'Accelerator type "{accelerator}" is not supported by the Cloud TPU API; '
                "TPU7x and later are served through GKE or Compute Engine",
                "INVALID_ARGUMENT",
            )
        if self.offered is not None:
            if gen not in self.offered.get(zone, set()):
                raise ApiError(
                    400,
                    f'Accelerator type "{accelerator}" is not available in zone "{zone}"',
                    "INVALID_ARGUMENT",
                )

    def _nodes(
        self, method: str, parent: str, zone: str, rest: list[str], q: dict, body: dict
    ) -> tuple[int, dict]:
        if not rest:
            if method == "GET":
                nodes = [n.body for n in self.nodes.values() if zone == "-" or n.zone == zone]
                return 200, {"nodes": nodes}
            if method == "POST":
                node_id = q.get("nodeId")
                if not node_id:
                    raise ApiError(400, "nodeId is required")
                name = f"{parent}/nodes/{node_id}"
                if name in self.nodes:
                    raise ApiError(409, f"Resource '{name}' already exists", "ALREADY_EXISTS")
                self.received.append((f"{parent}/nodes/{node_id}", body))
                self._check_create(zone, body.get("acceleratorType", ""))
                node_body = {
                    **body,
                    "name": name,
                    "state": "CREATING",
                    "health": "HEALTH_UNSPECIFIED",
                    "createTime": _now(),
                    "apiVersion": "V2",
                }
                created = _Node(name, zone, node_body)
                self.nodes[name] = created
                return 200, self._op(zone, lambda: self._boot(created))
            raise ApiError(405, "method not allowed")
        ident, _, verb = rest[0].partition(":")
        name = f"{parent}/nodes/{ident}"
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, f"Resource '{name}' was not found", "NOT_FOUND")
        self._authorize(
            {"GET": "tpu.nodes.get", "DELETE": "tpu.nodes.delete"}.get(method)
            or f"tpu.nodes.{verb}"
        )
        if method == "GET" and not verb:
            if node.maintenance_until and time.monotonic() >= node.maintenance_until:
                node.maintenance_until = 0.0
                node.body["health"] = "HEALTHY"
            return 200, node.body
        if method == "DELETE":
            node.body["state"] = "DELETING"

            def finish_delete() -> tuple[dict | None, dict | None]:
                self._release(node)
                self.nodes.pop(name, None)
                return {"@type": EMPTY_TYPE}, None

            return 200, self._op(zone, finish_delete)
        if method == "POST" and verb == "stop":
            if hosts_for(node.body.get("acceleratorType", "v4-8")) > 1:
                raise ApiError(
                    400,
                    f"Stopping is only available with single TPU nodes; '{name}' is a multi-host "
                    "slice (delete it instead)",
                    "INVALID_ARGUMENT",
                )
            if (node.body.get("schedulingConfig") or {}).get("spot") or (
                node.body.get("schedulingConfig") or {}
            ).get("preemptible"):
                raise ApiError(
                    400,
                    f"Stopping is not supported for Spot/preemptible TPU node '{name}'; delete it instead",
                    "INVALID_ARGUMENT",
                )
            node.body["state"] = "STOPPING"

            def finish_stop() -> tuple[dict | None, dict | None]:
                for m in node.machines:
                    m.stop()
                node.body["state"] = "STOPPED"
                return {"@type": NODE_TYPE, **node.body}, None

            return 200, self._op(zone, finish_stop)
        if method == "POST" and verb == "start":
            if node.body["state"] not in ("STOPPED",):
                raise ApiError(
                    400, f"node is {node.body['state']}, not STOPPED", "FAILED_PRECONDITION"
                )
            node.body["state"] = "STARTING"

            def finish_start() -> tuple[dict | None, dict | None]:
                for m in node.machines:
                    m.start(new_host_key=True)
                node.body["state"] = "READY"
                if not node.sticky_unhealthy:
                    node.body["health"] = "HEALTHY"
                return {"@type": NODE_TYPE, **node.body}, None

            return 200, self._op(zone, finish_start)
        raise ApiError(400, f"unsupported {method} {verb}")

    def _queued(
        self, method: str, parent: str, zone: str, rest: list[str], q: dict, body: dict
    ) -> tuple[int, dict]:
        if not rest:
            if method == "GET":
                return 200, {
                    "queuedResources": [
                        r["body"] for r in self.queued.values() if zone == "-" or r["zone"] == zone
                    ]
                }
            if method == "POST":
                qid = q.get("queuedResourceId")
                name = f"{parent}/queuedResources/{qid}"
                if name in self.queued:
                    raise ApiError(409, f"Resource '{name}' already exists", "ALREADY_EXISTS")
                self.received.append((name, body))
                specs = (body.get("tpu") or {}).get("nodeSpec") or []
                if len(specs) != 1:
                    raise ApiError(400, "exactly one nodeSpec is supported")
                self._check_create(zone, specs[0].get("node", {}).get("acceleratorType", ""))
                rec: dict[str, Any] = {
                    "zone": zone,
                    "created": time.monotonic(),
                    "body": {
                        **body,
                        "name": name,
                        "createTime": _now(),
                        "state": {"state": "ACCEPTED"},
                    },
                }
                pol = body.get("queueingPolicy") or {}
                if "validUntilDuration" in pol:
                    rec["deadline"] = time.monotonic() + float(
                        str(pol["validUntilDuration"]).rstrip("s")
                    )
                if "validAfterDuration" in pol:
                    rec["not_before"] = time.monotonic() + float(
                        str(pol["validAfterDuration"]).rstrip("s")
                    )
                if "validInterval" in pol:
                    import datetime as _dt

                    def _at(text: str) -> float:
                        t = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
                        return time.monotonic() + (t.timestamp() - time.time())

                    rec["not_before"] = _at(pol["validInterval"]["startTime"])
                    rec["deadline"] = _at(pol["validInterval"]["endTime"])
                if "validUntilTime" in pol:
                    import datetime as _dt

                    t = _dt.datetime.fromisoformat(pol["validUntilTime"].replace("Z", "+00:00"))
                    rec["deadline"] = time.monotonic() + (t.timestamp() - time.time())
                self.queued[name] = rec
                return 200, self._op(zone, lambda: ({"@type": QR_TYPE, **rec["body"]}, None))
            raise ApiError(405, "method not allowed")
        self._authorize(
            "tpu.queuedResources.get" if method == "GET" else "tpu.queuedResources.delete"
        )
        name = f"{parent}/queuedResources/{rest[0]}"
        found = self.queued.get(name)
        if found is None:
            raise ApiError(404, f"Resource '{name}' was not found", "NOT_FOUND")
        rec = found
        if method == "GET":
            self._advance(rec)
            return 200, rec["body"]
        if method == "DELETE":
            spec = rec["body"]["tpu"]["nodeSpec"][0]
            node_name = f"{spec['parent']}/nodes/{spec['nodeId']}"
            node = self.nodes.get(node_name)
            if node is not None and q.get("force") not in ("true", "True", "1"):
                raise ApiError(
                    400,
                    "the queued resource has a node; delete it with force=true",
                    "FAILED_PRECONDITION",
                )

            def finish() -> tuple[dict | None, dict | None]:
                if node is not None:
                    self._release(node)
                    self.nodes.pop(node_name, None)
                self.queued.pop(name, None)
                return {"@type": EMPTY_TYPE}, None

            return 200, self._op(zone, finish)
        raise ApiError(405, "method not allowed")

    def _advance(self, rec: dict) -> None:
        state = rec["body"]["state"]["state"]
        if state in ("ACTIVE", "FAILED"):
            return
        now = time.monotonic()
        if "deadline" in rec and now > rec["deadline"]:
            rec["body"]["state"] = {
                "state": "FAILED",
                "failedData": {
                    "error": {
                        "code": 4,
                        "message": "validUntil passed before capacity was available",
                    }
                },
            }
            return
        if now < rec.get("not_before", 0) or now - rec["created"] < self.queue_delay:
            rec["body"]["state"] = {"state": "WAITING_FOR_RESOURCES"}
            return
        zone = rec["zone"]
        if self.stockouts.get(zone, 0) > 0:  # a queued resource waits out a stockout
            self.stockouts[zone] -= 1
            rec["body"]["state"] = {"state": "WAITING_FOR_RESOURCES"}
            return
        spec = rec["body"]["tpu"]["nodeSpec"][0]
        name = f"{spec['parent']}/nodes/{spec['nodeId']}"
        node_body = {
            **spec.get("node", {}),
            "name": name,
            "state": "CREATING",
            "createTime": _now(),
            "queuedResource": rec["body"]["name"],
            "apiVersion": "V2",
        }
        if "spot" in rec["body"]:
            node_body["schedulingConfig"] = {"spot": True}
        node = _Node(name, zone, node_body)
        self.nodes[name] = node
        _, err = self._boot(node)
        if err:
            self.nodes.pop(name, None)
            rec["body"]["state"] = {"state": "WAITING_FOR_RESOURCES"}
            return
        rec["body"]["state"] = {"state": "ACTIVE"}


# ---------------------------------------------------------------------------- host images
# What a TPU VM runtime image ships: Ubuntu 22.04 with its Python 3.10 as python3
# (https://cloud.google.com/tpu/docs/runtimes: "tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite",
# "v2-alpha-tpuv6e", ... are Ubuntu 22.04 images). torch_tpu 0.2.0 publishes cp311/cp312 wheels
# only (https://pypi.org/project/torch-tpu/#files), so pip on the image's Python finds none.
RUNTIME_IMAGES: dict[str, dict[str, str]] = {
    rv: {"os": "Ubuntu 22.04", "python3": "3.10"}
    for rv in ("tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv5", "v2-alpha-tpuv6e")
}
WHEEL_PYTHONS = {"torch_tpu": {"3.11", "3.12"}}


class SetupFailed(Exception):
    """A setup that fails on the image, with the message the image would print."""


def check_setup(
    runtime_version: str, lines: list[str], python: str, needs: str = "torch_tpu"
) -> None:
    """Follow ``lines`` (a provider's setup commands) on the image of ``runtime_version`` and
    raise :class:`SetupFailed` where the real image fails: pip on an interpreter the image does
    not have, a wheel with no build for the interpreter's Python (torch_tpu on 3.10), or a job
    ``python`` that ends up without ``needs``. Understands ``PY -m pip install ...``,
    ``PY -m uv venv --python X.Y [--seed] DIR`` (uv downloads a managed CPython,
    https://docs.astral.sh/uv/concepts/python-versions/#automatic-python-downloads) and
    ``python3.X -m venv DIR``."""
    import re
    import shlex

    image = RUNTIME_IMAGES[runtime_version]
    pythons = {"python3": image["python3"], "/usr/bin/python3": image["python3"]}
    packages: dict[str, set[str]] = {p: set() for p in pythons}
    for line in lines:
        for cmd in re.split(r"\s*(?:&&|;)\s*", line):
            argv = shlex.split(cmd) if cmd.strip() else []
            if len(argv) < 3 or argv[1] != "-m":
                continue
            py, mod, rest = argv[0], argv[2], argv[3:]
            if py not in pythons:
                raise SetupFailed(f"bash: {py}: No such file or directory")
            if mod == "venv" or (mod == "uv" and rest[:1] == ["venv"]):
                if mod == "uv" and "uv" not in packages[py]:
                    raise SetupFailed(f"{py}: No module named uv")
                want = pythons[py]
                if "--python" in rest:
                    want = rest[rest.index("--python") + 1]
                target = [a for a in rest if not a.startswith("-") and a not in ("venv", want)][-1]
                for name in ("python", "python3"):
                    pythons[f"{target}/bin/{name}"] = want
                    packages[f"{target}/bin/{name}"] = packages.setdefault(
                        f"{target}/bin/python", {"pip"}
                    )
                continue
            if mod == "pip" and rest[:1] == ["install"]:
                for req in rest[1:]:
                    if req.startswith("-"):
                        continue
                    name = re.split(r"[<>=~!\[ ]", req, maxsplit=1)[0].replace("-", "_").lower()
                    allowed = WHEEL_PYTHONS.get(name)
                    if allowed and pythons[py] not in allowed:
                        raise SetupFailed(
                            f"ERROR: Could not find a version that satisfies the requirement {req} "
                            f"(from versions: none)  [{py} is Python {pythons[py]}; {name} has "
                            f"wheels for {', '.join(sorted(allowed))} only]"
                        )
                    packages[py].add(name)
    if python not in pythons:
        raise SetupFailed(f"bash: {python}: No such file or directory")
    if needs not in packages[python]:
        raise SetupFailed(f"{python}: ModuleNotFoundError: No module named '{needs}'")


class FakeMetadataServer:
    """The GCE metadata server of a TPU VM, as far as aios's watchers read it (listens on
    127.0.0.1; point ``GCE_METADATA_HOST`` at :attr:`host`). Requires ``Metadata-Flavor: Google``
    as the real one does (403 otherwise).

    * ``instance/preempted``: ``FALSE`` until :meth:`preempt`;
    * ``instance/upcoming-maintenance``: ``{"error": "no notifications have been received yet,
      try again later"}`` until :meth:`announce`, then the notification's fields
      (``windowStartTime``, ``windowEndTime``, ``latestWindowStartTime``, ``maintenanceType``,
      ``canReschedule``, ``maintenanceStatus``;
      https://cloud.google.com/tpu/docs/view-maintenance-notifications).

    ``?wait_for_change=true`` holds the answer until the value changes or ``timeout_sec``
    passes, as the real server does
    (https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange): a watcher
    that long-polls is not answered in a busy loop.

    ``hosts`` given to :meth:`preempt` / :meth:`announce` (:class:`aios_cloud.testing.host.Host`)
    end when the platform ends them: 30 s after the preemption notice
    (https://cloud.google.com/compute/docs/instances/spot#preemption-process), at the
    maintenance window's start (a host event interrupts the whole slice).
    """

    #: Compute Engine stops a preempted VM this long after setting ``instance/preempted``
    PREEMPTION_STOP_S = 30.0

    NO_NOTIFICATION = {"error": "no notifications have been received yet, try again later"}

    def __init__(self) -> None:
        self.preempted = "FALSE"
        self.upcoming: dict[str, Any] | None = None
        self.paths: list[str] = []
        self.changed = threading.Condition()
        self.closed = False
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                srv.paths.append(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                url = urlparse(self.path)
                values = {
                    "/computeMetadata/v1/instance/preempted": lambda: srv.preempted,
                    "/computeMetadata/v1/instance/upcoming-maintenance": lambda: json.dumps(
                        srv.upcoming or srv.NO_NOTIFICATION
                    ),
                }
                value = values.get(url.path)
                if value is None:
                    return self._send(404, "not found")
                q = parse_qs(url.query)
                if q.get("wait_for_change") == ["true"]:
                    first = value()
                    wait = float((q.get("timeout_sec") or ["3600"])[0])
                    with srv.changed:
                        srv.changed.wait_for(lambda: srv.closed or value() != first, wait)
                return self._send(200, value())

            def _send(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _set(self, **values: Any) -> None:
        with self.changed:
            for k, v in values.items():
                setattr(self, k, v)
            self.changed.notify_all()

    def announce(
        self,
        start: float,
        end: float,
        maintenance_type: str = "SCHEDULED",
        hosts: Sequence[Host] = (),
        inspect: Callable[[], Any] | None = None,
    ) -> float:
        """Announce host maintenance from ``start`` to ``end`` (epoch seconds; whole seconds on
        the wire); ``hosts`` are interrupted at the window's start. Returns that start."""

        def iso(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

        self._set(
            upcoming={
                "windowStartTime": iso(start),
                "windowEndTime": iso(end),
                "latestWindowStartTime": iso(start),
                "maintenanceType": maintenance_type,
                "canReschedule": True,
                "maintenanceStatus": "PENDING",
            }
        )
        deadline = float(int(start))
        for h in hosts:
            h.reclaim_at(deadline, inspect)
        return deadline

    def ongoing(self) -> None:
        if self.upcoming:
            self._set(
                upcoming={
                    **self.upcoming,
                    "canReschedule": False,
                    "maintenanceStatus": "ONGOING",
                }
            )

    def preempt(
        self, hosts: Sequence[Host] = (), inspect: Callable[[], Any] | None = None
    ) -> float:
        """Preempt the VM: ``instance/preempted`` turns ``TRUE`` and ``hosts`` are stopped
        :attr:`PREEMPTION_STOP_S` later. Returns that deadline (epoch seconds)."""
        deadline = time.time() + self.PREEMPTION_STOP_S
        self._set(preempted="TRUE")
        for h in hosts:
            h.reclaim_at(deadline, inspect)
        return deadline

    def close(self) -> None:
        self._set(closed=True)
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeMetadataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
