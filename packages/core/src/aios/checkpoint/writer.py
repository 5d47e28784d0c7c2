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

import logging
import os
import signal
import sys
from typing import Any

_SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def shield(parent_pid: int) -> None:
    """In the checkpoint process: ignore the stop signals, die with ``parent_pid``, and yield
    the CPU and disk to training."""
    for sig in _SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    yield_to_training()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's exit handler still stops it
        pass
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)


def yield_to_training() -> None:
    """Run only on CPU time training leaves idle (Linux ``SCHED_IDLE``; elsewhere niceness 19)
    and, on Linux, at the lowest best-effort I/O priority. Set here, in the process's first
    thread before it starts any other (gloo's, DCP's writer threads), so that every thread
    inherits it: where cores are scarce the write proceeds in the gaps of the training step
    (collectives, data loading) instead of slowing it down, and at full speed once training
    waits for it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19 - os.nice(0))
        except OSError:
            pass
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import platform

        nr = {"x86_64": 251, "aarch64": 30}.get(platform.machine())  # Linux's ioprio_set
        if nr is not None:
            # IOPRIO_WHO_PROCESS, this thread (and those it starts), class best-effort, level 7
            ctypes.CDLL(None, use_errno=True).syscall(nr, 1, 0, (2 << 13) | 7)
    except (OSError, AttributeError):
        pass


def _unpickle(parent_pid: int) -> ShieldedTarget:
    shield(parent_pid)
    return ShieldedTarget(parent_pid)


class _WarningsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


class ShieldedTarget:
    """The checkpoint process's target: unpickling it (the first object ``spawn`` loads after
    its preparation data) shields the process; calling it runs DCP's own serving loop."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_unpickle, (self.parent_pid,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint._async_process_executor import _AsyncCheckpointProcess

        # DCP sets the root logger to INFO there and logs its start and every request to the
        # training process's stderr: its warnings and errors only (one line per event)
        logging.getLogger().addFilter(_WarningsOnly())

        return _AsyncCheckpointProcess._checkpointing_subprocess(*args, **kwargs)
