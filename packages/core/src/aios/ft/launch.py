"""``aios-run``'s side of ``ft.replica_groups``: the lighthouse and the groups' processes.

aios-run starts torchft's lighthouse in its own process, bound to the run's interface only
(``master_addr``; 127.0.0.1 for a local run) on a free port, starts G groups of N/G processes
(each group its own torch.distributed world, rendezvous port and manager store), and watches
them. A group with a failed process is lost: its other processes are stopped and the group alone
is started again (``ft.max_restarts`` times each); the other groups never restart. One line per
event. The run ends when every group has ended; its status is 0 when every group's last start
ended 0.

Each group's ranks register in a status folder of the group's own (``AIOS_RUN_STATUS_DIR``, as
aios-run's ranks without groups; :mod:`aios.resilience.workers`): SIGUSR1 to aios-run prints
where every rank of every live group is and writes the full stacks into the group's run record
(the run goes on), ``aios stacks`` finds the groups' folders as it finds any run's, and a group
judged hung has its stacks dumped before it is stopped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from aios.checkpoint.lock import LOCK_HEARTBEAT_S
from aios.checkpoint.store import CheckpointStore
from aios.ft import (
    GROUP_ENV,
    GROUPS_ENV,
    LIGHTHOUSE_ENV,
    RESTARTED_AT_ENV,
    STATE_DIR_ENV,
    STORE_PORT_ENV,
)
from aios.ft.hang import HangWatch
from aios.ft.hang import limit as hang_limit
from aios.ft.plan import rust_log
from aios.launcher import boot
from aios.launcher.contract import RUN_ID_ENV, STATUS_DIR_ENV
from aios.launcher.worker import child_preexec
from aios.resilience.notices import EXIT_PREEMPTED
from aios.resilience.watchdog import DEMAND_SIGNAL, EXIT_HUNG, Watchdog

PROG = "aios"
#: seconds aios-run waits for the groups past ``checkpoint.grace_seconds`` after a notice
STOP_MARGIN_S = 30.0


def start_lighthouse(cfg: Any) -> tuple[Any, str]:
    """torchft's lighthouse on ``master_addr`` (a free port); returns ``(server, address)``."""
    # torchft's Rust side reads RUST_LOG once, when it is loaded: per-step INFO lines off
    os.environ["RUST_LOG"] = rust_log(cfg, dict(os.environ))
    from torchft._torchft import LighthouseServer

    ft = cfg.ft
    server = LighthouseServer(
        bind=f"{cfg.master_addr}:0",
        min_replicas=1,
        join_timeout_ms=ft.join_timeout_ms,
        quorum_tick_ms=ft.quorum_tick_ms,
        heartbeat_timeout_ms=ft.heartbeat_timeout_ms,
    )
    port = server.address().rsplit(":", 1)[1].strip("/")
    return server, f"http://{cfg.master_addr}:{port}"


def committed_step(state_dir: str, group: int) -> int:
    """The last step a group committed (written by its rank 0, :mod:`aios.ft.replica`)."""
    try:
        with open(os.path.join(state_dir, f"group{group}.step")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


#: the access-log line torchft's HTTP checkpoint server (``http.server``) writes to stderr for
#: every state a healing group fetches: dropped unless ``ft.log`` asks for torchft's logs
ACCESS_LOG = re.compile(rb'^\S+ - - \[[^\]]*\] "[A-Z]+ /checkpoint/')


def _relay(src: IO[bytes], dst: IO[bytes], prefix: bytes, quiet: bool) -> None:
    """Copy a process's output to ``dst`` line by line, each line with the rank's prefix (as
    aios-run's ``[rankN]:``), so that the groups' lines never interleave within a line."""
    for line in iter(src.readline, b""):
        if quiet and ACCESS_LOG.match(line):
            continue
        dst.write(prefix + line)
        dst.flush()
    src.close()


class RunLock:
    """``checkpoint.dir``'s writer lock, held by aios-run for the whole run: one group writes
    each checkpoint (the first in the step's quorum, :meth:`aios.ft.replica.Replica.\
writes_checkpoints`), and which one changes when a group is lost, so no group's process holds
    it. Taken before any group starts (another run's lock: the one-line refusal), refreshed
    every :data:`aios.checkpoint.LOCK_HEARTBEAT_S`, released when the run ends."""

    def __init__(self, cfg: Any, run_id: str, echo: Callable[[str], None]) -> None:
        self.store = CheckpointStore(cfg.checkpoint.dir, keep=cfg.checkpoint.keep)
        self.store.check_writable()
        self.store.acquire_lock({"run_id": run_id, "started": time.time()})
        self.echo = echo
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="aios-ft-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(LOCK_HEARTBEAT_S):
            if not self.store.heartbeat():
                self.echo(f"{PROG}: {self.store.lost or 'lost the checkpoint lock'}")
                return

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.store.release_lock()


class Groups:
    """The replica groups of one run on this host (see the module docstring)."""

    def __init__(
        self,
        cfg: Any,
        nprocs: int,
        command: list[str],
        env: dict[str, str],
        free_port: Callable[[str], int],
        echo: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.command = command
        self.env = env
        self.free_port = free_port
        self.echo = echo
        self.groups = int(cfg.ft.replica_groups)
        self.per_group = nprocs // self.groups
        self.procs: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.relays: dict[int, list[threading.Thread]] = {}
        self.restarts = dict.fromkeys(range(self.groups), 0)
        self.done: dict[int, int] = {}
        self.state_dir = tempfile.mkdtemp(prefix="aios-ft-")
        self.lighthouse: Any = None
        self.address = ""
        #: the stop notice (SIGTERM/SIGINT) aios-run received and forwarded to every group: the
        #: groups stop at the same step (the writer saves the emergency checkpoint) and none is
        #: restarted
        self.stopping: int | None = None
        self.stop_by = float("inf")
        self.lock: RunLock | None = None
        #: a group that stopped stepping while another goes on is lost too (aios.ft.hang)
        self.hangs = HangWatch(self.state_dir, self.per_group, hang_limit(cfg.ft))
        #: each group's status folder and its stack dumper (see the module docstring)
        record = os.path.abspath(os.path.join(cfg.logging.run_dir, env.get(RUN_ID_ENV, "")))
        self.dogs = {
            g: Watchdog(
                cfg.watchdog,
                os.path.join(self.state_dir, f"status{g}"),
                record if g == 0 else os.path.join(record, f"group{g}"),
                lambda line: self.echo(f"{PROG}: {line}"),
            )
            for g in range(self.groups)
        }
        #: SIGUSR1 to aios-run: the stacks of every live group, at the next look
        self.dump_asked = threading.Event()

    def _group_env(self, g: int, rank: int, master_port: int, store_port: int) -> dict[str, str]:
        n = self.per_group
        return {
            **self.env,
            "RANK": str(rank),
            "LOCAL_RANK": str(g * n + rank),  # the group's devices on this host
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": self.cfg.master_addr,
            "MASTER_PORT": str(master_port),
            GROUP_ENV: str(g),
            GROUPS_ENV: str(self.groups),
            LIGHTHOUSE_ENV: self.address,
            STORE_PORT_ENV: str(store_port),
            STATE_DIR_ENV: self.state_dir,
            STATUS_DIR_ENV: self.dogs[g].status_dir,
            "RUST_LOG": rust_log(self.cfg, self.env),
        }

    def start(self, g: int, restarted: bool = False) -> None:
        status = self.dogs[g].status_dir  # the processes of this start register anew
        shutil.rmtree(status, ignore_errors=True)
        os.makedirs(status)
        addr = self.cfg.master_addr
        master, store = self.free_port(addr), self.free_port(addr)
        procs, relays = [], []
        for rank in range(self.per_group):
            env = self._group_env(g, rank, master, store)
            if restarted:
                env[RESTARTED_AT_ENV] = repr(time.time())
            proc = subprocess.Popen(  # the parent death signal, as every aios-run worker
                self.command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=child_preexec(os.getpid()),
            )
            prefix = f"[rank{g * self.per_group + rank}]:".encode()
            for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
                assert src is not None
                quiet = not self.cfg.ft.log
                t = threading.Thread(target=_relay, args=(src, dst, prefix, quiet), daemon=True)
                t.start()
                relays.append(t)
            procs.append(proc)
        self.procs[g] = procs
        self.relays[g] = relays

    def _stop(self, g: int) -> None:
        procs = self.procs[g]
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for t in self.relays.pop(g, []):
            t.join(timeout=10)  # the processes' last lines, before the next event's line

    def _lost(self, g: int, why: str) -> bool:
        """Group ``g`` lost a process (or hung): stop the rest, restart it. False when out of
        restarts."""
        self._stop(g)
        self.hangs.forget(g)
        alive = self.groups - len(self.done) - 1
        step = max((committed_step(self.state_dir, o) for o in range(self.groups)), default=0)
        self.echo(
            f"{PROG}: replica group {g} lost at step {step} ({why}); "
            f"{alive} of {self.groups} groups training"
        )
        if self.restarts[g] >= self.cfg.ft.max_restarts:
            self.echo(
                f"{PROG}: replica group {g} used its {self.cfg.ft.max_restarts} restarts "
                "(ft.max_restarts); the run fails"
            )
            return False
        self.restarts[g] += 1
        self.echo(
            f"{PROG}: restarting replica group {g} ({self.restarts[g]}/"
            f"{self.cfg.ft.max_restarts}); it heals from a live group"
        )
        self.start(g, restarted=True)
        return True

    def notice(self, signum: int, _frame: Any = None) -> None:
        """SIGTERM/SIGINT to aios-run: forwarded to every process of every group (each rank's
        notice handler; the groups agree on the step to stop at, :mod:`aios.ft.replica`).
        SIGHUP (the terminal or the ssh session closed) reaches the ranks as SIGTERM, as torch's
        elastic agent passes it on without groups."""
        if signum == signal.SIGHUP:
            signum = signal.SIGTERM
        if self.stopping is None:  # a rank that outlives its grace is not waited for
            grace = float(self.cfg.checkpoint.grace_seconds) + STOP_MARGIN_S
            self.stop_by = time.monotonic() + grace
        self.stopping = signum
        for procs in list(self.procs.values()):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)

    def _watch(self) -> int | None:
        """One look at every group; the run's exit status once it has ended, else None."""
        for g, procs in list(self.procs.items()):
            if g in self.done:
                continue
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed and self.stopping is not None:  # stopped on the notice: never restarted
                if all(c is not None for c in codes):
                    self.done[g] = failed[0]
            elif failed:
                if not self._lost(g, _describe(failed[0])):
                    return failed[0] if failed[0] > 0 else 128 - failed[0]
            elif all(c == 0 for c in codes):
                self.done[g] = 0
                open(os.path.join(self.state_dir, f"group{g}.done"), "w").close()
        live = [g for g in self.procs if g not in self.done]
        if self.dump_asked.is_set():
            self.dump_asked.clear()
            for g in live:
                self.dogs[g].dump(f"on demand (SIGUSR1), replica group {g}", kind="stacks")
        for g in self.hangs.look(live) if self.stopping is None else []:
            why = f"hung: no step for {self.hangs.limit_s:.0f}s while another group stepped"
            self.dogs[g].dump(f"replica group {g} {why}", kind="hang")
            if not self._lost(g, why):
                return EXIT_HUNG
        if self.stopping is not None and time.monotonic() > self.stop_by:
            left = sorted(set(range(self.groups)) - set(self.done))
            self.echo(
                f"{PROG}: replica groups {left} still running {STOP_MARGIN_S:.0f}s past "
                "checkpoint.grace_seconds after the notice: stopped"
            )
            return 128 + self.stopping
        if len(self.done) < self.groups:
            return None
        codes = list(self.done.values())
        if EXIT_PREEMPTED in codes:
            return EXIT_PREEMPTED  # the emergency checkpoint is written: relaunch to resume
        bad = [c for c in codes if c]
        return (bad[0] if bad[0] > 0 else 128 - bad[0]) if bad else 0

    def run(self) -> int:
        """Start every group, watch them; returns the run's exit status."""
        if self.cfg.checkpoint.dir:
            self.lock = RunLock(self.cfg, self.env.get(RUN_ID_ENV, ""), self.echo)
        self.lighthouse, self.address = start_lighthouse(self.cfg)
        notices = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        old = {s: signal.signal(s, self.notice) for s in notices}
        old[DEMAND_SIGNAL] = signal.signal(DEMAND_SIGNAL, lambda *_: self.dump_asked.set())
        try:
            for g in range(self.groups):
                self.start(g)
                if self.stopping is not None:  # a notice while starting: the new group too
                    self.notice(self.stopping)
            status = None
            while status is None:
                time.sleep(0.05)
                status = self._watch()
            return status
        finally:
            self.stop_all()
            for s, h in old.items():
                signal.signal(s, h)

    def stop_all(self) -> None:
        """Every group's processes, the lighthouse and the lock: nothing of the run is left."""
        for g in list(self.procs):
            self._stop(g)
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        shutil.rmtree(self.state_dir, ignore_errors=True)


def script_command(script: str, args: list[str], module: bool) -> list[str]:
    """A group process's command: the script through the rank's boot (:mod:`aios.launcher.boot`:
    the guard on launch variables), as every rank aios-run starts."""
    head = ["-m", script] if module else [script]
    return [sys.executable, "-u", "-m", boot.MODULE, *head, *args]
