"""``CudaDDPStrategy``: core's :class:`aios.strategies.ddp.DDPStrategy` on NVIDIA GPUs.

What it adds to the generic DDP strategy:

* NCCL process group, ``cuda:LOCAL_RANK`` device, and a clear error (never a CPU fallback) when
  this process cannot use CUDA: no GPU visible, a CPU-only or ROCm build of torch;
* TF32 for fp32 matmuls/convolutions (``cuda.tf32``, on by default as in most training code);
* opt-in ``torch.compile`` of the model (``cuda.compile``, ``cuda.compile_mode``), applied to the
  DDP-wrapped module as PyTorch recommends (DDPOptimizer splits graphs at bucket boundaries);
* fused optimizer kernels (``cuda.fused_optimizer``): Adam, AdamW, SGD and Adagrad whose
  ``fused``/``foreach`` the script left unset are switched to ``fused=True`` (one kernel per
  step, GradScaler-aware), others keep torch's foreach default;
* DDP knobs from the ``cuda`` section (bucket size, static graph, unused parameters);
* memory statistics (peak allocated/reserved, device total) in :meth:`metrics`.

The device parts (NCCL, ``set_device``, TF32, RNG, memory statistics) are the ``cuda``
accelerator's (:class:`aios_backend_cuda.accelerator.CudaAccelerator`); the class takes any
accelerator, so its generic parts are tested on CPU over gloo with core's ``CpuAccelerator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from aios.strategies.ddp import DDPStrategy

from aios_backend_cuda.accelerator import CudaAccelerator, check_cuda_runtime, set_tf32
from aios_backend_cuda.settings import CudaSettings

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator
    from aios.strategies.precision import Precision

__all__ = [
    "CudaDDPStrategy",
    "check_cuda_runtime",  # defined in aios_backend_cuda.accelerator; kept importable here
    "fuse_optimizer",
    "set_tf32",
]

FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")


def fuse_optimizer(optimizer: Any) -> str:
    """Switch ``optimizer`` to its fused kernels in place when the script left the choice to
    torch. Returns what it runs with: ``fused``, ``foreach`` or ``default``."""
    import torch

    groups = optimizer.param_groups
    if type(optimizer).__name__ not in FUSABLE or type(optimizer).__module__.split(".")[:2] != [
        "torch",
        "optim",
    ]:
        return "default"
    if any(g.get("fused") for g in groups):
        return "fused"
    if any(
        g.get("fused") is False or g.get("foreach") is not None or g.get("differentiable")
        for g in groups
    ):
        return "foreach" if any(g.get("foreach") for g in groups) else "default"
    if optimizer.state:  # state made without fused: its step counters live on the CPU
        return "default"
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    params = [p for g in groups for p in g["params"]]
    if not params or any(
        p.device.type not in supported or not torch.is_floating_point(p) for p in params
    ):
        return "default"
    for g in groups:
        g["fused"] = True
    optimizer.defaults["fused"] = True
    optimizer._step_supports_amp_scaling = True
    return "fused"


def make_ddp(config: AiosConfig, accelerator: Accelerator | None, backend: str) -> CudaDDPStrategy:
    """``StrategySpec.factory`` of ``ddp`` on the cuda backend."""
    return CudaDDPStrategy(config, accelerator)


class CudaDDPStrategy(DDPStrategy):
    """DDP over NCCL on NVIDIA GPUs (see the module docstring)."""

    name = "ddp"

    def __init__(self, config: AiosConfig, accelerator: Accelerator | None = None) -> None:
        if accelerator is None:
            accelerator = CudaAccelerator(config)
        super().__init__(config, accelerator)
        self.settings: CudaSettings = config.section("cuda") or CudaSettings()
        s = self.settings
        self.ddp_kwargs = {
            "bucket_cap_mb": s.bucket_cap_mb,
            "find_unused_parameters": s.find_unused_parameters,
            "static_graph": s.static_graph,
            "gradient_as_bucket_view": True,
        }
        self.compiled = False
        self.optimizer_impl: list[str] = []

    # ---------------------------------------------------------------- setup of user objects
    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        module = super().setup_module(module, precision)
        if self.settings.compile:
            import torch

            mode = None if self.settings.compile_mode == "default" else self.settings.compile_mode
            module = cast("torch.nn.Module", torch.compile(module, mode=mode))
            self.compiled = True
        return module

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        module = getattr(module, "_orig_mod", module)  # torch.compile
        return getattr(module, "module", module)  # DistributedDataParallel

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        impl = fuse_optimizer(optimizer) if self.settings.fused_optimizer else "default"
        self.optimizer_impl.append(f"{type(optimizer).__name__}:{impl}")
        return optimizer

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out.update(
            {
                "tf32": bool(self.settings.tf32),
                "compiled": self.compiled,
                "optimizers": list(self.optimizer_impl),
            }
        )
        if self.accelerator.name == "cuda" and self.device is not None:
            import torch

            props = torch.cuda.get_device_properties(self.device)
            out["gpu"] = props.name
            out["gpu_memory_total"] = props.total_memory
            out["peak_memory_allocated_gib"] = round(out.get("max_memory_allocated", 0) / 2**30, 3)
            out["peak_memory_fraction"] = round(
                out.get("max_memory_reserved", 0) / props.total_memory, 4
            )
        return out
