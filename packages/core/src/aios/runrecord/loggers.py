"""Metric loggers built by the built-in plugin (see ``aios.plugins.builtin.aios_register_loggers``).

A logger has ``log(metrics: dict[str, float], step: int)`` and ``close()``. The runtime builds
loggers on rank 0 only, once at :func:`aios.init`.
"""

from __future__ import annotations

import os
from typing import Any


class TensorBoardLogger:
    """Scalars to ``<run_dir>/tensorboard`` (needs ``tensorboard``; uses torch's SummaryWriter)."""

    name = "tensorboard"

    def __init__(self, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(run_dir, "tensorboard")
        self.writer = SummaryWriter(log_dir=self.log_dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.writer.add_text(
            "config", "```\n" + "\n".join(f"{k}: {v}" for k, v in params.items()) + "\n```"
        )

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbLogger:
    """Weights & Biases. The API key comes from ``WANDB_API_KEY`` (or wandb's own login) only;
    it is never written to configs or run records. Offline mode when no key is set."""

    name = "wandb"

    def __init__(self, config: Any, run_dir: str) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline"
        )
        self.run = wandb.init(
            project=getattr(config.logging, "wandb_project", None) or "aios",
            dir=run_dir,
            name=os.path.basename(run_dir.rstrip("/")),
            config=config.redacted_dict() if hasattr(config, "redacted_dict") else {},
            mode=mode,
            reinit=True,
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()
