"""The random-number state of a process, captured and restored in ONE place: Python's
``random``, NumPy's legacy global generator (when NumPy is installed), torch's CPU generator, and
the device part the strategy gives (CUDA, XLA: :meth:`aios.strategies.base.Strategy.rng_state`);
and the streams of a rank a checkpoint has none for (a world size larger than the saving run's),
derived from ``(seed, step, rank)`` (:func:`reseed`).

Checkpoints (full and sharded), the emergency save and ``rt.rng_state()`` all go through
:func:`capture` and :func:`restore`; the stored form is plain (lists and tensors) so that
``torch.load(weights_only=True)`` reads it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from typing import Any

__all__ = ["capture", "reseed", "reseed_value", "restore"]


def capture(device: dict[str, Any] | None = None) -> dict[str, Any]:
    """This process's RNG states, with ``device`` (the strategy's device RNG state) under
    ``"device"``."""
    import torch

    v, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [v, list(internal), gauss], "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy as np

        s: Any = np.random.get_state()  # numpy's stub omits the legacy tuple
        state["numpy"] = [
            s[0],
            torch.from_numpy(s[1].astype("int64")),
            int(s[2]),
            int(s[3]),
            float(s[4]),
        ]
    state["device"] = device or {}
    return state


def restore(state: dict[str, Any]) -> dict[str, Any]:
    """Restore what :func:`capture` returned (the parts present); returns the device part, for
    the caller to hand to its strategy's ``set_rng_state``."""
    import torch

    if "python" in state:
        v, internal, gauss = state["python"]
        random.setstate((v, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy as np

            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    return state.get("device") or {}


def reseed_value(seed: int | None, step: int, rank: int) -> int:
    """The seed a rank without saved RNG state gets (documented rule, deterministic)."""
    h = hashlib.sha256(f"aios-dcp-reseed:{seed or 0}:{step}:{rank}".encode()).digest()
    return int.from_bytes(h[:8], "little") % 2**63


def reseed(seed: int | None, step: int, rank: int) -> int:
    """Seed Python, NumPy and torch for a rank beyond the saved world size; returns the seed
    (the caller seeds the device RNG with it too)."""
    import torch

    value = reseed_value(seed, step, rank)
    random.seed(value)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(value % 2**32)
    torch.manual_seed(value)
    return value
