"""Signals: SIGTERM/SIGINT end every ssh this process runs and unwind the launcher; cleanup
runs with them deferred; the open-file limit a launch needs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from aios.errors import AiosError

from aios_cloud.records import Log
from aios_cloud.ssh import kill_all

_SIGNALLED: list[int] = []
#: a Ctrl-C whose ``KeyboardInterrupt`` has not been handled yet: the handler's raise can land in
#: a weakref callback or ``__del__`` run by the garbage collector, where Python prints
#: "Exception ignored" and goes on; loops that must stop on Ctrl-C also check this
#: (:func:`raise_pending_interrupt`)
_PENDING_INT = [False]


def install_signal_handlers() -> None:
    """SIGTERM (and SIGINT) end every ssh this process runs at once, then unwind the main
    thread (SIGTERM as ``SystemExit(143)``, SIGINT as ``KeyboardInterrupt``), so the launcher's
    cleanup runs within seconds whatever a remote host does."""
    import signal

    def on_term(signum: int, _frame: Any) -> None:
        _SIGNALLED.append(signum)
        kill_all()
        raise SystemExit(128 + signum)

    def on_int(signum: int, _frame: Any) -> None:
        _SIGNALLED.append(signum)
        _PENDING_INT[0] = True
        kill_all()
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, on_term)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_int)


def interrupt_handled() -> None:
    """The Ctrl-C's ``KeyboardInterrupt`` reached its handler: nothing is pending."""
    _PENDING_INT[0] = False


def raise_pending_interrupt() -> None:
    """Raise the ``KeyboardInterrupt`` of a Ctrl-C that no handler has seen (it was swallowed
    where Python ignores exceptions)."""
    if _PENDING_INT[0]:
        _PENDING_INT[0] = False
        raise KeyboardInterrupt


def interruptible_sleep(seconds: float) -> None:
    """``time.sleep`` that raises a swallowed Ctrl-C's ``KeyboardInterrupt`` before and after."""
    import time

    raise_pending_interrupt()
    time.sleep(seconds)
    raise_pending_interrupt()


def terminated() -> bool:
    """Whether this process got SIGTERM."""
    import signal

    return signal.SIGTERM in _SIGNALLED


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Cleanup (deleting what the launch created) is not cut short by a second Ctrl-C or
    SIGTERM; the signals are ignored while it runs (SIGKILL still ends the process)."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)


MIN_OPEN_FILES = 128


def check_open_files(log: Log) -> None:
    """Raise the open-file limit to the hard limit when it is low (macOS defaults to 256);
    refuse to launch, with the fix, when it stays under :data:`MIN_OPEN_FILES`."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= 4096:
        return
    target = min(hard, 65536) if hard != inf else 65536
    for want in (target, 10240, 4096):
        if want <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            continue
        log(f"raised the open-file limit from {soft} to {want}")
        return
    if soft < MIN_OPEN_FILES:
        raise AiosError(
            f"the open-file limit is {soft} (hard limit {hard}); a launch needs {MIN_OPEN_FILES}",
            f"raise it with `ulimit -n {MIN_OPEN_FILES * 8}` and launch again",
        )
