"""The base of every checkpoint format (see :mod:`aios.checkpoint.manager`, "Extension point:
checkpoint formats"). A module of its own so that formats (``dcp``, a plugin's) derive from it
without importing the manager."""

from __future__ import annotations

from typing import Any


class CheckpointFormat:
    """How training state becomes files in a staging directory (see the module docstring)."""

    name = "base"
    #: a checkpoint written at one world size can be loaded at another
    supports_resharding = False
    #: every rank writes its own files (else only the rank(s) where ``saves_on_this_rank()``)
    all_ranks_write = False

    def save(self, step: int, ctx: Any, staging: Any, store: Any) -> dict[str, Any]:
        raise NotImplementedError

    def load(
        self, info: Any, store: Any, target: Any, rank: int = 0, strict: bool = True
    ) -> dict[str, Any]:
        raise NotImplementedError


__all__ = ["CheckpointFormat"]
