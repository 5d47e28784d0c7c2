"""The checkpoint part of the script's ``rt.*`` surface: what is in a checkpoint
(``rt.register``, ``rt.values``, the RNG streams) and the collective saves and loads
(``rt.save``, ``rt.save_best``, ``rt.load``, ``rt.resume``), over the
:class:`aios.checkpoint.manager.CheckpointManager` and :class:`aios.checkpoint.state.TrainingState`
of a process. :class:`aios.runtime.Runtime` is one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aios.errors import AiosError

if TYPE_CHECKING:
    from aios.checkpoint.manager import CheckpointManager
    from aios.checkpoint.state import TrainingState
    from aios.checkpoint.store import CheckpointStore
    from aios.config.settings import AiosConfigBase
    from aios.strategies.base import Strategy


class Checkpoints:
    """Saves, loads and registered state of a process with a ``checkpointer`` over its
    ``training`` state."""

    config: AiosConfigBase
    strategy: Strategy
    #: registered objects, counters, state dict and RNG (:mod:`aios.checkpoint.state`)
    training: TrainingState
    #: save/load/resume, the pending boundary save, lineage and lock (:mod:`aios.checkpoint.manager`)
    checkpointer: CheckpointManager

    def _write_diagnostics(self, **extra: Any) -> None:
        """Called after :meth:`save` wrote a checkpoint: the run record's diagnostics (the
        runtime writes them on rank 0)."""

    def register(self, name: str, obj: Any) -> Any:
        """Include ``obj`` in checkpoints under ``name``: anything with
        ``state_dict``/``load_state_dict`` (a scheduler, an EMA), or a plain value (a number,
        string, tensor, or a dict/list of them) with no wrapper. Returns ``obj``, or for a
        plain value registered after :meth:`resume` the resumed value. A dict or list is
        restored in place; a number lives in :attr:`values` (``rt.values[name]``: read and
        assign it there, and the checkpoints hold what is there)."""
        return self.training.register(name, obj)

    @property
    def values(self) -> dict[str, Any]:
        """Plain values registered with :meth:`register`, as saved in every checkpoint."""
        return self.training.values

    # ---------------------------------------------------------------- seeding and RNG
    def seed_everything(self, seed: int) -> None:
        """Seed Python, NumPy, torch and the device RNG (the same seed on every rank)."""
        self.training.seed_everything(seed)

    def rng_state(self) -> dict[str, Any]:
        return self.training.rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.training.set_rng_state(state)

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoints(self) -> CheckpointStore:
        """The :class:`aios.checkpoint.CheckpointStore` of ``checkpoint.dir``."""
        return self.checkpointer.store

    def state_dict(self) -> dict[str, Any]:
        """The full training state of this process (model/optimizer tensors on CPU)."""
        return self.training.state_dict()

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        self.training.load_state_dict(state, strict=strict, rank=self.strategy.rank)
        self.checkpointer.saved_step = self.training.step

    def save(
        self,
        path: str | None = None,
        extra: dict[str, Any] | None = None,
        background: bool = False,
        replace: bool = False,
    ) -> str | None:
        """Write a checkpoint of the full state (collective: call it on every rank). Without
        ``path`` it goes to ``checkpoint.dir`` as ``ckpt-<step>``, atomically, keeping the
        newest ``checkpoint.keep`` of this run's lineage. Returns the checkpoint path on rank 0.
        ``path`` must not exist, unless ``replace=True``: then the aios checkpoint there is
        replaced atomically once the new one is committed (the old copy stays until then; a
        crash leaves one or the other, complete). ``background=True`` (sharded ``dcp``
        checkpoints) returns once the state is staged in memory and commits when written, like
        the periodic saves with ``checkpoint.async_save``; the path is then None. A save that
        fails on any rank stops every rank, with one line from the rank where it failed."""
        written = self.checkpointer.save(path, extra, background=background, replace=replace)
        if written:
            self._write_diagnostics()
        return written

    def save_best(self, metric: Any, name: str = "best", mode: str = "min") -> bool:
        """Collective: "save when it improves". When ``metric`` (rank 0's value decides) beats
        the best so far (lower for ``mode="min"``, higher for ``"max"``), write the checkpoint
        ``<checkpoint.dir>/<name>``, replacing the previous one atomically; returns whether it
        saved. The best value is part of every checkpoint (``rt.values["best/<name>"]``), so a
        resumed run compares against the best of the run it resumes, and an evaluation run
        again after a resume does not save again."""
        if mode not in ("min", "max"):
            raise AiosError(f"save_best(mode={mode!r})", "use mode='min' or mode='max'")
        if not self.config.checkpoint.dir:
            raise AiosError(
                "save_best needs checkpoint.dir",
                "set checkpoint.dir=PATH (flag, config file or aios.init(defaults=...))",
            )
        value = float(metric.item() if hasattr(metric, "item") else metric)
        value = float(self.strategy.broadcast_object(value, 0))
        key = f"best/{name}"
        if key not in self.training.values:
            self.register(key, None)  # the resumed best, if the checkpoint holds one
        best = self.training.values[key]
        if best is not None and not (value < best if mode == "min" else value > best):
            return False
        self.training.values[key] = value  # in the checkpoint written now and every later one
        self.save(f"{self.config.checkpoint.dir.rstrip('/')}/{name}", replace=True)
        return True

    def load(
        self, path: str | int | None = None, strict: bool = True, reshard: bool | None = None
    ) -> dict[str, Any]:
        """Restore the full state from a checkpoint (a step number, a directory/URL, or the
        newest complete one in ``checkpoint.dir``). Collective. Returns the ``extra`` dict."""
        return self.checkpointer.load(path, strict=strict, reshard=reshard)

    def resume(self, reshard: bool | None = None) -> int:
        """Load the most recent complete checkpoint in ``checkpoint.dir`` when
        ``checkpoint.resume`` is on; returns the step to continue from (0 when starting fresh).
        Incomplete checkpoints (interrupted saves) are skipped with a warning; a corrupt one is
        an error. One written at another shape resumes (``checkpoint.reshard``, on by default):
        the data position, random streams and batch arithmetic carry over as the README's
        "Resuming at another shape" says."""
        return self.checkpointer.resume(reshard=reshard)

    @property
    def _resumed_from(self) -> str | None:
        return self.checkpointer.resumed_from
