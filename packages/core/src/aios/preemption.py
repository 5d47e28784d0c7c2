"""Preemption notices: SIGTERM and plugin watchers (:func:`aios.hookspecs.aios_preemption_watchers`).

A notice only sets a flag; the runtime acts on it at the next optimizer-step boundary, where all
ranks agree (``strategy.any_rank``) so that every rank stops at the same step. The runtime then
writes an emergency checkpoint (deadline ``checkpoint.grace_seconds``) and exits with
:data:`EXIT_PREEMPTED`. Relaunching with the same ``checkpoint.dir`` resumes.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from aios.types import Notice

#: Exit status of a process (and of ``aios-run``) that stopped for a preemption notice after
#: writing its emergency checkpoint: 75 (``EX_TEMPFAIL``: "try again later"). A run killed by
#: SIGTERM *without* aios reports 143 (128 + 15); 75 says "checkpoint written, relaunch to resume".
EXIT_PREEMPTED = 75


class PreemptionMonitor:
    """Collects notices from signals and watchers into one flag (thread- and signal-safe)."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self.reason: str | None = None
        self.noticed_at: float | None = None
        #: the first notice, with its source and deadline (:class:`aios.types.Notice`)
        self.notice: Notice | None = None
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self._watchers: list[Any] = []
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- sources
    def notify(self, notice: Notice | str) -> None:
        """Record a notice (first one wins). Safe from signal handlers and watcher threads. A plain
        string is a notice without a deadline from an unnamed watcher (the 0.1 form)."""
        if self.reason is None:
            if isinstance(notice, str):
                notice = Notice(source="watcher", reason=notice)
            self.notice = notice
            self.reason = notice.reason
            self.noticed_at = time.monotonic()

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.notify(Notice(source=name.lower(), reason=f"signal {name}"))

    def install(self) -> None:
        """Handle the signals (main thread only; elsewhere only watchers work)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self._signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except (ValueError, OSError):  # pragma: no cover - not allowed here
                pass

    def start_watchers(
        self, watchers: list[Any], on_error: Callable[[str], None] | None = None
    ) -> None:
        for w in watchers:
            try:
                w.start(self.notify)
                self._watchers.append(w)
            except Exception as exc:  # noqa: BLE001 - a broken watcher must not stop training
                if on_error:
                    on_error(f"preemption watcher {getattr(w, 'name', w)!r} failed to start: {exc}")

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            try:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # pragma: no cover
                pass
        self._previous.clear()
        for w in self._watchers:
            try:
                w.stop()
            except Exception:  # noqa: BLE001
                pass
        self._watchers.clear()

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def elapsed(self) -> float:
        return 0.0 if self.noticed_at is None else time.monotonic() - self.noticed_at


class FileWatcher:
    """A watcher that fires when a file appears (for tests and for orchestration that signals
    preemption by touching a file, e.g. a sidecar polling a cloud metadata server)."""

    name = "file"

    def __init__(self, path: str, interval: float = 0.2) -> None:
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        import os

        def poll() -> None:
            while not self._stop.wait(self.interval):
                if os.path.exists(self.path):
                    notify(Notice(source="file", reason=f"notice file {self.path}"))
                    return

        self._thread = threading.Thread(target=poll, name="aios-preempt-file", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
