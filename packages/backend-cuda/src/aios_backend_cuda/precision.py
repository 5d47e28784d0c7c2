"""Precision policies on NVIDIA GPUs.

``fp32`` (TF32 tensor cores per ``cuda.tf32``), ``bf16-mixed`` (autocast), ``fp16-mixed``
(autocast + ``torch.amp.GradScaler``; inf/nan steps skipped and counted by core's
:class:`aios.strategies.precision.GradScalerPrecision`), ``bf16-true`` (weights in bfloat16).

bfloat16 needs compute capability 8.0 (Ampere) or later on **every** visible GPU; the check is
made from NVML discovery (so it is testable with recorded NVML answers) before any CUDA work, and
a GPU without it is a :class:`aios.errors.ConfigError` naming the GPU and the way out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aios.errors import ConfigError
from aios.strategies.precision import default_precision

from aios_backend_cuda import nvml

if TYPE_CHECKING:  # pragma: no cover
    from aios.devices.accelerator import Accelerator
    from aios.strategies.precision import Precision

    from aios_backend_cuda.nvml import GpuInventory


def _capabilities_from_torch() -> list[tuple[int, str, tuple[int, int]]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        (i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
        for i in range(torch.cuda.device_count())
    ]


def check_bf16(precision: str, inv: GpuInventory | None = None) -> None:
    """Raise ConfigError when ``precision`` needs bf16 and a visible GPU lacks it."""
    if not precision.startswith("bf16"):
        return
    if inv is None:
        inv, _ = nvml.try_inventory()
    if inv is not None:
        gpus = [(g.index, g.name, g.compute_capability) for g in inv.gpus]
    else:  # no NVML (e.g. inside some containers): ask the CUDA runtime
        gpus = _capabilities_from_torch()
    lacking = [(i, name, cc) for i, name, cc in gpus if tuple(cc) < (8, 0)]
    if not lacking:
        return
    which = ", ".join(
        f"cuda:{i} {name} (compute capability {cc[0]}.{cc[1]})" for i, name, cc in lacking
    )
    ok = [str(i) for i, _, cc in gpus if tuple(cc) >= (8, 0)]
    fix = "use precision=fp16-mixed (or fp32)"
    if ok:
        fix += f", or train only on the GPUs that have bf16: CUDA_VISIBLE_DEVICES={','.join(ok)}"
    raise ConfigError(
        f"precision {precision} needs bfloat16, which {which} lacks (needs 8.0+, Ampere or newer)",
        fix,
    )


def backend_precision(precision: str, config: object, accelerator: Accelerator) -> Precision:
    """``BackendSpec.precision`` of the cuda backend: bf16 refused on GPUs without it, else the
    core default over ``accelerator``."""
    check_bf16(precision)
    return default_precision(precision, accelerator=accelerator)


def make_precision(precision: str, config: Any, inv: GpuInventory | None = None) -> Precision:
    """The precision policy for a CUDA run (after :func:`check_bf16`)."""
    check_bf16(precision, inv)
    return default_precision(precision, "cuda")
