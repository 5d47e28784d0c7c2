"""The aios plugin for Google Cloud TPUs (entry point ``aios-backend-xla``).

Imports nothing heavy: the backends' components (:mod:`aios_backend_xla.components`: probes,
discovery, launch plans, precision, doctor checks, strategy factories) are named as
:class:`aios.types.Lazy` targets, imported when the registry first calls them; torch and
torch_xla only inside the strategy, the precision policy and the launcher.

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

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import (
    AcceleratorSpec,
    BackendSpec,
    Lazy,
    StrategySpec,
)

from aios_backend_xla.cluster_tpu import TpuVmEnvironment

#: the module whose callables the specs name (:class:`aios.types.Lazy`): loading this plugin
#: imports none of it
COMPONENTS = "aios_backend_xla.components"
BACKEND = "xla"
INSTALL_HINT = (
    "on a Cloud TPU VM: pip install -e './packages/core[xla]' ./packages/backend-xla (from the "
    "aios checkout); to test on XLA:CPU without a TPU, opt in with xla.allow_cpu=true or "
    "AIOS_XLA__ALLOW_CPU=1"
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
            description="Google Cloud TPU through torch_xla / PJRT (XLA:CPU with an explicit opt-in)",
            accelerator=None,
            default_strategy="ddp",
            discover=Lazy(f"{COMPONENTS}:discover_devices"),
            launch_plan=Lazy(f"{COMPONENTS}:launch_plan"),
            precision=Lazy(f"{COMPONENTS}:backend_precision"),
            doctor=Lazy(f"{COMPONENTS}:backend_doctor"),
        )
    )
    register(
        BackendSpec(
            name=TPU_BACKEND,
            priority=210,
            probe=Lazy(f"{COMPONENTS}:tpu_probe"),
            install_hint=TPU_INSTALL_HINT,
            device_type="tpu",
            description="Google Cloud TPU through TorchTPU (native tpu device, DDP/FSDP2/TP over the tpu "
            "process group)",
            accelerator="tpu",
            default_strategy="ddp",
            discover=Lazy(f"{COMPONENTS}:tpu_discover"),
            launch_plan=Lazy(f"{COMPONENTS}:tpu_plan"),
            doctor=Lazy(f"{COMPONENTS}:tpu_doctor"),
        )
    )


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(
        AcceleratorSpec(
            "tpu",
            Lazy("aios_backend_xla.tpu_accelerator:TpuAccelerator"),
            "TorchTPU's native tpu device (process group 'tpu', autocast bf16, compile backend 'tpu')",
        )
    )


@hookimpl
def aios_register_cluster_environments(register: Any) -> None:
    register(TpuVmEnvironment())


# ------------------------------------------------------------------------------ TorchTPU (backend tpu)

TPU_BACKEND = "tpu"
TPU_INSTALL_HINT = (
    "on a Cloud TPU VM: pip install torch==2.13.0 torch_tpu==0.2.0 (public registry; brings libtpu)"
)


@hookimpl
def aios_register_strategies(register: Any) -> None:
    register(
        StrategySpec(
            "ddp",
            Lazy(f"{COMPONENTS}:make_xla"),
            backends=(BACKEND,),
            description="data parallel, one process per chip, gradients all-reduced once per step",
        )
    )
    register(
        StrategySpec(
            "spmd",
            Lazy(f"{COMPONENTS}:make_spmd"),
            backends=(BACKEND,),
            description="XLA SPMD: one process per host, a data mesh over every device",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_backend_xla.settings import XlaSettings

    return {"xla": XlaSettings}


# ------------------------------------------------------------------------------ env


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
