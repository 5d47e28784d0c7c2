"""The ``dcp`` format as the checkpoint manager uses it (:class:`DcpFormat`): the sharded
model and optimizer state through :class:`aios.checkpoint.formats.dcp.DcpWriter`, with the
state every rank holds alike and each rank's own (RNG, data positions) beside it (see
:mod:`aios.checkpoint.formats.dcp` for the layout and rules)."""

from __future__ import annotations

from typing import Any

from aios.checkpoint.formats.base import CheckpointFormat
from aios.checkpoint.formats.dcp import (
    FORMAT_NAME,
    DcpWriter,
    SaveHandle,
    dist_info,
    rank_state_for,
)
from aios.errors import CheckpointError, outcome, settle

__all__ = ["DcpFormat"]


class DcpFormat(CheckpointFormat):
    """The ``dcp`` :class:`aios.checkpoint.formats.base.CheckpointFormat`: every rank writes its shards
    (``all_ranks_write``), loads reshard (``supports_resharding``), and with ``background`` saves
    the manager defers the commit to :meth:`commit_when_written` and finishes it in :meth:`wait`.

    What goes where: models and optimizers as DCP shards; step and micro-step counters, LR
    schedulers, registered objects, the precision state, ``extra`` and rank 0's loader positions
    in ``common.pt``; each rank's RNG states and loader positions in ``rank-<r>.pt``."""

    name = FORMAT_NAME
    supports_resharding = True
    all_ranks_write = True

    def __init__(self) -> None:
        # the manager sets the mode from checkpoint.async_writer (default: process)
        self.io = DcpWriter(async_mode="process")
        #: the run's seed (set by the manager): ranks beyond a saved world size reseed from it
        self.seed: int | None = None
        #: saved and current world size of the last load (for the resume message)
        self.last_load: dict[str, int] | None = None

    @property
    def pending(self) -> SaveHandle | None:
        return self.io.pending

    @staticmethod
    def _loader_states(training: Any) -> list[Any]:
        out = []
        for ld in training.loaders:
            st = ld.state_dict() if hasattr(ld, "state_dict") else None
            if isinstance(st, dict) and getattr(ld, "batch_size", None):
                st = {**st, "batch_size": int(ld.batch_size)}
            out.append(st)
        return out

    @staticmethod
    def _modules(training: Any) -> list[Any]:
        return [
            training.strategy.unwrap(m) for m in training.modules
        ]  # e.g. torch.compile's wrapper

    @staticmethod
    def _data_world(training: Any) -> int:
        """Ranks that read different data (the ``dp`` part of a 2-D mesh; all ranks otherwise)."""
        return int(training.strategy.data_world)

    def save(self, step: int, ctx: Any, staging: Any, store: Any) -> dict[str, Any]:
        tr = ctx.training
        _, rank, _ = dist_info()
        loaders = self._loader_states(tr)
        common = None
        if rank == 0:
            common = {
                "step": tr.step,
                "micro": tr.micro,
                "schedulers": [sch.state_dict() for sch in tr.schedulers],
                "objects": {k: v.state_dict() for k, v in tr.objects.items()},
                "precision": tr.precision.state_dict(),
                "extra": ctx.extra,
                "loaders": loaders,
                "world_size": tr.world_size,
                "data_world": self._data_world(tr),
                "backend": tr.backend,
            }
        mine = ctx.rngs[rank] if rank < len(ctx.rngs) else tr.rng_state()
        error: Exception | None = None
        entries: dict[str, Any] = {}
        try:
            entries = self.io.write_files(store, staging, common, {"rng": mine, "loaders": loaders})
        except Exception as exc:  # noqa: BLE001 - every rank learns it: no rank starts its shards
            error = exc
        # one line from the rank that failed, the others stop quietly (aios.errors.settle)
        settle(self.io.all_gather(outcome(error)), rank, error, f"saving checkpoint step {step}")
        # (the manager's collectives run on the default group, never on the checkpoint group
        # a background write uses)
        handle = self.io.write_shards(
            store,
            staging,
            self._modules(tr),
            tr.optimizers,
            bool(getattr(ctx, "background", False)),
        )
        if handle.future is None and rank == 0:  # synchronous: every rank's shards are written
            entries.update(self.io.shard_entries(store, staging))
        return entries

    def commit_when_written(self, commit: Any, abort: Any, store: Any, staging: Any) -> None:
        """Rank 0 after a background save: ``commit(shard_entries)`` once written, in a thread."""
        handle = self.io.pending
        assert handle is not None
        self.io.commit_when_written(
            handle, lambda: commit(self.io.shard_entries(store, staging)), abort
        )

    def wait(self) -> SaveHandle | None:
        """Collective: finish the pending background save (write and commit)."""
        return self.io.wait()

    def abandon(self) -> SaveHandle | None:
        """Stop waiting for the pending background save (a preemption's deadline comes before
        it could commit): the manager's commit callback refuses to commit it, so its staging
        directory is aborted if the write ends before the process does; nothing is committed
        half-written either way. Returns the abandoned handle."""
        handle, self.io.pending = self.io.pending, None
        return handle

    def load(
        self, info: Any, store: Any, target: Any, rank: int = 0, strict: bool = True
    ) -> dict[str, Any]:
        tr = target
        counts = {"schedulers": len(tr.schedulers)}
        common, per, saved_world = self.io.read(
            store, info, self._modules(tr), tr.optimizers, strict
        )
        for key, n in counts.items():
            if len(common.get(key, [])) != n:
                raise CheckpointError(
                    f"the checkpoint holds {len(common.get(key, []))} {key} but this script set up {n}",
                    "set up the same models/optimizers/schedulers as the run that saved it, "
                    "or start fresh with checkpoint.resume=false",
                )
        for sch, st in zip(tr.schedulers, common["schedulers"], strict=True):
            sch.load_state_dict(st)
        tr.load_objects(common.get("objects", {}))
        tr.precision.load_state_dict(common.get("precision", {}))
        tr.step = int(common.get("step", 0))
        tr.micro = int(common.get("micro", 0))
        world = int(tr.world_size)
        saved_data = int(common.get("data_world", saved_world))
        mine = rank_state_for(rank, per)
        tr.restore_rng(mine["rng"] if mine is not None else None, rank, common.get("backend"))
        # positions are global (aios.data.loaders): every rank's state says the same; rank 0's is in
        # common.pt. An older checkpoint's per-rank batch count becomes a global sample count.
        loaders = (mine or {}).get("loaders") or common.get("loaders", [])
        for ld, st in zip(tr.loaders, loaders, strict=False):
            if st is not None and hasattr(ld, "load_state_dict"):
                if "samples" not in st and "batch" in st:
                    bs = int(st.get("batch_size") or getattr(ld, "batch_size", None) or 1)
                    st = {**st, "samples": int(st["batch"]) * bs * saved_data, "world": saved_data}
                ld.load_state_dict(st)
        self.last_load = {"saved_world": saved_world, "world": world}
        return common.get("extra", {}) or {}
