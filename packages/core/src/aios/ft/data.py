"""The data stays global across replica groups: each step's batches are split over the groups in
that step's quorum, and the epoch's position is counted in committed samples (as a resume at
another shape counts them, :mod:`aios.data.loaders`). A lost group's share is trained by the
others; a step that did not commit leaves the position where it was (its batches are trained
again); a healing group receives the position with the model. Its first step contributes no
gradient (torchft zeroes it), so the data it reads then is not counted. A loader with workers
reads the predicted next steps ahead (:class:`WorkerSplit`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from aios.data.loaders import DeviceLoader, sampler_order, script_order
from aios.errors import ConfigError


class GlobalStepSampler:
    """A batch sampler: the indices of this rank for each batch, decided at its step's quorum.

    Training (the script's model in ``train()`` mode when an iteration begins): each batch read
    in a step is ``participants x data ranks x batch_size`` consecutive samples of the epoch's
    order from the read position, where a group's data ranks are its strategy's data-parallel
    ranks (``data_world``: every rank under ddp and fsdp, the ``dp`` ranks under tp, whose ``tp``
    ranks read the same batch); participant ``p``'s data rank ``k`` takes slot
    ``p x data ranks + k``. A step may read several batches (``grad_accum``): each comes after
    the last. When the step commits its batches are consumed (the committed position moves to
    the read position); when it does not they are read again. The last step of an epoch is
    short (or dropped, ``drop_last``).

    Evaluation (the model in ``eval()`` mode when an iteration begins, as a validation loop
    sets it): no quorum and no commit; the epoch's order is split over this group's data ranks
    only, as ``DistributedSampler`` splits it (padded), so each group evaluates every sample and
    the script's own reductions within its group see the whole set."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        replica: Any,
        source: Any = None,
    ) -> None:
        #: the script's own sampler whose order is split (aios.data.loaders.sampler_order)
        self.source = source
        self.size = size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.replica = replica
        self.epoch = 0
        #: samples of this epoch's order trained in committed steps (every group together)
        self.pos = 0
        #: samples of this epoch's order read so far (every group together): ``pos`` plus
        #: the batches of the step being trained
        self.cursor = 0
        self._read_in_step = False
        self._order: tuple[int, list[int]] | None = None
        #: an evaluation pass is being read (a training step during it is named, Replica.commit)
        self.in_eval_pass = False

    def __len__(self) -> int:
        if self.replica.evaluating():
            per = self.batch_size * self.replica.data_world
            return -(-self.size // per) if not self.drop_last else self.size // per
        per = self.batch_size * self.replica.groups * self.replica.data_world
        return (self.size // per) if self.drop_last else -(-self.size // per)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.pos = self.cursor = 0
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            import torch

            if self.source is not None:
                idx = sampler_order(self.source, self.seed, self.epoch)
            elif self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + self.epoch)
                idx = torch.randperm(self.size, generator=g).tolist()
            else:
                idx = list(range(self.size))
            self._order = (self.epoch, idx)
        return self._order[1]

    def indices(self, pos: int, participants: int, participant: int | None) -> list[int] | None:
        """This rank's samples of a batch read from the position ``pos`` with ``participants``
        groups in its step's quorum, this group being ``participant`` (None: healing, read as
        participant 0 and not counted); None when the epoch has no batch left there."""
        rep = self.replica
        bs = self.batch_size
        world = participants * rep.data_world
        left = self.size - pos
        if left <= 0 or (self.drop_last and left < world * bs):
            return None
        slot = (participant or 0) * rep.data_world + rep.data_rank
        order = self.order()
        start = pos + slot * bs
        idx = order[start : min(start + bs, self.size)]
        # a short last step: pad from the epoch's start, as DistributedSampler
        return idx or order[:bs]

    def step_samples(self, participants: int) -> int:
        """The samples one batch of every rank of ``participants`` groups reads."""
        return participants * self.replica.data_world * self.batch_size

    def evaluation(self) -> list[list[int]]:
        """This rank's batches of an evaluation pass over the epoch's order: split over the
        group's data ranks as ``DistributedSampler`` splits it (padded from the start; the
        tail dropped with ``drop_last``)."""
        rep = self.replica
        order = self.order()
        world = rep.data_world
        if self.drop_last:
            order = order[: (len(order) // world) * world]
        else:
            pad = -len(order) % world
            order = order + (order * (pad // max(1, len(order)) + 1))[:pad]
        mine = order[rep.data_rank :: world]
        bs = self.batch_size
        batches = [mine[i : i + bs] for i in range(0, len(mine), bs)]
        if self.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        rep = self.replica
        if rep.evaluating():  # a validation pass: this group's own split, no quorum
            self.in_eval_pass = True
            try:
                yield from self.evaluation()
            finally:
                self.in_eval_pass = False
            self.epoch += 1
            return
        self.cursor = self.pos
        while True:
            rep.begin_step()
            idx = self.indices(self.cursor, rep.participants, rep.participant_rank)
            if idx is None:
                break
            self.cursor += self.step_samples(rep.participants)
            self._read_in_step = True
            yield idx
        self.pos = self.cursor = 0
        self.epoch += 1

    def end_step(self, committed: bool, participants: int) -> None:
        """The step ended: a committed step's batches are consumed; the batches of one that did
        not commit are read again."""
        if not self._read_in_step:
            return
        self._read_in_step = False
        if committed:
            self.pos = min(self.size, self.cursor)
        else:
            self.cursor = self.pos

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """A live group's position (a heal, applied when the step commits; torchft's first step
        syncs every group from the first one so) or a checkpoint's: what this step has read
        already stays read after it."""
        read = self.cursor - self.pos
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.cursor = self.pos + max(0, read)


class _Ahead:
    """The batch sampler of the script's workers under replica groups: the steps after the one
    being trained, as they will be if each commits with the same groups (a prediction; the
    quorum decides each step). ``sent`` holds the predictions handed to the workers, oldest
    first: their batches come back in that order."""

    def __init__(self, steps: GlobalStepSampler) -> None:
        self.steps = steps
        self.sent: collections.deque[list[int]] = collections.deque()
        self._from: tuple[int, int, int | None] = (0, 1, None)

    def start(self, pos: int, participants: int, participant: int | None) -> None:
        """The next iteration predicts from ``pos`` on (nothing sent yet)."""
        self.sent.clear()
        self._from = (pos, participants, participant)

    def __iter__(self) -> Iterator[list[int]]:
        pos, participants, participant = self._from
        while True:
            idx = self.steps.indices(pos, participants, participant)
            if idx is None:
                return
            self.sent.append(idx)
            yield idx
            pos += self.steps.step_samples(participants)


class WorkerSplit:
    """The global step split read by the script's ``DataLoader`` workers (``num_workers > 0``).

    Each step's samples are decided at its quorum, after the workers would have read it; so the
    workers read ahead the steps as they will be when each commits with the same groups (almost
    always), and a step whose samples differ from the prediction (the groups in the quorum
    changed, a step did not commit, a heal moved the position) is read here, in this process,
    while the workers start over from the next step. An evaluation pass is read by the workers
    as it is (:meth:`GlobalStepSampler.evaluation`: no quorum decides it). The script's ``num_workers``,
    ``collate_fn``, ``worker_init_fn``, ``prefetch_factor``, ``pin_memory``, ``timeout``,
    ``multiprocessing_context`` and ``persistent_workers`` are kept; the workers' seeds come from
    the loader's ``generator``, else from one of the run's seed (a restart of the workers never
    draws from the script's random stream)."""

    def __init__(self, loader: Any, steps: GlobalStepSampler, seed: int, rank: int) -> None:
        import torch
        from torch.utils.data import DataLoader

        self.dataset = loader.dataset
        self.steps = steps
        self.collate_fn = loader.collate_fn
        self.ahead = _Ahead(steps)
        generator = loader.generator
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(seed * 1_000_003 + rank)
        kwargs: dict[str, Any] = dict(
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=generator,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers,
        )
        self.workers = DataLoader(loader.dataset, batch_sampler=self.ahead, **kwargs)
        #: an evaluation pass (no quorum decides it): the workers read the group's split as is
        self.evaluator = DataLoader(loader.dataset, batch_sampler=steps, **kwargs)
        #: steps read by the workers, and read in this process (a prediction missed)
        self.read_ahead = 0
        self.read_here = 0

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Any]:
        steps, ahead = self.steps, self.ahead
        if steps.replica.evaluating():
            yield from self.evaluator
            return
        it: Iterator[Any] | None = None
        try:
            for idx in steps:
                if it is not None and ahead.sent and ahead.sent[0] == idx:
                    ahead.sent.popleft()
                    batch = next(it)
                    self.read_ahead += 1
                else:
                    it = None  # the workers' reads ahead are dropped (they stop, or reset)
                    batch = self.collate_fn([self.dataset[i] for i in idx])
                    self.read_here += 1
                    rep = steps.replica
                    ahead.start(steps.cursor, rep.participants, rep.participant_rank)
                    it = iter(self.workers)
                yield batch
        finally:
            it = None


class GroupLoader(DeviceLoader):
    """What ``rt.setup`` returns for a loader under replica groups: a :class:`DeviceLoader`
    whose position is its :class:`GlobalStepSampler`'s, counted in committed samples of every
    group together. Its ``state_dict`` has the layout of any aios loader's (``samples`` of the
    epoch's order, the data-parallel ``world`` and ``batch_size``), so a checkpoint written under
    replica groups resumes with another number of groups or without groups (plain ddp), and a
    plain run's checkpoint resumes under groups."""

    def __init__(
        self,
        loader: Any,
        sampler: GlobalStepSampler,
        device: Any,
        seed: int,
        rank: int,
        user: Any = None,
    ) -> None:
        super().__init__(loader, device, seed=seed, rank=rank, world=1)
        self.steps = sampler
        #: the script's own DistributedSampler: its set_epoch() calls choose the epoch
        self._user = user
        self._user_epoch = None if user is None else int(user.epoch)

    def _user_sampler(self) -> Any:
        return self._user

    @property
    def batch_size(self) -> int:
        return self.steps.batch_size

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.steps.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        s = self.steps
        return {
            "epoch": s.epoch,
            "batch": s.pos // max(1, s.batch_size * s.replica.data_world * s.replica.groups),
            "samples": s.pos,
            "world": s.replica.groups * s.replica.data_world,
            "batch_size": s.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch = int(state.get("epoch", 0))
        if "samples" in state:
            pos = int(state["samples"])
        else:  # an older checkpoint: its rank's batch count
            bs = int(state.get("batch_size") or self.steps.batch_size)
            pos = int(state.get("batch", 0)) * bs * int(state.get("world", 1))
        self.epoch, self._active = epoch, False
        self.steps.load_state_dict({"epoch": epoch, "pos": min(pos, self.steps.size)})


def shard(
    loader: Any, replica: Any, seed: int, shuffle: bool | None, device: Any, rank: int
) -> Any:
    """A :class:`GroupLoader` over a ``DataLoader`` like ``loader`` reading the global step
    split (see the module); any other loader as it is."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset

    if not isinstance(loader, DataLoader):
        return DeviceLoader(loader, device, seed=seed, rank=rank, world=1)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        raise ConfigError(
            "ft.replica_groups splits each step's batches over the live groups and needs a "
            "DataLoader with batch_size=... over a map-style dataset",
            "pass such a DataLoader to rt.setup, or drop ft.replica_groups",
        )
    if type(loader.batch_sampler) is not BatchSampler:
        raise ConfigError(
            f"ft.replica_groups splits each step's batches over the live groups; the "
            f"DataLoader's batch sampler {type(loader.batch_sampler).__name__} makes its own",
            "pass batch_size=... (and a sampler) instead of batch_sampler, or drop "
            "ft.replica_groups",
        )
    user, source, shuffle, seed, drop_last = script_order(loader, shuffle, seed)
    size = len(source) if source is not None else len(loader.dataset)  # type: ignore[arg-type]
    sampler = GlobalStepSampler(
        size, int(loader.batch_size), shuffle, seed, drop_last, replica, source=source
    )
    replica.samplers.append(sampler)
    split: Any
    if loader.num_workers:  # the script's workers read ahead (WorkerSplit)
        split = WorkerSplit(loader, sampler, seed, rank)
    else:
        split = DataLoader(loader.dataset, batch_sampler=sampler, collate_fn=loader.collate_fn)
    return GroupLoader(split, sampler, device, seed, rank, user=user)
