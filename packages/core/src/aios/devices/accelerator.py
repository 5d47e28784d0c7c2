"""The accelerator seam: one small definition per native torch device kind.

An :class:`Accelerator` says how a process uses one device of its kind: which ``torch.device``,
which process-group backend, how to seed and snapshot its RNG, its memory statistics, the dtype
passed to ``torch.autocast`` for ``bf16-mixed`` and the environment a worker needs. The native
strategies (:mod:`aios.strategies`: ``ddp``, ``fsdp``, ``tp``, ``hsdp``) run over ANY accelerator
and carry no device branches; the device specifics live here.

Accelerators are registered through :func:`aios.plugins.hookspecs.aios_register_accelerators` with an
:class:`aios.types.AcceleratorSpec`; a :class:`aios.types.BackendSpec` names its accelerator.
Core ships :class:`CpuAccelerator` (``cpu`` over gloo); ``aios-backend-cuda`` ships ``cuda``
(NCCL, TF32, memory statistics).

Torch is imported inside methods: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from aios.launcher.plan import rank_threads

if TYPE_CHECKING:  # pragma: no cover
    import torch


class Accelerator:
    """A native torch device kind. Subclass and override what differs from the defaults, which
    go through ``torch.accelerator`` where torch has it.

    :param config: the resolved config (``None`` when built for ``aios devices``).
    """

    name: str = "cpu"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    autocast_dtype: str = "bfloat16"
    supports_fp16: bool = True
    compile_backend: str | None = None
    #: the device holds tensors used in object/flag collectives (NCCL-like backends need this)
    collectives_on_device: bool = False
    #: pin host memory and copy batches with ``non_blocking=True``
    non_blocking_copies: bool = False

    def __init__(self, config: Any = None) -> None:
        self.config = config

    # ---------------------------------------------------------------- availability
    def is_available(self) -> bool:
        import torch

        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "current_accelerator"):
            cur = acc.current_accelerator()
            return cur is not None and cur.type == self.device_type and acc.device_count() > 0
        return False

    def device_count(self) -> int:
        import torch

        if self.is_available():
            return int(torch.accelerator.device_count())
        return 0

    # ---------------------------------------------------------------- the process's device
    def device(self, local_rank: int) -> torch.device:
        import torch

        return torch.device(self.device_type, local_rank)

    def set_device(self, device: Any) -> None:
        """Make ``device`` the current device of this process (before the process group)."""
        import torch

        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "set_device_index") and device.index is not None:
            acc.set_device_index(device.index)

    def setup(self) -> None:
        """Process-wide settings before any device work (TF32, allocator, env checks)."""

    def synchronize(self) -> None:
        import torch

        if self.is_available():
            torch.accelerator.synchronize()

    # ---------------------------------------------------------------- RNG
    def manual_seed(self, seed: int) -> None:
        """Seed this device kind's RNG (torch's CPU generator is seeded by the runtime)."""

    def rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        pass

    # ---------------------------------------------------------------- diagnostics / autocast
    def memory_stats(self) -> dict[str, int]:
        """Peak/current memory in bytes where the device reports them."""
        return {}

    def autocast(self, dtype: Any) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` on this device type with ``dtype`` passed explicitly."""
        import torch

        return torch.autocast(self.device_type, dtype=dtype)

    def worker_env(self, local_rank: int, local_world_size: int) -> dict[str, str]:
        """Environment a worker process needs on this device kind (set by the launch plan)."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {
            "accelerator": self.name,
            "device_type": self.device_type,
            "dist_backend": self.dist_backend,
        }


class CpuAccelerator(Accelerator):
    """Processes on the CPU, talking over gloo."""

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def device(self, local_rank: int) -> torch.device:
        import torch

        return torch.device("cpu")

    def set_device(self, device: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def memory_stats(self) -> dict[str, int]:
        try:
            import resource

            return {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        except Exception:  # noqa: BLE001 - not on every platform
            return {}

    def worker_env(self, local_rank: int, local_world_size: int) -> dict[str, str]:
        if local_world_size <= 1:
            return {}
        return {"OMP_NUM_THREADS": str(rank_threads(local_world_size))}
