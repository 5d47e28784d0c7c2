"""A long-lived lock contender for test_lock_atomic.py: each round it waits at the barrier with
the others, tries to take the lock of ``ckdir`` once and reports whether it won."""

from __future__ import annotations

from typing import Any


def take(ckdir: str, rounds: int, barrier: Any, results: Any, me: int) -> None:
    from aios.checkpoint import CheckpointStore
    from aios.errors import CheckpointError

    for _ in range(rounds):
        barrier.wait()
        store = CheckpointStore(ckdir, keep=None)
        try:
            store.acquire_lock({"run_id": f"taker-{me}"})
            won = True
        except CheckpointError:
            won = False
        results.put((me, won))
