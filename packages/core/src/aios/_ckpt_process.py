"""The first thing DCP's checkpoint process runs (``checkpoint.async_writer=process``).

That process is started with ``multiprocessing``'s ``spawn`` and lives in the training process's
process group, where a preemption ``SIGTERM`` (or a ``SIGINT``) sent to the whole group would kill
it in the middle of the save the training process is about to wait for. A blocked signal mask does
not survive ``spawn`` (CPython's ``fork_exec`` resets it), so the process shields itself as it
unpickles its target, before it imports torch: it ignores ``SIGTERM``/``SIGINT``/``SIGHUP`` (the
training process ends it, after the pending and emergency saves, by a message and then
``SIGKILL``) and asks the kernel to ``SIGKILL`` it when the training process dies, so it never
outlives its parent. Kept free of imports beyond the standard library: it runs before torch loads.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def shield(parent_pid: int) -> None:
    """In the checkpoint process: ignore the stop signals, die with ``parent_pid``."""
    for sig in _SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's exit handler still stops it
        pass
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)


def _unpickle(parent_pid: int) -> ShieldedTarget:
    shield(parent_pid)
    return ShieldedTarget(parent_pid)


class ShieldedTarget:
    """The checkpoint process's target: unpickling it (the first object ``spawn`` loads after
    its preparation data) shields the process; calling it runs DCP's own serving loop."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_unpickle, (self.parent_pid,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint._async_process_executor import _AsyncCheckpointProcess

        return _AsyncCheckpointProcess._checkpointing_subprocess(*args, **kwargs)
