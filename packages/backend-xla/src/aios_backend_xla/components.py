"""The xla and tpu backends' components, as their specs carry them (:mod:`aios_backend_xla.plugin`
names each as an :class:`aios.types.Lazy` target, so loading the plugin imports none of this):
the probes, discovery, launch plans, precision, doctor checks and strategy factories.

Imports nothing heavy: torch and torch_xla are imported only inside the strategy, the precision
policy and the launcher, never by discovery, doctor or launch planning.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from aios.errors import ConfigError
from aios.types import Availability, DeviceInfo, DeviceReport, DoctorCheck, LaunchPlan

from aios_backend_xla.discovery import discover
from aios_backend_xla.doctor import checks, tpu_checks
from aios_backend_xla.launch import no_tpu_error, xla_launch_plan
from aios_backend_xla.plugin import BACKEND, TPU_BACKEND, TPU_INSTALL_HINT
from aios_backend_xla.precision import xla_precision
from aios_backend_xla.settings import cpu_opt_in, planned_accelerator, settings_of
from aios_backend_xla.strategy import XlaSpmdStrategy, XlaStrategy
from aios_backend_xla.tpu import (
    check_backend_runtime,
    runtime_setting,
    torch_tpu_installed,
    tpu_launch_plan,
)


def _torch_xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def probe(config: Any = None) -> Availability:
    """Available when torch_xla is importable (not imported) and a TPU is attached, or when the
    XLA:CPU opt-in is set. Reads sysfs, env and (on GCE only) the metadata server."""
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
    why = no_tpu_error(facts).message.removeprefix(f"backend '{BACKEND}': ")
    return (
        f"{why}; to test on XLA:CPU set xla.allow_cpu=true or AIOS_XLA__ALLOW_CPU=1"
        if hint
        else why
    )


def tpu_probe(config: Any = None) -> Availability:
    """Available when TorchTPU is installed (found, not imported) and a TPU is attached, or for
    planning a slice named by ``xla.accelerator`` from elsewhere. Refused under
    ``xla.runtime=torch_xla``."""
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


def tpu_discover(config: Any) -> DeviceReport:
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


def tpu_plan(config: Any, request: Any) -> LaunchPlan:
    return tpu_launch_plan(config, request, discover())


def tpu_doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    return tpu_checks(config, deep=explicit)


def make_xla(config: Any, accelerator: Any, backend: str) -> XlaStrategy:
    return XlaStrategy(config, pjrt_device=pjrt_device_for(config))


def make_spmd(config: Any, accelerator: Any, backend: str) -> XlaSpmdStrategy:
    return XlaSpmdStrategy(config, pjrt_device=pjrt_device_for(config))


def device_report(facts: Any, config: Any = None, installed: bool | None = None) -> DeviceReport:
    """Build ``aios devices``' answer from :class:`~aios_backend_xla.discovery.TpuFacts`."""
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


def discover_devices(config: Any) -> DeviceReport:
    return device_report(discover(), config)


def pjrt_device_for(config: Any, environ: dict[str, str] | None = None) -> str:
    """``TPU`` or ``CPU`` (opt-in only). ``PJRT_DEVICE`` set by the launch plan is trusted; an
    unset one is decided from discovery, never defaulted to CPU silently."""
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


def backend_precision(precision: str, config: Any, accelerator: Any) -> Any:
    return xla_precision(precision)


def launch_plan(config: Any, request: Any) -> LaunchPlan:
    check_backend_runtime(BACKEND, config)
    return xla_launch_plan(config, request, discover())


def backend_doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    return checks(config, deep=explicit)
