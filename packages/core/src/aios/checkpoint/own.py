"""This rank's own part of the model and optimizer state, read and written without a collective.

A replica group that heals (:mod:`aios.ft.replica`) takes the state of the same rank of a live
group of the same shape: under a sharded strategy (fsdp, tp) that rank holds the same shards, so
each rank's local tensors are all it needs, and no process of either group runs a collective
for it (the live group's state is read on torchft's quorum thread while the training waits for
the quorum; a collective there would race the group's own). DTensors travel as their local
tensors and come back as DTensors with the receiving parameter's mesh and placements; plain
tensors (ddp) travel as they are.

Torch is imported by the functions (a rank under replica groups has it loaded already).
"""

from __future__ import annotations

from typing import Any


def _local(value: Any) -> Any:
    """``value`` with every DTensor in it replaced by its local tensor (dicts, lists, tuples)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_local(v) for v in value)
    return value


def module_state(module: Any) -> dict[str, Any]:
    """The module's parameters and buffers as this rank holds them (its shards)."""
    return {k: _local(v) for k, v in module.state_dict().items()}


def load_module_state(module: Any, state: dict[str, Any]) -> None:
    """Copy :func:`module_state` of a rank of the same shape into the module, in place."""
    import torch
    from torch.distributed.tensor import DTensor

    own = module.state_dict()
    missing = sorted(set(own) ^ set(state))
    if missing:
        raise ValueError(f"the peer's state differs in {missing[:3]}")
    with torch.no_grad():
        for name, dst in own.items():
            local = dst.to_local() if isinstance(dst, DTensor) else dst
            if not isinstance(local, torch.Tensor):
                continue
            src = state[name]
            if tuple(src.shape) != tuple(local.shape):
                raise ValueError(
                    f"{name}: the peer holds a {tuple(src.shape)} shard, this rank "
                    f"{tuple(local.shape)}"
                )
            local.copy_(src)


def optimizer_state(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state as this rank holds it (its parameters' shards)."""
    return dict(_local(optimizer.state_dict()))


def load_optimizer_state(optimizer: Any, state: dict[str, Any]) -> None:
    """Load :func:`optimizer_state` of a rank of the same shape: each per-parameter tensor
    shaped as the parameter's shard becomes a DTensor laid out as that parameter."""
    import torch
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param: dict[Any, dict[str, Any]] = {}
    for index, values in state.get("state", {}).items():
        p = params[int(index)]
        shard = p.to_local() if isinstance(p, DTensor) else None
        per_param[index] = {
            k: DTensor.from_local(
                v, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
            if shard is not None
            and isinstance(v, torch.Tensor)
            and v.dim() > 0
            and tuple(v.shape) == tuple(shard.shape)
            else v
            for k, v in values.items()
        }
    optimizer.load_state_dict({**state, "state": per_param})
