"""The global data position of :mod:`aios.data.loaders` (issue 26): a position saved by ``W`` ranks
resumes on ``W'`` ranks with every sample of the epoch exactly once; at the same shape each rank
gets what an uninterrupted ``DistributedSampler`` gives it; a loader whose position cannot be
moved is refused in one line. In-process, no process group (each rank's loader built alone)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aios.data.loaders import DeviceLoader, ResumableDistributedSampler, shard_dataloader  # noqa: E402
from aios.errors import CheckpointError, ConfigError  # noqa: E402
from torch.utils.data import (  # noqa: E402
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)


def _loaders(n: int, world: int, batch: int, shuffle: bool = True, drop_last: bool = False):
    ds = TensorDataset(torch.arange(n))
    return [
        DeviceLoader(
            shard_dataloader(
                DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=drop_last),
                rank,
                world,
                seed=7,
            ),
            world=world,
        )
        for rank in range(world)
    ]


def _take(loader: DeviceLoader, batches: int | None = None) -> list[int]:
    out: list[int] = []
    for i, (b,) in enumerate(loader):
        out += b.tolist()
        if batches is not None and i + 1 == batches:
            break
    return out


@pytest.mark.parametrize(
    ("n", "world", "batch", "stop", "new_world", "new_batch"),
    [
        (960, 2, 8, 18, 1, 8),
        (960, 2, 8, 18, 3, 8),
        (960, 3, 8, 5, 2, 16),
        (960, 4, 4, 7, 3, 5),  # 112 consumed: not a multiple of 3 x 5
        (100, 2, 8, 3, 3, 4),
    ],
)
def test_a_position_saved_on_w_ranks_resumes_on_another_number_exactly_once(
    n, world, batch, stop, new_world, new_batch
):
    before = _loaders(n, world, batch)
    seen: list[int] = []
    for ld in before:
        seen += _take(ld, stop)
    # a checkpoint cut at the next batch boundary: every rank's state is the same global one
    states = [ld.state_dict() for ld in before]
    for st in states:
        st["epoch"] = 0  # the cut is mid-epoch: the abandoned iteration does not count
    assert {st["samples"] for st in states} == {stop * batch * world}
    after = _loaders(n, new_world, new_batch)
    for ld in after:
        ld.load_state_dict(states[0])
        assert ld.samples == stop * batch * world
        seen += _take(ld)
    assert set(seen) == set(range(n))
    # padding (drop_last=False) repeats at most new_world - 1 samples, at the end only
    assert len(seen) - n < new_world


def test_at_the_same_shape_each_rank_resumes_with_what_an_uninterrupted_sampler_gives():
    ds = TensorDataset(torch.arange(103))
    for rank in range(2):
        want = list(DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7))
        (ld,) = [_loaders(103, 2, 4)[rank]]
        ld.load_state_dict({"epoch": 0, "samples": 5 * 4 * 2, "world": 2, "batch_size": 4})
        assert _take(ld) == want[5 * 4 :]


def test_drop_last_drops_only_the_tail_the_new_world_cannot_divide():
    ld = _loaders(50, 1, 5, drop_last=True)[0]
    first = _take(ld, 2)
    st = ld.state_dict()
    seen: list[int] = []
    for new in _loaders(50, 3, 5, drop_last=True):
        new.load_state_dict(st)
        seen += _take(new)
    # 40 left: the sampler keeps 39 (13 per rank), the loader drops each rank's short batch
    assert len(seen) == 30 and len(set(seen)) == 30 and not set(seen) & set(first)


def test_the_scripts_distributed_sampler_keeps_shuffle_seed_drop_last_and_set_epoch():
    ds = TensorDataset(torch.arange(17))
    mine = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3, drop_last=True)
    ld = DeviceLoader(shard_dataloader(DataLoader(ds, batch_size=2, sampler=mine), 1, 2, seed=0))
    for epoch in (0, 1, 4):
        mine.set_epoch(epoch)
        ref = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3, drop_last=True)
        ref.set_epoch(epoch)
        assert _take(ld) == list(ref), epoch


def test_a_loader_whose_position_cannot_move_is_refused_at_another_shape_in_one_line():
    ds = TensorDataset(torch.arange(40))
    custom = BatchSampler(SequentialSampler(ds), batch_size=4, drop_last=False)
    ld = DeviceLoader(DataLoader(ds, batch_sampler=custom), world=1)
    with pytest.raises(CheckpointError) as ei:
        ld.load_state_dict({"epoch": 0, "batch": 3, "samples": 24, "world": 2, "batch_size": 4})
    text = str(ei.value)
    assert "\n" not in text and "cannot be moved to 1 ranks" in text and "2 data-parallel" in text
    # at the shape that saved it, the batches are read and dropped
    ld.load_state_dict({"epoch": 0, "batch": 3, "samples": 12, "world": 1, "batch_size": 4})
    assert _take(ld)[:4] == [12, 13, 14, 15]


class _Counting(IterableDataset):
    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]

    def __iter__(self):
        while self.pos < 30:
            self.pos += 1
            yield self.pos - 1


def test_an_iterable_dataset_with_state_dict_saves_the_position_of_the_batches_received():
    ds = _Counting()
    ld = DeviceLoader(DataLoader(ds, batch_size=4), world=1)
    it = iter(ld)
    next(it), next(it)
    assert ld.state_dict()["dataset"] == {"pos": 8}
    ds2 = _Counting()
    ld2 = DeviceLoader(DataLoader(ds2, batch_size=4), world=1)
    ld2.load_state_dict({**ld.state_dict(), "epoch": 0})
    assert next(iter(ld2)).tolist() == [8, 9, 10, 11]
    with pytest.raises(ConfigError, match="num_workers=2"):
        shard_dataloader(DataLoader(_Counting(), batch_size=4, num_workers=2), 0, 1, seed=0)


def test_the_sampler_alone_splits_the_rest_of_the_order_over_the_new_ranks():
    ds = TensorDataset(torch.arange(10))
    got = []
    for rank in range(3):
        s = ResumableDistributedSampler(ds, num_replicas=3, rank=rank, shuffle=False)
        s.set_start(3)
        got.append(list(s))
    assert got == [[3, 6, 9], [4, 7, 0], [5, 8, 1]]  # padded from the start of the order
