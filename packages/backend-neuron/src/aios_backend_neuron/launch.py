"""Launch plans for Trainium: ``torchrun`` (``python -m torch.distributed.run``) with one process
per logical NeuronCore, c10d rendezvous across nodes, and the Neuron environment.

Never imports torch: ``aios-run --backend neuron --dry-run`` prints these plans on any machine.
Give the instance type (``neuron.instance_type=trn1.32xlarge``, or ``LaunchRequest.accelerator``)
to plan off-instance; otherwise the plan is built from this machine's ``neuron-ls``.

The cloud-aws package builds per-node plans with :func:`plan_for_instances`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aios.config.schema import resolve
from aios.errors import BackendUnavailable, ConfigError, LaunchError
from aios.launcher.plan import elastic_plan, resolve_nprocs
from aios.types import Host, LaunchPlan, LaunchRequest

from aios_backend_neuron import catalog
from aios_backend_neuron.discovery import (
    NeuronTopology,
    format_core_list,
    run_neuron_ls,
    visible_core_ids,
)
from aios_backend_neuron.packages import XLA_CPU_ENV, NeuronSoftware, detect, placeholder_message
from aios_backend_neuron.settings import NeuronSettings, settings_of

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig

EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
PRECOMPILE_TOOL = "neuron_parallel_compile"


# ------------------------------------------------------------------------------ validation


def check_precision(precision: str) -> None:
    """fp16 on Trainium and the removed XLA_USE_BF16 switches are errors."""
    if precision == "fp16-mixed":
        raise ConfigError(
            "precision fp16-mixed is not supported on Trainium (backend neuron)",
            "use precision=bf16-mixed (autocast) or precision=bf16-true (bf16 weights with stochastic rounding)",
        )
    for var in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        if os.environ.get(var, "").strip() not in ("", "0"):
            raise ConfigError(
                f"{var} is set; it was removed from torch-neuronx and would silently change every dtype",
                f"unset {var} and use precision=bf16-true (or bf16-mixed)",
            )


def check_parallel(tp: int, pp: int, cores_per_node: int, world: int) -> int:
    """Validate tensor/pipeline degrees against the cores; return the data-parallel degree."""
    if tp > cores_per_node or cores_per_node % tp:
        raise ConfigError(
            f"neuron.tp_degree={tp} does not divide the {cores_per_node} NeuronCores per node",
            f"use a tp_degree that divides {cores_per_node} (e.g. "
            f"{', '.join(str(d) for d in _divisors(cores_per_node))})",
        )
    if world % (tp * pp):
        raise ConfigError(
            f"neuron.tp_degree={tp} x neuron.pp_degree={pp} = {tp * pp} does not divide the {world} workers",
            f"choose tp_degree x pp_degree dividing {world}",
        )
    return world // (tp * pp)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_runtime(facts: catalog.InstanceType | None) -> str:
    """The runtime for an instance family when nothing is installed to say otherwise: TorchNeuron
    (``native``) on Trn2/Trn3, the XLA-based torch-neuronx on Trn1 (Neuron <= 2.29 pinned)."""
    if facts is not None and facts.family.startswith("trn1"):
        return "xla"
    return "native"


TRN1_PIN = "Trn1 trains on the XLA runtime only with Neuron <= 2.29 pinned (torch-neuronx 2.9.0.2.29.*, torch 2.9)"


def resolve_runtime(
    settings: NeuronSettings, sw: NeuronSoftware, facts: catalog.InstanceType | None, local: bool
) -> str:
    """The runtime a plan targets: ``neuron.runtime`` when set, else what is installed here,
    else the instance family's default (:func:`default_runtime`: TorchNeuron on Trn2/Trn3, XLA
    on Trn1). A Trn1 asked to use TorchNeuron is an error."""
    installed = sw.runtime()
    rt: str
    if settings.runtime != "auto":
        rt = settings.runtime
        if local and installed is not None and installed != rt and not sw.xla_cpu_stand_in:
            raise ConfigError(
                f"neuron.runtime={rt} but the installed torch-neuronx "
                f"{sw.torch_neuronx.version} is the {installed} runtime",
                f"set neuron.runtime={installed} or auto, or install the matching "
                "torch-neuronx from "
                f"{('the torch 2.10+ ' if rt == 'native' else 'the torch<=2.9 ')}Neuron "
                "release",
            )
    else:
        rt = installed or default_runtime(facts)
    if rt == "native" and facts is not None and facts.family.startswith("trn1"):
        raise ConfigError(
            f"the native TorchNeuron runtime supports Trn2 and Trn3, not {facts.name}",
            f"set neuron.runtime=xla for Trn1: {TRN1_PIN}",
        )
    return rt


# ------------------------------------------------------------------------------ topology


def _catalog_topology(
    settings: NeuronSettings, instance: str, origin: str
) -> tuple[NeuronTopology, bool, str]:
    try:
        facts = catalog.lookup(instance)
    except ValueError as exc:
        raise ConfigError(
            str(exc), "set neuron.instance_type to one of the known Trainium types"
        ) from None
    lnc = settings.logical_nc_config or facts.default_lnc
    if lnc not in facts.supported_lnc():
        raise ConfigError(
            f"neuron.logical_nc_config={lnc} is not available on {facts.name} (supported: "
            f"{', '.join(map(str, facts.supported_lnc()))})",
            "leave neuron.logical_nc_config unset for the instance default",
        )
    return NeuronTopology.from_catalog(facts, lnc), False, f"{facts.name} (from {origin})"


def plan_topology(
    settings: NeuronSettings, request: LaunchRequest, notes: list[str] | None = None
) -> tuple[NeuronTopology, bool, str]:
    """(topology, local, where). ``LaunchRequest.accelerator`` (a cloud launch) plans for that
    instance type; otherwise this machine's neuron-ls wins, and ``neuron.instance_type`` is the
    fallback for planning off-instance."""
    if request.accelerator:
        return _catalog_topology(settings, request.accelerator, "request")
    res = run_neuron_ls(settings.neuron_ls)
    if res.topology is None or not res.topology.devices:
        if settings.instance_type:
            return _catalog_topology(settings, settings.instance_type, "neuron.instance_type")
        raise BackendUnavailable(
            f"backend 'neuron' found no Neuron devices here ({res.error or 'neuron-ls lists none'})",
            "run on a Trainium instance, or plan off-instance with neuron.instance_type=trn1.32xlarge",
        )
    topo = res.topology
    if (
        settings.instance_type
        and topo.instance_type
        and settings.instance_type != topo.instance_type
        and notes is not None
    ):
        notes.append(
            f"neuron.instance_type={settings.instance_type} ignored: this machine is a {topo.instance_type}"
        )
    if settings.logical_nc_config and settings.logical_nc_config != topo.lnc:
        facts = topo.facts
        if facts is not None and settings.logical_nc_config not in facts.supported_lnc():
            raise ConfigError(
                f"neuron.logical_nc_config={settings.logical_nc_config} is not available on {facts.name}",
                "leave neuron.logical_nc_config unset",
            )
        topo = topo.with_lnc(settings.logical_nc_config)
    return topo, True, f"{topo.instance_type or 'this instance'} (from {res.path})"


def compiler_flags(settings: NeuronSettings, facts: catalog.InstanceType | None) -> list[str]:
    flags: list[str] = []
    if facts is not None:
        flags += ["--target", facts.target]
    if settings.model_type:
        flags += ["--model-type", settings.model_type]
    if settings.optlevel:
        flags += [f"--optlevel={settings.optlevel}"]
    if settings.compiler_auto_cast:
        flags += ["--auto-cast", settings.compiler_auto_cast]
    flags += list(settings.cc_flags)
    return flags


# ------------------------------------------------------------------------------ plans


def build_plan(
    config: AiosConfig,
    request: LaunchRequest,
    *,
    software: NeuronSoftware | None = None,
    python: str | None = None,
) -> LaunchPlan:
    """The launch plan for ``request`` on Trainium (its ``BackendSpec.launch_plan``)."""
    settings = settings_of(config)
    check_precision(config.precision)
    sw = software or detect()
    early_notes: list[str] = []
    topo, local, where = plan_topology(settings, request, early_notes)
    facts = topo.facts
    runtime = resolve_runtime(settings, sw, facts, local)
    if local and sw.placeholders:
        msg, fix = placeholder_message(sw)
        raise BackendUnavailable(msg, fix)
    rt_note = _runtime_note(settings, sw, runtime, facts, local)

    spec = settings.visible_cores
    origin = "neuron.visible_cores"
    if not spec and local and os.environ.get("NEURON_RT_VISIBLE_CORES"):
        spec, origin = os.environ["NEURON_RT_VISIBLE_CORES"], "NEURON_RT_VISIBLE_CORES"
    cores = visible_core_ids(topo, spec, origin)
    stand_in = sw.xla_cpu_stand_in and local
    if stand_in and config.nprocs != "auto" and int(config.nprocs) > 1:
        raise LaunchError(
            f"the XLA:CPU stand-in ({XLA_CPU_ENV}=1) runs one process: multi-process XLA "
            "collectives do not work on CPU",
            "pass --nprocs 1 (or test multi-process runs on Trainium)",
        )
    nprocs = 1 if stand_in else resolve_nprocs(config, len(cores))
    nnodes = max(config.nnodes, len(request.hosts))
    world = nprocs * nnodes
    dp = check_parallel(settings.tp_degree, settings.pp_degree, nprocs, world)

    env = _worker_env(settings, config, runtime, stand_in, topo, cores if spec else None)

    notes = [
        f"runtime: {rt_note}",
        f"instance: {where}: {len(topo.devices)} Neuron device(s), {topo.cores_per_device} logical cores each "
        f"(LNC={topo.lnc}, {topo.physical_cores} physical), using cores {format_core_list(cores)}",
        f"parallelism: {world} workers = dp {dp} x tp {settings.tp_degree} x pp {settings.pp_degree}",
        *early_notes,
    ]
    if nnodes > 1:
        _multi_node(settings, config, request, facts, env, notes)
    if settings.precompile and settings.precompile_retries is not None:
        env["NEURON_PARALLEL_COMPILE_MAX_RETRIES"] = str(settings.precompile_retries)
    env.update(settings.env)

    plan = elastic_plan("neuron", config, request, nprocs, env=env, python=python, notes=notes)
    if settings.precompile:
        _precompile(plan, settings, runtime)
    if not local and not request.accelerator:
        _guard_off_instance(plan, topo.instance_type, python)
    if sw.xla_cpu_stand_in and local:
        plan.notes.append(
            f"{XLA_CPU_ENV}=1: XLA:CPU stands in for NeuronCores (PJRT_DEVICE=CPU); for tests only"
        )
    if os.path.isfile(request.script):
        plan.notes.extend(script_notes(request.script, runtime))
    return plan


def _runtime_note(settings: Any, sw: NeuronSoftware, runtime: str, facts: Any, local: bool) -> str:
    """The plan's ``runtime:`` note: what runs the script, and where that was decided."""
    if local and sw.runtime():
        return sw.runtime_label()
    if settings.runtime != "auto":
        return f"{runtime} (neuron.runtime)"
    if runtime == "xla":
        return f"{runtime} (planned for {facts.name if facts else 'this instance'}: {TRN1_PIN})"
    return f"{runtime} (planned: TorchNeuron, device neuron, torch.compile(backend='neuron'))"


def _worker_env(
    settings: Any,
    config: AiosConfig,
    runtime: str,
    stand_in: bool,
    topo: Any,
    cores: list[int] | None,
) -> dict[str, str]:
    """The Neuron runtime's and compiler's variables for every worker (``cores``: the visible
    cores the user asked for, else None)."""
    env: dict[str, str] = {}
    if runtime == "xla":
        env["PJRT_DEVICE"] = "CPU" if stand_in else "NEURON"
    flags = compiler_flags(settings, topo.facts)
    if flags:
        env["NEURON_CC_FLAGS"] = " ".join(flags)
    env["NEURON_COMPILE_CACHE_URL"] = settings.compile_cache
    if settings.logical_nc_config or (topo.facts is not None and topo.facts.default_lnc != 1):
        env["NEURON_LOGICAL_NC_CONFIG"] = str(topo.lnc)
    if cores is not None:
        env["NEURON_RT_VISIBLE_CORES"] = format_core_list(cores)
    sr = settings.stochastic_rounding
    if sr is None and config.precision == "bf16-true":
        sr = True
    if sr is not None:
        env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if sr else "0"
    return env


def _multi_node(
    settings: Any,
    config: AiosConfig,
    request: LaunchRequest,
    facts: Any,
    env: dict[str, str],
    notes: list[str],
) -> None:
    """Several nodes: the collectives' root, EFA (or the note that there is none), and the note
    for a node-local compile cache."""
    hosts = request.hosts
    master = config.master_addr
    if len(hosts) > 1:
        master = hosts[0].internal_address or hosts[0].address
    env["NEURON_RT_ROOT_COMM_ID"] = f"{master}:{settings.root_comm_port}"
    efa = settings.efa == "on" or (
        settings.efa == "auto" and (facts is None or facts.efa_interfaces > 0)
    )
    if efa:
        env.update(EFA_ENV)
    elif facts is not None and facts.efa_interfaces == 0:
        notes.append(
            f"{facts.name} has no EFA: collectives between nodes go over TCP and will be slow"
        )
    if not settings.compile_cache.startswith("s3://"):
        notes.append(
            "compile cache is node-local: every node compiles its own graphs; "
            "share one with neuron.compile_cache=s3://BUCKET/PREFIX"
        )


def _precompile(plan: LaunchPlan, settings: Any, runtime: str) -> None:
    """``neuron.precompile``: every host's command under neuron_parallel_compile (torch_xla
    graphs only)."""
    if runtime != "xla":
        raise ConfigError(
            "neuron.precompile runs neuron_parallel_compile, which extracts torch_xla "
            "graphs; the native runtime compiles with torch.compile",
            "set neuron.precompile=false (or use neuron.runtime=xla)",
        )
    for hp in plan.hosts:
        hp.command = [PRECOMPILE_TOOL, *hp.command]
    plan.notes.append(
        f"precompile: {PRECOMPILE_TOOL} runs the script with NEURON_EXTRACT_GRAPHS_ONLY (outputs are not real), "
        f"compiles every graph in parallel into {settings.compile_cache}; limit the run to ~10 steps, "
        "then launch again without neuron.precompile to start warm"
    )


def _guard_off_instance(plan: LaunchPlan, instance_type: str | None, python: str | None) -> None:
    """Planned from neuron.instance_type on a machine without Neuron devices: meant for the
    instance; the guard makes running it here one clear error, and is transparent there."""
    exe = python or sys.executable
    for hp in plan.hosts:
        hp.command = [
            exe,
            "-m",
            "aios_backend_neuron.guard",
            instance_type or "trainium",
            "--",
            *hp.command,
        ]
    plan.notes.append(
        "planned off-instance: the command starts with aios_backend_neuron.guard, which runs it only "
        "where Neuron devices exist"
    )


def script_notes(script: str, runtime: str) -> list[str]:
    """``aios check``'s findings that break on neuron (core's rules and this package's), one plan
    note each: ``script PATH line N: CODE what (the aios form)``."""
    from aios.check import CORE_RULES, CheckError, check_file, for_backend

    from aios_backend_neuron.check_rules import NEURON_RULES, XLA_RUNTIME_ONLY

    try:
        found = for_backend(check_file(script, [*CORE_RULES, *NEURON_RULES]), "neuron")
    except CheckError as exc:
        return [f"script {exc} (aios check cannot read it)"]
    return [
        f"script {script} line {f.line}: {f.code} {f.message}"
        for f in found
        if runtime == "xla" or f.code != XLA_RUNTIME_ONLY
    ]


def plan_for_instances(
    instance_type: str,
    hosts: Sequence[Host],
    script: str,
    args: Sequence[str] = (),
    *,
    config: Any = None,
    overrides: Sequence[str] = (),
    module: bool = False,
    python: str = "python3",
) -> LaunchPlan:
    """Per-node plans for a Trainium cluster (the entry point for cloud-aws).

    :param instance_type: e.g. ``trn1.32xlarge`` or ``trn2.48xlarge`` (what
        ``LaunchRequest.accelerator`` carries).
    :param hosts: every node, first one is the rendezvous master (its ``internal_address`` is used
        when set); ``worker_id`` is informative.
    :param script: the training script path on the nodes; ``args`` its arguments.
    :param config: a resolved :class:`aios.config.settings.AiosConfig`; built from ``overrides``
        (``key=value`` strings, e.g. ``neuron.tp_degree=8``) when omitted.
    :param python: the interpreter on the nodes.
    :return: a :class:`aios.types.LaunchPlan` with one :class:`aios.types.HostPlan` per node; run
        ``host_plan.command`` with ``host_plan.env`` on ``host_plan.host``.

    Raises :class:`aios.errors.ConfigError` for an unknown instance type, fp16, or parallel
    degrees that do not fit the cores.
    """
    if config is None:
        config = resolve(overrides=[*overrides, "backend=neuron"], environ={}, check_backend=False)
    if not hosts:
        raise ConfigError("plan_for_instances needs at least one host", "pass the cluster's hosts")
    request = LaunchRequest(
        script=script, args=list(args), module=module, hosts=list(hosts), accelerator=instance_type
    )
    return build_plan(config, request, python=python)
