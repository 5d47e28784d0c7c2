"""Device data loading for XLA: rank sharding, fixed shapes, background transfer, resumable position.

:func:`xla_shard_loader` re-creates a ``torch.utils.data.DataLoader`` with the core's resumable
rank-sharded sampler, ``drop_last=True`` (a short last batch would compile a second graph) and a
CPU generator (XLA generators are not supported).

:class:`XlaDeviceLoader` is the core :class:`aios.data.loaders.DeviceLoader` (epoch/batch position saved
in checkpoints, pending checkpoints written before the next batch) whose batches come through
torch_xla's ``MpDeviceLoader``: host-to-device transfer in a background thread, ``prefetch``
batches ahead, one graph cut per batch, and in SPMD mode every tensor sharded on its batch axis
over the device mesh.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from aios.data.loaders import DeviceLoader, shard_dataloader


def _fixed_shape_copy(loader: Any, drop_last: bool, seed: int) -> Any:
    """``loader`` with ``drop_last`` on and a CPU generator, when it can be rebuilt."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset

    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        return loader
    generator = loader.generator
    bad_gen = generator is not None and generator.device.type != "cpu"
    if bad_gen:
        warnings.warn(
            f"the DataLoader's generator is on {generator.device}; aios uses a CPU generator "
            "(XLA generators are not supported)",
            UserWarning,
            stacklevel=4,
        )
        generator = torch.Generator("cpu")
        generator.manual_seed(seed)
    if not bad_gen and (loader.drop_last or not drop_last):
        return loader
    kwargs: dict[str, Any] = dict(
        batch_size=loader.batch_size,
        sampler=loader.sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=False,
        drop_last=drop_last or loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=generator,
        persistent_workers=loader.persistent_workers,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(loader.dataset, **kwargs)


def xla_shard_loader(
    loader: Any, rank: int, world: int, seed: int, shuffle: bool | None, drop_last: bool
) -> Any:
    """This rank's share of ``loader`` with fixed batch shapes (see module docstring)."""
    return shard_dataloader(
        _fixed_shape_copy(loader, drop_last, seed), rank, world, seed, shuffle, pin_memory=False
    )


class BatchSharding:
    """Shard every tensor of a batch on dim 0 over the mesh's ``data`` axis, whatever its rank;
    duck-types torch_xla's ``ShardingSpec`` for ``send_cpu_data_to_device``."""

    minibatch = False

    def __init__(self, mesh: Any, axis: str = "data") -> None:
        self.mesh = mesh
        self.axis = axis
        self._specs: dict[int, Any] = {}

    def spec_for(self, ndim: int) -> Any:
        import torch_xla.distributed.spmd as xs

        if ndim not in self._specs:
            self._specs[ndim] = xs.ShardingSpec(self.mesh, (self.axis, *([None] * (ndim - 1))))
        return self._specs[ndim]

    def xla_spec(self, t: Any) -> Any:
        if t.dim() == 0:
            return None
        return self.spec_for(t.dim()).xla_spec(t)


class XlaDeviceLoader(DeviceLoader):
    """Batches on an XLA device through ``MpDeviceLoader`` with the core loader's resumable
    position (the global position of :mod:`aios.data.loaders`), ``len()`` and ``set_epoch()``."""

    def __init__(
        self,
        loader: Any,
        device: Any,
        prefetch: int = 2,
        input_sharding: Any = None,
        batches_per_execution: int = 1,
        world: int | None = None,
    ) -> None:
        super().__init__(loader, device, transfer=lambda b: b, world=world)
        self.prefetch = max(1, prefetch)
        self.input_sharding = input_sharding
        self.batches_per_execution = batches_per_execution
        self._mp: Any = None

    def _open(self) -> Iterator[Any]:
        if self._mp is None:
            import torch_xla.distributed.parallel_loader as pl

            kwargs: dict[str, Any] = dict(
                loader_prefetch_size=max(2, self.prefetch * 2),
                device_prefetch_size=self.prefetch,
                batches_per_execution=self.batches_per_execution,
            )
            if self.input_sharding is not None:
                kwargs["input_sharding"] = self.input_sharding
            # the loader, or its batches tagged with an iterable dataset's position (the
            # transfer thread reads ahead; the position of each batch comes with it)
            self._mp = pl.MpDeviceLoader(self._source(), self.device, **kwargs)
        return iter(self._mp)  # closes the previous epoch's background loader, if any

    def close(self) -> None:
        """Stop the background transfer thread (an iteration abandoned part-way keeps it)."""
        pl = getattr(self._mp, "_parallel_loader", None)
        if pl is not None:
            pl.close()

    def _abandon(
        self,
    ) -> None:  # an iteration broke out early (evaluation of N batches): free the thread
        self.close()
