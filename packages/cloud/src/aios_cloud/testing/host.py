"""A host that its cloud takes back at a deadline, for interruption-notice tests.

A cloud that announces an interruption ends the machine at a time it fixes: EC2 at the spot
``instance-action``'s ``time``, Compute Engine 30 s after ``instance/preempted``, Cloud TPU at the
maintenance window's start, the kubelet at the pod's grace, EC2 again at a Capacity Block's end
minus 30 minutes. Then every process on the machine dies at once, whatever it was doing.

:class:`Host` stands for such a machine: the command it starts (``aios-run``) runs in a session
of its own, and every process descended from it is the host's, including the ranks, which
``aios-run`` starts in process groups of their own. The notice stand-ins
(:meth:`aios_cloud_aws.testing.imds.ImdsServer.interrupt`,
:meth:`aios_cloud_gcp.testing.FakeMetadataServer.preempt` and ``announce``,
:func:`aios_cloud_k8s.testing.delete_pod`) call :meth:`Host.reclaim_at` with the platform's
deadline; at that wall-clock time the host SIGKILLs the process group of every process it has
seen, as a terminated VM's processes die, and records what ``inspect`` saw just after (e.g. the
committed checkpoints). A host whose processes all ended before the deadline has nothing left
to kill: the record is taken when the last one is gone (nothing of it can change the disk
after that), so a passing test never waits for a deadline it beat.

Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _children() -> dict[int, list[int]]:
    """Every live process's children, from ``/proc/<pid>/stat`` (zombies left out)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


class Host:
    """A machine running ``cmd``; see the module docstring.

    ``clock``: wall-clock seconds (the deadlines the platforms give are wall-clock times).
    ``poll``: seconds between looks at the process tree while waiting for the deadline."""

    def __init__(
        self,
        cmd: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        poll: float = 0.05,
    ) -> None:
        self.clock = clock
        self.poll = poll
        self._cmd, self._env, self._cwd = list(cmd), env, cwd
        self.proc: subprocess.Popen[str] | None = None
        self.pid = 0
        #: every process of the host seen so far (the ranks outlive a killed launcher briefly)
        self.pids: set[int] = set()
        #: the deadline the platform set (:meth:`reclaim_at`)
        self.deadline: float | None = None
        #: when the host was killed; None when its processes had all ended before the deadline
        self.killed_at: float | None = None
        #: the processes the kill found running
        self.killed: list[int] = []
        #: what ``inspect`` returned at the kill (or when the last process ended before it)
        self.at_deadline: Any = None
        self.ended_at: float | None = None
        self._output: list[str] = []
        self._reader = threading.Thread(target=self._read, name="host-output", daemon=True)
        self._reclaimer: threading.Thread | None = None

    def start(self) -> Host:
        """Boot the machine: start the command (in a session of its own)."""
        self.proc = subprocess.Popen(
            self._cmd,
            env=self._env,
            cwd=self._cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.pids.add(self.pid)
        self._reader.start()
        if self._reclaimer is not None:  # a deadline given before the boot
            self._reclaimer.start()
        return self

    def __enter__(self) -> Host:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ processes
    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._output.append(line)

    @property
    def output(self) -> str:
        return "".join(self._output)

    def _scan(self) -> None:
        kids = _children()
        todo = [p for p in self.pids if _alive(p)]
        while todo:
            p = todo.pop()
            for c in kids.get(p, ()):
                if c not in self.pids:
                    self.pids.add(c)
                    todo.append(c)

    def running(self) -> list[int]:
        """The host's processes still running (the launcher reaped when it exited)."""
        if self.proc is None:
            return []
        self._scan()
        if self.proc.poll() is not None and self.ended_at is None:
            self.ended_at = self.clock()
        return sorted(p for p in self.pids if _alive(p))

    # ------------------------------------------------------------------ the platform's side
    def signal_main(self, sig: int = signal.SIGTERM) -> None:
        """Signal the host's main process only (a container's PID 1, a VM's service), as the
        kubelet and a shutting-down OS do."""
        assert self.proc is not None, "the host is not started"
        self.proc.send_signal(sig)

    def stop(self) -> None:
        """The machine goes away now: SIGKILL to the process group of every process it runs."""
        running = self.running()
        self.killed_at = self.clock()
        self.killed = running
        groups = set()
        for p in running:
            try:
                groups.add(os.getpgid(p))
            except ProcessLookupError:
                continue
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in running:  # one that left its group (setsid) dies with the machine too
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 10
        while self.running() and time.monotonic() < end:
            time.sleep(0.01)

    def reclaim_at(self, deadline: float, inspect: Callable[[], Any] | None = None) -> None:
        """Kill the host at ``deadline`` (wall clock) unless every process of it ended before;
        ``inspect()`` then records the state the deadline found (:attr:`at_deadline`). May be
        called before :meth:`start` (a deadline known at launch)."""
        if self._reclaimer is not None:
            raise RuntimeError("this host already has a deadline")
        self.deadline = deadline

        def run() -> None:
            while self.clock() < deadline:
                if not self.running():
                    break
                time.sleep(min(self.poll, max(0.0, deadline - self.clock())))
            else:
                self.stop()
            self.at_deadline = inspect() if inspect is not None else None

        self._reclaimer = threading.Thread(target=run, name="host-reclaim", daemon=True)
        if self.proc is not None:
            self._reclaimer.start()

    # ------------------------------------------------------------------ the test's side
    def wait(self, timeout: float) -> int:
        """The main process's exit status once the host is done (its deadline passed or every
        process ended); kills the host and raises ``TimeoutError`` after ``timeout`` seconds."""
        assert self.proc is not None, "the host is not started"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            reclaimer_done = self._reclaimer is None or not self._reclaimer.is_alive()
            if self.proc.poll() is not None and not self.running() and reclaimer_done:
                self._reader.join(5)
                return self.proc.returncode
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"host still running after {timeout:g}s:\n{self.output[-3000:]}")

    def close(self) -> None:
        if self.proc is None:
            return
        if self.running():
            self.stop()
        self.proc.wait()
