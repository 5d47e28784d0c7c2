"""The data stays global across replica groups: each step's batches are split over the groups in
that step's quorum, and the epoch's position is counted in committed samples (as a resume at
another shape counts them, :mod:`aios.data.loaders`). A lost group's share is trained by the
others; a step that did not commit leaves the position where it was (its batches are trained
again); a healing group receives the position with the model. Its first step contributes no
gradient (torchft zeroes it), so the data it reads then is not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aios.data.loaders import DeviceLoader
from aios.errors import ConfigError


class GlobalStepSampler:
    """A batch sampler: the indices of this rank for each step, decided at the step's quorum.

    The step's global batch is ``participants x group ranks x batch_size`` consecutive samples of
    the epoch's order from the committed position; participant ``p``'s rank ``k`` takes slot
    ``p x group ranks + k``. The last step of an epoch is short (or dropped, ``drop_last``)."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        replica: Any,
    ) -> None:
        self.size = size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.replica = replica
        self.epoch = 0
        #: samples of this epoch's order trained in committed steps (every group together)
        self.pos = 0
        self._step_world = 0
        self._order: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        per = self.batch_size * self.replica.groups * self.replica.group_world
        return (self.size // per) if self.drop_last else -(-self.size // per)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.pos = 0
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            import torch

            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + self.epoch)
                idx = torch.randperm(self.size, generator=g).tolist()
            else:
                idx = list(range(self.size))
            self._order = (self.epoch, idx)
        return self._order[1]

    def __iter__(self) -> Iterator[list[int]]:
        rep = self.replica
        bs = self.batch_size
        while True:
            rep.begin_step()
            world = rep.participants * rep.group_world
            left = self.size - self.pos
            if left <= 0 or (self.drop_last and left < world * bs):
                break
            self._step_world = world
            slot = (rep.participant_rank or 0) * rep.group_world + rep.group_rank
            order = self.order()
            start = self.pos + slot * bs
            idx = order[start : min(start + bs, self.size)]
            if not idx:  # a short last step: pad from the epoch's start, as DistributedSampler
                idx = order[:bs]
            yield idx
        self.pos = 0
        self.epoch += 1

    def end_step(self, committed: bool, participants: int) -> None:
        """The step ended: a committed step's samples are consumed."""
        if committed and self._step_world:
            step = participants * self.replica.group_world * self.batch_size
            self.pos = min(self.size, self.pos + step)
        self._step_world = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


class GroupLoader(DeviceLoader):
    """What ``rt.setup`` returns for a loader under replica groups: a :class:`DeviceLoader`
    whose position is its :class:`GlobalStepSampler`'s, counted in committed samples of every
    group together. Its ``state_dict`` has the layout of any aios loader's (``samples`` of the
    epoch's order, the data-parallel ``world`` and ``batch_size``), so a checkpoint written under
    replica groups resumes with another number of groups or without groups (plain ddp), and a
    plain run's checkpoint resumes under groups."""

    def __init__(self, loader: Any, sampler: GlobalStepSampler, device: Any, seed: int, rank: int):
        super().__init__(loader, device, seed=seed, rank=rank, world=1)
        self.steps = sampler

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
            "batch": s.pos // max(1, s.batch_size * s.replica.group_world * s.replica.groups),
            "samples": s.pos,
            "world": s.replica.groups * s.replica.group_world,
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
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler

    if not isinstance(loader, DataLoader):
        return DeviceLoader(loader, device, seed=seed, rank=rank, world=1)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        raise ConfigError(
            "ft.replica_groups splits each step's batches over the live groups and needs a "
            "DataLoader with batch_size=... over a map-style dataset",
            "pass such a DataLoader to rt.setup, or drop ft.replica_groups",
        )
    if loader.num_workers:
        raise ConfigError(
            f"ft.replica_groups decides each step's samples at the step's quorum; a DataLoader "
            f"with num_workers={loader.num_workers} reads batches ahead of it",
            "use num_workers=0 with ft.replica_groups",
        )
    if shuffle is None:
        shuffle = isinstance(loader.sampler, RandomSampler)
    size = len(loader.dataset)  # type: ignore[arg-type]  # a map-style dataset is sized
    sampler = GlobalStepSampler(
        size, int(loader.batch_size), shuffle, seed, loader.drop_last, replica
    )
    replica.samplers.append(sampler)
    split = DataLoader(loader.dataset, batch_sampler=sampler, collate_fn=loader.collate_fn)
    return GroupLoader(split, sampler, device, seed, rank)
