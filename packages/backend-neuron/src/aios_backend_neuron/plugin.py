"""The aios plugin for AWS Trainium (entry point ``aios-backend-neuron``).

Imports nothing heavy: the backend's components (:mod:`aios_backend_neuron.components`: probe,
discovery, launch plan, precision, doctor checks, strategy factories) are named as
:class:`aios.types.Lazy` targets, imported when the registry first calls them; torch, torch_xla,
torch_neuronx and neuronx_distributed only inside the strategy (at ``aios.init`` in a worker).

Registers backend ``neuron`` (priority 200; discovery, launch plan, precision and doctor checks
carried by its :class:`~aios.types.BackendSpec`), strategies ``ddp`` (data parallel on the XLA or
native runtime; the default) and ``nxd`` (neuronx-distributed TP/PP/ZeRO-1) for backend
``neuron``, config section ``neuron``; ``aios_env_info``.
"""

from __future__ import annotations

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import (
    AcceleratorSpec,
    BackendSpec,
    Lazy,
    StrategySpec,
)

#: the module whose callables the specs name (:class:`aios.types.Lazy`): loading this plugin
#: imports none of it
COMPONENTS = "aios_backend_neuron.components"
BACKEND = "neuron"
INSTALL_HINT = (
    "pip install -e './packages/core[neuron]' ./packages/backend-xla "
    "./packages/backend-neuron (from the aios checkout) && pip install --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com "
    "torch-neuronx neuronx-cc neuronx-distributed (on a Trainium instance)"
)


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name=BACKEND,
            priority=200,
            probe=Lazy(f"{COMPONENTS}:probe"),
            install_hint=INSTALL_HINT,
            device_type="xla",
            description="AWS Trainium (Trn1/Trn2) through torch-neuronx (XLA or native) and neuronx-distributed",
            accelerator=None,
            default_strategy="ddp",
            discover=Lazy(f"{COMPONENTS}:device_report"),
            launch_plan=Lazy(f"{COMPONENTS}:launch_plan"),
            precision=Lazy(f"{COMPONENTS}:backend_precision"),
            doctor=Lazy(f"{COMPONENTS}:backend_doctor"),
        )
    )


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            Lazy(f"{COMPONENTS}:make"),
            backends=(BACKEND,),
            description="data parallel over NeuronCores (torch-neuronx XLA or native runtime)",
        )
    )
    register(
        StrategySpec(
            "nxd",
            Lazy(f"{COMPONENTS}:make"),
            backends=(BACKEND,),
            description="legacy: neuronx-distributed tensor/pipeline parallel and ZeRO-1 on the XLA "
            "runtime (neuron.tp_degree, pp_degree, zero1)",
        )
    )
    for name, what in (("fsdp", "FSDP2"), ("tp", "DTensor tensor parallel"), ("hsdp", "HSDP")):
        register(
            StrategySpec(
                name,
                Lazy(f"{COMPONENTS}:make_{name}"),
                backends=(BACKEND,),
                description=f"{what} on TorchNeuron (core's native strategy over the neuron accelerator; Trn2/Trn3)",
            )
        )


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "neuron",
            Lazy("aios_backend_neuron.native_strategy:NeuronAccelerator"),
            "TorchNeuron's native neuron device (process group 'neuron', autocast bf16, compile backend 'neuron')",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_neuron.settings import NeuronSettings

    return {"neuron": NeuronSettings}


# ------------------------------------------------------------------------------ env


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
