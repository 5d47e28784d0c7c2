"""Data loading helpers shared by strategies: rank sharding with a resumable *global* position,
and a loader wrapper that moves batches to the device and remembers where it is in the epoch.

* :class:`ResumableDistributedSampler`: ``DistributedSampler`` whose order depends only on
  ``(seed, epoch)`` (never on the global RNG) and that can start part-way into an epoch at a
  global position: ``set_start(n)`` skips the first ``n`` samples of the epoch's order (all
  ranks together) and splits the rest over this run's ranks, whatever their number was when the
  position was saved.
* :func:`shard_dataloader`: rebuild a ``DataLoader`` with that sampler (same batch size,
  workers, collate function, ``drop_last``); a ``DistributedSampler`` the script built keeps its
  ``shuffle``, ``seed`` and ``drop_last``, and its ``set_epoch`` calls are followed.
* :class:`DeviceLoader`: what ``runtime.setup`` returns for a loader; iterating it yields batches
  on the device; ``state_dict()`` is the position saved in checkpoints.

The position (exactly once across a change of shape). A loader's state is
``{"epoch", "samples", "batch", "world", "batch_size"}``: ``samples`` is the number of samples of
the epoch's order that every rank together has consumed, ``world`` the data-parallel ranks that
consumed them (``batch`` is this rank's batch count, for reading). A resumed run with another
number of data-parallel ranks or another batch size starts the epoch's order at ``samples`` and
splits the rest over its ranks: no sample of the epoch is repeated or skipped. An iterable
dataset with ``state_dict()``/``load_state_dict()`` has its own state saved beside it (it must
describe the position of all ranks together); any other loader resumes only at the shape that
saved it (a one-line refusal otherwise).

Torch is imported lazily.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from aios.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from aios.strategies.base import Strategy


def data_parallel_size(strategy: Strategy) -> int:
    """The number of ranks reading different data under ``strategy`` (its declared
    :attr:`aios.strategies.base.Strategy.data_world`)."""
    return int(strategy.data_world)


def _sampler_class() -> type:
    import torch
    from torch.utils.data import DistributedSampler

    class ResumableDistributedSampler(DistributedSampler):
        """``DistributedSampler`` that can start one epoch at a global position: the first
        ``start`` samples of the epoch's order (consumed by every rank together, at any earlier
        number of ranks) are skipped and the rest is split over this sampler's replicas. With
        ``start`` a multiple of ``num_replicas`` each rank gets the same indices as an
        uninterrupted ``DistributedSampler`` would from there. Works with ``num_replicas=1``."""

        def __init__(self, *args: Any, source: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.start = 0
            #: the script's own sampler (a subset, weights, its own class): each epoch's order is
            #: its order drawn from ``(seed, epoch)`` (:func:`sampler_order`), split over the ranks
            self.source = source
            if source is not None:
                n, world = len(source), self.num_replicas
                self.num_samples = n // world if self.drop_last else -(-n // world)
                self.total_size = self.num_samples * world

        def set_start(self, start: int) -> None:
            """Skip the first ``start`` samples of the next epoch's order (all ranks together)."""
            self.start = max(0, int(start))

        def __iter__(self) -> Iterator[int]:
            start, self.start = self.start, 0
            if not start and self.source is None:
                return super().__iter__()
            if self.source is not None:
                order = sampler_order(self.source, self.seed, self.epoch)
            elif self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + self.epoch)
                order = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
            else:
                order = list(range(len(self.dataset)))  # type: ignore[arg-type]
            n = len(order)
            world = self.num_replicas
            if self.drop_last:  # as DistributedSampler: the tail that does not divide is dropped
                end = start + (max(0, n - start) // world) * world
                rest = order[start:end]
            else:  # padded from the start of the order, as DistributedSampler pads
                rest = order[start:]
                pad = -len(rest) % world
                while pad > 0:
                    rest += order[:pad]
                    pad = -len(rest) % world
            return iter(rest[self.rank :: world])

    return ResumableDistributedSampler


def sampler_order(source: Any, seed: int, epoch: int) -> list[int]:
    """One epoch's order of the script's own sampler (``SubsetRandomSampler``,
    ``WeightedRandomSampler``, ``RandomSampler`` with replacement, a class of its own), a
    function of ``(seed, epoch)`` only: the same on every rank, and again after a resume or a
    heal. A sampler with a torch ``generator`` attribute draws from a fresh one seeded
    ``base + epoch`` (base: the seed of a generator the script gave it, else ``seed``); any
    other (a generator of another library too) draws from torch's,
    Python's and numpy's global generators, forked and seeded ``seed + epoch`` for the draw, so
    the script's own streams are not consumed."""
    import random
    import sys

    import torch

    mine = getattr(source, "generator", False)  # a user's object: torch's samplers have one
    if mine is None or isinstance(mine, torch.Generator):
        base = mine.initial_seed() if isinstance(mine, torch.Generator) else seed
        g = torch.Generator()
        g.manual_seed(base + epoch)
        source.generator = g
        try:
            return [int(i) for i in source]
        finally:
            source.generator = mine
    py = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + epoch)
            random.seed(seed + epoch)
            if np is not None:
                np.random.seed((seed + epoch) % 2**32)
            return [int(i) for i in source]
    finally:
        random.setstate(py)
        if np is not None:
            np.random.set_state(np_state)


def own_order(loader: Any) -> Any:
    """The script's own sampler whose order aios splits over the ranks (:func:`sampler_order`),
    or None for a ``SequentialSampler``, a plain ``RandomSampler`` (a shuffle of the dataset)
    and a ``DistributedSampler`` (its settings are kept). A sampler that shards by rank itself
    (``num_replicas``) is refused: aios cannot split it again."""
    from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

    sampler = loader.sampler
    if isinstance(sampler, (SequentialSampler, DistributedSampler)):
        return None
    if isinstance(sampler, RandomSampler) and not sampler.replacement:
        if sampler.num_samples == len(sampler.data_source):  # the whole dataset once: a shuffle
            return None
    if hasattr(sampler, "num_replicas"):
        raise ConfigError(
            f"the DataLoader's sampler {type(sampler).__name__} splits the data over ranks "
            "itself; aios splits a loader's order over its ranks and cannot split it again",
            "give the DataLoader a sampler of the whole order (without ranks) or a "
            "DistributedSampler, or leave this loader out of rt.setup (it then reads as its "
            "sampler says, and aios saves no position for it)",
        )
    return sampler


def script_order(loader: Any, shuffle: bool | None, seed: int) -> tuple[Any, Any, bool, int, bool]:
    """What the script's ``DataLoader`` asks of its order: ``(user, source, shuffle, seed,
    drop_last)``. ``user``: its ``DistributedSampler``, whose ``shuffle``, ``seed`` and
    ``drop_last`` stay; ``source``: a sampler of its own whose order is split
    (:func:`own_order`); else a ``RandomSampler`` means a shuffle seeded by ``seed``."""
    from torch.utils.data import DistributedSampler, RandomSampler

    user = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
    source = own_order(loader)  # a subset, weights, a sampler class of the script's own
    drop_last = bool(loader.drop_last)
    if user is not None:
        if shuffle is None:
            shuffle = bool(user.shuffle)
        seed = int(user.seed)
        drop_last = drop_last or bool(user.drop_last)
    elif shuffle is None:
        shuffle = isinstance(loader.sampler, RandomSampler)
    return user, source, bool(shuffle), seed, drop_last


_SAMPLER: type | None = None


def ResumableDistributedSampler(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - a class factory
    global _SAMPLER
    if _SAMPLER is None:
        _SAMPLER = _sampler_class()
    return _SAMPLER(*args, **kwargs)


def shard_dataloader(
    loader: Any,
    rank: int,
    world_size: int,
    seed: int,
    shuffle: bool | None = None,
    pin_memory: bool | None = None,
) -> Any:
    """A ``DataLoader`` like ``loader`` whose sampler is a :func:`ResumableDistributedSampler`
    for this rank. A ``DistributedSampler`` the script configured keeps its ``shuffle``,
    ``seed`` and ``drop_last`` (only its ranks become aios's); a ``RandomSampler`` means
    ``shuffle=True`` with ``seed``. Loaders that cannot be re-sharded (iterable datasets, custom
    batch samplers) are returned unchanged (with one process) or refused (with several)."""
    from torch.utils.data import (
        BatchSampler,
        DataLoader,
        IterableDataset,
    )

    if not isinstance(loader, DataLoader):
        return loader
    if isinstance(loader.dataset, IterableDataset):
        # iterable datasets shard themselves (e.g. via torch.utils.data.get_worker_info / rank)
        if loader.num_workers > 0 and _stateful(loader.dataset):
            raise ConfigError(
                f"the iterable dataset {type(loader.dataset).__name__} has state_dict(), but with "
                f"num_workers={loader.num_workers} its position lives in the worker processes, "
                "where aios cannot read it",
                "use num_workers=0 for a dataset whose position aios saves, or a map-style "
                "dataset (aios then saves the position itself)",
            )
        return loader
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        if world_size > 1:
            raise ConfigError(
                "a DataLoader with a custom batch_sampler cannot be sharded across ranks by aios",
                "pass batch_size=... instead of batch_sampler, or shard the data yourself and "
                "leave this loader out of rt.setup (aios then saves no position for it)",
            )
        return loader
    if getattr(loader.sampler, "_aios_sharded", False):
        return loader
    user, source, shuffle, seed, drop_last = script_order(loader, shuffle, seed)
    sampler = ResumableDistributedSampler(
        loader.dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        source=source,
    )
    sampler._aios_sharded = True
    #: the script's DistributedSampler: its set_epoch() calls choose the epoch (DeviceLoader)
    sampler._aios_user_sampler = user
    kwargs: dict[str, Any] = dict(
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory if pin_memory is None else pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator if loader.generator is not None else _new_generator(),
        persistent_workers=loader.persistent_workers,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, **kwargs)


def _stateful(dataset: Any) -> bool:
    """An iterable dataset that exposes its position (``state_dict``/``load_state_dict``)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def _new_generator() -> Any:
    import torch

    return torch.Generator()


def move_to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """Tensors in (nested) tuples, lists and dicts moved to ``device``; everything else as is."""
    if hasattr(batch, "to") and callable(batch.to) and hasattr(batch, "device"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(b, device, non_blocking) for b in batch]
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return type(batch)(moved)
    if isinstance(batch, dict):
        return type(batch)({k: move_to_device(v, device, non_blocking) for k, v in batch.items()})
    return batch


class _Tagged:
    """The loader's batches, each followed by the dataset's ``state_dict()`` as it is right after
    the batch was made (an iterable dataset's position, exact even when a device loader fetches
    ahead in a thread)."""

    def __init__(self, loader: Any, dataset: Any, states: collections.deque[Any]) -> None:
        self.loader, self.dataset, self.states = loader, dataset, states

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)  # made now, not at the first next() (see DeviceLoader._open)
        return self._tag(it)

    def _tag(self, it: Iterator[Any]) -> Iterator[Any]:
        for b in it:
            self.states.append(self.dataset.state_dict())
            yield b


class DeviceLoader:
    """Iterate a (sharded) loader with batches on ``device``, tracking the epoch and the global
    position inside it for checkpoints (see the module docstring).

    * Each ``iter()`` starts the current epoch; running it to the end advances the epoch. An
      iteration abandoned part-way counts as finished when the next one starts.
    * ``set_epoch(n)`` behaves like ``DistributedSampler.set_epoch``; so does ``set_epoch`` on a
      ``DistributedSampler`` the script built and passed in its loader.
    * ``state_dict()``/``load_state_dict()`` save and restore the position; after a load the
      next iteration resumes there, at any number of data-parallel ranks, without reading the
      skipped samples (resumable sampler, iterable dataset with ``state_dict()``), or, at the
      shape that saved it only, by reading and dropping the batches (any other loader).

    :param transfer: optional ``transfer(batch) -> batch`` replacing the default device move
        (XLA's parallel loader, pinned-memory copies).
    :param world: the data-parallel ranks reading different data (default: the sampler's
        ``num_replicas``, else 1).
    """

    def __init__(
        self,
        loader: Any,
        device: Any = None,
        transfer: Callable[[Any], Any] | None = None,
        non_blocking: bool = False,
        seed: int | None = None,
        rank: int = 0,
        world: int | None = None,
    ) -> None:
        self.loader = loader
        self.seed = seed
        self.rank = rank
        self.device = device
        sampler = getattr(loader, "sampler", None)
        self.world = int(world or getattr(sampler, "num_replicas", None) or 1)
        self.epoch = 0
        self.batch = 0  # batches of the current epoch handed out on this rank so far
        self._skip = 0
        self._start = 0  # global samples of the epoch consumed before this iteration began
        self._start_batch = 0
        self._active = False
        user = getattr(sampler, "_aios_user_sampler", None)
        #: the epoch of the script's own DistributedSampler when last seen
        self._user_epoch: int | None = None if user is None else int(user.epoch)
        self._dataset_state: Any = None  # an iterable dataset's position at the last batch
        self._dataset_states: collections.deque[Any] = collections.deque()
        #: the runtime's checkpoint manager (:class:`aios.checkpoint.manager.CheckpointManager`): its
        #: public ``at_batch_boundary()`` runs before each batch when ``pending`` is set
        self.owner: Any = None
        if transfer is not None:
            self._transfer: Callable[[Any], Any] | None = transfer
        elif device is None or getattr(device, "type", str(device)) == "cpu":
            self._transfer = None
        else:
            self._transfer = lambda b: move_to_device(b, device, non_blocking)

    # ---------------------------------------------------------------- pass-through
    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_size(self) -> Any:
        return getattr(self.loader, "batch_size", None)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._skip = 0
            self._start = self._start_batch = 0
            self.batch = 0
        self.epoch = int(epoch)
        self._active = False

    # ---------------------------------------------------------------- position
    def _movable(self) -> bool:
        """The position can be moved to another shape: a resumable sampler, or an iterable
        dataset that saves its own position."""
        return hasattr(self.sampler, "set_start") or self._stateful_dataset()

    def _stateful_dataset(self) -> bool:
        from torch.utils.data import IterableDataset

        ds = self.dataset
        return isinstance(ds, IterableDataset) and _stateful(ds)

    @property
    def samples(self) -> int:
        """Samples of this epoch's order consumed by all data-parallel ranks together."""
        per_batch = int(self.batch_size or 1) * self.world
        return self._start + (self.batch - self._start_batch) * per_batch

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "batch": self.batch,
            "samples": self.samples,
            "world": self.world,
        }
        if self.batch_size:
            state["batch_size"] = int(self.batch_size)
        if self._stateful_dataset():
            ds_state = self._dataset_state
            state["dataset"] = ds_state if ds_state is not None else self.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch = int(state.get("epoch", 0))
        batch = int(state.get("batch", 0))
        saved_world = int(state.get("world", self.world))
        saved_bs = state.get("batch_size")
        bs = int(self.batch_size or saved_bs or 1)
        if "samples" not in state:  # an older checkpoint: this rank's batch count
            samples = batch * int(saved_bs or bs) * saved_world
        else:
            samples = int(state["samples"])
        same_shape = saved_world == self.world and int(saved_bs or bs) == bs
        self.epoch = epoch
        self._active = False
        self._dataset_state = None
        if self._stateful_dataset():
            if state.get("dataset") is not None:
                self.dataset.load_state_dict(state["dataset"])
                self._dataset_state = state["dataset"]
            self._start, self._start_batch = samples, samples // (bs * self.world)
            self.batch, self._skip = self._start_batch, -1
            return
        if hasattr(self.sampler, "set_start"):
            self._start = samples
            self.batch = self._start_batch = samples // (bs * self.world)
            self._skip = -1  # set_start(samples) at the next iteration
            return
        if not same_shape and samples:
            raise CheckpointError(
                f"the checkpoint's data position ({samples} samples of epoch {epoch} over "
                f"{saved_world} ranks, batches of {saved_bs}) cannot be moved to {self.world} "
                f"ranks with batches of {bs}: this loader "
                f"({type(self.sampler or self.loader).__name__}) has no position aios can move",
                f"resume with the shape that saved it ({saved_world} data-parallel ranks, "
                f"batch size {saved_bs}), or give aios a DataLoader with batch_size=... over a "
                "map-style dataset, or an iterable dataset with state_dict()/load_state_dict()",
            )
        self.batch = batch
        self._start, self._start_batch = 0, 0
        self._skip = batch

    # ---------------------------------------------------------------- iteration
    def _user_sampler(self) -> Any:
        """The ``DistributedSampler`` the script built, if any."""
        return getattr(self.sampler, "_aios_user_sampler", None)

    def _follow_user_sampler(self) -> None:
        """A ``DistributedSampler`` the script built: the epoch it was given with
        ``set_epoch`` (when the script called it since the last iteration) is the epoch."""
        user = self._user_sampler()
        if user is None:
            return
        seen = int(user.epoch)
        if seen != self._user_epoch:
            self._user_epoch = seen
            if seen != self.epoch:
                self.set_epoch(seen)

    def __iter__(self) -> Iterator[Any]:
        self._follow_user_sampler()
        if self._active:  # the previous iteration was abandoned part-way
            self.epoch += 1
            self.batch = 0
            self._skip = 0
            self._start = self._start_batch = 0
        self._active = True
        skip, self._skip = self._skip, 0
        sampler = self.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        elif hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        drop = 0
        if skip == -1:  # a loaded global position
            if hasattr(sampler, "set_start"):
                sampler.set_start(self._start)
            at = self._start_batch
        elif skip:  # this rank's batch count (set by an older checkpoint's state)
            at = skip
            if hasattr(sampler, "set_start") and self.batch_size:
                self._start, self._start_batch = skip * int(self.batch_size) * self.world, skip
                sampler.set_start(self._start)
            else:
                self._start = self._start_batch = 0
                drop = skip
        else:
            at = 0
            self._start = self._start_batch = 0
            self._dataset_state = None
        return self._generate(at, drop)

    def _generate(self, at: int, drop: int) -> Iterator[Any]:
        self.batch = at
        transfer = self._transfer
        self._dataset_states.clear()
        it = self._open()
        for _ in range(drop):
            next(it, None)
            if self._dataset_states:
                self._dataset_states.popleft()
        owner = self.owner
        states = self._dataset_states if self._stateful_dataset() else None
        finished = False
        try:
            while True:
                if owner is not None and owner.pending:
                    owner.at_batch_boundary()
                try:
                    b = next(it)
                except StopIteration:
                    break
                self.batch += 1
                if states:
                    self._dataset_state = states.popleft()
                yield b if transfer is None else transfer(b)
            finished = True
        finally:
            if not finished:  # the loop broke out early (evaluation of N batches)
                self._abandon()
        self.epoch += 1
        self.batch = 0
        self._start = self._start_batch = 0
        self._dataset_state = None
        self._active = False

    def _source(self) -> Any:
        """What the batches are read from: the loader, tagged with an iterable dataset's
        position after each batch when it has one (see :class:`_Tagged`)."""
        if self._stateful_dataset():
            return _Tagged(self.loader, self.dataset, self._dataset_states)
        return self.loader

    def _open(self) -> Iterator[Any]:
        """A fresh iterator over this epoch's batches (subclasses: a device loader's)."""
        gen = getattr(self.loader, "generator", None)
        if gen is not None and self.seed is not None:
            # worker seeds depend on (seed, epoch, rank) only, never on where the global RNG is
            gen.manual_seed((self.seed * 1_000_003 + self.epoch * 7919 + self.rank) % (2**63))
        source = self._source()
        if gen is None and hasattr(self.loader, "_get_iterator"):
            import torch  # a DataLoader without generator draws its worker seed from the global RNG

            rng = torch.get_rng_state()
            it = iter(source)
            torch.set_rng_state(rng)
            return it
        return iter(source)

    def _abandon(self) -> None:
        """Called when an iteration stops part-way (subclasses free background workers)."""


def reshard_loader_state(
    state: dict[str, Any] | None,
    saved_world: int,
    world: int,
    saved_batch_size: int | None = None,
    batch_size: int | None = None,
) -> dict[str, Any] | None:
    """A loader position ``{"epoch", "batch"}`` saved on ``saved_world`` ranks with per-rank
    batches of ``saved_batch_size`` samples, re-derived for ``world`` ranks with ``batch_size``
    (default: the same) from the global sample count (see :mod:`aios.checkpoint.formats.dcp`)."""
    if state is None or "batch" not in state:
        return state
    old_bs = int(saved_batch_size or batch_size or 1)
    new_bs = int(batch_size or old_bs)
    if saved_world == world and old_bs == new_bs:
        return state
    consumed = int(state["batch"]) * old_bs * saved_world  # samples consumed over all ranks
    batch, rest = divmod(consumed, new_bs * world)
    if rest:
        warnings.warn(
            f"aios: data position ({consumed} samples over {saved_world} ranks) does not divide into batches of "
            f"{new_bs} x {world} ranks: resuming at batch {batch}, {rest} samples are seen twice (none skipped)",
            stacklevel=2,
        )
    return {**state, "batch": batch}
