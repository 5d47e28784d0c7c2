"""The aios plugin for Google Cloud TPUs (entry point ``aios-backend-xla``).

Imports nothing heavy: torch and torch_xla are imported only inside the strategy, the precision
policy and the launcher, never by registration, discovery, doctor or launch planning.

Registers backend ``xla`` (priority 200; discovery, launch plan, precision and doctor checks
carried by its :class:`~aios.types.BackendSpec`), strategies ``ddp`` (one process per chip,
gradients all-reduced once per step; the default) and ``spmd`` for backend ``xla``, config section
``xla``; ``aios_env_info``. torch_xla is not a native torch device, so the spec names no
accelerator and core's native strategies (``fsdp``, ``tp``, ...) are refused on it.

Also registers backend ``tpu`` (TorchTPU, priority 210: ``--backend auto`` prefers it when
``torch_tpu`` is installed), its accelerator ``tpu`` (core's native ``ddp``/``fsdp``/``tp``/``hsdp``
run on it) and the ``tpu-vm`` cluster environment. See :mod:`aios_backend_xla.tpu` for how
``xla.runtime`` maps to the two backends.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from aios.errors import ConfigError
from aios.plugins.hookspecs import hookimpl
from aios.types import (
    AcceleratorSpec,
    Availability,
    BackendSpec,
    DeviceInfo,
    DeviceReport,
    DoctorCheck,
    StrategySpec,
)

BACKEND = "xla"
INSTALL_HINT = (
    "on a Cloud TPU VM: pip install -e './packages/core[xla]' ./packages/backend-xla (from the "
    "aios checkout); to test on XLA:CPU without a TPU, opt in with xla.allow_cpu=true or "
    "AIOS_XLA__ALLOW_CPU=1"
)


def _torch_xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def probe(config: Any = None) -> Availability:
    """Available when torch_xla is importable (not imported) and a TPU is attached, or when the
    XLA:CPU opt-in is set. Reads sysfs, env and (on GCE only) the metadata server."""
    from aios_backend_xla.discovery import discover
    from aios_backend_xla.settings import cpu_opt_in, planned_accelerator
    from aios_backend_xla.tpu import runtime_setting

    if runtime_setting(config) == "torch_tpu":
        return Availability(False, "xla.runtime=torch_tpu: TorchTPU runs as --backend tpu")
    facts = discover()
    if not facts.present:
        acc = planned_accelerator(config)
        if acc:  # planning a slice from elsewhere (dry-run, cloud launch); running here is refused by the launcher
            return Availability(True, f"no TPU on this machine; planning for {acc}")
    if not _torch_xla_installed():
        return Availability(False, "torch_xla is not installed")
    if facts.present:
        return Availability(True)
    if cpu_opt_in(config):
        return Availability(True, "XLA:CPU (opt-in: xla.allow_cpu / AIOS_XLA__ALLOW_CPU)")
    return Availability(False, no_tpu_reason(facts, hint=False))


def no_tpu_reason(facts: Any, hint: bool = True) -> str:
    from aios_backend_xla.launch import no_tpu_error

    why = no_tpu_error(facts).message.removeprefix(f"backend '{BACKEND}': ")
    return (
        f"{why}; to test on XLA:CPU set xla.allow_cpu=true or AIOS_XLA__ALLOW_CPU=1"
        if hint
        else why
    )


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name=BACKEND,
            priority=200,
            probe=probe,
            install_hint=INSTALL_HINT,
            device_type="xla",
            description="Google Cloud TPU through torch_xla / PJRT (XLA:CPU with an explicit opt-in)",
            accelerator=None,
            default_strategy="ddp",
            discover=_discover,
            launch_plan=_launch_plan,
            precision=_precision,
            doctor=_doctor,
        )
    )
    register(
        BackendSpec(
            name=TPU_BACKEND,
            priority=210,
            probe=tpu_probe,
            install_hint=TPU_INSTALL_HINT,
            device_type="tpu",
            description="Google Cloud TPU through TorchTPU (native tpu device, DDP/FSDP2/TP over the tpu "
            "process group)",
            accelerator="tpu",
            default_strategy="ddp",
            discover=_tpu_discover,
            launch_plan=_tpu_launch_plan,
            doctor=_tpu_doctor,
        )
    )


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "tpu",
            _tpu_accelerator,
            "TorchTPU's native tpu device (process group 'tpu', autocast bf16, compile backend 'tpu')",
        )
    )


def _tpu_accelerator(config: Any = None) -> Any:
    from aios_backend_xla.tpu_accelerator import TpuAccelerator

    return TpuAccelerator(config)


@hookimpl
def aios_register_cluster_environments(register: Any) -> None:
    from aios_backend_xla.cluster_tpu import TpuVmEnvironment

    register(TpuVmEnvironment())


# ------------------------------------------------------------------------------ TorchTPU (backend tpu)

TPU_BACKEND = "tpu"
TPU_INSTALL_HINT = (
    "on a Cloud TPU VM: pip install torch==2.13.0 torch_tpu==0.2.0 (public registry; brings libtpu)"
)


def tpu_probe(config: Any = None) -> Availability:
    """Available when TorchTPU is installed (found, not imported) and a TPU is attached, or for
    planning a slice named by ``xla.accelerator`` from elsewhere. Refused under
    ``xla.runtime=torch_xla``."""
    from aios_backend_xla.discovery import discover
    from aios_backend_xla.settings import planned_accelerator
    from aios_backend_xla.tpu import runtime_setting, torch_tpu_installed

    rt = runtime_setting(config)
    if rt == "torch_xla":
        return Availability(False, "xla.runtime=torch_xla: torch_xla runs as --backend xla")
    facts = discover()
    if not facts.present:
        acc = planned_accelerator(config)
        if acc:
            return Availability(True, f"no TPU on this machine; planning for {acc}")
    if not torch_tpu_installed():
        why = (
            "xla.runtime=torch_tpu is set but torch_tpu is not installed"
            if rt == "torch_tpu"
            else "torch_tpu (TorchTPU) is not installed"
        )
        return Availability(False, why)
    if not facts.present:
        return Availability(False, no_tpu_reason(facts, hint=False))
    return Availability(True)


def _tpu_discover(config: Any) -> DeviceReport:
    import dataclasses

    from aios_backend_xla.discovery import discover
    from aios_backend_xla.tpu import torch_tpu_installed

    installed = torch_tpu_installed()
    facts = discover()
    rep = device_report(facts, None, installed=installed)
    reason = rep.reason
    if facts.present and not installed:
        reason = f"torch_tpu is not installed; {TPU_INSTALL_HINT}"
    elif not facts.present:
        reason = "torch_tpu is not installed" if not installed else no_tpu_reason(facts, hint=False)
    topology = dict(rep.topology)
    topology["runtime"] = "torch_tpu"
    return dataclasses.replace(rep, backend=TPU_BACKEND, reason=reason, topology=topology)


def _tpu_launch_plan(config: Any, request: Any) -> Any:
    from aios_backend_xla.discovery import discover
    from aios_backend_xla.tpu import tpu_launch_plan

    return tpu_launch_plan(config, request, discover())


def _tpu_doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    from aios_backend_xla.doctor import tpu_checks

    return tpu_checks(config, deep=explicit)


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            _make_xla,
            backends=(BACKEND,),
            description="data parallel, one process per chip, gradients all-reduced once per step",
        )
    )
    register(
        StrategySpec(
            "spmd",
            _make_spmd,
            backends=(BACKEND,),
            description="XLA SPMD: one process per host, a data mesh over every device",
        )
    )


def _make_xla(config: Any, accelerator: Any, backend: str) -> Any:
    from aios_backend_xla.strategy import XlaStrategy

    return XlaStrategy(config, pjrt_device=pjrt_device_for(config))


def _make_spmd(config: Any, accelerator: Any, backend: str) -> Any:
    from aios_backend_xla.strategy import XlaSpmdStrategy

    return XlaSpmdStrategy(config, pjrt_device=pjrt_device_for(config))


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_xla.settings import XlaSettings

    return {"xla": XlaSettings}


# ------------------------------------------------------------------------------ discovery


def device_report(facts: Any, config: Any = None, installed: bool | None = None) -> DeviceReport:
    """Build ``aios devices``' answer from :class:`~aios_backend_xla.discovery.TpuFacts`."""
    from aios_backend_xla.settings import cpu_opt_in, settings_of

    installed = _torch_xla_installed() if installed is None else installed
    notes = list(facts.problems)
    if facts.present:
        topo = None
        try:
            topo = facts.topology()
        except ConfigError as exc:
            notes.append(str(exc))
        n = facts.pci_chips or (topo.chips_per_host if topo else 0)
        hbm = topo.hbm_gib_per_chip * 2**30 if topo else None
        kind = f"TPU {topo.generation} chip" if topo else "TPU chip"
        devices = [
            DeviceInfo(
                i,
                kind,
                hbm,
                {"pci_device_id": facts.pci_device_ids[i]} if i < len(facts.pci_device_ids) else {},
            )
            for i in range(n)
        ]
        topology: dict[str, Any] = {}
        if topo:
            topology.update(
                accelerator_type=topo.accelerator_type,
                generation=topo.generation,
                chips=topo.chips,
                tensorcores=topo.tensorcores,
                hosts=topo.hosts,
                chips_per_host=topo.chips_per_host,
                hbm_gib_per_chip=topo.hbm_gib_per_chip,
                peak_bf16_tflops=topo.peak_bf16_tflops,
                runtime_version=topo.runtime_version,
            )
        if facts.worker_id is not None:
            topology["worker_id"] = facts.worker_id
        if facts.worker_addresses:
            topology["workers"] = list(facts.worker_addresses)
        topology["sources"] = ",".join(facts.sources)
        reason = (
            ""
            if installed
            else "torch_xla is not installed; pip install -e './packages/core[xla]' "
            "./packages/backend-xla (from the aios checkout)"
        )
        return DeviceReport(BACKEND, kind, installed, devices, topology, notes, reason)
    if installed and cpu_opt_in(config):
        n = settings_of(config).cpu_devices or int(os.environ.get("CPU_NUM_DEVICES", "1") or 1)
        return DeviceReport(
            BACKEND,
            "XLA:CPU (opt-in)",
            True,
            [DeviceInfo(i, "XLA:CPU") for i in range(n)],
            {"pjrt_device": "CPU"},
            ["no TPU found; XLA:CPU is enabled by the opt-in (for testing only)", *notes],
        )
    reason = "torch_xla is not installed" if not installed else no_tpu_reason(facts)
    return DeviceReport(BACKEND, "TPU", False, [], {}, notes, reason)


def _discover(config: Any) -> DeviceReport:
    from aios_backend_xla.discovery import discover

    return device_report(discover(), config)


# ------------------------------------------------------------------------------ step semantics


def pjrt_device_for(config: Any, environ: dict[str, str] | None = None) -> str:
    """``TPU`` or ``CPU`` (opt-in only). ``PJRT_DEVICE`` set by the launch plan is trusted; an
    unset one is decided from discovery, never defaulted to CPU silently."""
    from aios_backend_xla.discovery import discover
    from aios_backend_xla.launch import no_tpu_error
    from aios_backend_xla.settings import cpu_opt_in

    env = os.environ if environ is None else environ
    current = env.get("PJRT_DEVICE", "").upper()
    if current == "TPU":
        return "TPU"
    if current == "CPU":
        if cpu_opt_in(config, dict(env)):
            return "CPU"
        facts = discover(environ=dict(env))
        if facts.present:
            raise ConfigError(
                "PJRT_DEVICE=CPU is set on a machine with a TPU",
                "unset PJRT_DEVICE (aios sets PJRT_DEVICE=TPU) or opt in to XLA:CPU with xla.allow_cpu=true",
            )
        raise no_tpu_error(facts)
    if current:
        raise ConfigError(
            f"PJRT_DEVICE={current} is not a device the xla backend drives",
            "unset PJRT_DEVICE or set it to TPU (the neuron backend handles NEURON)",
        )
    facts = discover(environ=dict(env))
    if facts.present:
        return "TPU"
    if cpu_opt_in(config, dict(env)):
        return "CPU"
    raise no_tpu_error(facts)


def _precision(precision: str, config: Any, accelerator: Any) -> Any:
    from aios_backend_xla.precision import xla_precision

    return xla_precision(precision)


# ------------------------------------------------------------------------------ launch


def _launch_plan(config: Any, request: Any) -> Any:
    from aios_backend_xla.discovery import discover
    from aios_backend_xla.launch import xla_launch_plan
    from aios_backend_xla.tpu import check_backend_runtime

    check_backend_runtime(BACKEND, config)
    return xla_launch_plan(config, request, discover())


# ------------------------------------------------------------------------------ doctor / env


def _doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    from aios_backend_xla.doctor import checks

    return checks(config, deep=explicit)


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("torch_xla", "libtpu", "libtpu-nightly"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            if dist != "libtpu-nightly":
                out[dist] = "not installed"
    from aios_backend_xla.discovery import discover

    facts = discover()
    out["tpu"] = facts.accelerator_type or (
        f"{facts.pci_chips} chips" if facts.pci_chips else "none found"
    )
    return out
