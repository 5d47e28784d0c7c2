"""The ``xla`` config section (contributed through ``aios_config_sections``).

Every key is settable in YAML (``xla: {allow_cpu: true}``), as ``key=value`` (``xla.allow_cpu=true``)
or as an env var (``AIOS_XLA__ALLOW_CPU=1``). Importing this module needs only pydantic.
"""

from __future__ import annotations

import os
from typing import Literal

from aios.config.settings import Section
from pydantic import Field, field_validator

from aios_backend_xla.topology import parse_accelerator_type

#: The XLA:CPU opt-in as an env var. It is also the config key ``xla.allow_cpu`` through the
#: normal ``AIOS_<SECTION>__<KEY>`` env layer, so one name works everywhere.
ALLOW_CPU_ENV = "AIOS_XLA__ALLOW_CPU"
DEFAULT_CACHE_DIR = "~/.cache/aios/xla-compile"
DEFAULT_TPU_CACHE_DIR = "~/.cache/aios/torch-tpu-compile"


class XlaSettings(Section):
    allow_cpu: bool = Field(
        False,
        description="run --backend xla on XLA:CPU (PJRT_DEVICE=CPU) when no TPU is attached; for tests only",
    )
    accelerator: str | None = Field(
        None,
        description="TPU accelerator type to plan for (v4-16, v5litepod-8, v6e-4); default: the one discovered",
    )
    compile_cache: bool = Field(True, description="persistent XLA compilation cache on TPU")
    compile_cache_dir: str = Field(
        DEFAULT_CACHE_DIR, description="directory of the persistent compilation cache"
    )
    warmup_steps: int = Field(
        2,
        ge=0,
        description="optimizer steps allowed to compile before a compile counts as a recompile",
    )
    max_recompiles: int | None = Field(
        None,
        ge=0,
        description="fail the run after this many recompiles past warm-up (None: warn only)",
    )
    prefetch: int = Field(2, ge=0, description="batches the device loader transfers ahead")
    drop_last: bool = Field(
        True, description="drop the short last batch so every step has the same shapes"
    )
    cpu_devices: int | None = Field(
        None, ge=1, description="XLA:CPU devices (CPU_NUM_DEVICES) when allow_cpu is on"
    )
    runtime: Literal["auto", "torch_tpu", "torch_xla"] = Field(
        "auto",
        description="TPU runtime: torch_tpu (TorchTPU, --backend tpu), torch_xla (PyTorch/XLA, --backend xla), "
        "auto: TorchTPU when installed, else torch_xla (what --backend auto picks)",
    )
    tpu_compile_cache_dir: str = Field(
        DEFAULT_TPU_CACHE_DIR,
        description="TorchTPU compilation caches (TORCH_TPU_TIER2_COMPILATION_CACHE = <dir>/tier2, "
        "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT = <dir>/tier3); empty string: off",
    )
    tpu_base_port: int = Field(
        8070,
        ge=1024,
        le=65000,
        description="first TORCH_TPU_SLICEBUILDER_ADDRESSES port (one per local rank)",
    )
    num_slices: int = Field(
        1,
        ge=1,
        description="multislice: slices of the accelerator type (MEGASCALE_* env on every host)",
    )
    megascale_port: int = Field(
        8080,
        ge=1024,
        le=65535,
        description="multislice coordinator port (MEGASCALE_COORDINATOR_ADDRESS)",
    )

    @field_validator("accelerator")
    @classmethod
    def _valid_type(cls, v: str | None) -> str | None:
        if v is None:
            return v

        return parse_accelerator_type(v).accelerator_type


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def cpu_opt_in(config: object | None = None, environ: dict[str, str] | None = None) -> bool:
    """Whether XLA:CPU was explicitly allowed: config ``xla.allow_cpu``, or ``AIOS_XLA__ALLOW_CPU``
    in ``environ`` (the process env by default; it is what counts when no config is given, as
    for ``aios devices``)."""
    env = os.environ if environ is None else environ
    if _truthy(env.get(ALLOW_CPU_ENV)):
        return True
    return bool(getattr(getattr(config, "xla", None), "allow_cpu", False))


def planned_accelerator(
    config: object | None = None, environ: dict[str, str] | None = None
) -> str | None:
    """``xla.accelerator`` from the config, else ``AIOS_XLA__ACCELERATOR`` (no config given)."""
    env = os.environ if environ is None else environ
    return (
        getattr(getattr(config, "xla", None), "accelerator", None)
        or env.get("AIOS_XLA__ACCELERATOR")
        or None
    )


def settings_of(config: object | None) -> XlaSettings:
    section = getattr(config, "xla", None) if config is not None else None
    return section if isinstance(section, XlaSettings) else XlaSettings()
