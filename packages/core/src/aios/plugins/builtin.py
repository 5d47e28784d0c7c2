"""The built-in plugin (entry point ``aios-core``): the CPU backend and accelerator, the native
strategy family (``ddp``, ``fsdp``, ``tp``, ``hsdp`` over any native accelerator), the ``local``
and ``torchelastic`` cluster environments, TensorBoard and W&B loggers, local file storage, the
``full`` and ``dcp`` checkpoint formats and the known-deadline notice source.
Registered exactly like a third-party plugin; its names cannot be displaced by one.

Loading it stays cheap (``aios --help`` loads every plugin's hook module): what needs more than
the standard library (the strategies, the accelerator, the checkpoint formats) is named as a
:class:`aios.types.Lazy` target, imported on first use."""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from typing import Any

from aios.environments.base import LocalEnvironment, TorchElasticEnvironment
from aios.environments.k8s import KubernetesEnvironment
from aios.environments.slurm import SlurmEnvironment
from aios.launcher.plan import elastic_plan, plans_here, usable_cpus
from aios.plugins.hookspecs import hookimpl
from aios.resilience.notices import DeadlineWatcher
from aios.runrecord.loggers import TensorBoardLogger, WandbLogger
from aios.types import (
    AcceleratorSpec,
    Availability,
    BackendSpec,
    CheckpointFormatSpec,
    DeviceInfo,
    DeviceReport,
    DoctorCheck,
    Lazy,
    LoggerSpec,
    StorageSpec,
    StrategySpec,
)


def _probe_cpu(config: Any = None) -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed")
    return Availability(True)


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name="cpu",
            priority=0,
            probe=_probe_cpu,
            device_type="cpu",
            accelerator="cpu",
            install_hint="pip install -e './packages/core[torch]' (from the aios checkout)",
            description="CPU processes over gloo (the embedded default)",
            discover=_discover_cpu,
            launch_plan=_launch_cpu,
            doctor=_doctor_cpu,
        )
    )


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "cpu", Lazy("aios.devices.accelerator:CpuAccelerator"), "the CPU, processes over gloo"
        )
    )


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            Lazy("aios.strategies.native:ddp"),
            accelerators=("*",),
            description="DistributedDataParallel, one process per device",
        )
    )
    register(
        StrategySpec(
            "fsdp",
            Lazy("aios.strategies.native:fsdp"),
            accelerators=("*",),
            description="FSDP2 fully_shard per block (with mesh.tp > 1: 2-D FSDP x tensor parallel)",
        )
    )
    register(
        StrategySpec(
            "tp",
            Lazy("aios.strategies.native:tp"),
            accelerators=("*",),
            description="DTensor tensor/sequence parallel (mesh.tp), data parallel over mesh.dp",
        )
    )
    register(
        StrategySpec(
            "hsdp",
            Lazy("aios.strategies.native:hsdp"),
            accelerators=("*",),
            description="FSDP2 sharded within a node, replicated across nodes",
        )
    )


@hookimpl
def aios_register_cluster_environments(register: Any) -> None:
    register(LocalEnvironment())
    register(TorchElasticEnvironment())

    register(SlurmEnvironment())  # srun tasks (SLURM_PROCID, SLURM_JOB_NODELIST, ...)
    register(KubernetesEnvironment())  # indexed Job / JobSet pods (JOB_COMPLETION_INDEX)


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _discover_cpu(config: Any) -> DeviceReport:
    avail = _probe_cpu()
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    name = platform.processor() or platform.machine()
    return DeviceReport(
        backend="cpu",
        kind="CPU",
        available=bool(avail),
        reason=avail.reason,
        devices=[DeviceInfo(0, name, _mem_total(), {"cores": cores})],
        topology={"cores": cores, "machine": platform.machine()},
    )


def cpu_threads(nprocs: int, cpus: int, busy: float) -> tuple[int, str | None]:
    """Intra-op threads per process for a CPU run: the CPUs this process may use, shared among
    its processes (as torchrun does). One process alone is given only the CPUs the machine has
    idle (``cpus`` minus ``busy``, the CPUs other processes keep busy): threads that spin on a
    busy machine's cores make a run several times slower than one thread does. Returns the
    count and, when it was lowered, the note that says so."""
    if nprocs > 1:
        return max(1, cpus // nprocs), None
    idle = max(1, int(cpus - busy + 0.5))
    if idle >= cpus:
        return cpus, None
    return idle, (
        f"{busy:.1f} of {cpus} CPUs busy: OMP_NUM_THREADS={idle} for the one process (set "
        "OMP_NUM_THREADS to choose)"
    )


def busy_cpus(window: float = 0.1) -> float:
    """How many CPUs the machine's processes keep busy, from ``/proc/stat`` over ``window``
    seconds (time blocked on I/O counts as idle: the 1-minute load average counts it as busy);
    the 1-minute load average where ``/proc`` is missing."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0
    spent = max(1, total1 - total0)
    return (os.cpu_count() or 1) * (spent - (idle1 - idle0)) / spent


def _launch_cpu(config: Any, request: Any) -> Any:
    nprocs = 1 if config.nprocs == "auto" else int(config.nprocs)
    env: dict[str, str] = {}
    notes: list[str] = []

    # the user's own setting wins; remote hosts count their own CPUs
    if "OMP_NUM_THREADS" not in os.environ and plans_here(request):
        cpus = usable_cpus()
        threads, note = cpu_threads(nprocs, cpus, busy_cpus() if nprocs == 1 else 0.0)
        if nprocs > 1 or note:
            env["OMP_NUM_THREADS"] = str(threads)
        notes += [note] if note else []
    return elastic_plan("cpu", config, request, nprocs, env=env, notes=notes)


def _doctor_cpu(config: Any, explicit: bool) -> list[DoctorCheck]:
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return [
            DoctorCheck(
                "torch installed",
                "fail",
                "torch is not installed",
                "pip install -e './packages/core[torch]' (from the aios checkout)",
                backend="cpu",
            )
        ]
    from importlib.metadata import version

    return [DoctorCheck("torch installed", "pass", f"torch {version('torch')}", backend="cpu")]


def _tensorboard_enabled(config: Any) -> bool:
    return bool(config.logging.tensorboard) and (
        importlib.util.find_spec("tensorboard") is not None
    )


def _tensorboard_factory(config: Any, run_dir: str) -> Any:
    return TensorBoardLogger(run_dir)


def _wandb_enabled(config: Any) -> bool:
    return bool(config.logging.wandb) and importlib.util.find_spec("wandb") is not None


def _wandb_factory(config: Any, run_dir: str) -> Any:
    return WandbLogger(config, run_dir)


@hookimpl
def aios_register_loggers(register: Any) -> None:
    register(LoggerSpec("tensorboard", _tensorboard_enabled, _tensorboard_factory))
    register(LoggerSpec("wandb", _wandb_enabled, _wandb_factory))


@hookimpl
def aios_register_checkpoint_formats(register: Any) -> None:
    register(CheckpointFormatSpec("full", Lazy("aios.checkpoint.formats.full:FullStateFormat")))
    register(CheckpointFormatSpec("dcp", Lazy("aios.checkpoint.formats.dcp_format:DcpFormat")))


@hookimpl
def aios_preemption_watchers(config: Any) -> list[Any] | None:
    """A known end of the capacity the launcher computed ahead (``AIOS_RUN_DEADLINE``: a
    Capacity Block's end, a queued resource's ``--valid-until``); the runtime sets its lead."""
    known_end = DeadlineWatcher.from_env()
    return [known_end] if known_end is not None else None


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


@hookimpl
def aios_check_rules() -> list[Any]:
    # deferred: the checker is loaded by `aios check` (and a failed run's hint), never by a rank
    from aios.check.rules import CORE_RULES

    return list(CORE_RULES)
