"""The ``k8s`` config section (``AIOS_K8S__IMAGE=...``, YAML ``k8s:``)."""

from __future__ import annotations

from typing import Literal

from aios.config.settings import Section
from pydantic import Field


class K8sSettings(Section):
    kubeconfig: str | None = Field(
        None, description="kubeconfig path (default: KUBECONFIG, then ~/.kube/config)"
    )
    context: str | None = Field(None, description="kubeconfig context (default: the current one)")
    namespace: str = Field(
        "default", description="namespace of the jobs, secrets and config maps aios creates"
    )
    image: str | None = Field(
        None,
        description="container image with python, torch and aios installed (required to launch)",
    )
    python: str = Field("python3", description="interpreter in the image")
    api: Literal["auto", "jobset", "job"] = Field(
        "auto",
        description="auto: JobSet for TPU slices and several nodes, an indexed Job otherwise",
    )
    check_node_pools: bool = Field(
        True,
        description="refuse a TPU type/topology no node pool offers (off for Autopilot, which provisions on demand)",
    )
    service_account: str | None = None
    cpu: str | None = Field(None, description="CPU request per pod (e.g. '8')")
    memory: str | None = Field(None, description="memory request per pod (e.g. '32Gi')")
    queue: str | None = Field(
        None,
        description="Kueue LocalQueue of the namespace (label kueue.x-k8s.io/queue-name on the "
        "Job/JobSet); on clusters where Kueue manages jobs, one without a queue stays suspended",
    )
    shm_size: str | None = Field(
        None,
        description="size of the memory-backed /dev/shm on every pod (e.g. '16Gi'); default: half "
        "of k8s.memory when set, else 2Gi per accelerator device of the pod (2Gi for CPU pods)",
    )
    master_port: int = Field(29500, ge=1, le=65535)
    max_code_kib: int = Field(
        900, ge=1, description="code shipped in a ConfigMap (Kubernetes caps objects at 1 MiB)"
    )
    poll_interval: float = Field(5.0, gt=0)
