"""Step semantics of the template backend. Imported only when training (torch is fine here)."""

from __future__ import annotations

from typing import Any

from aios.strategies.ddp import DDPStrategy


class TemplateStrategy(DDPStrategy):
    """CPU over gloo. A real device overrides placement, reduction and stepping here."""

    name = "template"

    def __init__(self, config: Any) -> None:
        super().__init__(config, device_type="cpu", dist_backend="gloo")

    def setup_environment(self) -> None:
        import torch

        torch.set_num_threads(self.config.template.threads)
        super().setup_environment()

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "template_threads": self.config.template.threads}
