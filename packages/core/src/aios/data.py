"""Data loading helpers shared by strategies: rank sharding with a resumable position, and a
loader wrapper that moves batches to the device and remembers where it is in the epoch.

* :class:`ResumableDistributedSampler`: ``DistributedSampler`` whose order depends only on
  ``(seed, epoch)`` (never on the global RNG) and that can start part-way into an epoch, so a
  resumed run sees exactly the batches an uninterrupted run would have seen.
* :func:`shard_dataloader`: rebuild a ``DataLoader`` with that sampler (same batch size,
  workers, collate function, ``drop_last``).
* :class:`DeviceLoader`: what ``runtime.setup`` returns for a loader; iterating it yields batches
  on the device; ``state_dict()`` is ``{"epoch", "batch"}`` and is saved in checkpoints.

Torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def _sampler_class() -> type:
    from torch.utils.data import DistributedSampler

    class ResumableDistributedSampler(DistributedSampler):
        """``DistributedSampler`` that can skip the first ``start`` samples of this rank's shard
        for one epoch (resume mid-epoch). Works with ``num_replicas=1`` too."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.start = 0

        def set_start(self, start: int) -> None:
            self.start = max(0, int(start))

        def __iter__(self) -> Iterator[int]:
            indices = list(super().__iter__())
            start, self.start = self.start, 0
            return iter(indices[start:])

    return ResumableDistributedSampler


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
    for this rank. Loaders that cannot be re-sharded (iterable datasets, custom batch samplers)
    are returned unchanged (with one process) or refused (with several)."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

    from aios.errors import ConfigError

    if not isinstance(loader, DataLoader):
        return loader
    if isinstance(loader.dataset, IterableDataset):
        # iterable datasets shard themselves (e.g. via torch.utils.data.get_worker_info / rank)
        return loader
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        if world_size > 1:
            raise ConfigError(
                "a DataLoader with a custom batch_sampler cannot be sharded across ranks by aios",
                "pass batch_size=... instead of batch_sampler, or shard the data yourself and "
                "call setup_dataloaders(..., use_distributed_sampler=False)",
            )
        return loader
    if getattr(loader.sampler, "_aios_sharded", False):
        return loader
    if shuffle is None:
        shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = ResumableDistributedSampler(
        loader.dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=loader.drop_last,
    )
    sampler._aios_sharded = True
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


class DeviceLoader:
    """Iterate a (sharded) loader with batches on ``device``, tracking the epoch and the batch
    position inside it for checkpoints.

    * Each ``iter()`` starts the current epoch; running it to the end advances the epoch. An
      iteration abandoned part-way counts as finished when the next one starts.
    * ``set_epoch(n)`` behaves like ``DistributedSampler.set_epoch``.
    * ``state_dict()``/``load_state_dict()`` save and restore ``(epoch, batch)``; after a load the
      next iteration resumes at that batch without reading the skipped ones (when the sampler is
      resumable) or by reading and dropping them (any other loader).

    :param transfer: optional ``transfer(batch) -> batch`` replacing the default device move
        (XLA's parallel loader, pinned-memory copies).
    """

    def __init__(
        self,
        loader: Any,
        device: Any = None,
        transfer: Callable[[Any], Any] | None = None,
        non_blocking: bool = False,
        seed: int | None = None,
        rank: int = 0,
    ) -> None:
        self.loader = loader
        self.seed = seed
        self.rank = rank
        self.device = device
        self.epoch = 0
        self.batch = 0  # batches of the current epoch handed out so far
        self._skip = 0
        self._active = False
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
            self.batch = 0
        self.epoch = int(epoch)
        self._active = False

    # ---------------------------------------------------------------- position
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state.get("epoch", 0))
        self.batch = int(state.get("batch", 0))
        self._skip = self.batch
        self._active = False

    # ---------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Any]:
        if self._active:  # the previous iteration was abandoned part-way
            self.epoch += 1
            self.batch = 0
            self._skip = 0
        self._active = True
        skip, self._skip = self._skip, 0
        sampler = self.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        elif hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        drop = 0
        if skip:
            if hasattr(sampler, "set_start") and self.batch_size:
                sampler.set_start(skip * self.batch_size)
            else:
                drop = skip
        return self._generate(skip, drop)

    def _generate(self, skip: int, drop: int) -> Iterator[Any]:
        self.batch = skip
        transfer = self._transfer
        it = self._open()
        for _ in range(drop):
            next(it, None)
        owner = self.owner
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
                yield b if transfer is None else transfer(b)
            finished = True
        finally:
            if not finished:  # the loop broke out early (evaluation of N batches)
                self._abandon()
        self.epoch += 1
        self.batch = 0
        self._active = False

    def _open(self) -> Iterator[Any]:
        """A fresh iterator over this epoch's batches (subclasses: a device loader's)."""
        gen = getattr(self.loader, "generator", None)
        if gen is not None and self.seed is not None:
            # worker seeds depend on (seed, epoch, rank) only, never on where the global RNG is
            gen.manual_seed((self.seed * 1_000_003 + self.epoch * 7919 + self.rank) % (2**63))
        if gen is None and hasattr(self.loader, "_get_iterator"):
            import torch  # a DataLoader without generator draws its worker seed from the global RNG

            rng = torch.get_rng_state()
            it = iter(self.loader)
            torch.set_rng_state(rng)
            return it
        return iter(self.loader)

    def _abandon(self) -> None:
        """Called when an iteration stops part-way (subclasses free background workers)."""
