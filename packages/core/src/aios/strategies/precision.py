"""Precision policies (returned by a ``StrategySpec``'s or ``BackendSpec``'s ``precision``;
core defaults below).

* ``fp32``: nothing.
* ``bf16-mixed``: ``torch.autocast(device_type, dtype=torch.bfloat16)`` around the forward pass.
* ``fp16-mixed``: autocast to float16 plus a gradient scaler; steps with inf/nan gradients are
  skipped and counted.
* ``bf16-true``: parameters and buffers converted to bfloat16 (no autocast).

Backends pass their autocast device type (``cpu``, ``cuda``, ``xla``); they may return their
own subclasses (e.g. an XLA-aware scaler) or refuse a precision with a ConfigError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aios.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from aios.devices.accelerator import Accelerator


class Precision:
    name = "fp32"

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self.skipped_steps = 0

    def convert_module(self, module: Any) -> Any:
        return module

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backward(self, loss: Any) -> None:
        loss.backward()

    def unscale(self, optimizer: Any) -> None:
        """Bring gradients to their true scale before clipping (no-op without a scaler)."""

    def step(self, optimizer: Any) -> bool:
        """Step the optimizer; return False when the step was skipped (inf/nan under fp16)."""
        optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class MixedPrecision(Precision):
    """Autocast to ``dtype`` around the forward pass."""

    def __init__(self, device_type: str, dtype: str) -> None:
        super().__init__(device_type)
        self.dtype_name = dtype
        self.name = "fp16-mixed" if dtype == "float16" else "bf16-mixed"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        import torch

        with torch.autocast(self.device_type, dtype=getattr(torch, self.dtype_name)):
            yield


class GradScalerPrecision(MixedPrecision):
    """fp16 autocast with dynamic loss scaling; inf/nan steps are skipped and counted."""

    def __init__(self, device_type: str) -> None:
        super().__init__(device_type, "float16")
        import torch

        self._unscaled: set[int] = set()
        self.scaler = torch.amp.GradScaler(device_type)

    def backward(self, loss: Any) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: Any) -> None:
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: Any) -> bool:
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        taken = self.scaler.get_scale() >= before
        if not taken:
            self.skipped_steps += 1
        return taken

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))


class TruePrecision(Precision):
    """Weights held in ``dtype`` (``bf16-true``)."""

    def __init__(self, device_type: str, dtype: str = "bfloat16") -> None:
        super().__init__(device_type)
        self.dtype_name = dtype
        self.name = "bf16-true"

    def convert_module(self, module: Any) -> Any:
        import torch

        return module.to(dtype=getattr(torch, self.dtype_name))


def default_precision(
    precision: str, device_type: str | None = None, accelerator: Accelerator | None = None
) -> Precision:
    """The core's policy for ``precision``. With a native :class:`aios.devices.accelerator.Accelerator`
    the device type and the ``bf16-mixed`` autocast dtype are the accelerator's (passed to
    ``torch.autocast`` explicitly); ``device_type`` is for non-native backends (``xla``)."""
    if accelerator is not None:
        device_type = accelerator.device_type
    device_type = device_type or "cpu"
    if precision == "fp32":
        return Precision(device_type)
    if precision == "bf16-mixed":
        dtype = accelerator.autocast_dtype if accelerator is not None else "bfloat16"
        return MixedPrecision(device_type, dtype)
    if precision == "fp16-mixed":
        if accelerator is not None and not accelerator.supports_fp16:
            raise ConfigError(
                f"precision 'fp16-mixed' is not supported on the {accelerator.name} accelerator",
                "use precision=bf16-mixed or fp32",
            )
        return GradScalerPrecision(device_type)
    if precision == "bf16-true":
        return TruePrecision(device_type)
    raise ConfigError(
        f"unknown precision '{precision}'", "choose one of: fp32, bf16-mixed, fp16-mixed, bf16-true"
    )
