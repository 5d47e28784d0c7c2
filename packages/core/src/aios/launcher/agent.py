"""torch's elastic agent run inside ``aios-run`` (:func:`run_elastic_inprocess`), and what
aios adds to it while it runs (:class:`AgentWatch`): workers started with the parent death signal
or forked warm (:mod:`aios.launcher.warm`), the order in which they exit, the rank to blame, one
line per restart, the ranks' output with one ``[rankN]:`` prefix. Imports torch when used."""

from __future__ import annotations

import os
import signal
from contextlib import suppress as _suppress
from typing import Any

import click

from aios.launcher import boot, warm
from aios.launcher import relay as tail
from aios.launcher.outcome import PROG
from aios.launcher.ports import port_taken
from aios.launcher.worker import child_preexec

#: the key torch's store-based barrier counts the ranks of the default group in
#: (``init_process_group`` with ``TORCH_DIST_INIT_BARRIER=1``; the default group's store is the
#: launcher's under ``PrefixStore("default_pg")``)
JOIN_COUNT_KEY = "default_pg/store_based_barrier_key:0"


def joined_count(store: Any) -> int | None:
    """How many ranks joined the default process group, read from the launcher's store (the
    root of torch elastic's prefixed stores), or None when it cannot be read."""
    from torch.distributed import PrefixStore

    while isinstance(store, PrefixStore):
        store = store.underlying_store
    try:
        return int(store.add(JOIN_COUNT_KEY, 0))
    except (RuntimeError, ValueError):  # the store is gone (the agent closed it)
        return None


def joined_count_at(addr: str | None, port: int | None) -> int | None:
    """:func:`joined_count` from the store the workers bootstrapped on (``MASTER_ADDR`` and
    ``MASTER_PORT`` of this attempt): after a restart torch's elastic agent hands the workers a
    fresh store that rank 0 hosts and that ends with them, so it is read while they run."""
    if not addr or not port:
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        store = TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=0.5))
        return int(store.add(JOIN_COUNT_KEY, 0))
    except (RuntimeError, ValueError, OSError):  # not up yet, or already gone
        return None


def _most(*counts: int | None) -> int | None:
    seen = [c for c in counts if c is not None]
    return max(seen) if seen else None


class _OnePrefix:
    """The stream a worker's lines are copied to with the ``[rankN]:`` prefix: a line that
    already carries the same prefix (torch's ``init_process_group`` wraps the excepthook of a
    plain torchrun script with it) keeps one, never ``[rank1]:[rank1]:``."""

    def __init__(self, dst: Any, header: str) -> None:
        self.dst = dst
        self.twice = header + header.rstrip()

    def write(self, text: str) -> Any:
        if self.twice.strip() and text.startswith(self.twice):
            text = text[len(self.twice) - len(self.twice) // 2 :]
        return self.dst.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dst, name)


class AgentWatch:
    """What ``aios-run`` adds to torch's elastic agent while it runs in this process (patched in
    for the run, restored after):

    * every worker is started with the parent death signal (:func:`aios.launcher.worker.child_preexec`):
      torch starts each worker in its own session, so neither a SIGKILL of ``aios-run`` nor a
      ``kill -9 -PGID`` of its group would reach it otherwise. The workers are forked by the
      thread that runs the agent (this process's main thread), which lives as long as the run;
    * the order in which the workers exit (their pidfds in an epoll set; elsewhere a thread per
      worker that waits without reaping) and the workers the agent itself signalled (``close``),
      so the rank blamed for a failure is the one that failed FIRST on its own, never one the
      agent stopped afterwards;
    * one line per restart: attempt n/N, the rank that failed and its exit code.
    """

    def __init__(self, zygote: warm.Zygote | None = None) -> None:
        import threading

        self.zygote = zygote  # the ranks are forked from it where that is safe
        self.lock = threading.Lock()
        self.exited: dict[int, int] = {}  # pid -> position in the order the workers exited
        self.stopped: set[int] = set()  # pids the agent signalled while they still ran
        self.last_failures: dict[int, Any] = {}
        self.no_restart = False  # set by the watchdog's stop action
        self.hang_note = ""  # set by the watchdog before it stops hung workers
        self.launcher = os.getpid()
        self._undo: list[tuple[Any, str, Any]] = []
        self._epoll: Any = None
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self.groups: list[int] = []  # the ranks' process groups (torch starts each in its own)
        #: ranks that joined the default process group, read when the workers succeeded
        self.joined: int | None = None

    def _exited(self, pid: int) -> None:
        with self.lock:
            self.exited.setdefault(pid, len(self.exited))

    def _start_epoll(self) -> None:
        """Linux: one thread reads the workers' pidfds from an epoll set, whose ready list keeps
        the order in which the kernel saw them exit, however late this thread runs (a thread
        woken per worker would take the order in which the threads got the GIL, which under load
        inverts exits a few milliseconds apart: a peer failing because the first rank died)."""
        import select
        import threading

        if not (hasattr(os, "pidfd_open") and hasattr(select, "epoll")):
            return
        try:
            ep = select.epoll()
        except OSError:
            return
        self._epoll = ep

        def loop() -> None:
            try:
                watch(ep)
            finally:
                for fd in list(self._fds):
                    if self._fds.pop(fd, None) is not None:
                        os.close(fd)
                ep.close()

        def watch(ep: Any) -> None:
            while self._epoll is ep:
                try:
                    events = ep.poll(0.5)
                except OSError:
                    return
                for fd, _ in events:
                    pid = self._fds.pop(fd, None)
                    if pid is not None:
                        self._exited(pid)
                    try:
                        ep.unregister(fd)
                    except OSError:
                        pass
                    os.close(fd)

        threading.Thread(target=loop, name="aios-worker-exits", daemon=True).start()

    def _track(self, pid: int) -> None:
        import threading

        self.groups.append(pid)

        if self._epoll is not None:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                pass
            else:
                self._fds[fd] = pid
                self._epoll.register(fd, 1)  # EPOLLIN: the process exited
                return
        if not hasattr(os, "waitid"):
            return

        def wait() -> None:  # the portable fallback: wait without reaping (the agent reaps)
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # the agent reaped it first: it exited just now
            except OSError:
                return
            self._exited(pid)

        threading.Thread(target=wait, name=f"aios-wait-{pid}", daemon=True).start()

    def _warm_popen(self, kwargs: dict[str, Any]) -> Any:
        """The rank forked by the zygote (``aios.launcher.warm``), or None to start it fresh."""
        zygote = self.zygote
        if zygote is None or not kwargs.get("start_new_session") or kwargs.get("preexec_fn"):
            return None
        args, env = kwargs.get("args"), kwargs.get("env")
        if not isinstance(args, (list, tuple)) or env is None:
            return None
        return zygote.spawn(args, env, kwargs.get("stdout"), kwargs.get("stderr"))

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self) -> AgentWatch:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler as sh,
        )

        watch = self
        popen, close = sh.Popen, sh.SubprocessHandler.close
        monitor, restart = LocalElasticAgent._monitor_workers, SimpleElasticAgent._restart_workers
        preexec = child_preexec(self.launcher)

        from torch.distributed.elastic.multiprocessing import tail_log

        tail = tail_log.tail_logfile

        def _tail(header: str, file: str, dst: Any, *args: Any, **kwargs: Any) -> Any:
            from typing import TextIO, cast

            return tail(header, file, cast(TextIO, _OnePrefix(dst, header)), *args, **kwargs)

        self._patch(tail_log, "tail_logfile", _tail)

        def _popen(*args: Any, **kwargs: Any) -> Any:
            proc = watch._warm_popen(kwargs)
            if proc is None:
                if preexec is not None and kwargs.get("preexec_fn") is None:
                    kwargs["preexec_fn"] = preexec
                # a fresh rank's first frame is the boot's (the guard on launch variables)
                booted = boot.command(kwargs.get("args") or ())
                if booted is not None:
                    kwargs["args"] = booted
                proc = popen(*args, **kwargs)
            watch._track(proc.pid)
            return proc

        def _close(handler: Any, death_sig: Any = None) -> None:
            if handler.proc.poll() is None:
                with watch.lock:
                    watch.stopped.add(handler.proc.pid)
            if death_sig is not None and int(death_sig) == int(signal.SIGKILL):
                close(handler, death_sig)  # torch's: the rank's whole process group
                return
            death_sig = death_sig if death_sig is not None else signal.SIGTERM
            # a notice (SIGTERM/SIGINT) goes to the rank only, never to its process group: its
            # DataLoader workers must live until it has written its emergency checkpoint
            with _suppress(ProcessLookupError):
                handler.proc.send_signal(death_sig)
            for f in (handler._stdout, handler._stderr):
                if f is not None:
                    f.close()

        def _restart(agent: Any, worker_group: Any) -> None:
            spec = worker_group.spec
            attempt = spec.max_restarts - agent._remaining_restarts
            failures, watch.last_failures = watch.last_failures, {}
            note, watch.hang_note = watch.hang_note, ""
            if note:
                what = f"hang: {note}"
            elif failures:
                rank, f = watch.first_failure(failures)
                what = f"rank {rank} {describe_exit(f.exitcode)}"
            else:
                what = "the node group changed (a node joined, or another node's workers failed)"
            click.echo(
                f"{PROG}: restart {attempt}/{spec.max_restarts}: {what}; restarting all workers",
                err=True,
            )
            restart(agent, worker_group)

        self._start_epoll()
        self._patch(sh, "Popen", _popen)
        self._patch(sh.SubprocessHandler, "close", _close)
        self._patch(LocalElasticAgent, "_monitor_workers", wrap_monitor(monitor, watch))
        self._patch(SimpleElasticAgent, "_restart_workers", _restart)
        return self

    def _kill_leftovers(self) -> None:
        """After the agent reaped every rank: what is left in a rank's process group (a
        DataLoader worker of a rank that died of a signal, which notices only within seconds)
        is killed, so nothing of the run outlives ``aios-run``."""
        for pgid in self.groups:
            with _suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        self.groups.clear()

    def __exit__(self, *exc: Any) -> None:
        self._kill_leftovers()
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()
        self._epoll = None  # the thread ends at its next wake-up

    def first_failure(self, failures: dict[int, Any]) -> tuple[int, Any]:
        """The rank that failed first on its own: not stopped by the agent, first to exit (the
        elastic error file's time where that is all there is), lowest rank last."""
        with self.lock:
            stopped, exited = set(self.stopped), dict(self.exited)
        agent_stopped = (-int(signal.SIGTERM), -int(signal.SIGKILL), -int(signal.SIGINT))

        def key(kv: tuple[int, Any]) -> tuple[bool, bool, float, int]:
            rank, f = kv
            by_agent = f.pid in stopped or (not exited and f.exitcode in agent_stopped)
            return (by_agent, f.pid not in exited, exited.get(f.pid, f.timestamp), rank)

        return min(failures.items(), key=key)


def blame(failures: dict[int, Any], status: dict[int, str], watch: AgentWatch) -> tuple[int, Any]:
    """The root cause of a failed run: the rank whose exception reached aios's excepthook first
    (``failed <monotonic ns>`` in its status file, written before it closed any connection, so
    a peer failing because of it always stamps later); else the rank that exited first on its
    own (not one the agent stopped, nor one that stopped because another rank failed)."""
    stamped: dict[int, int] = {}
    for r, text in status.items():
        word, _, stamp = text.partition(" ")
        if r in failures and word == "failed" and stamp.isdigit():
            stamped[r] = int(stamp)
    if stamped:
        rank = min(stamped, key=lambda r: (stamped[r], r))
        return rank, failures[rank]
    own = {r: f for r, f in failures.items() if not status.get(r, "").startswith("stopped")}
    return watch.first_failure(own or failures)


def wrap_monitor(monitor: Any, watch: AgentWatch) -> Any:
    def _monitor(agent: Any, worker_group: Any) -> Any:
        result = monitor(agent, worker_group)
        world = worker_group.workers[0].world_size if worker_group.workers else 0
        if result.state.name == "HEALTHY" and (watch.joined or 0) < world:
            count = joined_count_at(worker_group.master_addr, worker_group.master_port)
            watch.joined = _most(watch.joined, count)
        if result.state.name == "SUCCEEDED" and worker_group.store is not None:
            watch.joined = _most(watch.joined, joined_count(worker_group.store))
        if result.is_failed():
            watch.joined = None  # the next attempt's ranks join again
            watch.last_failures = dict(result.failures)
            if watch.no_restart:  # the watchdog stopped a hung run: no restart
                agent._remaining_restarts = 0
        return result

    return _monitor


def describe_exit(code: int) -> str:
    if code < 0:
        name = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        return f"was killed by {name}"
    return f"exited with code {code}"


def run_elastic_inprocess(
    targs: list[str],
    env: dict[str, str],
    grace: float,
    watch: AgentWatch,
    port_is_ours: bool = False,
) -> tuple[str, Any]:
    """``torch.distributed.run`` in this process. Returns ``("ok"|"failed"|"signal", detail)``,
    or ``("port-taken", error)`` when the store could not bind a port that is aios's own choice
    (``port_is_ours``)."""
    os.environ.update(env)
    os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(int(grace + 5)))
    # torch's barrier after init_process_group counts the ranks that joined the default group in
    # the launcher's store: how aios-run tells a plain torchrun script's ranks from copies that
    # never joined (a user's own setting wins)
    os.environ.setdefault("TORCH_DIST_INIT_BARRIER", "1")
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun's own INFO/WARNING chatter (rendezvous banners) is noise here; errors still show
    # (the failing rank is reported by aios-run in one line)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed.run").setLevel(logging.ERROR)
    from torch.distributed import DistNetworkError

    tail.install()  # each rank's output reaches the terminal in whole lines
    try:
        with watch:
            run(parse_args(targs))
        return "ok", None
    except DistNetworkError as exc:
        if port_is_ours and port_taken(exc) and not watch.joined:
            return "port-taken", exc
        raise
    except ChildFailedError as exc:
        return "failed", exc.failures
    except SignalException as exc:
        return "signal", exc.sigval
