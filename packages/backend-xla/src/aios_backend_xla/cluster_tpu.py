"""The TPU-VM / GKE-TPU cluster environment (``tpu-vm``), registered through
``aios_register_cluster_environments``. Env only: no torch, no network.

A multi-host TPU slice names its workers in ``TPU_WORKER_HOSTNAMES`` (GKE TPU node pools, and
aios's TorchTPU plan) and each host's index in ``TPU_WORKER_ID`` (TPU VMs, the plan) or, on GKE
Indexed Jobs / JobSets, ``JOB_COMPLETION_INDEX``. A single-host TPU VM sets one hostname: that
is not a cluster (TorchTPU counts the names for the same reason), so ``local`` stays in charge.
Priority 80: below torchelastic (100), which wins when a launcher already started the ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

from aios.environments.base import ClusterEnvironment, ClusterInfo, _int
from aios.errors import ConfigError


class TpuVmEnvironment(ClusterEnvironment):
    name = "tpu-vm"
    priority = 80

    @staticmethod
    def _hosts(environ: Mapping[str, str]) -> list[str]:
        return [h.strip() for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]

    def detect(self, environ: Mapping[str, str]) -> bool:
        return len(self._hosts(environ)) > 1

    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        hosts = self._hosts(environ)
        rank = _int(
            environ, "TPU_WORKER_ID", "JOB_COMPLETION_INDEX", "CLOUD_TPU_TASK_ID", default=None
        )
        if rank is None:
            raise ConfigError(
                "TPU_WORKER_HOSTNAMES names several hosts but neither TPU_WORKER_ID nor "
                "JOB_COMPLETION_INDEX says which one this is",
                "set TPU_WORKER_ID (TPU VMs) or run as an Indexed Job (GKE sets JOB_COMPLETION_INDEX)",
            )
        if not 0 <= rank < len(hosts):
            raise ConfigError(
                f"TPU worker id {rank} is outside the {len(hosts)} hosts of TPU_WORKER_HOSTNAMES",
                "fix TPU_WORKER_ID / JOB_COMPLETION_INDEX or TPU_WORKER_HOSTNAMES",
            )
        return ClusterInfo(
            name=self.name,
            nnodes=len(hosts),
            node_rank=rank,
            master_addr=environ.get("MASTER_ADDR") or hosts[0],
            master_port=_int(environ, "MASTER_PORT"),
            hosts=tuple(hosts),
        )
