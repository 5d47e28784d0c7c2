"""The ``aios-backend-cuda`` plugin (entry point target). Imports nothing heavy: no torch, no
NVML initialisation, no DeepSpeed: every component is named as an :class:`aios.types.Lazy`
target, imported when the registry first calls it.

Registers: backend ``cuda`` (priority 100; its discovery, launch plan, precision policy and
doctor checks carried by the :class:`~aios.types.BackendSpec`), the ``cuda`` accelerator (NCCL,
TF32, memory statistics; core's native ``ddp``/``fsdp``/``tp``/``hsdp`` run on it), strategy
``ddp`` for backend ``cuda`` (core's DDP plus fused optimizers, compile and the ``cuda`` section's
DDP knobs), and strategy ``deepspeed`` for backends ``cuda`` and ``cpu`` (DeepSpeed's CPU
accelerator over gloo, ``DS_ACCELERATOR=cpu``: how the DeepSpeed path is tested without a GPU).
Config sections ``cuda`` and ``deepspeed``; ``aios_env_info``.
"""

from __future__ import annotations

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import AcceleratorSpec, BackendSpec, Lazy, StrategySpec

from aios_backend_cuda import nvml

DS_BACKENDS = ("cuda", "cpu")


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name="cuda",
            priority=100,
            probe=Lazy("aios_backend_cuda.probe:backend_probe"),
            device_type="cuda",
            accelerator="cuda",
            install_hint="pip install -e './packages/core[cuda]' ./packages/backend-cuda (from the aios checkout)",
            description="NVIDIA GPUs: DDP over NCCL, FSDP2/TP, AMP (bf16/fp16), DeepSpeed ZeRO 1-3",
            discover=Lazy("aios_backend_cuda.discovery:discover"),
            launch_plan=Lazy("aios_backend_cuda.launch:cuda_launch_plan"),
            precision=Lazy("aios_backend_cuda.precision:backend_precision"),
            doctor=Lazy("aios_backend_cuda.doctor:backend_doctor"),
        )
    )


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "cuda",
            Lazy("aios_backend_cuda.accelerator:CudaAccelerator"),
            "NVIDIA GPU: NCCL, TF32, CUDA RNG and memory statistics",
        )
    )


def _deepspeed_env(config: Any, backend: str) -> dict[str, str]:
    return {"DS_ACCELERATOR": "cpu"} if backend == "cpu" else {}


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            Lazy("aios_backend_cuda.strategy:make_ddp"),
            backends=("cuda",),
            description="DDP over NCCL with fused optimizers, opt-in torch.compile and the cuda section's DDP knobs",
        )
    )
    register(
        StrategySpec(
            "deepspeed",
            Lazy("aios_backend_cuda.deepspeed_strategy:make_deepspeed"),
            backends=DS_BACKENDS,
            precision=Lazy("aios_backend_cuda.deepspeed_strategy:deepspeed_precision"),
            launch_env=_deepspeed_env,
            description="DeepSpeed ZeRO 1-3 (on cpu: DeepSpeed's CPU accelerator over gloo)",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_cuda.settings import CudaSettings, DeepSpeedSettings

    return {"cuda": CudaSettings, "deepspeed": DeepSpeedSettings}


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("aios-backend-cuda", "nvidia-ml-py", "deepspeed"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    inv, why = nvml.try_inventory()
    if inv is not None:
        out["nvidia_driver"] = inv.driver_version
        out["nvidia_driver_cuda"] = inv.cuda_version
        out["nvidia_gpus"] = (
            ", ".join(f"{sum(1 for g in inv.gpus if g.name == m)}x {m}" for m in inv.models)
            or "none visible"
        )
    else:
        out["nvidia_driver"] = f"unavailable ({why})"
    return out
