"""Kubernetes manifests generated from a launch plan (plain dicts, applied through the official
client; ``--dry-run`` prints them as YAML).

* GKE TPU slices (``-a v5litepod-16``, ``v4-16``, ``v5p-32``, ``v6e-8``): a JobSet with one
  replicatedJob ``slice`` whose ``replicas`` is the number of slices (multislice) and whose Job
  runs one pod per TPU host (``parallelism = completions = hosts``, Indexed). Pods request
  ``google.com/tpu: <chips per host>`` and select nodes with
  ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``; the JobSet
  carries ``alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool`` so each
  slice gets a node pool of its own.
* EKS (``-a trn1.32xlarge``, ``p5.48xlarge``, ...): one pod per instance, requesting
  ``aws.amazon.com/neuron`` or ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` (with the EFA
  libfabric env), selecting ``node.kubernetes.io/instance-type``; a JobSet, or with
  ``k8s.api=job`` an indexed Job with a headless Service as its pods' subdomain.
* ``-a cpu``: plain CPU pods (any cluster).

Every pod gets the variables :mod:`aios.environments.k8s` reads (pod count, subdomain, JobSet names,
``JOB_INDEX`` from the ``jobset.sigs.k8s.io/job-index`` label), ``MASTER_PORT``, and its secrets
through ``envFrom: secretRef`` (a Secret aios creates from the forwarded variables): no secret
value is ever written into a manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from aios.devices.efa import efa_interfaces, fabric_env
from aios.errors import ConfigError
from aios.launcher.contract import GRACE_CAP_ENV
from aios_backend_xla.topology import parse_accelerator_type

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
CLUSTER_LABEL = "aios-cluster"

# GKE node label values per TPU generation (cloud.google.com/gke-tpu-accelerator,
# https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus#availability). TPU7x
# (Ironwood) is served through GKE (1.34.0-gke.2201000+) and Compute Engine only, not the Cloud
# TPU API: https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
GKE_TPU_ACCELERATOR = {
    "v4": "tpu-v4-podslice",
    "v5e": "tpu-v5-lite-podslice",
    "v5p": "tpu-v5p-slice",
    "v6e": "tpu-v6e-slice",
    "tpu7x": "tpu7x",
}
# generations whose slices are 3D tori (topology AxBxC): v4, v5p, TPU7x
_TORUS_3D = ("v4", "v5p", "tpu7x")
_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
}

# EKS instance types: (kind, devices). Their EFA interfaces and libfabric variables come from
# aios.devices.efa's table (RDMA read only on Nitro v4+ families), the same one backend-cuda reads.
EKS_INSTANCES: dict[str, tuple[str, int]] = {
    "trn1.2xlarge": ("neuron", 1),
    "trn1.32xlarge": ("neuron", 16),
    "trn1n.32xlarge": ("neuron", 16),
    "trn2.48xlarge": ("neuron", 16),
    "inf2.48xlarge": ("neuron", 12),
    "p4d.24xlarge": ("gpu", 8),
    "p4de.24xlarge": ("gpu", 8),
    "p5.48xlarge": ("gpu", 8),
    "p5e.48xlarge": ("gpu", 8),
    "g5.xlarge": ("gpu", 1),
    "g5.12xlarge": ("gpu", 4),
    "g5.48xlarge": ("gpu", 8),
    "g6.xlarge": ("gpu", 1),
}
EFA_RESOURCE = "vpc.amazonaws.com/efa"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # https://kueue.sigs.k8s.io/docs/tasks/run/jobs/
# Kueue's Workload of a job carries the job's uid in this label
# (https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/)
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
SHM_VOLUME = "aios-shm"
#: /dev/shm per accelerator device when neither k8s.shm_size nor k8s.memory says otherwise
SHM_PER_DEVICE = 2 * 2**30


@dataclass
class Placement:
    """Where and on what the pods run."""

    kind: str  # tpu | neuron | gpu | cpu
    accelerator: str
    pods_per_job: int
    jobs: int = 1  # TPU slices (replicatedJob replicas)
    resources: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    backend: str = "cpu"
    topology: str | None = None
    tolerations: list[dict[str, Any]] = field(default_factory=list)


def tpu_layouts(place: Placement) -> list[tuple[int, int]]:
    """``(pods per slice, chips per pod)`` layouts the slice can take (the planned one first)."""

    return parse_accelerator_type(place.accelerator).host_layouts()


def with_layout(place: Placement, hosts: int, chips: int) -> Placement:
    """``place`` with ``hosts`` pods of ``chips`` TPU chips per slice."""
    return replace(
        place, pods_per_job=hosts, resources={**place.resources, TPU_RESOURCE: str(chips)}
    )


def node_pool_hint(place: Placement) -> str:
    """How to create the node pool a TPU slice needs. Multi-host TPU7x pools take a workload
    policy (``--placement-policy``) instead of ``--tpu-topology``
    (https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood#workload-policy)."""
    gen = next(
        (
            g
            for g, v in GKE_TPU_ACCELERATOR.items()
            if v == place.node_selector.get(TPU_ACCELERATOR_LABEL)
        ),
        "",
    )
    if gen == "tpu7x" and place.pods_per_job > 1:
        return (
            "gcloud compute resource-policies create workload-policy POLICY --type=HIGH_THROUGHPUT "
            f"--accelerator-topology={place.topology}, then gcloud container node-pools create "
            "... --machine-type=tpu7x-standard-4t --placement-policy=POLICY; or set "
            "k8s.check_node_pools=false on Autopilot"
        )
    return (
        f"gcloud container node-pools create ... --tpu-topology {place.topology}; "
        "or set k8s.check_node_pools=false on Autopilot"
    )


def tpu_topology(generation: str, chips: int) -> str:
    table = _3D if generation in _TORUS_3D else _2D
    if chips not in table:
        raise ConfigError(
            f"no GKE topology for a {generation} slice of {chips} chips",
            f"pick one of {sorted(table)} chips",
        )
    return table[chips]


def placement(accelerator: str, nodes: int) -> Placement:
    """The pods for ``accelerator`` x ``nodes`` (TPU slices / instances / CPU pods)."""
    if accelerator == "cpu":
        return Placement("cpu", "cpu", pods_per_job=nodes, backend="cpu")
    if accelerator in EKS_INSTANCES:
        kind, devices = EKS_INSTANCES[accelerator]
        res = {"aws.amazon.com/neuron" if kind == "neuron" else "nvidia.com/gpu": str(devices)}
        # the node's instance type (the pods' nodeSelector) decides, never this machine
        env: dict[str, str] = fabric_env(accelerator)
        if efa_interfaces(accelerator):
            res[EFA_RESOURCE] = str(efa_interfaces(accelerator))
        if kind == "neuron":
            env["NEURON_CC_FLAGS"] = (
                "--retry_failed_compilation"  # the rest comes from the neuron backend's plan
            )
        return Placement(
            kind,
            accelerator,
            pods_per_job=nodes,
            resources=res,
            node_selector={INSTANCE_TYPE_LABEL: accelerator},
            env=env,
            backend="neuron" if kind == "neuron" else "cuda",
        )
    if re.match(r"^(v\d|tpu)", accelerator):
        # the TPU chip facts (chips, hosts, chips per host) have one home: the XLA backend's
        # topology table (a declared dependency of this package)

        t = parse_accelerator_type(accelerator)
        if t.generation not in GKE_TPU_ACCELERATOR:
            raise ConfigError(
                f"GKE does not offer TPU {t.generation} node pools",
                f"use one of {', '.join(GKE_TPU_ACCELERATOR)}",
            )
        topo = tpu_topology(t.generation, t.chips)
        return Placement(
            "tpu",
            t.accelerator_type,
            pods_per_job=t.hosts,
            jobs=nodes,
            resources={TPU_RESOURCE: str(t.chips_per_host)},
            node_selector={
                TPU_ACCELERATOR_LABEL: GKE_TPU_ACCELERATOR[t.generation],
                TPU_TOPOLOGY_LABEL: topo,
            },
            backend="xla",
            topology=topo,
            tolerations=[{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    raise ConfigError(
        f"unknown accelerator '{accelerator}' for Kubernetes",
        "use a TPU type (v5litepod-16, v4-16, ...), an EKS instance type "
        f"({', '.join(sorted(EKS_INSTANCES)[:4])}, ...) or cpu",
    )


@dataclass
class JobRequest:
    name: str
    namespace: str
    image: str
    command: list[str]  # run in the container after the code is unpacked
    place: Placement
    api: str  # jobset | job
    env: dict[str, str] = field(default_factory=dict)
    secret_name: str | None = None
    code_configmap: str | None = None
    master_port: int = 29500
    service_account: str | None = None
    cpu: str | None = None
    memory: str | None = None
    backoff_limit: int = 0  # indexed Job: retries of each index (backoffLimitPerIndex)
    max_restarts: int = 0  # JobSet: whole-set restarts (preemption recovery)
    grace_seconds: float = 25.0  # checkpoint.grace_seconds: the pods' terminationGracePeriodSeconds
    spot: bool = False  # GKE Spot nodes (cloud.google.com/gke-spot)
    queue: str | None = None  # Kueue LocalQueue (kueue.x-k8s.io/queue-name)
    shm_size: str | None = None  # /dev/shm sizeLimit (default: :func:`shm_size`)


#: GKE gives non-system pods on a Spot node at most this long after the node's termination
#: notice; a larger terminationGracePeriodSeconds has no effect there
#: (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown)
GKE_SPOT_GRACE_S = 15
SPOT_LABEL = "cloud.google.com/gke-spot"


def pod_grace(req: JobRequest) -> int:
    """The pods' ``terminationGracePeriodSeconds``: aios's grace, capped to what GKE honours on
    Spot nodes. The same number reaches the ranks as ``AIOS_RUN_GRACE_CAP`` so that the
    manifest's grace and aios's agree."""
    import math

    grace = math.ceil(req.grace_seconds)
    return min(grace, GKE_SPOT_GRACE_S) if req.spot else grace


_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def quantity_bytes(value: str, setting: str) -> int:
    """A Kubernetes memory quantity (``16Gi``, ``512Mi``, ``32G``, ``1073741824``) in bytes; one
    line naming ``setting`` when it is not one."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?\s*", str(value))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(
            f"{setting}={value!r} is not a memory size",
            f"set {setting} to a Kubernetes quantity such as 16Gi or 512Mi",
        )
    return int(float(m.group(1)) * _UNITS.get(m.group(2) or "", 1))


def shm_size(req: JobRequest) -> str:
    """The ``sizeLimit`` of the pods' memory-backed ``/dev/shm``: ``k8s.shm_size``; else half
    of the pod's memory request (``k8s.memory``: a memory-backed emptyDir counts against the
    container's memory, https://kubernetes.io/docs/concepts/storage/volumes/#emptydir); else
    :data:`SHM_PER_DEVICE` per accelerator device of the pod (its ranks share it: NCCL's
    intra-node buffers, DataLoader workers, aios's background checkpoint), one for CPU pods."""
    if req.shm_size:
        quantity_bytes(req.shm_size, "k8s.shm_size")
        return req.shm_size
    if req.memory:
        return f"{quantity_bytes(req.memory, 'k8s.memory') // 2 // 2**20}Mi"
    devices = max(
        [
            int(v)
            for k, v in req.place.resources.items()
            if k in (TPU_RESOURCE, "nvidia.com/gpu", "aws.amazon.com/neuron")
        ]
        or [1]
    )
    return f"{max(1, devices) * SHM_PER_DEVICE // 2**30}Gi"


def _pod_spec(req: JobRequest, extra_env: list[dict[str, Any]]) -> dict[str, Any]:
    p = req.place
    env = [{"name": k, "value": v} for k, v in sorted({**p.env, **req.env}.items())]
    grace = pod_grace(req)
    env += [
        {"name": "AIOS_K8S_PODS_PER_JOB", "value": str(p.pods_per_job)},
        {"name": "MASTER_PORT", "value": str(req.master_port)},
        # a pod's deletion (or a node drain) is SIGTERM, then SIGKILL after the grace below
        {"name": GRACE_CAP_ENV, "value": str(grace)},
    ]
    env += extra_env
    script = "set -e; mkdir -p /workspace; "
    if req.code_configmap:
        script += "tar xzf /aios/code/code.tar.gz -C /workspace; "
    script += "cd /workspace; exec " + " ".join(_sh(c) for c in req.command)
    container: dict[str, Any] = {
        "name": "aios",
        "image": req.image,
        "command": ["bash", "-c", script],
        "env": env,
        "ports": [{"containerPort": req.master_port, "name": "rendezvous"}],
    }
    limits = dict(p.resources)
    requests = dict(p.resources)
    if req.cpu:
        requests["cpu"] = req.cpu
    if req.memory:
        requests["memory"] = req.memory
    if limits or requests:
        container["resources"] = {
            k: v for k, v in (("limits", limits), ("requests", requests)) if v
        }
    if req.secret_name:
        container["envFrom"] = [{"secretRef": {"name": req.secret_name}}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "containers": [container],
    }
    # a container's /dev/shm is 64 MiB unless a volume replaces it: NCCL (intra-node transport),
    # DataLoader workers and the background checkpoint need more; memory-backed emptyDir
    # (https://kubernetes.io/docs/concepts/storage/volumes/#emptydir)
    container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    spec["volumes"] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(req)}}
    ]
    if req.code_configmap:
        container["volumeMounts"].append(
            {"name": "aios-code", "mountPath": "/aios/code", "readOnly": True}
        )
        spec["volumes"].append({"name": "aios-code", "configMap": {"name": req.code_configmap}})
    selector = {**p.node_selector, **({SPOT_LABEL: "true"} if req.spot else {})}
    if selector:
        spec["nodeSelector"] = selector
    tolerations = list(p.tolerations)
    if req.spot:  # Spot node pools may carry the matching taint
        tolerations.append(
            {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        )
    if tolerations:
        spec["tolerations"] = tolerations
    if req.service_account:
        spec["serviceAccountName"] = req.service_account
    return spec


def _sh(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _labels(req: JobRequest) -> dict[str, str]:
    return {CLUSTER_LABEL: req.name}


def _top_labels(req: JobRequest) -> dict[str, str]:
    """The Job's/JobSet's own labels: with ``k8s.queue``, the LocalQueue Kueue admits it through
    (``metadata.labels``, for a Job and a JobSet alike:
    https://kueue.sigs.k8s.io/docs/tasks/run/jobs/, https://kueue.sigs.k8s.io/docs/tasks/run/jobsets/)."""
    return {**_labels(req), **({QUEUE_LABEL: req.queue} if req.queue else {})}


def jobset(req: JobRequest) -> dict[str, Any]:
    p = req.place
    rjob = "slice" if p.kind == "tpu" else "workers"
    extra: list[dict[str, Any]] = [
        {"name": "JOBSET_NAME", "value": req.name},
        {"name": "REPLICATED_JOB_NAME", "value": rjob},
        {"name": "REPLICATED_JOB_REPLICAS", "value": str(p.jobs)},
        {"name": "AIOS_K8S_SUBDOMAIN", "value": req.name},
        {
            "name": "JOB_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}},
        },
    ]
    meta: dict[str, Any] = {
        "name": req.name,
        "namespace": req.namespace,
        "labels": _top_labels(req),
    }
    if p.kind == "tpu":
        meta["annotations"] = {EXCLUSIVE_TOPOLOGY: NODEPOOL_LABEL}  # one slice per node pool
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            # a preempted or failed pod fails its Job (backoffLimit 0); the JobSet then recreates
            # every Job (all ranks restart together and resume from the checkpoint)
            "failurePolicy": {"maxRestarts": req.max_restarts},
            "network": {"enableDNSHostnames": True, "subdomain": req.name},
            "replicatedJobs": [
                {
                    "name": rjob,
                    "replicas": p.jobs,
                    "template": {
                        "metadata": {"labels": _labels(req)},
                        "spec": {
                            "parallelism": p.pods_per_job,
                            "completions": p.pods_per_job,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"labels": _labels(req)},
                                "spec": _pod_spec(req, extra),
                            },
                        },
                    },
                }
            ],
        },
    }


def indexed_job(req: JobRequest) -> list[dict[str, Any]]:
    """An indexed Job and the headless Service that gives its pods stable names."""
    p = req.place
    if p.jobs != 1:
        raise ConfigError("several TPU slices need a JobSet", "set k8s.api=jobset (or auto)")
    extra: list[dict[str, Any]] = [
        {"name": "AIOS_K8S_JOB_NAME", "value": req.name},
        {"name": "AIOS_K8S_SUBDOMAIN", "value": req.name},
    ]
    pod = _pod_spec(req, extra)
    pod["subdomain"] = req.name
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": req.name, "namespace": req.namespace, "labels": _labels(req)},
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": req.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": req.master_port}],
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": req.name, "namespace": req.namespace, "labels": _top_labels(req)},
        "spec": {
            "parallelism": p.pods_per_job,
            "completions": p.pods_per_job,
            "completionMode": "Indexed",
            # --max-restarts counts per index: backoffLimit counts failed pods over all indexes,
            # so one lost pod (and its peers failing with it) spent the whole budget. The first
            # index out of retries ends the Job (maxFailedIndexes 0): its peers cannot train on.
            # https://kubernetes.io/docs/concepts/workloads/controllers/job/#backoff-limit-per-index
            "backoffLimitPerIndex": req.backoff_limit,
            "maxFailedIndexes": 0,
            "template": {"metadata": {"labels": _labels(req)}, "spec": pod},
        },
    }
    return [svc, job]


def secret(name: str, namespace: str, cluster: str, values: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_LABEL: cluster}},
        "stringData": dict(values),
    }


def code_configmap(name: str, namespace: str, cluster: str, tar_b64: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_LABEL: cluster}},
        "binaryData": {"code.tar.gz": tar_b64},
    }


def manifests(
    req: JobRequest, secret_values: dict[str, str] | None = None, code_b64: str | None = None
) -> list[dict[str, Any]]:
    """Everything applied for one launch, in creation order."""
    out: list[dict[str, Any]] = []
    if req.secret_name:
        out.append(secret(req.secret_name, req.namespace, req.name, secret_values or {}))
    if req.code_configmap:
        out.append(code_configmap(req.code_configmap, req.namespace, req.name, code_b64 or ""))
    if req.api == "jobset":
        out.append(jobset(req))
    else:
        out.extend(indexed_job(req))
    return out
