"""The ``tpu`` accelerator: TorchTPU's native ``tpu`` device for core's native strategies
(``ddp``, ``fsdp``, ``tp``, ``hsdp``) over the ``tpu`` process group.

TorchTPU specifics that the generic strategies must not branch on live here:

* the device is ``torch.device("tpu")`` (one device per process; the launcher starts one
  process per chip with the slice-builder addresses that bind it);
* ``torch.accelerator.*`` for availability, count and synchronisation (TorchTPU blocks the
  ``torch.tpu.*`` equivalents for user code);
* ``bf16-mixed`` passes ``dtype=torch.bfloat16`` to ``torch.autocast("tpu")`` explicitly: TorchTPU's
  default autocast dtype is float16; fp16 is refused (use bf16);
* ``torch.compile(backend="tpu")`` is the compile backend (opt-in: ``fsdp.compile=true`` compiles
  each wrapped block with the accelerator's backend);
* fused AdamW/Adam run through TorchTPU's own ``_fused_adamw_``/``_fused_adam_`` kernels (it
  registers them for the device, and torch lists ``tpu`` among the fused-capable devices), so
  optimizers are left as the script built them;
* :meth:`setup` loads TorchTPU when the autoload was switched off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)
  and checks versions and libtpu from metadata before the import (a missing libtpu would kill the
  process).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from aios.devices.accelerator import Accelerator
from aios.errors import BackendUnavailable

from aios_backend_xla.tpu import preflight

if TYPE_CHECKING:  # pragma: no cover
    import torch


def load_torch_tpu() -> Any:
    """Import TorchTPU and register the ``tpu`` device (what the autoload does). Checks first,
    from metadata only, that it can be imported safely."""
    preflight()
    import torch
    import torch_tpu

    if torch._C._get_privateuse1_backend_name() != "tpu":  # autoload off: register now (idempotent)
        torch_tpu._loader.load()
    return torch_tpu


class TpuAccelerator(Accelerator):
    name = "tpu"
    device_type = "tpu"
    dist_backend = "tpu"
    autocast_dtype = "bfloat16"
    supports_fp16 = False
    compile_backend = "tpu"
    collectives_on_device = True
    non_blocking_copies = False

    def setup(self) -> None:
        load_torch_tpu()

        if not self.is_available():
            raise BackendUnavailable(
                "TorchTPU sees no TPU in this process (torch.accelerator reports none)",
                "run on a Cloud TPU VM through aios-run --backend tpu (one process per chip)",
            )

    def is_available(self) -> bool:
        import torch

        cur = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return cur is not None and cur.type == "tpu"

    def device_count(self) -> int:
        import torch

        return int(torch.accelerator.device_count()) if self.is_available() else 0

    def device(self, local_rank: int) -> torch.device:
        import torch

        return torch.device("tpu")

    def set_device(self, device: Any) -> None:
        """One device per process: nothing to select."""

    def synchronize(self) -> None:
        import torch

        torch.accelerator.synchronize()

    def memory_stats(self) -> dict[str, int]:
        import torch

        out: dict[str, int] = {}
        for key, fn in (
            ("max_memory_allocated", "max_memory_allocated"),
            ("memory_allocated", "memory_allocated"),
        ):
            f = getattr(torch.accelerator, fn, None)
            if f is not None:
                with contextlib.suppress(Exception):
                    out[key] = int(f())
        return out

    def autocast(self, dtype: Any) -> contextlib.AbstractContextManager[Any]:
        import torch

        return torch.autocast("tpu", dtype=dtype if dtype is not None else torch.bfloat16)

    def worker_env(self, local_rank: int, local_world_size: int) -> dict[str, str]:
        return {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["autoload"] = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
        return out
