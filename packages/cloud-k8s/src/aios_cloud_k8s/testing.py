"""A local HTTP service that answers as the Kubernetes API server does, for tests where no real
API server can run (no kube-apiserver is packaged for apt/PyPI here).

It serves the REST paths the official ``kubernetes`` client calls for what aios uses: create /
get / list (``labelSelector``) / delete of Secrets, ConfigMaps, Services, Pods, batch/v1 Jobs and
``jobset.x-k8s.io/v1alpha2`` JobSets, pod logs, and nodes. Like the real server it validates
every created object against its schema (the official Kubernetes OpenAPI schemas bundled by
``kubernetes-validate``, and the JobSet CRD's ``openAPIV3Schema`` passed in) and answers 422 with
a ``Status`` when it does not conform, 409 for a name in use, 404 for a missing object or an
uninstalled CRD (the JobSet paths, unless ``jobset_crd`` is given).

The "controller" part is explicit: creating a Job/JobSet creates its pods (named as the Job
controller and JobSet do: ``<job>-<index>-<suffix>`` with hostname ``<job>-<index>`` /
``<jobset>-<rjob>-<jobIndex>-<podIndex>``); :meth:`FakeKubeApi.finish` marks a job's pods
Succeeded/Failed with their logs and sets the Complete/Failed condition.

The scheduler part follows kube-scheduler's filters
(https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/#kube-scheduler-implementation):
a pod is bound (``spec.nodeName``, phase ``Running``) to a node whose labels match its
``nodeSelector``, whose ``NoSchedule`` taints it tolerates, and whose ``allocatable`` still holds
its resource requests (limits count as requests for extended resources such as
``google.com/tpu``, https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources);
otherwise it stays ``Pending`` with the ``PodScheduled=False``/``Unschedulable`` condition and
the scheduler's "0/N nodes are available: ..." message. As the real controllers do, a Job's
``status.active`` and a JobSet's ``replicatedJobsStatus[].active`` count pending pods too
(https://kubernetes.io/docs/concepts/workloads/controllers/job/: "active: the number of pending
and running pods"): a JobSet whose pods cannot schedule still looks active.

Kueue, when ``kueue`` is given (:class:`Kueue`), as its documentation says it behaves:

* its webhook creates every Job/JobSet it manages suspended (``spec.suspend: true``) and resumes
  it once its Workload is admitted (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/); a job is
  managed when it carries ``kueue.x-k8s.io/queue-name`` in its ``metadata.labels`` (for a Job
  and a JobSet alike, https://kueue.sigs.k8s.io/docs/tasks/run/jobsets/), or always with
  ``manageJobsWithoutQueueName``, where a job without the label "will be suspended ... [and] not
  considered for admission"
  (https://kueue.sigs.k8s.io/docs/tasks/manage/enforce_job_management/manage_jobs_without_queue_name/);
* a Workload (``kueue.x-k8s.io/v1beta1``, labelled ``kueue.x-k8s.io/job-uid``) per queued job:
  admitted when its LocalQueue exists, else ``QuotaReserved=False`` with the reason;
* a suspended Job carries the Job controller's ``Suspended``/``JobSuspended``/"Job suspended"
  condition (https://kubernetes.io/docs/concepts/workloads/controllers/job/#suspending-a-job),
  a suspended JobSet the JobSet controller's ``Suspended``/``SuspendedJobs``/"jobset is
  suspended"; neither has pods.

Pods get the container runtime's default 64 MiB ``/dev/shm`` unless a memory-backed
``emptyDir`` is mounted there (:meth:`FakeKubeApi.dev_shm_bytes`; Docker's ``--shm-size``
default, which Kubernetes does not change:
https://kubernetes.io/docs/concepts/storage/volumes/#emptydir).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

if TYPE_CHECKING:
    from collections.abc import Callable

    from aios_cloud.testing.host import Host

CORE = {"secrets": "Secret", "configmaps": "ConfigMap", "services": "Service", "pods": "Pod"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _quantity(v: Any) -> float:
    """A Kubernetes quantity (``"4"``, ``"7910m"``, ``"16Gi"``) as a number."""
    text = str(v).strip()
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text or 0)


def _pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """What a pod asks the scheduler for: every container's requests (limits where a resource
    has no request, as the API server defaults them)."""
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in asked.items():
            total[k] = total.get(k, 0.0) + _quantity(v)
    return total


def _tolerates(spec: dict[str, Any], taint: dict[str, Any]) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value") == taint.get("value"):
            return True
    return False


def _match(selector: str, labels: dict[str, str]) -> bool:
    for part in filter(None, (selector or "").split(",")):
        if "=" in part:
            k, v = part.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif part not in labels:
            return False
    return True


def spec_pods(spec: dict[str, Any]) -> int:
    return int(spec.get("parallelism", 1))


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: a container's /dev/shm without a volume there: the runtime's default (Docker --shm-size 64m)
DEFAULT_SHM_BYTES = 64 * 2**20


@dataclass
class Kueue:
    """Kueue in the cluster: the namespace's LocalQueues, and whether it manages jobs without a
    queue name (``manageJobsWithoutQueueName``, as on clusters that enforce queues)."""

    local_queues: list[str] = field(default_factory=list)
    manage_jobs_without_queue_name: bool = True


class FakeKubeApi:
    def __init__(
        self,
        nodes: list[dict[str, Any]] | None = None,
        jobset_crd: dict[str, Any] | None = None,
        k8s_version: str = "1.30.0",
        kueue: Kueue | None = None,
    ) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> obj
        self.logs: dict[tuple[str, str], str] = {}
        self.nodes = nodes or []
        self.jobset_schema = (jobset_crd or {}).get("openAPIV3Schema")
        self.k8s_version = k8s_version
        self.kueue = kueue
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: Any, text: bool = False) -> None:
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}") if n else {}

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

            def _handle(self, method: str) -> None:
                u = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                with api.lock:
                    api.requests.append((method, u.path))
                    code, body, text = api.route(
                        method, u.path, q, self._body() if method in ("POST", "DELETE") else None
                    )
                self._send(code, body, text)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ helpers for tests
    def kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        path = Path(path)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": "test", "namespace": namespace},
                        }
                    ],
                }
            )
        )
        return path

    def get(self, kind: str, name: str, ns: str = "default") -> dict[str, Any] | None:
        return self.objects.get((kind, ns, name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    def finish(
        self,
        name: str,
        ns: str = "default",
        succeeded: bool = True,
        logs: dict[int, str] | None = None,
    ) -> None:
        """The job's pods ran: phase Succeeded/Failed, logs (by pod index), job condition set."""
        with self.lock:
            pods = [
                o
                for (k, n, _), o in sorted(self.objects.items())
                if k == "Pod" and n == ns and o["metadata"]["labels"].get("aios-cluster") == name
            ]
            for i, pod in enumerate(pods):
                pod["status"] = {"phase": "Succeeded" if succeeded else "Failed"}
                self.logs[(ns, pod["metadata"]["name"])] = (logs or {}).get(i, "")
            cond = "Complete" if succeeded else "Failed"
            if (job := self.objects.get(("Job", ns, name))) is not None:
                job["status"] = {
                    "conditions": [{"type": cond, "status": "True", "lastTransitionTime": _now()}],
                    "succeeded" if succeeded else "failed": len(pods),
                }
            if (js := self.objects.get(("JobSet", ns, name))) is not None:
                js["status"] = {
                    "conditions": [
                        {
                            "type": "Completed" if succeeded else "Failed",
                            "status": "True",
                            "reason": "AllJobsCompleted" if succeeded else "FailedJobs",
                            "message": "",
                            "lastTransitionTime": _now(),
                        }
                    ]
                }

    def dev_shm_bytes(self, pod: dict[str, Any]) -> int:
        """The size of ``/dev/shm`` in the pod's first container: a memory-backed ``emptyDir``
        mounted there gives its ``sizeLimit`` (the node's allocatable memory without one), else
        the runtime's 64 MiB."""
        spec = pod["spec"]
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        for m in spec["containers"][0].get("volumeMounts") or []:
            vol = vols.get(m["name"]) or {}
            ed = vol.get("emptyDir")
            if m.get("mountPath") == "/dev/shm" and ed is not None and ed.get("medium") == "Memory":
                if ed.get("sizeLimit"):
                    return int(_quantity(ed["sizeLimit"]))
                node = next(
                    (n for n in self.nodes if n["metadata"]["name"] == spec.get("nodeName")), {}
                )
                return int(
                    _quantity(
                        ((node.get("status") or {}).get("allocatable") or {}).get("memory", 0)
                    )
                )
        return DEFAULT_SHM_BYTES

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeKubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the API
    def validate(self, obj: dict[str, Any]) -> str | None:
        kind = obj.get("kind")
        try:
            if kind == "JobSet":
                if self.jobset_schema is None:
                    return None
                import jsonschema

                jsonschema.validate(obj, self.jobset_schema)
            else:
                import kubernetes_validate

                kubernetes_validate.validate(obj, self.k8s_version, strict=True)
        except ImportError:
            return None
        except Exception as exc:  # noqa: BLE001 - the validator's message, like the server's
            return str(getattr(exc, "message", exc)).splitlines()[0][:300]
        return None

    def route(self, method: str, path: str, q: dict[str, str], body: Any) -> tuple[int, Any, bool]:
        if path == "/api/v1/nodes" and method == "GET":
            return (
                200,
                {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": self.nodes},
                False,
            )
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", path)
        if m and method == "GET":
            if ("Pod", m.group(1), m.group(2)) not in self.objects:
                return 404, _status(404, "NotFound", f'pods "{m.group(2)}" not found'), False
            return 200, self.logs.get((m.group(1), m.group(2)), ""), True
        m = re.match(
            r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps|services|pods)(?:/([^/]+))?$", path
        )
        if m:
            return self._crud(
                method, CORE[m.group(2)], m.group(2), "v1", m.group(1), m.group(3), q, body
            )
        m = re.match(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$", path)
        if m:
            return self._crud(method, "Job", "jobs", "batch/v1", m.group(1), m.group(2), q, body)
        m = re.match(r"^/apis/kueue\.x-k8s\.io/v1beta1/namespaces/([^/]+)/workloads$", path)
        if m and self.kueue is not None and method == "GET":
            return self._crud(
                method, "Workload", "workloads", "kueue.x-k8s.io/v1beta1", m.group(1), None, q, body
            )
        m = re.match(
            r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/([^/]+)/jobsets(?:/([^/]+))?$", path
        )
        if m:
            if self.jobset_schema is None:
                return (
                    404,
                    _status(404, "NotFound", "the server could not find the requested resource"),
                    False,
                )
            return self._crud(
                method,
                "JobSet",
                "jobsets",
                "jobset.x-k8s.io/v1alpha2",
                m.group(1),
                m.group(2),
                q,
                body,
            )
        return (
            404,
            _status(404, "NotFound", "the server could not find the requested resource"),
            False,
        )

    def _crud(
        self,
        method: str,
        kind: str,
        plural: str,
        api_version: str,
        ns: str,
        name: str | None,
        q: dict[str, str],
        body: Any,
    ) -> tuple[int, Any, bool]:
        if name is None and method == "GET":
            items = [
                o
                for (k, n, _), o in sorted(self.objects.items())
                if k == kind
                and n == ns
                and _match(q.get("labelSelector", ""), o["metadata"].get("labels") or {})
            ]
            return (
                200,
                {
                    "kind": f"{kind}List",
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                },
                False,
            )
        if name is None and method == "POST":
            obj = dict(body or {})
            oname = (obj.get("metadata") or {}).get("name")
            if obj.get("kind") != kind or not oname:
                return (
                    400,
                    _status(400, "BadRequest", f"expected a {kind} with metadata.name"),
                    False,
                )
            err = self.validate(obj)
            if err:
                return 422, _status(422, "Invalid", f'{kind} "{oname}" is invalid: {err}'), False
            if (kind, ns, oname) in self.objects:
                return (
                    409,
                    _status(409, "AlreadyExists", f'{plural} "{oname}" already exists'),
                    False,
                )
            obj["metadata"] = {
                **obj["metadata"],
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "resourceVersion": "1",
            }
            if (
                kind == "Secret" and "stringData" in obj
            ):  # the server stores stringData as base64 data
                import base64

                obj["data"] = {
                    k: base64.b64encode(v.encode()).decode()
                    for k, v in obj.pop("stringData").items()
                }
            self.objects[(kind, ns, oname)] = obj
            if kind in ("Job", "JobSet") and not self._kueue_holds(kind, ns, obj):
                self._pods(kind, ns, obj)
            return 201, obj, False
        key = (kind, ns, name or "")
        if key not in self.objects:
            return 404, _status(404, "NotFound", f'{plural} "{name}" not found'), False
        if method == "GET":
            return 200, self.objects[key], False
        if method == "DELETE":
            obj = self.objects.pop(key)
            if kind in ("Job", "JobSet"):  # foreground propagation: the pods go too
                for k in [
                    k
                    for k, o in self.objects.items()
                    if k[0] == "Pod"
                    and k[1] == ns
                    and o["metadata"].get("labels", {}).get("aios-owner") == f"{kind}/{name}"
                ]:
                    self.objects.pop(k)
                # its Kueue Workload is owned by it: garbage-collected with it
                uid = obj["metadata"].get("uid")
                for k in [
                    k
                    for k, o in self.objects.items()
                    if k[0] == "Workload" and o["metadata"]["labels"].get(JOB_UID_LABEL) == uid
                ]:
                    self.objects.pop(k)
            return 200, obj, False
        return 405, _status(405, "MethodNotAllowed", method), False

    def _kueue_holds(self, kind: str, ns: str, obj: dict[str, Any]) -> bool:
        """Kueue's webhook and controller on a new Job/JobSet: True when it stays suspended."""
        if self.kueue is None:
            return False
        queue = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if not queue and not self.kueue.manage_jobs_without_queue_name:
            return False  # not Kueue's: the job runs as created
        obj["spec"]["suspend"] = True  # the webhook suspends every job Kueue manages
        admitted = bool(queue) and queue in self.kueue.local_queues
        if queue:  # a Workload per queued job, with its admission
            wname = f"{kind.lower()}-{obj['metadata']['name']}-{uuid.uuid4().hex[:5]}"
            cond = (
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}
                if admitted
                else {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Inadmissible",
                    "message": f"LocalQueue {queue} doesn't exist",
                }
            )
            self.objects[("Workload", ns, wname)] = {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "Workload",
                "metadata": {
                    "name": wname,
                    "namespace": ns,
                    "labels": {JOB_UID_LABEL: obj["metadata"]["uid"]},
                },
                "spec": {"queueName": queue},
                "status": {"conditions": [{**cond, "lastTransitionTime": _now()}]},
            }
        if admitted:
            obj["spec"]["suspend"] = False  # resumed once admitted: its pods are created
            return False
        # the controllers' view of a suspended job: a condition, no pods
        if kind == "Job":
            reason, message = "JobSuspended", "Job suspended"
        else:
            reason, message = "SuspendedJobs", "jobset is suspended"
        obj["status"] = {
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            ],
            **({"active": 0} if kind == "Job" else {}),
        }
        return True

    def _pods(self, kind: str, ns: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        jobs: list[
            tuple[str, dict[str, Any], int, str]
        ] = []  # (job name, job spec, job index, rjob)
        if kind == "Job":
            jobs.append((name, obj["spec"], 0, ""))
        else:
            for rj in obj["spec"]["replicatedJobs"]:
                for j in range(rj.get("replicas", 1)):
                    jobs.append((f"{name}-{rj['name']}-{j}", rj["template"]["spec"], j, rj["name"]))
        for job_name, spec, j, rjob in jobs:
            tmpl = spec["template"]
            for i in range(spec.get("parallelism", 1)):
                pname = f"{job_name}-{i}-{uuid.uuid4().hex[:5]}"
                labels = {
                    **(tmpl.get("metadata", {}).get("labels") or {}),
                    "job-name": job_name,
                    "batch.kubernetes.io/job-completion-index": str(i),
                    "aios-owner": f"{kind}/{name}",
                }
                if kind == "JobSet":
                    labels.update(
                        {
                            "jobset.sigs.k8s.io/jobset-name": name,
                            "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                            "jobset.sigs.k8s.io/job-index": str(j),
                        }
                    )
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pname,
                        "namespace": ns,
                        "labels": labels,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": _now(),
                    },
                    "spec": {**tmpl["spec"], "hostname": f"{job_name}-{i}"},
                    "status": {"phase": "Pending"},
                }
                self._schedule(pod)
                self.objects[("Pod", ns, pname)] = pod
        # the controllers' status: every created pod (pending or running) counts as active
        if kind == "Job":
            obj["status"] = {"active": spec_pods(obj["spec"])}
        else:
            obj["status"] = {
                "replicatedJobsStatus": [
                    {
                        "name": rj["name"],
                        "ready": 0,
                        "succeeded": 0,
                        "failed": 0,
                        "suspended": 0,
                        "active": rj.get("replicas", 1),
                    }
                    for rj in obj["spec"]["replicatedJobs"]
                ]
            }

    def _used(self, node: str) -> dict[str, float]:
        used: dict[str, float] = {}
        for (k, _, _), o in self.objects.items():
            if k == "Pod" and o["spec"].get("nodeName") == node:
                if (o.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                for r, v in _pod_requests(o["spec"]).items():
                    used[r] = used.get(r, 0.0) + v
        return used

    def _schedule(self, pod: dict[str, Any]) -> None:
        """kube-scheduler's filter step: bind the pod to the first node that can hold it, or
        leave it Pending with the scheduler's reasons."""
        spec = pod["spec"]
        want = _pod_requests(spec)
        reasons: dict[str, int] = {}
        for node in self.nodes:
            meta, status = node.get("metadata") or {}, node.get("status") or {}
            labels = meta.get("labels") or {}
            if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
                why = "node(s) didn't match Pod's node affinity/selector"
                reasons[why] = reasons.get(why, 0) + 1
                continue
            taints = (node.get("spec") or {}).get("taints") or []
            bad = next((t for t in taints if not _tolerates(spec, t)), None)
            if bad is not None:
                why = f"node(s) had untolerated taint {{{bad.get('key')}: {bad.get('value', '')}}}"
                reasons[why] = reasons.get(why, 0) + 1
                continue
            alloc = {k: _quantity(v) for k, v in (status.get("allocatable") or {}).items()}
            used = self._used(meta.get("name", ""))
            short = [r for r, v in want.items() if used.get(r, 0.0) + v > alloc.get(r, 0.0) + 1e-9]
            if short:
                why = f"Insufficient {short[0]}"
                reasons[why] = reasons.get(why, 0) + 1
                continue
            spec["nodeName"] = meta.get("name")
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
            }
            return
        detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        pod["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": f"0/{len(self.nodes)} nodes are available: {detail}.",
                }
            ],
        }


#: GKE gives non-system pods on a Spot node at most this long after the node's shutdown notice,
#: whatever their terminationGracePeriodSeconds
#: (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown)
GKE_SPOT_POD_GRACE_S = 15


def terminate_pod(
    host: Host,
    pod_spec: dict[str, Any],
    node_labels: dict[str, str] | None = None,
    inspect: Callable[[], Any] | None = None,
) -> float:
    """The kubelet ending a pod whose container runs on ``host`` (a deleted pod, a drained or
    shut-down node): SIGTERM to the container's main process, SIGKILL to everything in it when
    the pod's ``terminationGracePeriodSeconds`` (default 30) runs out
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination); on a
    GKE Spot node (label ``cloud.google.com/gke-spot: "true"``) at most 15 s. Returns that
    deadline (epoch seconds)."""
    grace = float(pod_spec.get("terminationGracePeriodSeconds", 30))
    if (node_labels or {}).get("cloud.google.com/gke-spot") == "true":
        grace = min(grace, GKE_SPOT_POD_GRACE_S)
    deadline = time.time() + grace
    host.reclaim_at(deadline, inspect)
    host.signal_main(signal.SIGTERM)
    return deadline
