"""Precision on XLA devices.

* ``fp32``: nothing.
* ``bf16-mixed``: ``torch.autocast("xla", dtype=torch.bfloat16)`` around the forward pass
  (fp32 master weights and optimizer state).
* ``bf16-true``: parameters and buffers converted to bfloat16 before they move to the device.
* ``fp16-mixed``: refused: TPUs compute in bf16; fp16 with loss scaling brings nothing but risk.

The deprecated ``XLA_USE_BF16`` / ``XLA_DOWNCAST_BF16`` env vars are never used and are refused
when set, since they silently change every float tensor's dtype.
"""

from __future__ import annotations

import os

from aios.errors import ConfigError
from aios.strategies.precision import MixedPrecision, Precision, TruePrecision

DEPRECATED_ENV = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")


def check_deprecated_env(environ: dict[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    for name in DEPRECATED_ENV:
        if env.get(name, "").strip() not in ("", "0"):
            raise ConfigError(
                f"{name}={env[name]} is set: this deprecated torch_xla switch silently turns "
                "every float32 tensor into bf16",
                f"unset {name} and use precision=bf16-mixed (autocast) or precision=bf16-true (bf16 weights)",
            )


def xla_precision(precision: str) -> Precision:
    check_deprecated_env()
    if precision == "fp32":
        return Precision("xla")
    if precision == "bf16-mixed":
        return MixedPrecision("xla", "bfloat16")
    if precision == "bf16-true":
        return TruePrecision("xla", "bfloat16")
    if precision == "fp16-mixed":
        raise ConfigError(
            "precision 'fp16-mixed' is not supported on the xla backend (TPUs compute in bfloat16)",
            "use precision=bf16-mixed, or bf16-true for bf16 weights",
        )
    raise ConfigError(
        f"unknown precision '{precision}'", "choose one of: fp32, bf16-mixed, bf16-true"
    )
