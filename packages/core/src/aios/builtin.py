"""The built-in plugin (entry point ``aios-core``): the CPU backend, TensorBoard and W&B
loggers, local file storage. Registered exactly like a third-party plugin."""

from __future__ import annotations

import importlib.util
import os
import platform
from typing import Any

from aios.hookspecs import hookimpl
from aios.types import Availability, BackendSpec, DeviceInfo, DeviceReport, DoctorCheck, LoggerSpec, StorageSpec


def _probe_cpu() -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed")
    return Availability(True)


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(BackendSpec(
        name="cpu", priority=0, probe=_probe_cpu, device_type="cpu",
        install_hint="pip install -e './packages/core[torch]' (from the aios checkout)",
        description="CPU processes over gloo (the embedded default)",
    ))


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@hookimpl
def aios_discover_devices(backend: str, config: Any) -> DeviceReport | None:
    if backend != "cpu":
        return None
    avail = _probe_cpu()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    name = platform.processor() or platform.machine()
    return DeviceReport(
        backend="cpu", kind="CPU", available=bool(avail), reason=avail.reason,
        devices=[DeviceInfo(0, name, _mem_total(), {"cores": cores})],
        topology={"cores": cores, "machine": platform.machine()},
    )


@hookimpl
def aios_make_strategy(backend: str, config: Any) -> Any:
    if backend != "cpu":
        return None
    from aios.strategies.ddp import DDPStrategy

    return DDPStrategy(config, device_type="cpu", dist_backend="gloo")


@hookimpl
def aios_launch_plan(backend: str, config: Any, request: Any) -> Any:
    if backend != "cpu":
        return None
    from aios.launch import elastic_plan

    nprocs = 1 if config.nprocs == "auto" else int(config.nprocs)
    threads = max(1, (os.cpu_count() or 1) // nprocs)
    return elastic_plan("cpu", config, request, nprocs, env={"OMP_NUM_THREADS": str(threads)} if nprocs > 1 else {})


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend not in (None, "cpu"):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return [DoctorCheck("torch installed", "fail", "torch is not installed", "pip install -e './packages/core[torch]' (from the aios checkout)", backend="cpu")]
    from importlib.metadata import version

    return [DoctorCheck("torch installed", "pass", f"torch {version('torch')}", backend="cpu")]


def _tensorboard_enabled(config: Any) -> bool:
    return bool(config.logging.tensorboard) and (
        importlib.util.find_spec("tensorboard") is not None
    )


def _tensorboard_factory(config: Any, run_dir: str) -> Any:
    from aios.loggers import TensorBoardLogger

    return TensorBoardLogger(run_dir)


def _wandb_enabled(config: Any) -> bool:
    return bool(config.logging.wandb) and importlib.util.find_spec("wandb") is not None


def _wandb_factory(config: Any, run_dir: str) -> Any:
    from aios.loggers import WandbLogger

    return WandbLogger(config, run_dir)


@hookimpl
def aios_register_loggers(register: Any) -> None:
    register(LoggerSpec("tensorboard", _tensorboard_enabled, _tensorboard_factory))
    register(LoggerSpec("wandb", _wandb_enabled, _wandb_factory))


@hookimpl
def aios_register_storage(register: Any) -> None:
    register(StorageSpec(scheme="file", protocol="file"))
    register(StorageSpec(scheme="memory", protocol="memory"))


@hookimpl
def aios_env_info() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("torch", "pluggy", "pydantic", "click", "fsspec"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out
