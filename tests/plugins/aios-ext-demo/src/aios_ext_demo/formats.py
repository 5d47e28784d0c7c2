"""Checkpoint format ``demo-pickle``: the whole state in one ``demo-state.pt`` written by the
saving rank, read back whole."""

from __future__ import annotations

import io
from typing import Any

from aios.checkpoint.formats.base import CheckpointFormat

STATE = "demo-state.pt"


class PickleFormat(CheckpointFormat):
    name = "demo-pickle"

    def save(self, step: int, ctx: Any, staging: Any, store: Any) -> dict[str, Any]:
        import torch

        state = ctx.full_state()
        return {STATE: store.write_file(staging, STATE, lambda f: torch.save(state, f))}

    def load(
        self, info: Any, store: Any, target: Any, rank: int = 0, strict: bool = True
    ) -> dict[str, Any]:
        import torch

        state = torch.load(io.BytesIO(store.read_file(info, STATE)), weights_only=False)
        target.load_state_dict(state, strict=strict, rank=rank)
        return state.get("extra", {}) or {}
