"""``aios launch --cloud k8s``: Kubernetes through the official ``kubernetes`` Python client
(``CustomObjectsApi`` for JobSets, ``BatchV1Api`` for Jobs, ``CoreV1Api`` for pods, logs,
Secrets, ConfigMaps, Services and nodes).

A "cluster" in the aios store is one named job: ``aios launch --cloud k8s --name N`` creates
the Secret ``N-env`` (forwarded variables), the ConfigMap ``N-code`` (the synced code) and the
JobSet (or indexed Job + headless Service) ``N``; ``aios status --refresh`` reads its state,
``aios logs N [-f]`` every pod's log, ``aios cancel N`` / ``aios down N`` delete them all
(foreground propagation: pods go with them). ``aios catalog --cloud k8s`` lists the node pools.

Bad input is one line and exit 2 with nothing left in the cluster: no kubeconfig, a missing
JobSet CRD, a TPU type no node pool offers, an object the API server rejects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from aios_cloud.features import COST_LIMIT, IMAGE, SETUP, SPOT
from aios_cloud.provider.data import CatalogEntry, CloudCommand, ClusterInfo
from aios_cloud.provider.errors import CloudError
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.request import LaunchRequest
from aios_cloud.store import ClusterRecord, JobRecord, Store

from aios_cloud_k8s import launch as k8s_launch
from aios_cloud_k8s import manifests as M
from aios_cloud_k8s.settings import K8sSettings

PRICE_NOTE = "n/a (your cluster)"


class K8sProvider(SchedulerProvider):
    name = "k8s"
    storage_scheme = ""
    cli = "kubectl"
    # pods on the cluster's nodes: GKE Spot TPU node pools are the one capacity choice
    features = frozenset({SPOT})
    feature_hints = {
        SETUP: "bake setup into the image (k8s.image)",
        IMAGE: "set k8s.image (AIOS_K8S__IMAGE)",
        COST_LIMIT: "bound the job with the scheduler's own limits",
    }

    pending_reason: str = ""
    #: why a suspended job waits and the fix (set by :meth:`job_state`; "" when not suspended)
    suspended_reason: str = ""
    #: whether the suspended job carries a Kueue queue label (it may be admitted later)
    suspended_queued: bool = False

    def __init__(self, config: Any = None) -> None:
        section = config.section("k8s") if config is not None else None
        self.settings = section if section is not None else K8sSettings()
        # the seconds a rank has after SIGTERM (checkpoint.grace_seconds): the pods' grace
        self.grace_seconds = float(config.checkpoint.grace_seconds) if config is not None else 25.0
        self._api: Any = None

    # ------------------------------------------------------------------ client
    def client(self) -> Any:
        if self._api is None:
            try:
                from kubernetes import config
            except ImportError:
                raise CloudError(
                    "the kubernetes Python client is not installed", "pip install kubernetes"
                ) from None
            # KUBECONFIG is read now: the client's own default is fixed when kubernetes is
            # first imported, so a process that changed it since would read a stale file
            config_file = (
                self.settings.kubeconfig
                or os.environ.get("KUBECONFIG")
                or os.path.expanduser("~/.kube/config")
            )
            try:
                api_client = config.new_client_from_config(
                    config_file=config_file, context=self.settings.context
                )
            except (config.ConfigException, FileNotFoundError, OSError) as exc:
                raise CloudError(
                    f"no usable kubeconfig: {str(exc).splitlines()[0][:160]}",
                    "point KUBECONFIG (or k8s.kubeconfig) at one: gcloud container clusters get-credentials NAME, "
                    "or aws eks update-kubeconfig --name NAME",
                ) from None
            self._api = api_client
        return self._api

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client())

    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.client())

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client())

    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kw: Any
    ) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            raise CloudError(
                f"{what}: {_reason(exc)}", "check the cluster, namespace and your RBAC permissions"
            ) from None
        except Exception as exc:
            if type(exc).__module__.startswith(("urllib3", "kubernetes")):
                raise CloudError(
                    f"{what}: cannot reach the API server ({type(exc).__name__})",
                    "check the kubeconfig's server and your network",
                ) from None
            raise

    # ------------------------------------------------------------------ CloudProvider
    def catalog(self) -> list[CatalogEntry]:
        nodes = self._call("listing nodes", self.core().list_node).items
        pools: dict[str, dict[str, Any]] = {}
        for n in nodes:
            labels = n.metadata.labels or {}
            pool = (
                labels.get(M.NODEPOOL_LABEL)
                or labels.get("eks.amazonaws.com/nodegroup")
                or labels.get(M.INSTANCE_TYPE_LABEL)
                or "default"
            )
            alloc = n.status.allocatable or {}
            p = pools.setdefault(pool, {"nodes": 0, "labels": labels, "alloc": alloc})
            p["nodes"] += 1
        out = []
        for pool, p in sorted(pools.items()):
            labels, alloc = p["labels"], p["alloc"]
            tpu = labels.get(M.TPU_ACCELERATOR_LABEL)
            kind, per_node, backend = "CPU core", _qty(alloc.get("cpu")), "cpu"
            for res, k, b in (
                ("google.com/tpu", f"TPU chip ({tpu}, {labels.get(M.TPU_TOPOLOGY_LABEL)})", "xla"),
                ("aws.amazon.com/neuron", "Neuron device", "neuron"),
                ("nvidia.com/gpu", "NVIDIA GPU", "cuda"),
            ):
                if _qty(alloc.get(res)):
                    kind, per_node, backend = k, _qty(alloc.get(res)), b
            out.append(
                CatalogEntry(
                    cloud=self.name,
                    accelerator=pool,
                    devices=per_node * p["nodes"],
                    device_kind=kind,
                    memory_gb=0.0,
                    hosts=p["nodes"],
                    runtime=labels.get(M.INSTANCE_TYPE_LABEL, ""),
                    zones=(labels.get("topology.kubernetes.io/zone", ""),),
                    backend=backend,
                    extra={
                        "price": PRICE_NOTE,
                        "vcpus": _qty(alloc.get("cpu")),
                        "tpu_topology": labels.get(M.TPU_TOPOLOGY_LABEL),
                        "instance_type": labels.get(M.INSTANCE_TYPE_LABEL),
                        "efa_interfaces": _qty(alloc.get("vpc.amazonaws.com/efa")),
                    },
                )
            )
        return out

    def check_node_pools(self, place: M.Placement) -> M.Placement:
        """The placement that fits the cluster's TPU node pools, or one line saying none does.

        A pool matches when its nodes carry the slice's accelerator and topology labels; it fits
        when a node's allocatable ``google.com/tpu`` holds one pod's request (the scheduler
        binds a pod only there, https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources).
        v5e/v6e 2x4 pools are one 8-chip VM or two 4-chip VMs per slice: the pods follow the
        pool that exists (:meth:`TpuTopology.host_layouts`).
        """
        if place.kind != "tpu" or not self.settings.check_node_pools:
            return place
        nodes = self._call("listing nodes", self.core().list_node).items
        offered = sorted(
            {
                (n.metadata.labels or {}).get(M.TPU_ACCELERATOR_LABEL, "")
                + " "
                + (n.metadata.labels or {}).get(M.TPU_TOPOLOGY_LABEL, "")
                for n in nodes
                if (n.metadata.labels or {}).get(M.TPU_ACCELERATOR_LABEL)
            }
        )
        want = f"{place.node_selector[M.TPU_ACCELERATOR_LABEL]} {place.node_selector[M.TPU_TOPOLOGY_LABEL]}"
        if want not in offered:
            raise CloudError(
                f"no node pool offers {place.accelerator} ({want.replace(' ', ' topology ')})"
                + (
                    f"; the cluster has: {', '.join(o.replace(' ', ' topology ') for o in offered)}"
                    if offered
                    else "; the cluster has no TPU node pools"
                ),
                M.node_pool_hint(place),
            )
        matching = [
            n
            for n in nodes
            if all((n.metadata.labels or {}).get(k) == v for k, v in place.node_selector.items())
        ]
        per_node = sorted(
            {_qty((n.status.allocatable or {}).get("google.com/tpu")) for n in matching}
        )
        layouts = M.tpu_layouts(place)
        for hosts, chips in layouts:
            if chips in per_node:
                return M.with_layout(place, hosts, chips)
        types = sorted(
            {(n.metadata.labels or {}).get(M.INSTANCE_TYPE_LABEL, "?") for n in matching}
        )
        raise CloudError(
            f"no node pool fits {place.accelerator}: its pods ask google.com/tpu: "
            f"{' or '.join(str(c) for _, c in layouts)} per node, the "
            f"{place.topology} pool's nodes ({', '.join(types)}) hold "
            f"{' or '.join(str(c) for c in per_node)}",
            "create a pool whose machine type matches the slice's hosts "
            f"({M.node_pool_hint(place)})",
        )

    def _record(self, name: str) -> Any:
        return Store().get_cluster(name)

    def job_state(self, name: str, api: str) -> tuple[str, dict[str, Any]]:
        ns = self.settings.namespace
        if api == "jobset":
            obj = self._call(
                f"reading JobSet {name}",
                self.custom().get_namespaced_custom_object,
                M.JOBSET_GROUP,
                M.JOBSET_VERSION,
                ns,
                M.JOBSET_PLURAL,
                name,
                missing_ok=True,
            )
            if obj is None:
                return "GONE", {}
            status = obj.get("status") or {}
            conds = {c.get("type"): c for c in status.get("conditions") or []}
            if (conds.get("Completed") or {}).get("status") == "True":
                return "COMPLETED", status
            if (conds.get("Failed") or {}).get("status") == "True":
                return "FAILED", status
            suspended = conds.get("Suspended") or {}
            if suspended.get("status") == "True" or (obj.get("spec") or {}).get("suspend"):
                self._suspended(
                    "JobSet",
                    name,
                    obj["metadata"],
                    suspended.get("reason") or "",
                    suspended.get("message") or "",
                )
                return "SUSPENDED", status
            return self._pods_state(name), status
        obj = self._call(
            f"reading Job {name}", self.batch().read_namespaced_job, name, ns, missing_ok=True
        )
        if obj is None:
            return "GONE", {}
        st = obj.status
        conds = {c.type: c for c in (st.conditions or [])}
        true = {t for t, c in conds.items() if c.status == "True"}
        if "Complete" in true:
            return "COMPLETED", {"succeeded": st.succeeded}
        if "Failed" in true:
            return "FAILED", {"failed": st.failed}
        cond = conds.get("Suspended")
        if "Suspended" in true or obj.spec.suspend:
            meta = {"uid": obj.metadata.uid, "labels": obj.metadata.labels or {}}
            self._suspended(
                "Job",
                name,
                meta,
                (cond.reason or "") if cond is not None else "",
                (cond.message or "") if cond is not None else "",
            )
            return "SUSPENDED", {"active": st.active}
        return self._pods_state(name), {"active": st.active}

    def _suspended(
        self, kind: str, name: str, meta: dict[str, Any], reason: str, message: str
    ) -> None:
        """Why a suspended Job/JobSet waits, and the fix, in :attr:`suspended_reason`.

        Kueue creates the jobs it manages suspended and resumes them once their Workload is
        admitted (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/); where it manages jobs
        without a queue name, such a job "will not be considered for admission by Kueue until
        [it is] edited to have a kueue.x-k8s.io/queue-name label"
        (https://kueue.sigs.k8s.io/docs/tasks/manage/enforce_job_management/manage_jobs_without_queue_name/).
        The Workload's own condition says why it is not admitted (quota, a missing LocalQueue).
        """
        ns = self.settings.namespace
        queue = (meta.get("labels") or {}).get(M.QUEUE_LABEL)
        self.suspended_queued = bool(queue)
        why = f"{kind} {name} is suspended"
        if reason or message:
            why += f" ({': '.join(x for x in (reason, message) if x)})"
        admission = self._workload_message(meta.get("uid") or "")
        if admission:
            why += f"; Kueue: {admission}"
        if queue:
            self.suspended_reason = (
                f"{why}; it waits for Kueue to admit it through LocalQueue {queue} "
                f"(kubectl -n {ns} get workloads)"
            )
        else:
            self.suspended_reason = (
                f"{why}; it has no queue, so Kueue never admits it: set k8s.queue to a "
                f"LocalQueue of namespace {ns} (kubectl -n {ns} get localqueues), "
                f"then `aios down {name}` and launch again"
            )

    def _workload_message(self, uid: str) -> str:
        """The message of the Kueue Workload of the job with ``uid`` (its ``QuotaReserved`` or
        ``Admitted`` condition), "" when Kueue or the Workload is not there or not readable."""
        if not uid:
            return ""
        try:
            found = self._call(
                "listing Kueue workloads",
                self.custom().list_namespaced_custom_object,
                M.KUEUE_GROUP,
                M.KUEUE_VERSION,
                self.settings.namespace,
                "workloads",
                label_selector=f"{M.KUEUE_JOB_UID_LABEL}={uid}",
                missing_ok=True,
            )
        except CloudError:  # no RBAC on Kueue's objects: the job's own condition still says it
            return ""
        for wl in (found or {}).get("items") or []:
            for c in (wl.get("status") or {}).get("conditions") or []:
                if c.get("type") in ("QuotaReserved", "Admitted") and c.get("status") == "False":
                    return str(c.get("message") or c.get("reason") or "")
        return ""

    def _pods_state(self, name: str) -> str:
        """RUNNING once every pod of the job runs; PENDING while any waits (a Job's and a
        JobSet's ``active`` count pending pods too, so they cannot tell). The scheduler's reason
        for a pod that cannot be placed is kept in :attr:`pending_reason`."""
        self.pending_reason = ""
        pods = self.pods(name)
        if not pods:
            return "PENDING"
        for pod in pods:
            if (pod.status.phase or "Pending") != "Pending":
                continue
            for c in pod.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.message:
                    self.pending_reason = f"{pod.metadata.name}: {c.message}"
            return "PENDING"
        return "RUNNING"

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        rec = self._record(name)
        if rec is None:
            return None
        state, raw = self.job_state(name, rec.request.get("api", "jobset"))
        if state == "PENDING" and self.pending_reason:
            raw = {**raw, "pending": self.pending_reason}
        return ClusterInfo(
            name=name,
            cloud=self.name,
            zone=rec.zone,
            accelerator=rec.accelerator,
            state=state,
            raw=raw,
            waiting=self.suspended_reason if state == "SUSPENDED" else "",
        )

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        raise CloudError(
            "a Kubernetes job cannot be restarted in place",
            "launch it again with `aios launch --cloud k8s --name NAME ...`",
        )

    def cancel(self, name: str, api: str | None = None) -> None:
        """Delete everything aios created for ``name`` (labelled aios-cluster=name). Idempotent."""
        from kubernetes import client

        rec = self._record(name)
        api = api or (rec.request.get("api", "jobset") if rec else "jobset")
        ns = self.settings.namespace
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        if api == "jobset":
            self._call(
                f"deleting JobSet {name}",
                self.custom().delete_namespaced_custom_object,
                M.JOBSET_GROUP,
                M.JOBSET_VERSION,
                ns,
                M.JOBSET_PLURAL,
                name,
                body=body,
                missing_ok=True,
            )
        else:
            self._call(
                f"deleting Job {name}",
                self.batch().delete_namespaced_job,
                name,
                ns,
                body=body,
                missing_ok=True,
            )
            self._call(
                f"deleting Service {name}",
                self.core().delete_namespaced_service,
                name,
                ns,
                missing_ok=True,
            )
        self._call(
            f"deleting Secret {name}-env",
            self.core().delete_namespaced_secret,
            f"{name}-env",
            ns,
            missing_ok=True,
        )
        self._call(
            f"deleting ConfigMap {name}-code",
            self.core().delete_namespaced_config_map,
            f"{name}-code",
            ns,
            missing_ok=True,
        )

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        ns = self.settings.namespace
        if action in ("stop", "delete"):
            return [
                CloudCommand(
                    [
                        "kubectl",
                        "-n",
                        ns,
                        "delete",
                        "jobset,job,service,secret,configmap",
                        "-l",
                        f"{M.CLUSTER_LABEL}={name}",
                    ]
                )
            ]
        if action == "describe":
            return [
                CloudCommand(
                    [
                        "kubectl",
                        "-n",
                        ns,
                        "get",
                        "jobset,job,pods",
                        "-l",
                        f"{M.CLUSTER_LABEL}={name}",
                    ]
                )
            ]
        if action == "list":
            return [CloudCommand(["kubectl", "-n", ns, "get", "jobset,job", "-l", M.CLUSTER_LABEL])]
        raise CloudError(
            f"'{action}' does not apply to a Kubernetes job", "use launch/status/logs/cancel/down"
        )

    def describe_credentials(self) -> str:
        self.client()
        return f"kubeconfig context {self.settings.context or '(current)'}"

    def python(self, accelerator: str, backend: str | None = None) -> str:
        return self.settings.python

    # ------------------------------------------------------------------ apply
    def apply(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create ``objs`` in order; on any failure delete what was created and raise one line."""
        created: list[dict[str, Any]] = []
        try:
            for o in objs:
                self._create(o)
                created.append(o)
        except BaseException:
            for o in reversed(created):
                try:
                    self._delete(o)
                except Exception:  # noqa: BLE001 - best effort; the first error is the one to report
                    pass
            raise
        return created

    def _create(self, o: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        ns, kind, name = o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]
        try:
            if kind == "JobSet":
                self.custom().create_namespaced_custom_object(
                    M.JOBSET_GROUP, M.JOBSET_VERSION, ns, M.JOBSET_PLURAL, o
                )
            elif kind == "Job":
                self.batch().create_namespaced_job(ns, o)
            elif kind == "Service":
                self.core().create_namespaced_service(ns, o)
            elif kind == "Secret":
                self.core().create_namespaced_secret(ns, o)
            elif kind == "ConfigMap":
                self.core().create_namespaced_config_map(ns, o)
            else:  # pragma: no cover - manifests() makes only these
                raise CloudError(f"cannot create a {kind}", "report this")
        except ApiException as exc:
            if kind == "JobSet" and exc.status == 404:
                raise CloudError(
                    f"the JobSet CRD ({M.JOBSET_PLURAL}.{M.JOBSET_GROUP}/{M.JOBSET_VERSION}) "
                    "is not installed in the cluster",
                    "install JobSet (kubectl apply --server-side -f "
                    "https://github.com/kubernetes-sigs/jobset/releases/latest/download/manifests.yaml) "
                    "or set k8s.api=job",
                ) from None
            if exc.status == 409:
                raise CloudError(
                    f"{kind} {name} already exists in namespace {ns}",
                    f"`aios down {name}` or pick another --name",
                ) from None
            raise CloudError(
                f"the API server rejected {kind} {name}: {_reason(exc)}",
                "fix the k8s.* settings or the launch options",
            ) from None
        except Exception as exc:
            if type(exc).__module__.startswith(("urllib3", "kubernetes")):
                raise CloudError(
                    f"cannot reach the API server ({type(exc).__name__})",
                    "check the kubeconfig's server and your network",
                ) from None
            raise

    def _delete(self, o: dict[str, Any]) -> None:
        ns, kind, name = o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]
        fn = {
            "JobSet": lambda: self.custom().delete_namespaced_custom_object(
                M.JOBSET_GROUP, M.JOBSET_VERSION, ns, M.JOBSET_PLURAL, name
            ),
            "Job": lambda: self.batch().delete_namespaced_job(
                name, ns, propagation_policy="Foreground"
            ),
            "Service": lambda: self.core().delete_namespaced_service(name, ns),
            "Secret": lambda: self.core().delete_namespaced_secret(name, ns),
            "ConfigMap": lambda: self.core().delete_namespaced_config_map(name, ns),
        }[kind]
        self._call(f"deleting {kind} {name}", fn, missing_ok=True)

    def pods(self, name: str) -> list[Any]:
        items = self._call(
            "listing pods",
            self.core().list_namespaced_pod,
            self.settings.namespace,
            label_selector=f"{M.CLUSTER_LABEL}={name}",
        ).items
        return sorted(items, key=lambda p: p.metadata.name)

    def pod_log(self, pod: str) -> str:
        return (
            self._call(
                f"reading the log of {pod}",
                self.core().read_namespaced_pod_log,
                pod,
                self.settings.namespace,
            )
            or ""
        )

    # ------------------------------------------------------------------ launch
    def launch_job(
        self, request: LaunchRequest, store: Store | None, log: Callable[[str], None]
    ) -> int:
        return k8s_launch.launch(self, request, store, log)

    def job_logs(
        self,
        rec: ClusterRecord,
        job: JobRecord,
        follow: bool,
        dry_run: bool,
        echo: Callable[[str], None],
    ) -> int:
        return k8s_launch.logs(self, rec, job, follow, dry_run, echo)


def _qty(v: Any) -> int:
    try:
        return (
            int(str(v or 0).rstrip("m"))
            if not str(v or "").endswith("m")
            else int(str(v)[:-1]) // 1000
        )
    except ValueError:
        return 0


def _reason(exc: Any) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)[:240]
    except (ValueError, TypeError):
        return str(exc.reason)[:240]
