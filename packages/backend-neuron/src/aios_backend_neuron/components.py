"""The neuron backend's components, as its specs carry them (:mod:`aios_backend_neuron.plugin`
names each as an :class:`aios.types.Lazy` target, so loading the plugin imports none of this):
the probe, discovery, launch plan, precision, doctor checks and strategy factories.

Imports nothing heavy: torch, torch_xla, torch_neuronx and neuronx_distributed are imported only
inside the strategy (at ``aios.init`` in a worker).
"""

from __future__ import annotations

import os
from typing import Any

from aios.errors import ConfigError
from aios.strategies.precision import default_precision
from aios.types import Availability, DeviceInfo, DeviceReport, DoctorCheck, LaunchPlan

from aios_backend_neuron import catalog
from aios_backend_neuron.discovery import (
    NeuronTopology,
    device_nodes,
    format_core_list,
    run_neuron_ls,
    visible_core_ids,
)
from aios_backend_neuron.doctor import checks
from aios_backend_neuron.launch import build_plan, check_precision
from aios_backend_neuron.packages import XLA_CPU_ENV, detect, placeholder_message
from aios_backend_neuron.plugin import BACKEND
from aios_backend_neuron.settings import planned_instance_type, settings_of
from aios_backend_neuron.strategy import active_runtime, make_native_strategy, make_strategy


def probe(config: Any = None) -> Availability:
    """Neuron devices present (``/dev/neuron*`` or ``neuron-ls``) and a real torch-neuronx
    installed (the PyPI placeholder does not count). Reads metadata only; imports nothing.

    Without devices but with ``neuron.instance_type`` set, the backend is available *for
    planning* (``--dry-run``, cloud launches): the plan is built for that instance type, and a
    worker started here still fails at setup with the missing-package error. ``config`` is the
    resolved config the registry passes (None from ``aios devices``: then only
    ``AIOS_NEURON__INSTANCE_TYPE`` counts)."""
    nodes = device_nodes()
    ls_error = ""
    if not nodes:
        res = run_neuron_ls()
        if res.topology is None or not res.topology.devices:
            ls_error = res.error or "neuron-ls lists none"
    planned = planned_instance_type(config)
    if ls_error and planned:
        return Availability(True, f"no Neuron devices on this machine; planning for {planned}")
    sw = detect()
    if sw.placeholders:
        msg, fix = placeholder_message(sw)
        return Availability(False, f"{msg}; {fix}")
    if ls_error:
        return Availability(False, f"no Neuron devices here (/dev/neuron* absent; {ls_error})")
    if sw.runtime() is None:
        if sw.xla_cpu_stand_in:
            return Availability(False, f"{XLA_CPU_ENV}=1 needs torch_xla installed")
        return Availability(
            False,
            "torch-neuronx is not installed (it comes from the AWS Neuron pip index, not PyPI)",
        )
    return Availability(True, "XLA:CPU stand-in for tests" if sw.xla_cpu_stand_in else "")


def device_report(config: Any = None) -> DeviceReport:
    """``aios devices`` for Neuron: cores per device, memory, logical-core config, visible cores."""
    settings = settings_of(config)
    sw = detect()
    res = run_neuron_ls(settings.neuron_ls)
    notes: list[str] = []
    planned = False
    if res.topology is not None and res.topology.devices:
        topo = res.topology
        if settings.logical_nc_config and settings.logical_nc_config != topo.lnc:
            topo = topo.with_lnc(settings.logical_nc_config)
    elif settings.instance_type:
        topo = NeuronTopology.from_catalog(
            catalog.lookup(settings.instance_type), settings.logical_nc_config
        )
        planned = True
        notes.append(
            f"no Neuron devices here ({res.error}); showing {settings.instance_type} from the instance catalog"
        )
    else:
        return DeviceReport(
            BACKEND, "NeuronCore", False, reason=res.error or "neuron-ls lists no devices"
        )
    facts = topo.facts
    spec = settings.visible_cores or (
        None if planned else os.environ.get("NEURON_RT_VISIBLE_CORES")
    )
    origin = "neuron.visible_cores" if settings.visible_cores else "NEURON_RT_VISIBLE_CORES"
    reason = ""
    try:
        cores = visible_core_ids(topo, spec, origin)
    except ConfigError as exc:
        cores, reason = [], exc.one_line()
    kind = facts.core_kind if facts else "NeuronCore"
    if topo.lnc > 1:
        kind += f" (logical, LNC={topo.lnc})"
    by_core = {c: d for d in topo.devices for c in d.core_ids}
    devices = []
    for c in cores:
        d = by_core[c]
        devices.append(
            DeviceInfo(
                index=c,
                name=f"nd{d.index}/nc{c}",
                memory_bytes=(d.memory_bytes // d.cores) if d.cores else None,
                extra={
                    "device": d.index,
                    "physical_cores": topo.lnc,
                    "bdf": d.bdf,
                    "numa_node": d.numa_node,
                },
            )
        )
    runtime = sw.runtime()
    if sw.placeholders:
        reason = reason or "; ".join(placeholder_message(sw))
    elif runtime is None and not reason:
        reason = "torch-neuronx is not installed (AWS Neuron pip index)"
    if planned and not reason:
        reason = "planned from the catalog; no devices here"
    busy = [d for d in topo.devices if d.processes]
    for d in busy:
        pids = ", ".join(str(p.get("pid")) for p in d.processes)
        notes.append(
            f"device {d.index} is in use by pid {pids}: its cores cannot be claimed by another runtime"
        )
    if spec and cores:
        notes.append(f"{origin}={spec}: {len(cores)} of {len(topo.core_ids)} logical cores visible")
    if topo.lnc > 1:
        notes.append(
            f"logical NeuronCore config {topo.lnc} (NEURON_LOGICAL_NC_CONFIG): each logical "
            f"core is {topo.lnc} physical cores"
        )
    topology = {
        "instance_type": topo.instance_type or "unknown",
        "neuron_devices": len(topo.devices),
        "cores_per_device": topo.cores_per_device,
        "logical_nc_config": topo.lnc,
        "logical_cores": topo.logical_cores,
        "physical_cores": topo.physical_cores,
        "visible_cores": format_core_list(cores) if cores else "",
        "memory_per_device_gib": round(topo.devices[0].memory_bytes / 2**30, 1)
        if topo.devices
        else 0,
        "runtime": runtime or "none",
        "source": topo.source,
        "connected_to": {d.index: d.connected_to for d in topo.devices if d.connected_to},
    }
    return DeviceReport(
        BACKEND,
        kind,
        available=bool(cores) and runtime is not None and not sw.placeholders and not planned,
        devices=devices,
        topology=topology,
        notes=notes,
        reason=reason,
    )


def make(config: Any, accelerator: Any, backend: str) -> Any:
    """``StrategySpec.factory`` of ``ddp`` and ``nxd``: the runtime's strategy for the config."""
    return make_strategy(config)


def make_fsdp(config: Any, accelerator: Any, backend: str) -> Any:
    """``StrategySpec.factory`` of ``fsdp`` on TorchNeuron (core's native strategy)."""
    return make_native_strategy(config, "fsdp")


def make_tp(config: Any, accelerator: Any, backend: str) -> Any:
    """``StrategySpec.factory`` of ``tp`` on TorchNeuron (core's native strategy)."""
    return make_native_strategy(config, "tp")


def make_hsdp(config: Any, accelerator: Any, backend: str) -> Any:
    """``StrategySpec.factory`` of ``hsdp`` on TorchNeuron (core's native strategy)."""
    return make_native_strategy(config, "hsdp")


def backend_precision(precision: str, config: Any, accelerator: Any) -> Any:
    check_precision(precision)
    return default_precision(precision, "neuron" if active_runtime(config) == "native" else "xla")


def launch_plan(config: Any, request: Any) -> LaunchPlan:
    return build_plan(config, request)


def backend_doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    return checks(config, explicit=explicit)
