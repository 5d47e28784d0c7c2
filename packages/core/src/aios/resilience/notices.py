"""Interruption notices: one model for every source.

A notice (:class:`aios.types.Notice`) says where it came from (``source``), why (``reason``) and
by when the host will be gone (``deadline``, wall-clock epoch seconds, or ``None`` when the
source does not say). Sources:

* **SIGTERM** (:class:`PreemptionMonitor`): the deadline is ``checkpoint.grace_seconds`` after
  the signal, capped by what the platform allows (:func:`effective_grace`): the launcher's
  :data:`aios.launcher.contract.GRACE_CAP_ENV` (``AIOS_RUN_GRACE_CAP``, e.g. ``15`` on GKE Spot
  nodes; the Kubernetes manifest and the Slurm script set it).
* **A known end** (:class:`DeadlineWatcher`): a launcher that knows when the capacity ends (a
  Capacity Block's end minus the 30 minutes AWS reclaims before it, a queued resource's
  ``--valid-until``, a Slurm job's time limit) sets :data:`aios.launcher.contract.DEADLINE_ENV`
  (``AIOS_RUN_DEADLINE``, epoch seconds) and optionally ``AIOS_RUN_DEADLINE_SOURCE`` for every
  rank; each rank announces the notice itself when the time left falls to what the emergency
  checkpoint needs (the measured save cost, :class:`aios.checkpoint.SaveCost`, plus a margin).
* **A notice file** (:class:`FileWatcher`): a sidecar touches a file, optionally with JSON
  ``{"source": ..., "reason": ..., "deadline": ...}`` in it.
* **Plugin watchers** (:func:`aios.plugins.hookspecs.aios_preemption_watchers`): a
  :class:`aios.types.PreemptionWatcher` whose ``start(notify)`` polls (a cloud's metadata
  server) and calls ``notify(Notice(source, reason, deadline))`` once.

A notice whose deadline lies further ahead than the emergency checkpoint needs (a Cloud TPU
maintenance window announced days ahead) is held, not acted on: the monitor's ``lead`` (the
runtime's estimate of what the emergency checkpoint needs) decides when it becomes due, as for
a known end, and the run trains on until then (said once, in one line, by ``on_defer``).

A notice only sets a flag; the runtime acts on it at the next optimizer-step boundary, where all
ranks agree (``strategy.any_rank``) so that every rank stops at the same step, with the earliest
deadline any rank heard. It writes the emergency checkpoint when the save fits before that
deadline (else it keeps the last committed checkpoint and says so in one line) and exits with
:data:`EXIT_PREEMPTED`. Relaunching with the same ``checkpoint.dir`` resumes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from aios.launcher.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV, GRACE_CAP_ENV
from aios.types import Notice, PreemptionWatcher

#: Exit status of a process (and of ``aios-run``) that stopped for a preemption notice after
#: writing its emergency checkpoint: 75 (``EX_TEMPFAIL``: "try again later"). A run killed by
#: SIGTERM *without* aios reports 143 (128 + 15); 75 says "checkpoint written, relaunch to resume".
EXIT_PREEMPTED = 75


def parse_seconds(text: str | None) -> float | None:
    """A number of seconds from an environment value; None when unset, empty or not a
    positive finite number."""
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v > 0 and v != float("inf") else None


def effective_grace(
    configured: float, env: Mapping[str, str] | None = None
) -> tuple[float, str | None]:
    """The seconds a process has after SIGTERM: ``checkpoint.grace_seconds`` capped by the
    platform (the launcher's ``AIOS_RUN_GRACE_CAP``).
    Returns ``(grace, what capped it)``; the second is None when the config's value stands."""
    source: Mapping[str, str] = os.environ if env is None else env
    grace, why = float(configured), None
    cap = parse_seconds(source.get(GRACE_CAP_ENV))
    if cap is not None and cap < grace:
        grace, why = cap, f"{GRACE_CAP_ENV}={cap:g}"
    return grace, why


class PreemptionMonitor:
    """Collects notices from signals and watchers into one flag (thread- and signal-safe).

    ``grace``: the seconds the platform leaves after a signal (:func:`effective_grace`); a
    signal's notice carries the deadline ``now + grace``. ``clock``: wall-clock seconds
    (``time.time``; tests inject one)."""

    def __init__(
        self,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        grace: float | None = None,
        clock: Callable[[], float] = time.time,
        lead: Callable[[], float] | None = None,
        on_defer: Callable[[Notice, float], None] | None = None,
    ) -> None:
        self.grace = grace
        self.clock = clock
        #: seconds before a notice's deadline at which it is due (None: every notice is due at
        #: once); a notice further ahead is held by a :class:`DeadlineWatcher` until then
        self.lead = lead
        #: called once per held notice with the seconds until it is due
        self.on_defer = on_defer
        #: notices held until their deadline comes within ``lead``
        self.deferred: list[Notice] = []
        #: the longest a held notice's watcher sleeps between looks at the clock
        self.defer_interval = 5.0
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
            if self._defer(notice):
                return
            self.notice = notice
            self.reason = notice.reason
            self.noticed_at = time.monotonic()

    #: a notice is held only when it would be due more than this many seconds from now: the
    #: short notices (a spot reclaim's 2 minutes, GCE's 30 s, a signal's grace) are acted on at
    #: once, as the platforms advise; a maintenance window announced hours ahead is held
    HOLD_AFTER = 300.0

    def _defer(self, notice: Notice) -> bool:
        """Hold a watcher's notice whose deadline is further ahead than ``lead`` (by more than
        :attr:`HOLD_AFTER`): a watcher announces it when it becomes due. A notice already held
        (the same source and deadline, polled again) is not held twice. Signals are never
        held (:meth:`_handler`)."""
        if self.lead is None or notice.deadline is None or notice in self.deferred:
            return notice in self.deferred
        try:
            lead = float(self.lead())
        except Exception:  # noqa: BLE001 - without an estimate the notice is due now
            return False
        ahead = notice.deadline - self.clock() - lead
        if ahead <= self.HOLD_AFTER:
            return False
        self.deferred.append(notice)
        held = DeadlineWatcher(
            notice.deadline,
            notice.source,
            self.lead,
            clock=self.clock,
            interval=self.defer_interval,
            notice=notice,
        )
        held.start(self._due)
        self._watchers.append(held)
        if self.on_defer is not None:
            self.on_defer(notice, ahead)
        return True

    def _due(self, notice: Notice | str) -> None:
        """A held notice became due: recorded as any other (first one wins)."""
        if self.reason is None and isinstance(notice, Notice):
            self.notice = notice
            self.reason = notice.reason
            self.noticed_at = time.monotonic()

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        deadline = None if self.grace is None else self.clock() + self.grace
        # a signal is acted on at once: the platform may end the process before its grace
        self._due(Notice(source=name.lower(), reason=f"signal {name}", deadline=deadline))

    @property
    def deadline(self) -> float | None:
        """The notice's deadline (wall clock), None without a notice or a deadline."""
        return None if self.notice is None else self.notice.deadline

    def time_left(self, now: float | None = None) -> float | None:
        """Seconds until the notice's deadline (negative: past it); None without one."""
        d = self.deadline
        return None if d is None else d - (self.clock() if now is None else now)

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


class DeadlineWatcher(PreemptionWatcher):
    """Announces a known end of the capacity in time for the emergency checkpoint.

    ``deadline``: wall-clock epoch seconds by which the host is gone. ``lead()``: the seconds
    the emergency checkpoint needs (the runtime passes the checkpoint manager's estimate of a
    save plus a step and a margin; re-read at each poll, so a measured save cost counts). The
    notice (``source``, ``deadline``) fires once ``deadline - now <= lead()``. ``clock`` and
    ``interval`` are injectable (tests); the thread sleeps until the next moment that matters,
    at most ``interval`` seconds.

    :meth:`from_env` builds one from the launcher's ``AIOS_RUN_DEADLINE`` /
    ``AIOS_RUN_DEADLINE_SOURCE`` (None when unset); core's plugin (:mod:`aios.plugins.builtin`)
    contributes it through ``aios_preemption_watchers`` like any notice source, and the runtime
    sets its :attr:`lead` to the emergency checkpoint's measured need before starting it."""

    name = "deadline"

    def __init__(
        self,
        deadline: float,
        source: str = "deadline",
        lead: Callable[[], float] = lambda: 60.0,
        clock: Callable[[], float] = time.time,
        interval: float = 5.0,
        notice: Notice | None = None,
    ) -> None:
        self.deadline = float(deadline)
        self._notice = notice
        self.source = source
        self.lead = lead
        self.clock = clock
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(
        cls, lead: Callable[[], float] = lambda: 60.0, env: Mapping[str, str] | None = None
    ) -> DeadlineWatcher | None:
        source: Mapping[str, str] = os.environ if env is None else env
        deadline = parse_seconds(source.get(DEADLINE_ENV))
        if deadline is None:
            return None
        return cls(deadline, source.get(DEADLINE_SOURCE_ENV) or "deadline", lead)

    def due(self, now: float | None = None) -> bool:
        """Whether the notice is due now (the time left is at most the lead)."""
        now = self.clock() if now is None else now
        return self.deadline - now <= self.lead()

    def notice(self) -> Notice:
        if self._notice is not None:
            return self._notice
        when = time.strftime("%H:%M:%S UTC", time.gmtime(self.deadline))
        return Notice(
            source=self.source, reason=f"{self.source} ends at {when}", deadline=self.deadline
        )

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def run() -> None:
            while not self._stop.is_set():
                if self.due():
                    notify(self.notice())
                    return
                left = self.deadline - self.clock() - self.lead()
                self._stop.wait(max(0.05, min(self.interval, left)))

        self._thread = threading.Thread(target=run, name="aios-deadline", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def read_notice_file(path: str) -> Notice:
    """The notice a file stands for: JSON ``{"source", "reason", "deadline"}`` when it holds
    that, else a notice without a deadline."""
    try:
        with open(path) as f:
            data = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    deadline = data.get("deadline")
    return Notice(
        source=str(data.get("source") or "file"),
        reason=str(data.get("reason") or f"notice file {path}"),
        deadline=float(deadline) if isinstance(deadline, (int, float)) else None,
    )


class FileWatcher(PreemptionWatcher):
    """A watcher that fires when a file appears (for tests and for orchestration that signals
    preemption by touching a file, e.g. a sidecar polling a cloud metadata server). The file
    may hold JSON ``{"source": ..., "reason": ..., "deadline": EPOCH_SECONDS}``
    (:func:`read_notice_file`)."""

    name = "file"

    def __init__(self, path: str, interval: float = 0.2) -> None:
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def poll() -> None:
            while not self._stop.wait(self.interval):
                if os.path.exists(self.path):
                    notify(read_notice_file(self.path))
                    return

        self._thread = threading.Thread(target=poll, name="aios-preempt-file", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
