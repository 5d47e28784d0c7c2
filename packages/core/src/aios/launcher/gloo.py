"""Letting gloo's worker threads finish before the interpreter finalizes.

``ProcessGroupGloo`` runs each collective on a worker thread (named ``pt_gloo_runloop``) that
drops its reference to the collective's ``Work`` just after completing it. Since torch 2.13
a collective launched during backward carries a Python object in its captured thread-local
state (``torch.autograd.graph`` stashes a ``contextvars.Context`` there), so the worker that
drops the last reference takes the GIL. If the main thread has begun finalizing by then, the
worker is ended inside a ``noexcept`` destructor and the process dies of ``std::terminate``
(SIGABRT, "terminate called without an active exception") after the script itself succeeded.
The same thread can still be running a collective a peer has not joined yet.

:func:`wait_for_idle_workers` waits, with the GIL released, until every such thread of this
process is parked on its work queue (an untimed futex wait, read from
``/proc/self/task/<tid>/syscall``). It runs from aios's exit handler before the process group
is destroyed, so no rank finalizes while its gloo threads still hold work.
"""

from __future__ import annotations

import os
import platform
import time

RUNLOOP_THREAD = "pt_gloo_runloop"
_FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower()
)  # the futex syscall's number on this architecture
_FUTEX_WAIT_BITSET = 9  # pthread_cond_wait's futex command
_FUTEX_CMD_MASK = 0x7F  # strips FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME


def runloop_threads() -> list[int]:
    """Thread ids of this process's gloo worker threads (empty where /proc is missing)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    found = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == RUNLOOP_THREAD:
                    found.append(int(tid))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return found


def is_parked(tid: int) -> bool:
    """Whether thread ``tid`` of this process sleeps in an untimed condition-variable wait,
    which is where a gloo worker waits for its next collective. A thread running, preempted,
    waiting for the GIL (a timed wait) or for a peer (timed) is not parked."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return True  # the thread is gone: it holds nothing
    if _FUTEX_SYSCALL is None or len(fields) < 5 or fields[0] != str(_FUTEX_SYSCALL):
        return False
    try:
        op, timeout = int(fields[2], 16), int(fields[4], 16)
    except ValueError:
        return False
    return (op & _FUTEX_CMD_MASK) == _FUTEX_WAIT_BITSET and timeout == 0


def wait_for_idle_workers(timeout: float = 5.0, poll: float = 0.002) -> bool:
    """Wait up to ``timeout`` seconds for every gloo worker thread to be parked. True when
    they are (or there are none), False on timeout (a collective a peer never joined)."""
    deadline = time.monotonic() + timeout
    # two readings in a row: a worker between two collectives is parked for an instant
    settled = 0
    while True:
        if all(is_parked(t) for t in runloop_threads()):
            settled += 1
            if settled == 2:
                return True
        else:
            settled = 0
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)  # releases the GIL: a worker waiting for it can finish
