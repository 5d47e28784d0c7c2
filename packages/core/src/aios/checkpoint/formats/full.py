"""The ``full`` checkpoint format: one ``state.pt`` (``torch.save`` of the whole state, every
rank's RNG state included), written by the saving rank and read by every rank."""

from __future__ import annotations

from typing import Any

from aios.checkpoint.files import torch_save
from aios.checkpoint.formats.base import CheckpointFormat, SaveContext
from aios.checkpoint.store import STATE_FILE

__all__ = ["FullStateFormat"]


class FullStateFormat(CheckpointFormat):
    """One ``state.pt`` (``torch.save`` of the full state), written by the saving rank."""

    name = "full"

    def save(self, step: int, ctx: SaveContext, staging: Any, store: Any) -> dict[str, Any]:
        state = ctx.full_state()
        entry = store.write_file(staging, STATE_FILE, lambda f: torch_save(state, f))
        return {STATE_FILE: entry}

    def load(
        self, info: Any, store: Any, target: Any, rank: int = 0, strict: bool = True
    ) -> dict[str, Any]:
        state = store.load(info)
        # the state's tensors are backed by the checkpoint file (CheckpointStore.load): the
        # model's are copied into its parameters; all else (optimizer moments, which an
        # optimizer adopts as they are, objects, extra) gets memory of its own, so that nothing
        # the run keeps holds the file, whose disk space pruning must free
        for key, value in state.items():
            if key != "modules":
                state[key] = _own_memory(value)
        target.load_state_dict(state, strict=strict, rank=rank)
        return state.get("extra", {}) or {}


def _own_memory(obj: Any) -> Any:
    """``obj`` with every tensor inside (dicts, lists, tuples) cloned."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = _own_memory(v)
        return obj
    if isinstance(obj, list):
        obj[:] = [_own_memory(v) for v in obj]
        return obj
    if isinstance(obj, tuple):
        items = [_own_memory(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj
