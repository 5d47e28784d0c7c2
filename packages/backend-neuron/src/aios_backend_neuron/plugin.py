"""The aios plugin for AWS Trainium (entry point ``aios-backend-neuron``).

Imports nothing heavy: torch, torch_xla, torch_neuronx and neuronx_distributed are imported only
inside the strategy (at ``aios.init`` in a worker), never by registration, discovery, doctor, env
or launch planning.

Registers backend ``neuron`` (priority 200; discovery, launch plan, precision and doctor checks
carried by its :class:`~aios.types.BackendSpec`), strategies ``ddp`` (data parallel on the XLA or
native runtime; the default) and ``nxd`` (neuronx-distributed TP/PP/ZeRO-1) for backend
``neuron``, config section ``neuron``; ``aios_env_info``.
"""

from __future__ import annotations

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

BACKEND = "neuron"
INSTALL_HINT = (
    "pip install -e './packages/core[neuron]' ./packages/backend-xla "
    "./packages/backend-neuron (from the aios checkout) && pip install --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com "
    "torch-neuronx neuronx-cc neuronx-distributed (on a Trainium instance)"
)


def probe(config: Any = None) -> Availability:
    """Neuron devices present (``/dev/neuron*`` or ``neuron-ls``) and a real torch-neuronx
    installed (the PyPI placeholder does not count). Reads metadata only; imports nothing.

    Without devices but with ``neuron.instance_type`` set, the backend is available *for
    planning* (``--dry-run``, cloud launches): the plan is built for that instance type, and a
    worker started here still fails at setup with the missing-package error. ``config`` is the
    resolved config the registry passes (None from ``aios devices``: then only
    ``AIOS_NEURON__INSTANCE_TYPE`` counts)."""
    from aios_backend_neuron.discovery import device_nodes, run_neuron_ls
    from aios_backend_neuron.packages import XLA_CPU_ENV, detect, placeholder_message
    from aios_backend_neuron.settings import planned_instance_type

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


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name=BACKEND,
            priority=200,
            probe=probe,
            install_hint=INSTALL_HINT,
            device_type="xla",
            description="AWS Trainium (Trn1/Trn2) through torch-neuronx (XLA or native) and neuronx-distributed",
            accelerator=None,
            default_strategy="ddp",
            discover=device_report,
            launch_plan=_launch_plan,
            precision=_precision,
            doctor=_doctor,
        )
    )


def _make(config: Any, accelerator: Any, backend: str) -> Any:
    from aios_backend_neuron.strategy import make_strategy

    return make_strategy(config)


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            _make,
            backends=(BACKEND,),
            description="data parallel over NeuronCores (torch-neuronx XLA or native runtime)",
        )
    )
    register(
        StrategySpec(
            "nxd",
            _make,
            backends=(BACKEND,),
            description="legacy: neuronx-distributed tensor/pipeline parallel and ZeRO-1 on the XLA "
            "runtime (neuron.tp_degree, pp_degree, zero1)",
        )
    )
    for name, what in (("fsdp", "FSDP2"), ("tp", "DTensor tensor parallel"), ("hsdp", "HSDP")):
        register(
            StrategySpec(
                name,
                _native(name),
                backends=(BACKEND,),
                description=f"{what} on TorchNeuron (core's native strategy over the neuron accelerator; Trn2/Trn3)",
            )
        )


def _native(name: str) -> Any:
    def make(config: Any, accelerator: Any, backend: str) -> Any:
        from aios_backend_neuron.strategy import make_native_strategy

        return make_native_strategy(config, name)

    return make


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "neuron",
            _neuron_accelerator,
            "TorchNeuron's native neuron device (process group 'neuron', autocast bf16, compile backend 'neuron')",
        )
    )


def _neuron_accelerator(config: Any = None) -> Any:
    from aios_backend_neuron.native_strategy import NeuronAccelerator

    return NeuronAccelerator(config)


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_neuron.settings import NeuronSettings

    return {"neuron": NeuronSettings}


# ------------------------------------------------------------------------------ discovery


def device_report(config: Any = None) -> DeviceReport:
    """``aios devices`` for Neuron: cores per device, memory, logical-core config, visible cores."""
    from aios_backend_neuron import catalog
    from aios_backend_neuron.discovery import (
        NeuronTopology,
        format_core_list,
        run_neuron_ls,
        visible_core_ids,
    )
    from aios_backend_neuron.packages import detect, placeholder_message
    from aios_backend_neuron.settings import settings_of

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


# ------------------------------------------------------------------------------ components


def _precision(precision: str, config: Any, accelerator: Any) -> Any:
    from aios.strategies.precision import default_precision

    from aios_backend_neuron.launch import check_precision
    from aios_backend_neuron.strategy import active_runtime

    check_precision(precision)
    return default_precision(precision, "neuron" if active_runtime(config) == "native" else "xla")


def _launch_plan(config: Any, request: Any) -> Any:
    from aios_backend_neuron.launch import build_plan

    return build_plan(config, request)


# ------------------------------------------------------------------------------ doctor / env


def _doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    from aios_backend_neuron.doctor import checks

    return checks(config, explicit=explicit)


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from aios_backend_neuron.discovery import find_neuron_ls
    from aios_backend_neuron.packages import detect

    sw = detect()
    out: dict[str, Any] = {"neuron.runtime": sw.runtime_label()}
    for d in (sw.torch_neuronx, sw.neuronx_cc, sw.neuronx_distributed, sw.libneuronxla):
        if d.installed:
            out[d.name] = f"{d.version} (PyPI placeholder!)" if d.placeholder else d.version
        else:
            out[d.name] = "not installed"
    if sw.torch_xla.installed:
        out.setdefault("torch_xla", sw.torch_xla.version)
    out["neuron-ls"] = find_neuron_ls() or "not found"
    return out


@hookimpl
def aios_check_rules() -> list[Any]:
    # deferred, as every hook here: a rank loads this plugin and never the checker
    from aios_backend_neuron.check_rules import NEURON_RULES

    return list(NEURON_RULES)
