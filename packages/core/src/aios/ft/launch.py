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

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import IO, Any

from aios.checkpoint.lock import LOCK_HEARTBEAT_S
from aios.checkpoint.store import CheckpointStore
from aios.errors import AiosError
from aios.ft import (
    GROUP_ENV,
    GROUPS_ENV,
    LIGHTHOUSE_ENV,
    LIGHTHOUSE_KEY,
    RANK_RUNTIME_VARS,
    RESTARTED_AT_ENV,
    RUN_STORE_ENV,
    STATE_DIR_ENV,
    STORE_PORT_ENV,
    beat_key,
    done_key,
    ended_key,
    ready_path,
)
from aios.ft.hang import SHARE_EVERY_S, HangWatch
from aios.ft.hang import limit as hang_limit
from aios.ft.plan import rust_log
from aios.launcher import boot, warm
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


def host_address(master_addr: str, nnodes: int) -> str:
    """The address this host's groups serve on (their rendezvous, manager and heal transfer):
    the run's ``master_addr`` on one host; over several, this host's address on the route to
    ``master_addr`` (where the other hosts reach it)."""
    if nnodes == 1:
        return master_addr
    family, kind, _, _, where = socket.getaddrinfo(master_addr, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as s:
        s.connect(where)  # no packet is sent: the kernel picks the route's source address
        return str(s.getsockname()[0])


def run_store(cfg: Any, master: bool) -> Any:
    """The run's store on node 0 (``master_addr:master_port``) when the groups span hosts."""
    import torch.distributed as dist

    timeout = timedelta(seconds=cfg.ft.join_timeout_ms / 1000.0 + float(cfg.ft.timeout))
    return dist.TCPStore(
        cfg.master_addr,
        int(cfg.master_port),
        is_master=master,
        wait_for_workers=False,
        timeout=timeout,
    )


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
        zygote: warm.Zygote | None = None,
    ) -> None:
        """``command``: a process's ``python -u SCRIPT ARGS`` (or ``-m MODULE``); each process
        is forked from ``zygote`` where that is safe (:mod:`aios.launcher.warm`: a restarted
        group's imports are then done already), else started fresh through the boot."""
        self.cfg = cfg
        self.command = command
        self.zygote = zygote
        self.env = env
        self.free_port = free_port
        self.echo = echo
        self.groups = int(cfg.ft.replica_groups)
        self.per_group = nprocs // self.groups
        #: this host's groups: G/H of them over H hosts (one aios-run per host)
        self.nnodes = int(cfg.nnodes)
        per_node = self.groups // self.nnodes
        self.local = list(range(cfg.node_rank * per_node, (cfg.node_rank + 1) * per_node))
        self.addr = host_address(cfg.master_addr, self.nnodes)
        #: node 0's store when the groups span hosts (``run``)
        self.store: Any = None
        #: when this host's groups had all ended (over several hosts, :meth:`_hosts_ended`)
        self.ended_at: float | None = None
        self.procs: dict[int, list[subprocess.Popen[bytes] | warm.WarmProcess]] = {}
        self.relays: dict[int, list[threading.Thread]] = {}
        self.restarts = dict.fromkeys(self.local, 0)
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
        #: over several hosts: the other hosts' live groups' latest steps, and when they were
        #: last read (:meth:`_elsewhere`)
        self.elsewhere: dict[int, int] = {}
        self.shared_at = float("-inf")
        #: each group's status folder and its stack dumper (see the module docstring)
        record = os.path.abspath(os.path.join(cfg.logging.run_dir, env.get(RUN_ID_ENV, "")))
        self.dogs = {
            g: Watchdog(
                cfg.watchdog,
                os.path.join(self.state_dir, f"status{g}"),
                record if g == 0 else os.path.join(record, f"group{g}"),
                lambda line: self.echo(f"{PROG}: {line}"),
            )
            for g in self.local
        }
        #: SIGUSR1 to aios-run: the stacks of every live group, at the next look
        self.dump_asked = threading.Event()

    def _group_env(self, g: int, rank: int, master_port: int, store_port: int) -> dict[str, str]:
        n = self.per_group
        env = {
            **self.env,
            "RANK": str(rank),
            "LOCAL_RANK": str((g - self.local[0]) * n + rank),  # the group's devices here
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(master_port),
            GROUP_ENV: str(g),
            GROUPS_ENV: str(self.groups),
            LIGHTHOUSE_ENV: self.address,
            STORE_PORT_ENV: str(store_port),
            STATE_DIR_ENV: self.state_dir,
            STATUS_DIR_ENV: self.dogs[g].status_dir,
            "RUST_LOG": rust_log(self.cfg, self.env),
        }
        if self.nnodes > 1:
            env[RUN_STORE_ENV] = f"{self.cfg.master_addr}:{self.cfg.master_port}"
        return env

    def start(self, g: int, restarted: bool = False) -> None:
        status = self.dogs[g].status_dir  # the processes of this start register anew
        shutil.rmtree(status, ignore_errors=True)
        os.makedirs(status)
        for rank in range(self.per_group):  # "its manager is up" is said anew by this start
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ready_path(self.state_dir, g, rank))
        addr = self.addr
        master, store = self.free_port(addr), self.free_port(addr)
        procs, relays = [], []
        for rank in range(self.per_group):
            env = self._group_env(g, rank, master, store)
            if restarted:
                env[RESTARTED_AT_ENV] = repr(time.time())
            proc, streams = self._spawn(env)
            prefix = f"[rank{g * self.per_group + rank}]:".encode()
            for src, dst in zip(streams, (sys.stdout.buffer, sys.stderr.buffer), strict=True):
                quiet = not self.cfg.ft.log
                t = threading.Thread(target=_relay, args=(src, dst, prefix, quiet), daemon=True)
                t.start()
                relays.append(t)
            procs.append(proc)
        self.procs[g] = procs
        self.relays[g] = relays

    def _spawn(
        self, env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes] | warm.WarmProcess, tuple[IO[bytes], IO[bytes]]]:
        """One process of a group and its output and error pipes: forked from the zygote where
        that is safe, else fresh (with the parent death signal, as every aios-run worker)."""
        if self.zygote is not None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                forked = self.zygote.spawn(
                    self.command, env, out_w, err_w, runtime=RANK_RUNTIME_VARS
                )
            finally:
                os.close(out_w)
                os.close(err_w)
            if forked is not None:
                return forked, (os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
            os.close(out_r)
            os.close(err_r)
        fresh = boot.command(self.command) or self.command
        proc = subprocess.Popen(
            fresh,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=child_preexec(os.getpid()),
        )
        assert proc.stdout is not None and proc.stderr is not None
        return proc, (proc.stdout, proc.stderr)

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
        self.shared_at = float("-inf")  # the other hosts stop comparing with its old steps
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
                if self.store is not None:  # the groups on the other hosts read it
                    self.store.set(done_key(g), "1")
        live = [g for g in self.procs if g not in self.done]
        if self.dump_asked.is_set():
            self.dump_asked.clear()
            for g in live:
                self.dogs[g].dump(f"on demand (SIGUSR1), replica group {g}", kind="stacks")
        elsewhere = self._elsewhere(live)
        for g in self.hangs.look(live, elsewhere) if self.stopping is None else []:
            why = f"hung: no step for {self.hangs.limit_s:.0f}s while another group stepped"
            self.dogs[g].dump(f"replica group {g} {why}", kind="hang")
            if not self._lost(g, why):
                return EXIT_HUNG
        if self.stopping is not None and time.monotonic() > self.stop_by:
            left = sorted(set(self.local) - set(self.done))
            self.echo(
                f"{PROG}: replica groups {left} still running {STOP_MARGIN_S:.0f}s past "
                "checkpoint.grace_seconds after the notice: stopped"
            )
            return 128 + self.stopping
        if len(self.done) < len(self.local) or not self._hosts_ended():
            return None
        codes = list(self.done.values())
        if EXIT_PREEMPTED in codes:
            return EXIT_PREEMPTED  # the emergency checkpoint is written: relaunch to resume
        bad = [c for c in codes if c]
        return (bad[0] if bad[0] > 0 else 128 - bad[0]) if bad else 0

    def _elsewhere(self, live: list[int]) -> dict[int, int]:
        """Over several hosts (each :data:`aios.ft.hang.SHARE_EVERY_S` at most): this host's
        live groups' latest steps into the run's store, and the other hosts' live groups' read
        from it, for the hang watch. A store that does not answer leaves the last ones read."""
        now = time.monotonic()
        if self.store is None or now - self.shared_at < SHARE_EVERY_S:
            return self.elsewhere
        self.shared_at = now
        try:
            for g in self.local:
                steps = self.hangs.steps(g) if g in live else []
                self.store.set(beat_key(g), str(max(steps)) if steps else "")
            seen: dict[int, int] = {}
            for o in range(self.groups):
                if o in self.local or self.store.check([done_key(o)]):
                    continue
                if self.store.check([beat_key(o)]):
                    text = self.store.get(beat_key(o)).decode()
                    if text.isdigit():
                        seen[o] = int(text)
            self.elsewhere = seen
        except (RuntimeError, OSError):  # node 0's store is gone: so is the run
            pass
        return self.elsewhere

    def _hosts_ended(self) -> bool:
        """Over several hosts: this host's end is said in the store, and node 0 (its lighthouse
        serves every group) waits for the other hosts' ends. Every group commits the same steps,
        so they end together; node 0 gives up :func:`aios.ft.hang.limit` seconds after its own
        groups ended (said in one line)."""
        if self.store is None:
            return True
        if self.ended_at is None:
            self.ended_at = time.monotonic()
            self.store.set(ended_key(self.cfg.node_rank), "1")
        if self.cfg.node_rank != 0:
            return True
        others = [ended_key(n) for n in range(1, self.nnodes)]
        if self.store.check(others):
            return True
        if time.monotonic() - self.ended_at > hang_limit(self.cfg.ft):
            self.echo(
                f"{PROG}: the replica groups of another host had not ended "
                f"{hang_limit(self.cfg.ft):.0f}s after this host's: its lighthouse stops"
            )
            return True
        return False

    def _meet(self, first: bool) -> None:
        """Over several hosts: node 0 hosts the run's store and says where its lighthouse is;
        the other hosts read it there. A store that never answers is one line."""
        where = f"{self.cfg.master_addr}:{self.cfg.master_port}"
        try:
            self.store = run_store(self.cfg, master=first)
            if first:
                self.store.set(LIGHTHOUSE_KEY, self.address)
            else:
                self.address = self.store.get(LIGHTHOUSE_KEY).decode()
        except (RuntimeError, OSError) as exc:  # torch's store errors are RuntimeErrors
            why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            raise AiosError(
                f"replica groups over {self.nnodes} hosts: node {self.cfg.node_rank} could not "
                f"{'serve' if first else 'reach'} the run's store on {where} ({why})",
                "start aios-run on every host with the same --nnodes, --master-addr and "
                "--master-port, node 0 (--node-rank 0) on the master address; or raise "
                "ft.join_timeout_ms",
            ) from None

    def run(self) -> int:
        """Start every group, watch them; returns the run's exit status."""
        first = self.cfg.node_rank == 0
        notices = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        old: dict[int, Any] = {s: signal.signal(s, self.notice) for s in notices}
        old[DEMAND_SIGNAL] = signal.signal(DEMAND_SIGNAL, lambda *_: self.dump_asked.set())
        try:
            if self.cfg.checkpoint.dir and first:
                self.lock = RunLock(self.cfg, self.env.get(RUN_ID_ENV, ""), self.echo)
            if first:
                self.lighthouse, self.address = start_lighthouse(self.cfg)
            if self.nnodes > 1:  # node 0 tells the other hosts where its lighthouse is
                self._meet(first)
            for g in self.local:
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
        self.store = None  # node 0's: its server closes with it
        shutil.rmtree(self.state_dir, ignore_errors=True)


def script_command(script: str, args: list[str], module: bool) -> list[str]:
    """A group process's command, ``python -u SCRIPT ARGS`` (``-m MODULE``) as torch's agent
    gives its ranks: forked warm, or started fresh through the rank's boot
    (:mod:`aios.launcher.boot`: the guard on launch variables), as every rank aios-run starts."""
    head = ["-m", script] if module else [script]
    return [sys.executable, "-u", *head, *args]
