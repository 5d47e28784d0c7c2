"""Rank-0 progress of a training loop (``rt.progress(total)``): a rich bar on a terminal, a
plain line every few steps otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Rank-0 progress: a rich bar on a terminal, a plain line every ``every`` steps otherwise."""

    def __init__(
        self, total: int, description: str, enabled: bool, every: int, start: int = 0
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.every = max(1, every)
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._start = start
        self._want_bar = enabled and sys.stdout.isatty()  # started on the first update (a thread)
        self.description = description

    def _start_bar(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._want_bar = False
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._bar.start()
        self._task = self._bar.add_task(
            self.description, total=self.total, completed=self._start, info=""
        )

    def update(self, step: int, **metrics: Any) -> None:
        if not self.enabled:
            return
        info = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        if self._want_bar:
            self._start_bar()
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif step % self.every == 0 or step == self.total:
            rate = (step - self._start) / max(1e-9, time.perf_counter() - self._t0)
            print(f"{self.description} {step}/{self.total} {info} ({rate:.2f} steps/s)", flush=True)

    def close(self) -> None:
        self._want_bar = False
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _fmt(v: Any) -> str:
    if hasattr(v, "item"):
        v = v.item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)
