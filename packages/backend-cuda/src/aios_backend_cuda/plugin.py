"""The ``aios-backend-cuda`` plugin (entry point target). Imports nothing heavy: no torch, no
NVML initialisation, no DeepSpeed; every hook imports what it needs when called.

Hooks implemented: ``aios_register_backends`` (backend ``cuda``, priority 100),
``aios_config_sections`` (``cuda``, ``deepspeed``), ``aios_discover_devices``,
``aios_make_strategy`` (``ddp`` over NCCL, ``deepspeed``), ``aios_make_precision``,
``aios_launch_plan``, ``aios_doctor_checks``, ``aios_env_info``.

``strategy: deepspeed`` is also served on the ``cpu`` backend (DeepSpeed's CPU accelerator over
gloo, ``DS_ACCELERATOR=cpu``): that is how the DeepSpeed path is tested without a GPU, and it
keeps the built-in CPU backend from silently running plain DDP when DeepSpeed was asked for.
"""

from __future__ import annotations

from typing import Any

from aios.hookspecs import hookimpl
from aios.types import Availability, BackendSpec

DS_BACKENDS = ("cuda", "cpu")


def _probe() -> Availability:
    from aios_backend_cuda.probe import probe

    return probe()


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(BackendSpec(
        name="cuda", priority=100, probe=_probe, device_type="cuda",
        install_hint="pip install -e './packages/core[cuda]' ./packages/backend-cuda (from the aios checkout)",
        description="NVIDIA GPUs: DDP over NCCL, AMP (bf16/fp16), DeepSpeed ZeRO 1-3",
    ))


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_cuda.settings import CudaSettings, DeepSpeedSettings

    return {"cuda": CudaSettings, "deepspeed": DeepSpeedSettings}


@hookimpl
def aios_discover_devices(backend: str, config: Any) -> Any:
    if backend != "cuda":
        return None
    from aios_backend_cuda.discovery import report

    return report()


def _wants_deepspeed(config: Any) -> bool:
    return getattr(config, "strategy", None) == "deepspeed"


@hookimpl(tryfirst=True)  # before the built-in cpu answer for strategy=deepspeed
def aios_make_strategy(backend: str, config: Any) -> Any:
    if backend == "cpu" and _wants_deepspeed(config):
        from aios_backend_cuda.deepspeed_strategy import DeepSpeedStrategy

        return DeepSpeedStrategy(config, device_type="cpu", dist_backend="gloo")
    if backend != "cuda":
        return None
    strategy = getattr(config, "strategy", "auto")
    if strategy in ("spmd", "nxd"):
        from aios.errors import ConfigError

        raise ConfigError(f"strategy '{strategy}' is not available on the cuda backend", "use strategy=ddp (default) or strategy=deepspeed")
    if strategy == "deepspeed":
        from aios_backend_cuda.deepspeed_strategy import DeepSpeedStrategy

        return DeepSpeedStrategy(config, device_type="cuda", dist_backend="nccl")
    from aios_backend_cuda.strategy import CudaDDPStrategy

    return CudaDDPStrategy(config)


@hookimpl(tryfirst=True)  # before the built-in cpu answer for strategy=deepspeed
def aios_make_precision(backend: str, precision: str, config: Any) -> Any:
    if backend == "cpu" and _wants_deepspeed(config):
        from aios_backend_cuda.deepspeed_strategy import DeepSpeedPrecision

        return DeepSpeedPrecision(precision, "cpu")
    if backend != "cuda":
        return None
    from aios_backend_cuda.precision import check_bf16

    check_bf16(precision)
    if _wants_deepspeed(config):
        from aios_backend_cuda.deepspeed_strategy import DeepSpeedPrecision

        return DeepSpeedPrecision(precision, "cuda")
    from aios.precision import default_precision

    return default_precision(precision, "cuda")


@hookimpl(tryfirst=True)  # before the built-in cpu answer for strategy=deepspeed
def aios_launch_plan(backend: str, config: Any, request: Any) -> Any:
    if backend == "cpu" and _wants_deepspeed(config):
        import os

        from aios.launch import elastic_plan

        nprocs = 1 if config.nprocs == "auto" else int(config.nprocs)
        env = {"DS_ACCELERATOR": "cpu"}
        if nprocs > 1:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nprocs))
        return elastic_plan("cpu", config, request, nprocs, env=env, notes=["strategy deepspeed on CPU: DeepSpeed's CPU accelerator over gloo"])
    if backend != "cuda":
        return None
    from aios_backend_cuda.launch import cuda_launch_plan

    return cuda_launch_plan(config, request)


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> Any:
    if backend not in (None, "cuda"):
        return None
    from aios_backend_cuda.doctor import checks

    return checks(backend, config)


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    from aios_backend_cuda import nvml

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
        out["nvidia_gpus"] = ", ".join(f"{sum(1 for g in inv.gpus if g.name == m)}x {m}" for m in inv.models) or "none visible"
    else:
        out["nvidia_driver"] = f"unavailable ({why})"
    return out
