"""The checkpoint manager: save, load, resume, the pending save decided at a step boundary,
the emergency save on preemption, the run lineage and the writer lock of ``checkpoint.dir``.

:class:`CheckpointManager` is used by :class:`aios.runtime.Runtime` and can be tested alone with
a :class:`aios.checkpoint.state.TrainingState` and a strategy. Its constructor has no side effects;
:meth:`CheckpointManager.start` (collective) checks that ``checkpoint.dir`` is writable, takes
the directory's writer lock on rank 0 and starts the lock's heartbeat thread;
:meth:`CheckpointManager.close` releases both.

Batch boundary. ``Runtime.step`` only *decides* that a checkpoint is due (:attr:`pending`) and
notes the RNG streams (:meth:`CheckpointManager.note_step`); it is written at the next batch
boundary, so that what the script does after ``step()`` (scheduler, EMA) is in it and the data
position is exact. Data loaders call :meth:`CheckpointManager.at_batch_boundary` before the
next batch (``DeviceLoader``'s ``owner``); ``backward`` and ``accumulate`` call it for loops that
draw their own batches (the state as it is then, the step's RNG streams, since a resumed loop
runs the top of its loop again). It costs one attribute test when nothing is pending.

Every save ends with one collective that tells each rank every rank's outcome
(:func:`aios.errors.settle`): a failure anywhere raises on the failing rank and a quiet
:class:`aios.errors.PeerFailed` on the others.

Formats (*how* the state is written: :mod:`aios.checkpoint.formats.base`) stage and commit
through the store (:class:`aios.checkpoint.CheckpointStore`): the marker is written last.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aios.checkpoint.collective import least_time_left, on_rank0, settle_all
from aios.checkpoint.files import filesystem
from aios.checkpoint.formats.base import CheckpointFormat, SaveContext, get_format
from aios.checkpoint.formats.dcp_process import resolve_async_mode
from aios.checkpoint.lock import LOCK_HEARTBEAT_S
from aios.checkpoint.policy import SAFETY, Interval, SaveCost, choose_interval, fits
from aios.checkpoint.shape import batch_change, refuse_other_shape, shape_change
from aios.checkpoint.store import CheckpointStore
from aios.config.redact import redact_url
from aios.data.loaders import data_parallel_size
from aios.errors import CheckpointError, PeerFailed, os_cause
from aios.launcher import status as rank_status

if TYPE_CHECKING:  # pragma: no cover
    from aios.strategies.base import Strategy
    from aios.types import CheckpointFormatSpec

__all__ = ["CheckpointManager"]


def _cause(exc: BaseException) -> str:
    """A failed save in a few words: an aios error's own message, else the cause as the OS
    gave it (:func:`aios.errors.os_cause`)."""
    return exc.message if isinstance(exc, CheckpointError) else os_cause(exc)


# ------------------------------------------------------------------------------ manager

_NEVER = 1 << 62


class CheckpointManager:
    """Save/load/resume for one runtime (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        strategy: Strategy,
        training: Any,
        record: Any,
        backend: str,
        print_fn: Callable[..., None] = print,
        *,
        formats: Mapping[str, CheckpointFormatSpec],
    ) -> None:
        self.config = config
        #: the checkpoint formats this run can write and read (name -> spec)
        self.formats = formats
        self.strategy = strategy
        self.training = training
        self.record = record
        self.backend = backend
        self._print = print_fn
        self.world_size = int(strategy.world_size)
        self.every = int(config.checkpoint.every) if config.checkpoint.dir else 0
        #: what the next batch boundary does: None, "save" or "preempt"
        self.pending: str | None = None
        #: called for a "preempt" boundary (the runtime writes the emergency checkpoint and exits)
        self.on_preempt: Callable[[], None] | None = None
        #: called after each periodic save (the runtime rewrites the run record)
        self.on_saved: Callable[[], None] | None = None
        self.use_strategy(strategy)
        self.lineage: str | None = None
        self.saved_step: int | None = None
        self.resumed_from: str | None = None
        self._pending_meta: dict[str, Any] | None = None
        #: this rank's RNG state at the step that set :attr:`pending` (:meth:`note_step`)
        self.rng_at_step: dict[str, Any] | None = None
        #: the RNG state the emergency checkpoint records (None: the current one)
        self.preempt_rng: dict[str, Any] | None = None
        self._store: Any = None
        self._started = False
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()
        # -- cost and interval (aios.checkpoint.policy)
        #: monotonic seconds (``time.perf_counter``; tests inject a clock, with the runtime's)
        self.clock: Callable[[], float] = time.perf_counter
        #: the measured cost of saves, per format (``dcp`` and ``dcp+async`` apart)
        self.cost = SaveCost()
        #: ``checkpoint.max_lost`` in seconds when it chooses the interval (None: off, or
        #: ``checkpoint.every`` fixes it, or no ``checkpoint.dir``)
        self.max_lost: float | None = (
            config.checkpoint.max_lost if config.checkpoint.dir and not self.every else None
        )
        #: the clock time at which the next periodic save is due (``inf``: none)
        self.next_due = float("inf")
        #: the step at which the periodic save of max_lost is due (every rank agrees: rank 0
        #: plans and broadcasts, see :meth:`replan`) and the step of the next replan
        self.due_step = _NEVER
        self.check_step = 1 if self.max_lost is not None else _NEVER
        #: the step whose state the last committed periodic checkpoint holds
        self.committed_step: int | None = None
        #: the step of the last checkpoint loaded (resumed) into this process
        self.loaded_step: int | None = None
        #: the interval chosen last (:class:`aios.checkpoint.policy.Interval`)
        self.interval: Interval | None = None
        #: seconds one optimizer step takes (the runtime sets it to its timer's recent mean)
        self.step_time: Callable[[], float | None] = lambda: None
        self._said_conflict = False
        self._abandoned = False
        #: replica groups (:mod:`aios.ft`): whether this group writes the run's checkpoints now
        #: (one live group does; aios-run holds the lock); None: this process's ranks are the run
        self.writes: Callable[[], bool] | None = None
        self.replicas = 1  #: groups the state is replicated over (markers count every group)

    def use_strategy(self, strategy: Strategy) -> None:
        """Save and load through ``strategy`` and its checkpoint format (at construction, and
        when ``strategy=auto`` adopts the script's own sharding before anything was saved)."""
        self.strategy = strategy
        config = self.config
        self.format = get_format(strategy.checkpoint_format, self.formats)
        if hasattr(self.format, "seed"):
            self.format.seed = config.seed  # ranks beyond a saved world size reseed from it
        self.training.seed = config.seed  # the random streams of a rank the saving run did not have
        io = getattr(self.format, "io", None)
        if io is not None and hasattr(io, "async_mode"):
            device = strategy.accelerator.device_type if strategy.accelerator else None
            io.async_mode = resolve_async_mode(config.checkpoint.async_writer, device)

    # ---------------------------------------------------------------- identity
    @property
    def is_main(self) -> bool:
        return self.strategy.rank == 0

    @property
    def store(self) -> Any:
        """The :class:`aios.checkpoint.CheckpointStore` of ``checkpoint.dir``."""
        if self._store is None:
            if not self.config.checkpoint.dir:
                raise CheckpointError(
                    "no checkpoint directory is configured",
                    "set checkpoint.dir=PATH_OR_URL (flag, config file or AIOS_CHECKPOINT__DIR)",
                )
            self._store = CheckpointStore(
                self.config.checkpoint.dir, keep=self.config.checkpoint.keep, lineage=self.lineage
            )
        return self._store

    def meta(self) -> dict[str, Any]:
        """What every marker records about the writer: who wrote it, and the shape it trained
        at (world size, data-parallel ranks, strategy, backend, batch arithmetic), which a
        resume at another shape compares with its own (:func:`aios.checkpoint.shape.shape_change`)."""
        return {
            "run_id": self.record.run_id,
            "world_size": self.world_size * self.replicas,
            "backend": self.backend,
            "strategy": type(self.strategy).__name__,
            "checkpoint_format": self.format.name,
            **self.batch_shape(),
            # the run record of the writer: ``aios report`` follows resumes back through it
            "record": os.path.abspath(self.record.dir),
        }

    def batch_shape(self) -> dict[str, Any]:
        """This run's data-parallel ranks, ``grad_accum``, per-rank batch and the effective
        global batch (``micro_batch`` or the first loader's batch size, x ranks x accum)."""
        data = data_parallel_size(self.strategy) * self.replicas
        accum = int(getattr(self.config, "grad_accum", 1) or 1)
        micro = getattr(self.config, "micro_batch", None)
        if micro is None:
            for ld in self.training.loaders:
                micro = getattr(ld, "batch_size", None)
                if micro:
                    break
        out: dict[str, Any] = {"data_world": data, "grad_accum": accum}
        if micro:
            out["micro_batch"] = int(micro)
            out["global_batch"] = int(micro) * data * accum
        return out

    # ---------------------------------------------------------------- start / close
    def start(self) -> None:
        """Collective: check ``checkpoint.dir`` is writable and take its writer lock (rank 0)."""
        if self._started or not self.config.checkpoint.dir:
            return
        self._started = True

        def take() -> None:
            store = self.store
            store.check_writable()
            if self.writes is None:
                store.acquire_lock({"run_id": self.record.run_id, "started": time.time()})

        on_rank0(self.strategy, self.world_size, take, "taking the checkpoint directory")
        if self.is_main and self.writes is None:
            self._stop.clear()
            self._heartbeat = threading.Thread(
                target=self._beat, name="aios-ckpt-lock", daemon=True
            )
            self._heartbeat.start()

    def _beat(self) -> None:
        """Refresh the lock every :data:`aios.checkpoint.LOCK_HEARTBEAT_S`; a refresh that fails
        is retried until the store's fence (:data:`aios.checkpoint.LOCK_FENCE_S`) gives up,
        then the store writes no more checkpoints and this says why, once."""
        while not self._stop.wait(LOCK_HEARTBEAT_S):
            if not self.store.heartbeat():
                lost = self.store.lost or "lost the checkpoint lock"
                warnings.warn(f"aios: {redact_url(lost)}", stacklevel=1)
                return

    def close(self) -> None:
        self.pending = None
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
            self._heartbeat = None
        if self._store is not None and self.is_main:
            self._store.release_lock()
        self._started = False

    # ---------------------------------------------------------------- the batch boundary
    def request_save(self) -> None:
        if not self.pending:
            self.pending = "save"

    def request_preempt(self) -> None:
        self.pending = "preempt"

    def note_step(self) -> None:
        """Called by ``Runtime.step`` when it has set :attr:`pending`: remembers this rank's RNG
        state at the step, the one a cut at the next backward records (see
        :meth:`at_batch_boundary`)."""
        self.rng_at_step = self.training.rng_state()

    def at_batch_boundary(self, loader: bool = True) -> None:
        """Write the checkpoint (or act on the preemption) decided at the last step boundary.
        Called by aios data loaders before the next batch (``loader=True``: the state and the
        RNG streams as they are now; a resumed loop goes on from this very point), and by
        backward/accumulate/close (``loader=False``: a loop that draws its own batches; the
        state as it is now, the RNG streams as they were at ``rt.step``: a resumed loop runs
        again what lies between the top of its loop and this point, drawing the same numbers).
        """
        pending, self.pending = self.pending, None
        rng, self.rng_at_step = self.rng_at_step, None
        if pending == "save":
            self.save(rng=None if loader else rng)
            if self.on_saved is not None:
                self.on_saved()
        elif pending == "preempt":
            if self.on_preempt is None:
                raise RuntimeError("a preemption is pending but nothing handles it")
            self.preempt_rng = None if loader else rng
            self.on_preempt()

    # ---------------------------------------------------------------- save
    def _gather_rngs(self, mine: dict[str, Any] | None = None) -> list[Any]:
        mine = mine if mine is not None else self.training.rng_state()
        if self.world_size > 1:
            return self.strategy.gather_object(mine)
        return [mine]

    def save(
        self,
        path: str | None = None,
        extra: dict[str, Any] | None = None,
        background: bool | None = None,
        replace: bool = False,
        rng: dict[str, Any] | None = None,
    ) -> str | None:
        """Collective: write a checkpoint of the full state. Without ``path`` it goes to
        ``checkpoint.dir`` (keep-N of this lineage); with one, to that directory (nothing is
        pruned there). Returns the checkpoint's path on the writing rank (None for a background
        save: it is committed when written; :meth:`finish_pending` waits for that).

        ``background`` (default ``checkpoint.async_save`` for saves to ``checkpoint.dir``) lets
        a format that supports it (``dcp``) write while training continues. A pending background
        save is always finished first. ``replace``: an aios checkpoint at ``path`` is replaced
        once the new one is committed (atomically: the name always holds a complete one).
        ``rng``: this rank's RNG state to record instead of the current one.

        A failure on any rank stops every rank: the rank where it happened raises the error,
        the others a quiet :class:`aios.errors.PeerFailed`."""
        if self.writes is not None and not self.writes():
            self._skip_save(path)  # another replica group writes this one
            return None
        self.finish_pending()
        t0 = time.perf_counter()
        c0 = self.clock()
        step = self.training.step
        fmt = self.format
        if background is None:
            background = path is None and bool(getattr(self.config.checkpoint, "async_save", False))
        background = bool(background) and hasattr(fmt, "wait")
        ctx = SaveContext(self.training, extra or {}, self._gather_rngs(rng), background=background)
        store = self._target_store(path)
        writes = fmt.all_ranks_write or self.strategy.saves_on_this_rank()
        staging: Any = None
        error: BaseException | None = None
        files: dict[str, Any] = {}
        written: str | None = None
        try:
            target = path.rstrip("/").rpartition("/")[2] if path is not None else None
            if fmt.all_ranks_write:  # one staging directory for every rank, begun by rank 0
                staging = on_rank0(
                    self.strategy,
                    self.world_size,
                    lambda: store.begin(step, target, replace),
                    f"saving checkpoint step {step}",
                )
            elif writes:
                staging = store.begin(step, target, replace)
            if writes:
                files = fmt.save(step, ctx, staging, store) or {}
        except BaseException as exc:  # noqa: BLE001 - re-raised after the barrier
            error = exc
        if fmt.all_ranks_write:
            written, error = self._commit_all_ranks(fmt, store, staging, files, error, step, path)
        elif writes and staging is not None:
            if error is None:
                try:
                    written = self._commit(store, staging, files, path)
                except BaseException as exc:  # noqa: BLE001
                    error = exc
            else:
                store.abort(staging)
        if isinstance(error, Exception) and not isinstance(error, CheckpointError):
            error = store._save_error(step, error)
        settle_all(self.strategy, self.world_size, error, f"saving checkpoint step {step}")
        if path is None:  # a named save (rt.save(path), best) is no checkpoint of checkpoint.dir
            self.saved_step = step
            self.lineage = store.lineage
        self._note_save(fmt, step, written, store, t0, c0, background, path)
        if path is None:
            self.plan(c0)
        return written

    def _commit_all_ranks(
        self,
        fmt: CheckpointFormat,
        store: Any,
        staging: Any,
        files: dict[str, Any],
        error: BaseException | None,
        step: int,
        path: str | None,
    ) -> tuple[str | None, BaseException | None]:
        """A format where every rank writes: every rank's file entries and outcome gathered;
        rank 0 commits (a background write: once every rank's shards are written) or aborts.
        Returns the committed path and this rank's error."""
        written: str | None = None
        mine = (files, None if error is None else _cause(error))
        results = self.strategy.gather_object(mine) if self.world_size > 1 else [mine]
        failed = [e for _, e in results if e]
        if error is None and failed:
            error = PeerFailed(f"saving checkpoint step {step} failed on another rank")
        deferred = getattr(fmt, "pending", None) is not None
        if failed and deferred:
            with contextlib.suppress(Exception):
                fmt.wait()  # type: ignore[attr-defined]  # deferred formats (dcp) have it
        if self.is_main and staging is not None:
            if failed:
                store.abort(staging)
            else:
                merged: dict[str, Any] = {}
                for f, _ in results:
                    merged.update(f)
                try:
                    if deferred:  # written in the background: commit once every rank's shards are
                        self._abandoned = False
                        fmt.commit_when_written(  # type: ignore[attr-defined]  # deferred format
                            lambda shards, m=merged: self._commit_unless_abandoned(
                                store, staging, {**m, **shards}, path
                            ),
                            lambda: store.abort(staging),
                            store,
                            staging,
                        )
                    else:
                        written = self._commit(store, staging, merged, path)
                except BaseException as exc:  # noqa: BLE001
                    error = exc
        return written, error

    def _note_save(
        self,
        fmt: CheckpointFormat,
        step: int,
        written: str | None,
        store: Any,
        t0: float,
        c0: float,
        background: bool,
        path: str | None,
    ) -> None:
        """A save's figures: the checkpoint in the run record (or the background save pending
        its commit), and its cost for the interval's plan."""
        blocked = self.clock() - c0
        key = self.cost_key(background)
        if written and path is None:
            self.committed_step = step
        if written:
            dt = time.perf_counter() - t0
            self.record.diag["checkpoints"].append(
                {
                    "step": step,
                    "path": written,
                    "seconds": round(dt, 4),
                    "blocking_seconds": round(blocked, 4),
                    "time": time.time(),
                    "lineage": store.lineage,
                }
            )
        elif getattr(fmt, "pending", None) is not None:
            self._pending_meta = {
                "step": step,
                "staged_seconds": round(time.perf_counter() - t0, 4),
                "blocking_seconds": round(blocked, 4),
                "lineage": store.lineage,
                "background": True,
                "key": key,
                "clock_started": c0,
            }
        if not (getattr(fmt, "pending", None) is not None and background):
            self.cost.add(key, blocked, blocked)  # a synchronous save: blocking is its total

    def _skip_save(self, path: str | None) -> None:
        """A save another replica group writes: this group's counters move as if it had."""
        if path is None:
            self.saved_step = self.committed_step = self.training.step
            self.plan(self.clock())

    def cost_key(self, background: bool | None = None) -> str:
        """The name the save cost is measured under: the format, ``+async`` for background
        saves (their blocking and total times differ from a synchronous save's)."""
        if background is None:
            background = bool(getattr(self.config.checkpoint, "async_save", False))
        return self.format.name + ("+async" if background and hasattr(self.format, "wait") else "")

    def replan(self, step: int, now: float) -> None:
        """Collective (called by ``rt.step`` on every rank at :attr:`check_step`): turn the
        time-based plan into the step every rank saves at. Rank 0 reads its clock and step time
        and broadcasts ``(due_step, check_step)``; it replans again half-way to the due step, so
        steps that slow down still save in time. Costs one broadcast every so often (about
        log2 of the steps between saves), nothing on the other steps."""
        if self.max_lost is None:
            return
        due, check = _NEVER, step + 1  # no step time yet: ask again at the next step
        if self.is_main:
            if self.next_due == float("inf"):
                self.plan(now)  # the first step: lost work counts from here
            s = self.step_time()
            left = self.next_due - now
            if left <= 0:
                due, check = step, _NEVER
            elif s:
                n = max(1, int(left // s))
                due, check = step + n, step + max(1, n // 2) if n > 1 else _NEVER
        if self.world_size > 1:
            due, check = self.strategy.broadcast_object((due, check), 0)
        self.due_step, self.check_step = due, check

    def plan(self, captured: float) -> None:
        """Choose the next periodic save from ``checkpoint.max_lost`` (see
        :mod:`aios.checkpoint.policy`); ``captured``: the clock time of the state the last save
        holds (or the start of training). Says once when max_lost needs more saving than
        ``checkpoint.max_overhead`` allows."""
        if self.max_lost is None:
            return
        self.due_step, self.check_step = _NEVER, self.training.step + 1
        est = self.cost.estimate(self.cost_key())
        blocking, total = est if est is not None else (None, None)
        iv = choose_interval(
            self.max_lost,
            float(self.config.checkpoint.max_overhead),
            blocking,
            total,
            self.step_time(),
        )
        self.interval = iv
        self.next_due = captured + iv.seconds
        self.record.diag["checkpoint_interval"] = {
            "seconds": round(iv.seconds, 3),
            "overhead": round(iv.overhead, 5),
            "max_lost": self.max_lost,
            "max_overhead": self.config.checkpoint.max_overhead,
            "lost_bound_s": round(iv.lost_bound, 3),
            "cost": self.cost.to_dict(),
        }
        if iv.conflict and not self._said_conflict and est is not None:
            self._said_conflict = True
            self._print(
                f"aios: checkpoint.max_lost={self.max_lost:g}s needs a save every "
                f"{iv.seconds:.1f}s, which blocks training {iv.overhead:.1%} of the time (more "
                f"than checkpoint.max_overhead={self.config.checkpoint.max_overhead:g}); "
                "max_lost wins (raise max_lost to save less often)"
            )

    def _commit_unless_abandoned(
        self, store: Any, staging: Any, files: dict[str, Any], path: str | None
    ) -> str:
        if self._abandoned:
            raise CheckpointError(
                "the background save was abandoned at a preemption notice", "nothing to do"
            )
        return self._commit(store, staging, files, path)

    def finish_pending(self) -> str | None:
        """Collective: finish a background save (every rank's shards written, the marker
        committed by rank 0). Called before the next save, at preemption and at exit. Returns
        the committed path on rank 0."""
        fmt = self.format
        if getattr(fmt, "pending", None) is None:
            return None
        handle = fmt.wait()  # type: ignore[attr-defined]  # only deferred formats are pending
        meta, self._pending_meta = self._pending_meta or {}, None
        key = meta.pop("key", None)
        c0 = meta.pop("clock_started", None)
        if handle is not None and key and c0 is not None:
            # rank 0's commit thread timed the write and commit; elsewhere: until now
            total = (
                handle.finished - handle.started
                if handle.finished is not None
                else self.clock() - c0
            )
            self.cost.add(key, float(meta.get("blocking_seconds", 0.0)), total)
        if handle is not None and handle.path:
            self.committed_step = handle.step
            entry = {
                **meta,
                "path": handle.path,
                "seconds": round((handle.finished or time.perf_counter()) - handle.started, 4),
                "time": time.time(),
            }
            self.record.diag["checkpoints"].append(entry)
        return handle.path if handle is not None else None

    def pending_left(self) -> float | None:
        """Seconds the background save in flight still needs by the estimate (0 when it is
        done; None when none is in flight)."""
        handle = getattr(self.format, "pending", None)
        if handle is None:
            return None
        if handle.done():
            return 0.0
        meta = self._pending_meta or {}
        est = self.cost.estimate(self.cost_key(True))
        c0 = meta.get("clock_started")
        if est is None or c0 is None:
            return None
        return max(0.0, est[1] - (self.clock() - c0))

    def _target_store(self, path: str | None) -> Any:
        if path is None:
            return self.store
        parent = path.rstrip("/").rpartition("/")[0]
        return CheckpointStore(
            parent or ".", keep=None, lineage=self.lineage or self.store_lineage()
        )

    def store_lineage(self) -> str | None:
        return self._store.lineage if self._store is not None else None

    def _commit(self, store: Any, staging: Any, files: dict[str, Any], path: str | None) -> str:
        written = store.commit(staging, self.meta(), files)
        if path is not None and "://" not in path:
            return path  # as the caller named it
        return written

    # ---------------------------------------------------------------- load / resume
    def _source_store(self, path: str | int | None) -> tuple[Any, bool]:
        """The store holding ``path`` and whether it is ``checkpoint.dir`` (then the loaded
        checkpoint's lineage becomes this run's)."""
        if not (isinstance(path, str) and ("/" in path or "://" in path)):
            return self.store, True
        parent = path.rstrip("/").rpartition("/")[0] or "."
        if self.config.checkpoint.dir:
            where = filesystem(parent)[1] if "://" in parent else os.path.abspath(parent)
            if where.rstrip("/") == self.store.root.rstrip("/"):
                return self.store, True
        return CheckpointStore(parent, keep=None), False

    def _reshard(self, reshard: bool | None) -> bool:
        if reshard is not None:
            return reshard
        return bool(getattr(self.config.checkpoint, "reshard", True))

    def _format_for(self, info: Any) -> CheckpointFormat:
        """The format that reads ``info``: this run's, or the one that wrote it (a ``full``
        checkpoint under a sharded strategy, a ``dcp`` one under ddp/xla)."""
        name = info.meta.get("checkpoint_format", "full") or "full"
        if name == self.format.name:
            return self.format
        fmt = get_format(name, self.formats)
        if hasattr(fmt, "seed"):
            fmt.seed = self.config.seed
        return fmt

    def load(
        self, path: str | int | None = None, strict: bool = True, reshard: bool | None = None
    ) -> dict[str, Any]:
        """Collective: restore the full state from a checkpoint (a step number, a directory or
        URL, or the newest complete one in ``checkpoint.dir``). Returns the ``extra`` dict."""
        store, managed = self._source_store(path)
        info = store.resolve(path)
        refuse_other_shape(info, store, self.meta(), self._reshard(reshard))
        fmt = self._format_for(info)
        extra = fmt.load(info, store, self.training, rank=self.strategy.rank, strict=strict)
        self._carry_accumulation(info.meta)
        self.saved_step = self.training.step
        if managed:
            self.committed_step = self.training.step
        self.loaded_step = self.training.step
        self.resumed_from = store.display(info.path)
        if managed and info.lineage:
            self.lineage = info.lineage
            store.lineage = info.lineage
        return extra

    def _carry_accumulation(self, meta: dict[str, Any]) -> None:
        """A checkpoint cut at an optimizer-step boundary with another ``grad_accum``: the
        micro-step counter restarts at this run's boundary for the same step."""
        tr = self.training
        old = int(meta.get("grad_accum") or 0)
        new = int(getattr(self.config, "grad_accum", 1) or 1)
        if old and old != new and tr.micro == tr.step * old:
            tr.micro = tr.step * new

    def resume(self, reshard: bool | None = None) -> int:
        """Load the most recent complete checkpoint in ``checkpoint.dir`` when
        ``checkpoint.resume`` is on; returns the step to continue from (the current step when
        there is none). Says what it resumes; refuses an incompatible checkpoint."""
        if not self.config.checkpoint.dir or not self.config.checkpoint.resume:
            return self.training.step
        store = self.store

        def choose() -> tuple[str, str | None, dict[str, Any], int] | None:
            info = store.latest(say=self._print)
            if info is None:
                return None
            refuse_other_shape(info, store, self.meta(), self._reshard(reshard))
            return info.path, info.lineage, info.meta, info.step

        chosen = on_rank0(
            self.strategy, self.world_size, choose, "choosing the checkpoint to resume"
        )
        if chosen is None:
            return self.training.step
        path, lineage, meta, step = chosen
        self.load(
            path if "://" not in self.config.checkpoint.dir else store.display(path),
            reshard=reshard,
        )
        saved_world = meta.get("world_size", "?")
        world = self.world_size * self.replicas
        resharded = saved_world != "?" and int(saved_world) != world
        changes = shape_change(meta, self.meta())
        batch = batch_change(meta, self.meta(), self.batch_shape(), self.config)
        where = redact_url(self.resumed_from or "")
        self._print(
            f"aios: resumed from {where} at step {self.training.step} (run {meta.get('run_id', '?')}, "
            f"world size {saved_world}, backend {meta.get('backend', '?')}, lineage {lineage or 'legacy'})"
        )
        if changes or batch:
            what = ", ".join([*changes, *([batch] if batch else [])])
            self._print(f"aios: resumed at step {self.training.step}: {what}")
        event: dict[str, Any] = {
            "path": self.resumed_from,
            "step": self.training.step,
            "run_id": meta.get("run_id"),
            "lineage": lineage,
            "record": meta.get("record"),
        }
        if changes or batch:
            event["changed"] = [*changes, *([batch] if batch else [])]
        if resharded:
            event.update(resharded_from=int(saved_world), resharded_to=world)
            self.record.diag["resharded"] = {
                "from_world_size": int(saved_world),
                "to_world_size": world,
                "step": self.training.step,
            }
        self.record.event("resume", **event)
        return self.training.step

    # ---------------------------------------------------------------- preemption
    def emergency_save(
        self,
        reason: str,
        rank: int,
        elapsed: Callable[[], float],
        time_left: Callable[[], float | None] = lambda: None,
    ) -> dict[str, Any]:
        """Collective: the checkpoint after a preemption notice, when it fits before the
        earliest deadline any rank heard (``time_left()``: this rank's seconds until its
        notice's deadline, None without one). A background save in flight is finished when its
        estimate fits, else abandoned (never committed half-written). When the emergency save
        does not fit, the last committed checkpoint is kept and one line says so. Leaves the
        status file that ``aios-run`` reads; returns the event for the run record."""
        grace = self.config.checkpoint.grace_seconds
        path = None
        step = self.training.step
        skipped: str | None = None
        left = least_time_left(self.strategy, self.world_size, time_left)
        t_left = self.clock()
        if self.config.checkpoint.dir:
            if getattr(self.format, "pending", None) is not None:
                pend = self.pending_left()  # None: no estimate yet (then it is finished)
                abandon = on_rank0(
                    self.strategy,
                    self.world_size,
                    lambda: not fits(pend, left),
                    "finishing the background save",
                )
                if abandon and hasattr(self.format, "abandon"):
                    self._abandoned = True
                    handle = self.format.abandon()
                    self._pending_meta = None
                    self._print(
                        f"aios: the background save of step {getattr(handle, 'step', '?')} "
                        f"cannot commit before the deadline ({left:.1f}s left): abandoned"
                    )
                else:
                    try:
                        self.finish_pending()
                    except CheckpointError as exc:
                        # a lost background save must not cost the emergency one: the last
                        # committed checkpoint is kept, and this one is written by the process
                        warnings.warn(
                            f"aios: {redact_url(exc.message)}; writing the emergency checkpoint "
                            "anyway (the last committed checkpoint is kept)",
                            stacklevel=2,
                        )
            if left is not None:
                left -= self.clock() - t_left
            est = self.cost.estimate(self.cost_key(False))
            need = est[1] if est is not None else None
            go = on_rank0(
                self.strategy,
                self.world_size,
                lambda: fits(need, left),
                "deciding the emergency save",
            )
            if go:
                rng, self.preempt_rng = self.preempt_rng, None
                path = self.save(background=False, rng=rng)
            else:
                kept = self.committed_step
                skipped = (
                    f"an emergency checkpoint needs about {need * SAFETY:.1f}s"
                    if need is not None
                    else "no time is left for an emergency checkpoint"
                ) + f" and {max(left or 0.0, 0.0):.1f}s are left before the deadline"
                self._print(
                    f"aios: {skipped}: keeping the last committed checkpoint"
                    + (f" (step {kept})" if kept is not None else " (none yet: progress is lost)")
                    + f"; steps {kept or 0}-{step} will run again after the relaunch"
                )
        spent = elapsed()
        event = {
            "reason": reason,
            "step": step,
            "checkpoint": path,
            "seconds_since_notice": round(spent, 3),
            "grace_seconds": grace,
            "time_left_s": None if left is None else round(left, 3),
            "skipped": skipped,
            "kept_step": self.committed_step,
        }
        rank_status.mark_rank(f"preempted {path or ''}", rank=rank)
        return event
