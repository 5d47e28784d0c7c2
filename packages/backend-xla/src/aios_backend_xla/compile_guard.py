"""Compile guard: count XLA compilations per step and flag recompiles after warm-up.

Counting reads torch_xla's metrics (the ``UncachedCompile`` counter: graphs compiled because they
were not in the in-memory cache; ``CompileTime`` gives their cost). Steps up to ``warmup_steps``
compile freely. After that a compilation is classified with what the model was fed this step
(shapes recorded by a forward pre-hook, per *mode*: train / eval, with or without grad):

* the model ran in a mode not seen before (the first evaluation): a **new graph**, expected;
* the inputs of an already-seen mode have shapes never seen in that mode: a **recompile**: a
  warning names the step and the shapes that changed (``forward[0] (8, 16) -> (4, 16)``);
* no new mode and no new shapes: a **late graph** (a metric read with ``.item()`` every N
  steps compiles once); the first ``late_graphs`` of them are expected, more are recompiles
  ("the traced graph keeps changing": Python scalars baked into the graph, value-dependent
  control flow).

With ``max_recompiles`` set, more recompiles than that is an :class:`aios.errors.AiosError`
(the run stops with one line). The counter reader is injected (``read_compiles``), so the guard
is unit-testable and reused as is by the Neuron backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from aios.errors import AiosError

Shapes = dict[str, tuple[int, ...]]


class RecompileError(AiosError):
    """More recompiles after warm-up than ``xla.max_recompiles`` allows."""


class RecompileWarning(UserWarning):
    """An XLA graph was compiled again after warm-up (usually a changed input shape)."""


def shapes_of(obj: Any, prefix: str = "input") -> Shapes:
    """Shapes of every tensor in a (nested) batch: ``{"input[0]": (8, 64), "input['y']": (8,)}``."""
    out: Shapes = {}

    def walk(o: Any, path: str) -> None:
        shape = getattr(o, "shape", None)
        if shape is not None and hasattr(o, "dtype"):
            out[path] = tuple(int(d) for d in shape)
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{path}[{i}]")

    walk(obj, prefix)
    return out


def read_uncached_compiles() -> int:
    import torch_xla.debug.metrics as met

    return int(met.counter_value("UncachedCompile") or 0)


class CompileGuard:
    """Per-step compile accounting.

    :param warmup_steps: optimizer steps (1-based) during which compiles are expected.
    :param max_recompiles: fail after more than this many recompiles past warm-up; None warns only.
    :param read_compiles: returns the cumulative number of compilations so far.
    :param late_graphs: compilations after warm-up with no new input shape or mode that are
        still expected (periodic logging / checkpoint graphs).
    """

    def __init__(
        self,
        warmup_steps: int = 2,
        max_recompiles: int | None = None,
        read_compiles: Callable[[], int] = read_uncached_compiles,
        backend: str = "xla",
        late_graphs: int = 4,
    ) -> None:
        self.warmup_steps = warmup_steps
        self.max_recompiles = max_recompiles
        self.read = read_compiles
        self.backend = backend
        self.late_graphs_allowed = late_graphs
        self.start = self.read()
        self.last = self.start
        self.by_step: dict[int, int] = {}
        self.recompiles = 0
        self.new_graphs = 0
        self.late_graphs = 0
        self.events: list[dict[str, Any]] = []
        self._step_shapes: dict[str, Shapes] = {}
        self._seen: dict[str, set[tuple]] = {}
        self._last: dict[str, Shapes] = {}

    # ---------------------------------------------------------------- inputs
    def observe(self, batch: Any, prefix: str = "input", mode: str = "train") -> None:
        """Record the shapes of what went into the model this step, under ``mode``."""
        self._step_shapes.setdefault(mode, {}).update(shapes_of(batch, prefix))

    @property
    def compiles(self) -> int:
        """Compilations seen at step boundaries since the guard started."""
        return self.last - self.start

    # ---------------------------------------------------------------- step boundary
    def step_end(self, step: int) -> int:
        """Account the compilations of ``step``; return how many happened in it."""
        now = self.read()
        new = now - self.last
        self.last = now
        if new:
            self.by_step[step] = self.by_step.get(step, 0) + new
        current, self._step_shapes = self._step_shapes, {}
        changed: list[str] = []
        new_modes: list[str] = []
        for mode, shapes in current.items():
            sig = tuple(sorted(shapes.items()))
            seen = self._seen.setdefault(mode, set())
            if not seen:
                new_modes.append(mode)
            elif sig not in seen:
                changed.extend(self._diff(self._last.get(mode, {}), shapes, mode))
            seen.add(sig)
            self._last[mode] = shapes
        if not new or step <= self.warmup_steps:
            return new
        if changed:
            self._flag(step, new, "; ".join(changed))
        elif new_modes:
            self.new_graphs += new
        else:
            self.late_graphs += new
            if self.late_graphs > self.late_graphs_allowed:
                self._flag(
                    step,
                    new,
                    "input shapes unchanged: the traced graph keeps changing (Python scalars "
                    "baked into the graph, value-dependent control flow, a new .item())",
                )
        return new

    def _diff(self, old: Shapes, cur: Shapes, mode: str) -> list[str]:
        tag = "" if mode == "train" else f" ({mode})"
        out = [f"{k} {old[k]} -> {v}{tag}" for k, v in cur.items() if k in old and old[k] != v]
        out += [f"{k} new {v}{tag}" for k, v in cur.items() if k not in old]
        return out or [f"{mode} inputs {cur}"]

    def _flag(self, step: int, new: int, what: str) -> None:
        self.recompiles += new
        self.events.append({"step": step, "compiles": new, "why": what})
        if self.max_recompiles is not None and self.recompiles > self.max_recompiles:
            raise RecompileError(
                f"{self.recompiles} XLA recompiles after warm-up exceed "
                f"xla.max_recompiles={self.max_recompiles} (last at step {step}: {what})",
                "make input shapes static (drop_last, fixed padding) or raise xla.max_recompiles",
            )
        warnings.warn(
            f"XLA recompiled {new} graph(s) at step {step} after warm-up ({self.warmup_steps} steps): {what}. "
            "Keep shapes fixed (drop_last, pad to a fixed length) to avoid recompiles",
            RecompileWarning,
            stacklevel=4,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "compiles_by_step": {str(k): v for k, v in sorted(self.by_step.items())},
            "recompiles_after_warmup": self.recompiles,
            "new_graphs_after_warmup": self.new_graphs,
            "late_graphs_after_warmup": self.late_graphs,
            "warmup_steps": self.warmup_steps,
            "recompile_events": self.events[-20:],
        }
