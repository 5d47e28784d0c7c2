"""DataLoader worker processes leave preemption notices to their rank.

A preemption notice (SIGTERM, SIGINT) is for the rank: it sets a flag, and at the next step
boundary every rank writes the emergency checkpoint and exits 75. A loader's worker processes
must not die of the same signal, or the rank raises ``DataLoader worker (pid ...) exited
unexpectedly`` inside the step and no checkpoint is written. ``aios-run`` signals the ranks only
(never their process groups), but a notice sent to a whole group or job step (``kill -TERM
-PGID``, Slurm's ``scancel``, a terminal's Ctrl-C on a one-process run) still reaches the
workers. So:

* :class:`ShieldedInit` wraps a loader's ``worker_init_fn`` (chaining the script's own): the
  worker ignores SIGTERM and SIGINT from then on. ``rt.setup`` applies it to every loader it
  sets up, whatever the loader's multiprocessing context (fork, spawn, forkserver).
* :func:`install` (called by ``aios.init``): the same for every loader of the process, also those
  the script never passes to ``rt.setup``, whose workers are *forked* (the Linux default): torch's
  worker loop installs its signal handlers through
  ``torch.utils.data._utils.signal_handling._set_worker_signal_handlers``, which aios extends to
  ignore the two signals after torch's own handlers are set. Workers of a loader outside
  ``rt.setup`` started with ``multiprocessing_context="spawn"`` or ``"forkserver"`` are not
  reached (they import a fresh torch): pass the loader to ``rt.setup``.

Linux only (``sigwaitinfo``); elsewhere the workers keep torch's own handlers. Workers still stop
when their loader does (torch sends them the end-of-work marker) and when
their rank exits (torch's worker watchdog polls the parent pid); a worker that hangs is killed
with its rank's process group when the launcher's grace period ends (SIGKILL).

Nothing here imports torch at module level.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

#: the signals a loader worker leaves to its rank
NOTICE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

_installed = False
_shielded = False


def _rank_pids() -> set[int]:
    """The pids that own this worker: its parent, and the process that started it (the rank,
    also when a forkserver is the parent)."""
    import multiprocessing
    import os

    pids = {os.getppid()}
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        pids.add(int(parent.pid))
    return pids


def ignore_notices() -> None:
    """In a loader worker: SIGTERM and SIGINT no longer stop it, except a SIGTERM sent by its own
    rank (``Process.terminate()`` when the loader or the rank shuts its workers down, as torch's
    own worker handler allows). The signals are blocked and taken by a daemon thread with
    ``sigwaitinfo``, which sees the sender's pid; a plain ``SIG_IGN`` would also ignore the rank's
    ``terminate()`` and hang its exit (multiprocessing joins daemon children at exit)."""
    global _shielded
    if _shielded:
        return
    _shielded = True
    if sys.platform != "linux":  # pragma: no cover - no sigwaitinfo: torch's handlers stay
        return
    import os
    import threading

    owners = _rank_pids()
    signal.pthread_sigmask(signal.SIG_BLOCK, NOTICE_SIGNALS)  # the thread below inherits it

    def take() -> None:
        while True:
            info = signal.sigwaitinfo(NOTICE_SIGNALS)
            if info.si_signo == signal.SIGTERM and info.si_pid in owners:
                os._exit(0)  # the rank stops its worker: go quietly, like torch's handler

    threading.Thread(target=take, name="aios-loader-notices", daemon=True).start()


class ShieldedInit:
    """A ``worker_init_fn`` that makes the worker ignore preemption notices, then runs the
    script's own ``worker_init_fn`` (if any). Picklable (spawn/forkserver contexts) when the
    script's function is."""

    def __init__(self, init_fn: Callable[[int], Any] | None) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        ignore_notices()
        if self.init_fn is not None:
            self.init_fn(worker_id)

    def __repr__(self) -> str:
        return f"ShieldedInit({self.init_fn!r})"


def shield(loader: Any) -> Any:
    """Make the workers of ``loader`` (a ``torch.utils.data.DataLoader``) ignore preemption
    notices: its ``worker_init_fn`` becomes :class:`ShieldedInit` of the script's own. Anything
    that is not a DataLoader is returned unchanged. Returns ``loader``."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) and not isinstance(loader.worker_init_fn, ShieldedInit):
        loader.worker_init_fn = ShieldedInit(loader.worker_init_fn)
    return loader


def install() -> bool:
    """Process-wide: forked workers of every DataLoader of this process ignore preemption
    notices once torch has set its worker signal handlers. Idempotent; returns whether the hook
    is in place (False when this torch has no such seam; ``rt.setup``'s loaders are covered by
    :func:`shield` either way)."""
    global _installed
    if _installed:
        return True
    try:
        from torch.utils.data._utils import signal_handling

        original = signal_handling._set_worker_signal_handlers
    except (ImportError, AttributeError):  # pragma: no cover - a torch that moved it
        return False

    def _set_worker_signal_handlers(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        ignore_notices()
        return result

    _set_worker_signal_handlers.__wrapped__ = original  # type: ignore[attr-defined]
    signal_handling._set_worker_signal_handlers = _set_worker_signal_handlers
    _installed = True
    return True
