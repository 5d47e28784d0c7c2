"""Workers never outlive their launcher.

``aios-run`` starts every worker with :func:`child_preexec` (Linux: ``PR_SET_PDEATHSIG`` =
SIGKILL, so the kernel kills the worker the moment the launcher's forking thread dies, even by
SIGKILL, and whichever way the worker's process group or session was arranged) and exports its
pid as :data:`LAUNCHER_PID_ENV`. A worker that runs ``aios.init()`` also calls
:func:`watch_launcher`: the same death signal for itself where the platform has it, plus a
daemon thread that polls the launcher pid (the portable fallback, and the guard for processes
that are not the launcher's direct children, e.g. started by a backend's own launcher).

Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from aios.launcher.contract import LAUNCHER_PID_ENV

PR_SET_PDEATHSIG = 1
_watching = False


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.prctl
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        return fn
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies. Linux only;
    returns whether it was set."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def child_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` run in the forked child: parent death signal
    SIGKILL, and if the parent already died between fork and now, die at once. ``None`` where
    the platform has no parent death signal (the worker-side watchdog covers it)."""
    prctl = _PRCTL
    if prctl is None:
        return None
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:  # runs between fork and exec: no imports, no allocation-heavy work
        prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigkill)

    return preexec


def process_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a launcher killed but not yet reaped is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), "" where unknown; with
    the pid it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def watch_launcher(interval: float = 0.5) -> bool:
    """In a worker started by ``aios-run``: die with the launcher. Idempotent; returns whether a
    launcher is being watched."""
    global _watching
    raw = os.environ.get(LAUNCHER_PID_ENV, "")
    if _watching or not raw.isdigit():
        return _watching
    launcher = int(raw)
    direct_child = os.getppid() == launcher
    if direct_child:
        set_parent_death_signal(signal.SIGKILL)
    if not process_alive(launcher) or (direct_child and os.getppid() != launcher):
        os.kill(os.getpid(), signal.SIGKILL)
    ppid = os.getppid()

    def watch() -> None:
        import time

        while True:
            time.sleep(interval)
            if not process_alive(launcher) or (direct_child and os.getppid() != ppid):
                # the launcher is gone: nobody will collect this worker's result or stop it
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="aios-launcher-watch", daemon=True).start()
    _watching = True
    return True
