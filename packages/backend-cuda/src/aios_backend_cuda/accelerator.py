"""The ``cuda`` accelerator: NVIDIA GPUs for core's native strategies (``ddp``, ``fsdp``, ``tp``,
``hsdp``). Everything CUDA/NCCL-specific that the generic strategies used to branch on lives here:
the NCCL process group with the device bound to it, ``torch.cuda.set_device``, TF32 (from
``cuda.tf32``), the CUDA RNG in checkpoints, peak memory statistics, pinned non-blocking copies,
and a clear error (never a CPU fallback) when this process cannot use CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aios.devices.accelerator import Accelerator
from aios.errors import BackendUnavailable

from aios_backend_cuda.settings import CudaSettings

if TYPE_CHECKING:  # pragma: no cover
    import torch


class CudaAccelerator(Accelerator):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    autocast_dtype = "bfloat16"
    compile_backend = "inductor"
    collectives_on_device = True
    non_blocking_copies = True

    def _settings(self) -> Any:
        return (self.config.section("cuda") if self.config is not None else None) or CudaSettings()

    def is_available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0

    def setup(self) -> None:
        check_cuda_runtime()
        set_tf32(bool(self._settings().tf32))

    def device(self, local_rank: int) -> torch.device:
        import torch

        return torch.device("cuda", local_rank)

    def set_device(self, device: Any) -> None:
        import torch

        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.cuda.manual_seed_all(seed)

    def rng_state(self) -> dict[str, Any]:
        import torch

        return {"cuda": torch.cuda.get_rng_state(torch.cuda.current_device())}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        import torch

        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())

    def memory_stats(self) -> dict[str, int]:
        import torch

        dev = torch.cuda.current_device()
        return {
            "max_memory_allocated": int(torch.cuda.max_memory_allocated(dev)),
            "max_memory_reserved": int(torch.cuda.max_memory_reserved(dev)),
            "memory_allocated": int(torch.cuda.memory_allocated(dev)),
        }

    def worker_env(self, local_rank: int, local_world_size: int) -> dict[str, str]:
        # async error handling lets a hung NCCL collective fail instead of blocking forever
        return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def check_cuda_runtime() -> None:
    """Raise BackendUnavailable unless this torch can use an NVIDIA GPU here."""
    import torch

    if getattr(torch.version, "hip", None):
        raise BackendUnavailable(
            f"torch {torch.__version__} is a ROCm (AMD HIP {torch.version.hip}) build, not CUDA",
            "install a CUDA build of torch for NVIDIA GPUs (ROCm is not supported by the cuda backend)",
        )
    if torch.version.cuda is None:
        raise BackendUnavailable(
            f"torch {torch.__version__} is a CPU-only build",
            "install a CUDA build of torch: pip install -e './packages/core[cuda]' "
            "./packages/backend-cuda (from the aios checkout)",
        )
    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "CUDA is not available to this process (no GPU visible, or the driver is too old for this torch)",
            "run `aios doctor --backend cuda`",
        )


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores for fp32 matmuls and cuDNN convolutions (Ampere and later)."""
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
