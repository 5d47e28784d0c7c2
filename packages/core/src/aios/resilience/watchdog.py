"""The watchdog: a hang is named instead of endured.

Worker side (:mod:`aios.resilience.workers`): each rank under ``aios-run`` leaves its pid, a
mapped progress counter and a stack-dump file in the launch's status folder.

Launcher side (:class:`Watchdog`, a thread of ``aios-run``): polls the progress files; when NO
rank makes progress for the allowance of :class:`HangPolicy` it dumps every rank's stacks
(:func:`aios.resilience.stacks.collect`), prints a short summary
(:func:`~aios.resilience.stacks.summarize`), writes the full dump into the run
record (``<run dir>/watchdog/hang-<n>.txt``) and applies ``watchdog.action``. ``aios stacks`` and
SIGUSR1 to ``aios-run`` give the same view of a live run (``stacks-<n>.txt``).

Nothing here imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aios.launcher import status as rank_status
from aios.launcher.contract import LAUNCHER_PID_ENV, LOCAL_INDEX_ENV, STATUS_DIR_ENV
from aios.resilience import flightrec
from aios.resilience.stacks import Dump, collect, full_text, summarize
from aios.resilience.workers import alive, cpu_seconds, descendants, read_workers, registered

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import WatchdogSettings

#: exit status of ``aios-run`` when the watchdog stopped a hung run (as timeout(1) uses it)
EXIT_HUNG = 124
#: the signal that makes ``aios-run`` dump the stacks of its live run
DEMAND_SIGNAL = int(getattr(signal, "SIGUSR1", 10))


# ------------------------------------------------------------------------------ policy


class HangPolicy:
    """When no rank has made progress for too long. Pure (the caller passes the clock):

    * until the first step of an attempt: ``first_step`` seconds (compilation, loading,
      rendezvous), and at least the steady-state allowance;
    * after it: ``timeout`` seconds when fixed; ``auto``: ``max(min_timeout, factor x the
      slowest recent step)`` (per-step times measured by the ranks; until a step after the first
      was measured, ``first_step``). A run whose steps slow down ``factor`` times is no hang."""

    def __init__(
        self,
        timeout: float | None,
        first_step: float,
        min_timeout: float,
        factor: float,
        window: int = 64,
    ) -> None:
        self.timeout = timeout
        self.first_step = first_step
        self.min_timeout = min_timeout
        self.factor = factor
        self.samples: collections.deque[float] = collections.deque(maxlen=window)
        self.ranks: dict[int, tuple[int, float]] = {}
        self.last = 0.0
        self.stepped = False
        #: per rank: (CPU seconds, when read) of the last sample (before the first step)
        self.cpu: dict[int, tuple[float, float]] = {}
        #: when a rank last used the CPU (a compile, loading): the idle clock starts after it
        self.busy_at = 0.0

    def reset(self, now: float) -> None:
        """A new attempt (workers (re)started): the first-step allowance again."""
        self.samples.clear()
        self.ranks.clear()
        self.cpu.clear()
        self.last = now
        self.busy_at = now
        self.stepped = False

    #: a rank using at least this share of one CPU between two samples is busy (a compile on a
    #: loaded machine still gets more; a rank blocked in a collective or a lock gets ~0)
    BUSY_SHARE = 0.05

    def observe_cpu(self, rank: int, cpu: float, now: float) -> bool:
        """Before the first step: rank ``rank`` has used ``cpu`` CPU seconds by ``now``.
        Returns whether it was busy since its last sample."""
        prev = self.cpu.get(rank)
        self.cpu[rank] = (cpu, now)
        if prev is None or now <= prev[1]:
            self.busy_at = max(self.busy_at, now) if prev is None else self.busy_at
            return prev is None
        busy = (cpu - prev[0]) >= self.BUSY_SHARE * (now - prev[1])
        if busy:
            self.busy_at = now
        return busy

    def idle_timeout(self) -> float:
        """How long every rank may sit idle before the first step: ``timeout`` (``auto``:
        ``min_timeout``)."""
        return self.timeout if self.timeout is not None else self.min_timeout

    def idle_expired(self, now: float) -> bool:
        """Before the first step: every rank idle (no CPU progress) and no step for
        :meth:`idle_timeout`. A busy rank (a compile while the others wait) is no hang."""
        if self.stepped or not self.cpu:
            return False
        return now - max(self.last, self.busy_at) > self.idle_timeout()

    def observe(self, rank: int, steps: int, t: float, now: float) -> bool:
        """Rank ``rank`` has taken ``steps`` steps, the last at ``t`` (its clock); returns
        whether that is progress."""
        prev = self.ranks.get(rank)
        self.ranks[rank] = (steps, t)
        if prev is None:
            if steps:
                self.stepped = True
                self.last = now
                return True
            return False
        if steps <= prev[0]:
            return False
        if prev[0] >= 1 and t > prev[1]:  # steps after the first: their mean time
            self.samples.append((t - prev[1]) / (steps - prev[0]))
        self.stepped = True
        self.last = now
        return True

    def touch(self, now: float) -> None:
        """Something other than a step counts as progress (a worker came up or closed)."""
        self.last = now

    def allowance(self) -> float:
        steady = self.timeout
        if steady is None:
            steady = (
                max(self.min_timeout, self.factor * max(self.samples)) if self.samples else None
            )
        if not self.stepped or steady is None:
            return max(self.first_step, steady or 0.0)
        return steady

    def idle(self, now: float) -> float:
        return now - self.last

    def expired(self, now: float) -> bool:
        return now - self.last > self.allowance()


def policy_from(settings: Any) -> HangPolicy:
    t = settings.timeout
    return HangPolicy(
        None if t == "auto" else float(t),
        float(settings.first_step),
        float(settings.min_timeout),
        float(settings.factor),
    )


# ------------------------------------------------------------------------------ monitor


class Watchdog:
    """``aios-run``'s monitor thread over the ranks of this node (see the module docstring).

    ``on_hang(action)`` is called after a hang was dumped, with ``stop``/``restart``; the caller
    stops the workers (:meth:`kill_workers`) and keeps the restart budget or not. ``dump``
    only re-arms: the next dump comes after another full allowance without progress."""

    def __init__(
        self,
        settings: Any,
        status_dir: str,
        record_dir: str | None,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[int], float | None] = cpu_seconds,
    ) -> None:
        self.settings = settings
        #: CPU seconds a rank's process tree has used (tests inject it with the clock)
        self.cpu = cpu
        self.status_dir = status_dir
        self.record_dir = record_dir
        #: the environment the ranks run with: where their NCCL flight recorder pipes and dumps
        #: are (:mod:`aios.resilience.flightrec`)
        self.rank_env: dict[str, str] = dict(os.environ)
        self.say = say
        self.clock = clock
        self.policy = policy_from(settings)
        self.policy.reset(clock())
        self.pids: dict[int, int] = {}
        self.hang: dict[str, Any] | None = None  # the last hang of the current attempt
        self.idle_s = 0.0  # how long the last hang went without progress
        self.hangs = 0
        self.on_hang: Callable[[str], None] | None = None
        self._stop = threading.Event()
        self._demand = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop
    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._loop, name="aios-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._demand.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def request_dump(self, *_: Any) -> None:
        """On demand (SIGUSR1): dump the live run's stacks; the run goes on."""
        self._demand.set()

    def _loop(self) -> None:
        interval = float(self.settings.interval)
        while not self._stop.is_set():
            self._demand.wait(interval)
            if self._stop.is_set():
                return
            try:
                if self._demand.is_set():
                    self._demand.clear()
                    self.dump("on demand (SIGUSR1)", kind="stacks")
                self.check(self.clock())
            except Exception as exc:  # noqa: BLE001 - the watchdog must never take the run down
                self.say(f"watchdog: internal error, watching stops: {type(exc).__name__}: {exc}")
                return

    def check(self, now: float) -> bool:
        """One poll: feed the policy; on expiry dump and act. Returns whether a hang fired."""
        if not self.settings.enabled:
            return False
        workers = read_workers(self.status_dir)
        pol = self.policy
        live = {r: w for r, w in workers.items() if alive(w.pid)}
        if any(self.pids.get(r) not in (None, w.pid) for r, w in live.items()):
            pol.reset(now)  # a restart: new processes
            self.pids.clear()
            self.hang = None
        for r, w in live.items():
            if r not in self.pids:
                self.pids[r] = w.pid
                pol.touch(now)
            pol.observe(r, w.steps, w.last_step, now)
        watched = [w for w in live.values() if not w.closing]
        if not watched:  # nothing registered, or every rank is past its last step
            pol.touch(now)
            return False
        if not pol.stepped:  # before the first step: is any rank doing something?
            for w in watched:
                cpu = self.cpu(w.pid)
                if cpu is not None:
                    pol.observe_cpu(w.rank, cpu, now)
        if self.hang is not None:
            return False
        setting = self.settings.timeout
        if pol.idle_expired(now) and not pol.expired(now):
            idle = now - max(pol.last, pol.busy_at)
            why = (
                f"no rank made progress for {idle:.0f}s before the first step, every rank idle "
                f"(no CPU use) (watchdog.timeout={setting if setting == 'auto' else f'{setting:g}'}"
                + (f", min_timeout={pol.min_timeout:g}" if setting == "auto" else "")
                + ")"
            )
        elif pol.expired(now):
            idle = pol.idle(now)
            why = f"no rank made progress for {idle:.0f}s " + (
                f"(watchdog.timeout={setting:g})"
                if pol.stepped and setting != "auto"
                else f"(allowance {pol.allowance():.0f}s"
                + (", before the first step: watchdog.first_step)" if not pol.stepped else ")")
            )
        else:
            return False
        action = self.settings.action
        self.hangs += 1
        self.idle_s = idle
        path = self.dump(f"hang: {why}", kind="hang")
        if action == "dump":
            pol.touch(now)  # the next dump after another full allowance
            return True
        self.hang = {"why": why, "path": path, "action": action}
        if self.on_hang is not None:
            self.on_hang(action)
        return True

    # -- dumping
    def dump(self, reason: str, kind: str) -> str | None:
        """Collect, print the summary, write the full dump into the run record; returns its path."""
        dumps = collect(self.status_dir, float(self.settings.dump_wait))
        if not dumps:
            self.say(f"watchdog: {reason}: no rank registered yet (nothing to dump)")
            return None
        self.say(f"watchdog: {reason}; where each rank is:")
        for line in summarize(dumps):
            self.say("  " + line)

        records = flightrec.trigger_and_collect(
            {d.rank: self.rank_env for d in dumps}, float(self.settings.dump_wait)
        )
        for line in flightrec.summarize(records):
            self.say("  " + line)
        path = self._write(dumps, reason, kind)
        if path:
            self.say(f"watchdog: full stacks (every thread): {path}")
            folder = path[: -len(".txt")] + "-nccl"
            if flightrec.save(records, folder):
                self.say(
                    f"watchdog: NCCL flight recorder dumps: {folder} (`torchfrtrace {folder}`)"
                )
        return path

    def _write(self, dumps: list[Dump], reason: str, kind: str) -> str | None:
        if not self.record_dir:
            return None
        d = os.path.join(self.record_dir, "watchdog")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        try:
            os.makedirs(d, exist_ok=True)
            n = 1 + sum(1 for x in os.listdir(d) if x.startswith(kind + "-") and x.endswith(".txt"))
            node = min((x.node for x in dumps), default=0)
            base = os.path.join(d, f"{kind}-{n}" + (f"-node{node}" if node else ""))
            with open(base + ".txt", "w") as f:
                f.write(full_text(dumps, f"aios watchdog: {reason} ({stamp})"))
            with open(base + ".json", "w") as f:
                json.dump(
                    {
                        "reason": reason,
                        "time": time.time(),
                        # the seconds without progress before the hang was named (goodput: hung)
                        "idle_s": self.idle_s if kind == "hang" else 0.0,
                        "summary": summarize(dumps),
                        "ranks": [
                            {
                                "rank": x.rank,
                                "node": x.node,
                                "host": x.host,
                                "pid": x.pid,
                                "steps": x.steps,
                                "state": x.state,
                                "stacks": x.text,
                                "children": [
                                    {"pid": p, "state": s, "stacks": t} for p, s, t in x.children
                                ],
                            }
                            for x in dumps
                        ],
                    },
                    f,
                    indent=1,
                )
            return base + ".txt"
        except OSError as exc:
            self.say(f"watchdog: cannot write the dump into {d}: {exc}")
            return None

    def kill_workers(self, root: int | None = None) -> list[int]:
        """SIGKILL every process under ``root`` (default: this process, ``aios-run``): the ranks
        and their children; a hung rank acts on nothing gentler. Returns the pids signalled."""
        pids = [p for p in descendants(os.getpid() if root is None else root) if p != os.getpid()]
        for pid in reversed(pids):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return pids


def echo_err(line: str, prog: str = "aios-run") -> None:
    sys.stderr.write(f"{prog}: {line}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------ other launchers

#: the marker a watchdog leaves in the status folder when it stopped a hung run (cluster jobs
#: map the launcher's exit status to :data:`EXIT_HUNG` when it is there)
HUNG_MARKER = rank_status.HUNG


def start_sidecar(settings: Any, record_dir: str | None) -> bool:
    """Ranks started by a launcher other than ``aios-run`` that still set up a status folder (a
    cluster job of ``aios launch`` runs ``torchrun`` with ``AIOS_RUN_STATUS_DIR``): local rank 0
    starts the watchdog as its own process (``python -m aios.resilience.watchdog``), watching this node's
    ranks under their launcher (the rank's parent: torchrun's agent, a backend's spawner; a rank
    started by anything else gets none). It ends with that launcher; one per folder. Returns
    whether one was started."""
    import subprocess

    status_dir = os.environ.get(STATUS_DIR_ENV)
    # the rank's parent is a launcher: torchrun's agent (TORCHELASTIC_*) or a backend's spawner
    launched = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get(LOCAL_INDEX_ENV)
    if (
        not registered()
        or not settings.enabled
        or not status_dir
        or not launched
        or os.environ.get(LAUNCHER_PID_ENV)
        or os.environ.get("LOCAL_RANK", "0") != "0"
    ):
        return False
    try:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aios.resilience.watchdog",
                status_dir,
                str(os.getppid()),
                record_dir or "",
            ]
            + [settings.model_dump_json()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return False
    return True


def sidecar(status_dir: str, launcher: int, record_dir: str, settings: WatchdogSettings) -> int:
    """The watchdog beside a foreign launcher (see :func:`start_sidecar`): on a hang it leaves
    :data:`HUNG_MARKER`, stops the launcher (SIGTERM; not for ``action=restart``) and kills the
    ranks. Returns when the launcher is gone."""
    import fcntl

    with open(os.path.join(status_dir, "watchdog.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another rank's (a restarted rank 0's) watchdog runs already
        dog = Watchdog(settings, status_dir, record_dir or None, lambda m: echo_err(m, "aios"))

        def on_hang(action: str) -> None:
            with open(os.path.join(status_dir, HUNG_MARKER), "w") as f:
                f.write((dog.hang or {}).get("why", "hang") + "\n")
            if action != "restart":
                with contextlib.suppress(OSError):
                    os.kill(launcher, signal.SIGTERM)  # no restart, and it exits non-zero
            dog.kill_workers(launcher)

        dog.on_hang = on_hang
        signal.signal(DEMAND_SIGNAL, dog.request_dump)
        interval = float(settings.interval)
        while alive(launcher):
            if dog._demand.wait(interval):
                dog._demand.clear()
                dog.dump("on demand (SIGUSR1)", kind="stacks")
            dog.check(dog.clock())
    return 0


if (
    __name__ == "__main__"
):  # python -m aios.resilience.watchdog STATUS_DIR LAUNCHER_PID RECORD_DIR SETTINGS
    # the sidecar's own process reads its settings (pydantic) here: importing this module
    # (`aios check`'s outcome hint, the launcher) loads no pydantic
    from aios.config.settings import WatchdogSettings

    _settings = WatchdogSettings.model_validate_json(sys.argv[4])
    sys.exit(sidecar(sys.argv[1], int(sys.argv[2]), sys.argv[3], _settings))
