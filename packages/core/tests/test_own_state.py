"""``aios.checkpoint.own``: a rank's own part of the model and optimizer state, as a replica
group's heal moves it (issue 36). Under fsdp the parameters and the optimizer's per-parameter
state are DTensors; they travel as local tensors and come back laid out as the receiving
parameters, into an optimizer that has no state yet (a restarted group before its first step).
One process, a one-rank gloo group (fully_shard on it makes real DTensor parameters)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def group() -> Iterator[None]:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model(seed: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    fully_shard(m)
    return m, torch.optim.Adam(m.parameters(), lr=0.01)


def _step(m, opt, x: torch.Tensor) -> None:
    m(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _over_the_wire(state: dict) -> dict:
    """What the heal's transport does to it (aios.ft.transport): saved, read back as data."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _locals(m) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in m.parameters()]


def test_a_fresh_fsdp_rank_takes_a_peer_s_shards_and_steps_as_it_does(group: None) -> None:
    from aios.checkpoint import own
    from torch.distributed.tensor import DTensor

    live, live_opt = _model(0)
    x = torch.randn(16, 4)
    for _ in range(3):
        _step(live, live_opt, x)
    fresh, fresh_opt = _model(1)  # other weights, no optimizer state yet
    assert not fresh_opt.state
    sent = {"m": own.module_state(live), "o": own.optimizer_state(live_opt)}
    # what travels holds no DTensor
    leaves = [*sent["m"].values(), *(v for s in sent["o"]["state"].values() for v in s.values())]
    assert leaves and not any(isinstance(t, DTensor) for t in leaves)
    sent = _over_the_wire(sent)
    own.load_module_state(fresh, sent["m"])
    own.load_optimizer_state(fresh_opt, sent["o"])
    assert all(torch.equal(a, b) for a, b in zip(_locals(fresh), _locals(live), strict=True))
    moments = [fresh_opt.state[p]["exp_avg"] for p in fresh.parameters()]
    assert all(isinstance(t, DTensor) for t in moments)
    # the next steps are the peer's, bitwise (the moments came with the shards)
    for _ in range(2):
        _step(live, live_opt, x)
        _step(fresh, fresh_opt, x)
    assert all(torch.equal(a, b) for a, b in zip(_locals(fresh), _locals(live), strict=True))


def test_a_peer_of_another_shape_is_named(group: None) -> None:
    from aios.checkpoint import own

    live, _ = _model(0)
    state = own.module_state(live)
    state["0.weight"] = torch.zeros(3, 3)
    fresh, _ = _model(1)
    with pytest.raises(ValueError, match=r"0.weight: the peer holds a \(3, 3\) shard"):
        own.load_module_state(fresh, state)
