"""Config sections contributed by this plugin: ``cuda`` and ``deepspeed``.

Set them in YAML, as ``key=value`` overrides (``cuda.compile=true``, ``deepspeed.zero_stage=3``)
or as env vars (``AIOS_CUDA__NCCL_PRESET=p5``).
"""

from __future__ import annotations

from typing import Literal

from aios.config.settings import Section
from pydantic import Field

NcclPreset = Literal["auto", "none", "p4d", "p5", "efa", "efa-rdma", "ib"]


class CudaSettings(Section):
    tf32: bool = Field(
        True,
        description="allow TF32 tensor cores for fp32 matmuls and cuDNN convolutions (Ampere and later)",
    )
    compile: bool = Field(False, description="torch.compile the model at setup (opt-in)")
    compile_mode: Literal[
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = "default"
    fused_optimizer: bool = Field(
        True,
        description="switch Adam/AdamW/SGD to their fused CUDA kernels (foreach where fused is unavailable)",
    )
    find_unused_parameters: bool = Field(False, description="DDP find_unused_parameters")
    static_graph: bool = Field(False, description="DDP static_graph")
    bucket_cap_mb: int = Field(25, ge=1, description="DDP gradient bucket size")
    nccl_preset: NcclPreset = Field(
        "auto",
        description="NCCL/EFA environment for multi-node runs: auto (from the instance type or the EFA "
        "devices found), none, p4d, p5, efa, efa-rdma (EFA with RDMA read: Nitro v4+), ib",
    )
    nccl_socket_ifname: str | None = Field(
        None, description="NCCL_SOCKET_IFNAME (bootstrap interface); presets exclude lo and docker"
    )
    nccl_ib_hca: str | None = Field(None, description="NCCL_IB_HCA, e.g. mlx5 (InfiniBand hosts)")
    nccl_debug: Literal["WARN", "INFO", "TRACE"] | None = Field(
        None, description="NCCL_DEBUG for every rank"
    )


class DeepSpeedSettings(Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters"
    )
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field(
        "none", description="ZeRO-Offload of optimizer state (stages 1-3)"
    )
    offload_param: Literal["none", "cpu", "nvme"] = Field(
        "none", description="offload of parameters (stage 3 only)"
    )
    nvme_path: str | None = Field(None, description="directory on a local NVMe for nvme offload")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="train_micro_batch_size_per_gpu; default: the batch size of the first loader set up, else 1",
    )
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = Field(500_000_000, ge=1)
    config: str | None = Field(
        None, description="path to your own DeepSpeed JSON; its keys override the generated ones"
    )
