"""Device and step semantics of the template backend. Imported only when training (torch is fine
here).

* :class:`TemplateAccelerator` is where a native torch device's code goes (device, process-group
  backend, RNG, memory statistics, worker env). Registered as accelerator ``template``, it lets
  core's ``ddp``, ``fsdp``, ``tp`` and ``hsdp`` run on this backend with no extra code.
* :class:`TemplateStrategy` shows a backend-specific strategy: core's DDP plus what this device
  adds, registered as ``ddp`` for backend ``template`` (it wins over core's generic ``ddp``).
"""

from __future__ import annotations

from typing import Any

from aios.devices.accelerator import CpuAccelerator
from aios.strategies.ddp import DDPStrategy


class TemplateAccelerator(CpuAccelerator):
    """CPU over gloo. A real device overrides ``device``, ``set_device``, ``dist_backend``,
    ``manual_seed``, ``rng_state``, ``memory_stats`` ... here."""

    name = "template"

    def setup(self) -> None:
        import torch

        if self.config is not None:
            torch.set_num_threads(self.config.template.threads)

    def worker_env(self, local_rank: int, local_world_size: int) -> dict[str, str]:
        return {"TEMPLATE_DEVICE": "1"}


class TemplateStrategy(DDPStrategy):
    """Core's DDP on the template accelerator; a real device overrides placement, reduction and
    stepping here."""

    name = "template"

    def __init__(self, config: Any, accelerator: Any = None) -> None:
        super().__init__(config, accelerator or TemplateAccelerator(config))

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "template_threads": self.config.template.threads}
