"""The plugin module named by the ``aios`` entry point.

Rules for plugin modules (they are imported by ``aios plugins``, ``aios devices`` and
``aios-run --dry-run``):

* import nothing heavy at module level (no torch, no device SDK): import inside functions;
* every component hook receives the backend name and returns ``None`` when it is not yours;
* probes and discovery must not initialise the device runtime.

This backend trains on the CPU through gloo, like the built-in ``cpu`` backend, and shows where
a real device's code goes: discovery, step semantics (a ``Strategy``), precision, launch and
doctor checks, plus a config section (``template.threads``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aios import hookimpl
from aios.types import Availability, BackendSpec, DeviceInfo, DeviceReport, DoctorCheck

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


@hookimpl
def aios_register_backends(register: Any) -> None:
    register(BackendSpec(
        name=NAME, priority=-10, probe=_probe, device_type="cpu",
        install_hint="pip install 'aios-backend-template[runtime]'",
        description="template backend (CPU over gloo)",
    ))


@hookimpl
def aios_config_sections() -> dict[str, type]:
    return {NAME: TemplateSettings}


@hookimpl
def aios_discover_devices(backend: str, config: Any) -> DeviceReport | None:
    if backend != NAME:
        return None
    avail = _probe()
    return DeviceReport(
        backend=NAME, kind="template device", available=bool(avail), reason=avail.reason,
        devices=[DeviceInfo(0, "template0", None, {"cores": os.cpu_count()})],
        topology={"devices": 1},
    )


@hookimpl
def aios_make_strategy(backend: str, config: Any) -> Any:
    if backend != NAME:
        return None
    from aios_backend_template.strategy import TemplateStrategy

    return TemplateStrategy(config)


@hookimpl
def aios_make_precision(backend: str, precision: str, config: Any) -> Any:
    if backend != NAME:
        return None
    if precision == "fp16-mixed":
        from aios.errors import ConfigError

        raise ConfigError("precision 'fp16-mixed' is not supported by the template backend", "use precision=bf16-mixed or fp32")
    from aios.precision import default_precision

    return default_precision(precision, "cpu")


@hookimpl
def aios_launch_plan(backend: str, config: Any, request: Any) -> Any:
    if backend != NAME:
        return None
    from aios.launch import elastic_plan

    nprocs = 1 if config.nprocs == "auto" else int(config.nprocs)
    threads = config.template.threads
    return elastic_plan(NAME, config, request, nprocs, env={"OMP_NUM_THREADS": str(threads), "TEMPLATE_DEVICE": "1"})


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend not in (None, NAME):
        return None
    avail = _probe()
    if avail:
        return [DoctorCheck("template device", "pass", "template device ready", backend=NAME)]
    return [DoctorCheck("template device", "fail", avail.reason, "pip install 'aios-backend-template[runtime]'", backend=NAME)]
