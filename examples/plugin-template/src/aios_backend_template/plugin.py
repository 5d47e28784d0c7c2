"""The plugin module named by the ``aios`` entry point.

Rules for plugin modules (they are imported by ``aios plugins``, ``aios devices`` and
``aios-run --dry-run``):

* import nothing heavy at module level (no torch, no device SDK): import inside functions;
* components are carried by what you register (a ``BackendSpec`` carries discovery, launch plan,
  precision and doctor checks; a ``StrategySpec`` its factory; an ``AcceleratorSpec`` its
  factory): no hook has to check a backend name;
* probes and discovery must not initialise the device runtime.

This backend trains on the CPU through gloo, like the built-in ``cpu`` backend, and shows where
a real device's code goes: discovery, step semantics (a ``Strategy``), precision, launch and
doctor checks, plus a config section (``template.threads``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from aios import hookimpl
from aios.types import (
    AcceleratorSpec,
    Availability,
    BackendSpec,
    DeviceInfo,
    DeviceReport,
    DoctorCheck,
    StrategySpec,
)
from pydantic import BaseModel, ConfigDict, Field

NAME = "template"


class TemplateSettings(BaseModel):
    """The ``template:`` config section (``template.threads=2`` / ``AIOS_TEMPLATE__THREADS=2``)."""

    model_config = ConfigDict(extra="forbid")
    threads: int = Field(1, ge=1, description="intra-op threads per process")


def _probe() -> Availability:
    # A real backend looks for its device here (sysfs, a vendor tool, env vars) without
    # importing or initialising its runtime.
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed")
    return Availability(True)


def discover(config: Any) -> DeviceReport:
    avail = _probe()
    return DeviceReport(
        backend=NAME,
        kind="template device",
        available=bool(avail),
        reason=avail.reason,
        devices=[DeviceInfo(0, "template0", None, {"cores": os.cpu_count()})],
        topology={"devices": 1},
    )


def precision(precision: str, config: Any, accelerator: Any) -> Any:
    if precision == "fp16-mixed":
        from aios.errors import ConfigError

        raise ConfigError(
            "precision 'fp16-mixed' is not supported by the template backend",
            "use precision=bf16-mixed or fp32",
        )
    return None  # the core default over the accelerator


def launch_plan(config: Any, request: Any) -> Any:
    from aios.launcher.plan import elastic_plan

    nprocs = 1 if config.nprocs == "auto" else int(config.nprocs)
    threads = config.template.threads
    return elastic_plan(
        NAME, config, request, nprocs, env={"OMP_NUM_THREADS": str(threads), "TEMPLATE_DEVICE": "1"}
    )


def doctor(config: Any, explicit: bool) -> list[DoctorCheck]:
    avail = _probe()
    if avail:
        return [DoctorCheck("template device", "pass", "template device ready", backend=NAME)]
    return [
        DoctorCheck(
            "template device",
            "fail",
            avail.reason,
            "pip install 'aios-backend-template[runtime]'",
            backend=NAME,
        )
    ]


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(
        BackendSpec(
            name=NAME,
            priority=-10,
            probe=_probe,
            accelerator=NAME,
            default_strategy="ddp",
            install_hint="pip install 'aios-backend-template[runtime]'",
            description="template backend (CPU over gloo)",
            discover=discover,
            launch_plan=launch_plan,
            precision=precision,
            doctor=doctor,
        )
    )


def _accelerator(config: Any) -> Any:
    from aios_backend_template.strategy import TemplateAccelerator

    return TemplateAccelerator(config)


@hookimpl
def aios_register_accelerators(register: Any) -> None:
    register(AcceleratorSpec(NAME, _accelerator, "the template device (CPU over gloo)"))


def _strategy(config: Any, accelerator: Any, backend: str) -> Any:
    from aios_backend_template.strategy import TemplateStrategy

    return TemplateStrategy(config, accelerator)


@hookimpl
def aios_register_strategies(register: Any) -> None:
    # core's ddp/fsdp/tp/hsdp already run on the template accelerator; this one replaces ddp
    # on this backend only (a spec naming the backend wins over one naming the accelerator)
    register(
        StrategySpec(
            "ddp", _strategy, backends=(NAME,), description="DDP with the template device's extras"
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    return {NAME: TemplateSettings}
