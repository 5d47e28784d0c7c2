"""The ``neuron`` config section (contributed through ``aios_config_sections``).

Every key can be set in YAML (``neuron: {tp_degree: 8}``), as an override
(``neuron.tp_degree=8``) or from the environment (``AIOS_NEURON__TP_DEGREE=8``).
"""

from __future__ import annotations

from typing import Literal

from aios.config.settings import Section
from pydantic import Field, field_validator

from aios_backend_neuron.catalog import lookup
from aios_backend_neuron.discovery import parse_core_list


class NeuronSettings(Section):
    instance_type: str | None = Field(
        None,
        description="plan for this instance type (trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, trn2.3xlarge, "
        "trn2.48xlarge, trn2u.48xlarge) instead of discovering devices with neuron-ls; lets "
        "--dry-run work off-instance",
    )
    runtime: Literal["auto", "xla", "native"] = Field(
        "auto",
        description="auto: from what is installed; xla: torch-neuronx on torch_xla (device xla, PJRT_DEVICE=NEURON); "
        "native: TorchNeuron (device neuron, process-group backend neuron)",
    )
    tp_degree: int = Field(
        1,
        ge=1,
        description="tensor-parallel degree (neuronx-distributed); must divide the cores per node",
    )
    pp_degree: int = Field(1, ge=1, description="pipeline-parallel degree (neuronx-distributed)")
    pp_microbatches: int = Field(
        1, ge=1, description="micro-batches per pipeline step (pp_degree > 1)"
    )
    zero1: bool = Field(
        False, description="shard optimizer state over the data-parallel group (NxD ZeRO-1)"
    )
    logical_nc_config: Literal[1, 2] | None = Field(
        None,
        description="NEURON_LOGICAL_NC_CONFIG: physical NeuronCores per logical core (Trn2 default 2, Trn1 only 1)",
    )
    visible_cores: str | None = Field(
        None,
        description="NEURON_RT_VISIBLE_CORES: logical core ids to use, e.g. '0-3,8' (default: all)",
    )
    stochastic_rounding: bool | None = Field(
        None,
        description="NEURON_RT_STOCHASTIC_ROUNDING_EN; default: on for precision=bf16-true (bf16 weights), else the "
        "runtime default (round-to-nearest-even)",
    )
    model_type: Literal["generic", "transformer", "unet-inference"] | None = Field(
        None, description="neuronx-cc --model-type (transformer for decoder/encoder models)"
    )
    optlevel: Literal[1, 2, 3] | None = Field(None, description="neuronx-cc --optlevel")
    compiler_auto_cast: Literal["none", "matmult", "all"] | None = Field(
        None,
        description="neuronx-cc --auto-cast; leave unset: aios does precision with torch.autocast / bf16 weights",
    )
    cc_flags: list[str] = Field(
        default_factory=list, description="extra NEURON_CC_FLAGS, appended verbatim"
    )
    compile_cache: str = Field(
        "/var/tmp/neuron-compile-cache",
        description="NEURON_COMPILE_CACHE_URL: local directory or s3://bucket/prefix shared by all nodes",
    )
    precompile: bool = Field(
        False,
        description="run the script under neuron_parallel_compile (graph extraction + parallel compile into the "
        "cache) instead of training; rerun without it to start warm",
    )
    precompile_retries: int | None = Field(
        None, ge=0, description="NEURON_PARALLEL_COMPILE_MAX_RETRIES"
    )
    efa: Literal["auto", "on", "off"] = Field(
        "auto",
        description="EFA variables (FI_PROVIDER=efa ...): auto = on for multi-node on EFA instance types",
    )
    root_comm_port: int = Field(
        46820,
        ge=1,
        le=65535,
        description="port of NEURON_RT_ROOT_COMM_ID (master:port) for multi-node runs",
    )
    neuron_ls: str | None = Field(
        None, description="path of the neuron-ls tool (default: PATH, then /opt/aws/neuron/bin)"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="extra NEURON_*/FI_* variables for every worker (e.g. NEURON_RT_LOG_LEVEL)",
    )

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, v: str | None) -> str | None:
        if v is None:
            return v

        lookup(v)  # raises ValueError with the known types
        return v.strip().lower()

    @field_validator("visible_cores")
    @classmethod
    def _cores_syntax(cls, v: str | None) -> str | None:
        if v is None:
            return v

        parse_core_list(v)  # raises ValueError naming the bad part
        return v.replace(" ", "")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not k.startswith(("NEURON_", "FI_", "CCOM_", "XLA_", "MALLOC_"))]
        if bad:
            raise ValueError(
                f"{', '.join(sorted(bad))} is not a NEURON_/FI_/CCOM_/XLA_/MALLOC_ variable"
            )
        forbidden = sorted(k for k in v if k in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"))
        if forbidden:
            raise ValueError(
                f"{', '.join(forbidden)} was removed from torch-neuronx; use precision=bf16-true"
            )
        return {k: str(val) for k, val in v.items()}


def planned_instance_type(config: object | None = None) -> str | None:
    """``neuron.instance_type`` being planned for: from ``config``, else
    ``AIOS_NEURON__INSTANCE_TYPE`` (what counts when no config is given, as for ``aios devices``)."""
    import os

    sec = getattr(config, "neuron", None)
    return (
        getattr(sec, "instance_type", None) or os.environ.get("AIOS_NEURON__INSTANCE_TYPE") or None
    )


def settings_of(config: object | None) -> NeuronSettings:
    """The ``neuron`` section of ``config`` (defaults when absent or no config)."""
    sec = getattr(config, "neuron", None) if config is not None else None
    if isinstance(sec, NeuronSettings):
        return sec
    if sec is not None and hasattr(sec, "model_dump"):
        return NeuronSettings.model_validate(sec.model_dump())
    return NeuronSettings()
