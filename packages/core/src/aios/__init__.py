"""aios: one PyTorch training script on CPU, CUDA, Cloud TPU and Trainium.

Importing :mod:`aios` is cheap: torch is imported only when a runtime is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aios.__about__ import __version__
from aios.plugins.hookspecs import hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from aios.runtime import Runtime

__all__ = ["__version__", "hookimpl", "init", "Runtime"]


def __getattr__(name: str) -> Any:
    if name in ("init", "Runtime", "current"):
        from aios import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'aios' has no attribute {name!r}")
