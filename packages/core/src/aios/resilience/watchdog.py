"""The watchdog: a hang is named instead of endured.

Worker side (:func:`register_worker`, called by :func:`aios.init` under ``aios-run``): each rank
leaves three files in the launch's status folder (``AIOS_RUN_STATUS_DIR``):

* ``worker-<rank>.json``: pid, rank, node, host, the main thread's id, the dump signal;
* ``progress-<rank>``: 32 bytes mapped into memory: steps taken by this process, the time of
  the last one (``time.perf_counter``, the system's monotonic clock), closing flag. ``rt.step``
  writes two doubles into the mapping (no system call);
* ``stacks-<rank>.txt``: where :func:`faulthandler.register` dumps every thread's Python stack
  on :data:`DUMP_SIGNAL` (SIGUSR2). The dump runs in a C signal handler without the GIL, so a
  rank stuck in native code or holding the GIL is still read. DataLoader workers forked by the
  rank inherit the handler and dump to the same file.

Launcher side (:class:`Watchdog`, a thread of ``aios-run``): polls the progress files; when NO
rank makes progress for the allowance of :class:`HangPolicy` it dumps every rank's stacks
(:func:`collect`), prints a short summary (:func:`summarize`), writes the full dump into the run
record (``<run dir>/watchdog/hang-<n>.txt``) and applies ``watchdog.action``. ``aios stacks`` and
SIGUSR1 to ``aios-run`` give the same view of a live run (``stacks-<n>.txt``).

Nothing here imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aios.launcher import status as rank_status
from aios.launcher.contract import STATUS_DIR_ENV

#: exit status of ``aios-run`` when the watchdog stopped a hung run (as timeout(1) uses it)
EXIT_HUNG = 124
#: the signal each worker dumps its stacks on (faulthandler, no GIL needed)
DUMP_SIGNAL = int(getattr(signal, "SIGUSR2", 12))
#: the signal that makes ``aios-run`` dump the stacks of its live run
DEMAND_SIGNAL = int(getattr(signal, "SIGUSR1", 10))

_COUNT, _TIME, _STATE = 0, 1, 2  # slots of the progress mapping (doubles)
_CLOSING = 1.0

# ------------------------------------------------------------------------------ worker side

_mv: Any = None  # memoryview of doubles over the mapped progress file
_keep: list[Any] = []  # the mapping and the dump file: alive as long as the process


def register_worker() -> bool:
    """Make this process watchable (under ``aios-run``: ``AIOS_RUN_STATUS_DIR`` set). Returns
    whether it is; a failure warns once and training goes on unwatched."""
    global _mv
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if _mv is not None or not status_dir or not os.path.isdir(status_dir):
        return _mv is not None
    import faulthandler
    import mmap

    from aios.launcher.contract import HOST_ENV, LOCAL_INDEX_ENV, NODE_RANK_ENV

    # RANK from torchrun/aios-run; a backend's own spawner (torch_xla) gives the local index
    rank = int(os.environ.get("RANK") or os.environ.get(LOCAL_INDEX_ENV) or 0)
    try:
        stacks = open(rank_status.stacks_file(status_dir, rank), "a")
        faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)
        path = rank_status.progress_file(status_dir, rank)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(32))
            mm = mmap.mmap(fd, 32)
        finally:
            os.close(fd)
        info = {
            "rank": rank,
            "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0),
            "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
            "node_rank": int(os.environ.get("GROUP_RANK") or os.environ.get(NODE_RANK_ENV) or 0),
            "host": os.environ.get(HOST_ENV) or _hostname(),
            "pid": os.getpid(),
            "main_thread": threading.main_thread().ident,
            "signal": DUMP_SIGNAL,
            "lib": _library_dirs(),
            "started": time.time(),
        }
        tmp = rank_status.worker_tmp_file(status_dir, rank)
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, rank_status.worker_file(status_dir, rank))
    except (OSError, ValueError, RuntimeError, AttributeError) as exc:
        import warnings

        warnings.warn(
            f"aios: the watchdog cannot watch rank {rank} ({type(exc).__name__}: {exc}); "
            "a hang of this rank will not be named",
            stacklevel=2,
        )
        return False
    _keep[:] = [mm, stacks]
    _mv = memoryview(mm).cast("d")
    return True


def progress_stamp(append: Callable[[float], None]) -> Callable[[float], None]:
    """The runtime's per-step time stamp (``append(perf_counter())``), extended to report the
    step to the watchdog when this process is watched: two stores into the mapping."""
    mv = _mv
    if mv is None:
        return append

    def stamp(t: float, _append: Callable[[float], None] = append, _mv: Any = mv) -> None:
        _append(t)
        _mv[0] += 1.0
        _mv[1] = t

    return stamp


def worker_closing() -> None:
    """The runtime is closing (after the last step): no progress is expected any more."""
    if _mv is not None:
        _mv[_STATE] = _CLOSING


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _library_dirs() -> list[str]:
    """Where library code lives (a frame elsewhere is the user's)."""
    import sysconfig

    dirs = {
        sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    # aios itself (editable installs too): the package root, two folders up from this module
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with contextlib.suppress(Exception):
        import site

        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    return sorted(d.rstrip(os.sep) + os.sep for d in dirs if d)


# ------------------------------------------------------------------------------ reading


@dataclass
class Worker:
    """One rank's process as its files describe it."""

    rank: int
    info: dict[str, Any]
    steps: int = 0
    last_step: float = 0.0  # perf_counter of the last step (0: none yet)
    closing: bool = False

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", 0))

    @property
    def node(self) -> int:
        return int(self.info.get("node_rank", 0))


def read_workers(status_dir: str) -> dict[int, Worker]:
    """The ranks registered in ``status_dir`` with their progress."""
    import struct

    out: dict[int, Worker] = {}
    try:
        names = os.listdir(status_dir)
    except OSError:
        return out
    for name in names:
        if not rank_status.is_worker_file(name):
            continue
        try:
            with open(os.path.join(status_dir, name)) as f:
                info = json.load(f)
            rank = int(info["rank"])
            w = Worker(rank, info)
            with open(rank_status.progress_file(status_dir, rank), "rb") as f:
                count, t, state, _ = struct.unpack("4d", f.read(32))
            w.steps, w.last_step, w.closing = int(count), t, state == _CLOSING
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            continue
        out[rank] = w
    return out


def process_state(pid: int) -> str:
    """``"S (sleeping) in futex_wait_queue"``: the kernel's view of a process, "" when gone."""
    names = {
        "R": "running",
        "S": "sleeping",
        "D": "uninterruptible wait",
        "T": "stopped",
        "t": "traced",
        "Z": "zombie",
        "X": "dead",
        "I": "idle",
    }
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""
    out = f"{st} ({names.get(st, '?')})"
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
        if wchan and wchan != "0":
            out += f" in {wchan}"
    return out


def _alive(pid: int) -> bool:
    return process_state(pid)[:1] not in ("", "Z", "X")


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (so sending it cannot kill the process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from /proc."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids[ppid].append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_seconds(pid: int, with_children: bool = True) -> float | None:
    """CPU time (user + system, every thread) ``pid`` has used, plus its descendants' (a
    rank's DataLoader workers), from /proc; None when it is gone."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for i, p in enumerate([pid, *(descendants(pid) if with_children else [])]):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            if i == 0:
                return None
    return total


# ------------------------------------------------------------------------------ collecting


@dataclass
class Dump:
    """What could be read of one rank."""

    rank: int
    pid: int
    node: int
    host: str
    steps: int
    state: str
    text: str = ""  # faulthandler's dump of the rank process ("" when none came)
    children: list[tuple[int, str, str]] = field(default_factory=list)  # (pid, state, dump)
    info: dict[str, Any] = field(default_factory=dict)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _await_dumps(paths: dict[int, tuple[str, int]], deadline: float) -> dict[int, str]:
    """Wait until each file grew and then stayed the same for a moment, or the deadline.
    ``paths``: key -> (file, size before the signal)."""
    done: dict[int, str] = {}
    last: dict[int, tuple[int, float]] = {}
    while len(done) < len(paths):
        now = time.monotonic()
        for key, (path, before) in paths.items():
            if key in done:
                continue
            size = _file_size(path)
            if size > before:
                prev = last.get(key)
                if prev and prev[0] == size and now - prev[1] >= 0.3:
                    done[key] = _read_from(path, before)
                elif not prev or prev[0] != size:
                    last[key] = (size, now)
        if now >= deadline:
            for key, (path, before) in paths.items():
                if key not in done and _file_size(path) > before:
                    done[key] = _read_from(path, before)  # what came, even if incomplete
            break
        time.sleep(0.05)
    return done


def collect(status_dir: str, wait: float = 10.0) -> list[Dump]:
    """Every registered rank's stacks (all threads), and those of its forked children (DataLoader
    workers). Bounded: a rank that does not answer within ``wait`` seconds is reported with its
    process state only. Dumps of one status folder are serialised (a lock file)."""
    import fcntl

    workers = read_workers(status_dir)
    with open(os.path.join(status_dir, "dump.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _collect(status_dir, workers, wait)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _collect(status_dir: str, workers: dict[int, Worker], wait: float) -> list[Dump]:
    dumps: dict[int, Dump] = {}
    pending: dict[int, tuple[str, int]] = {}
    for rank, w in sorted(workers.items()):
        d = Dump(
            rank,
            w.pid,
            w.node,
            str(w.info.get("host", "")),
            w.steps,
            process_state(w.pid),
            info=w.info,
        )
        dumps[rank] = d
        if not _alive(w.pid):
            continue
        sig = int(w.info.get("signal", DUMP_SIGNAL))
        path = rank_status.stacks_file(status_dir, rank)
        if _catches(w.pid, sig):
            pending[rank] = (path, _file_size(path))
            with contextlib.suppress(OSError):
                os.kill(w.pid, sig)
    deadline = time.monotonic() + wait
    for rank, text in _await_dumps(pending, deadline).items():
        dumps[rank].text = text
    for rank, d in dumps.items():  # forked children (DataLoader workers): one at a time per file
        if not _alive(d.pid):
            continue
        sig = int(d.info.get("signal", DUMP_SIGNAL))
        path = rank_status.stacks_file(status_dir, rank)
        for child in descendants(d.pid)[:16]:
            state = process_state(child)
            text = ""
            if _catches(child, sig):
                before = _file_size(path)
                with contextlib.suppress(OSError):
                    os.kill(child, sig)
                end = min(deadline + 2.0, time.monotonic() + 2.0)
                text = _await_dumps({0: (path, before)}, end).get(0, "")
            d.children.append((child, state, text))
        d.state = process_state(d.pid) or d.state
    return [dumps[r] for r in sorted(dumps)]


# ------------------------------------------------------------------------------ summary

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

#: torch.distributed functions that are collectives (c10d's Python entry points)
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "batch_isend_irecv",
    }
)


def _collective(fn: str) -> str:
    """``all_gather_single`` -> ``all_gather``; "" for anything that is not a collective."""
    if fn in COLLECTIVES:
        return fn
    base = fn.rsplit("_", 1)[0]
    return base if fn.endswith(("_single", "_coalesced", "_base")) and base in COLLECTIVES else ""


_FSDP_GATHER = ("unshard", "wait_for_unshard", "foreach_all_gather", "foreach_all_gather_copy_out")
_FSDP_REDUCE = ("foreach_reduce", "post_backward", "_root_post_backward_final_callback")
_LOADER = ("_try_get_data", "_get_data", "_next_data")

Frame = tuple[str, int, str]  # file, line, function


def parse_threads(text: str) -> list[tuple[int, list[Frame]]]:
    """faulthandler's text -> [(thread id, frames innermost first)] (the first block only: a
    forked child's dump follows in the same file)."""
    threads: list[tuple[int, list[Frame]]] = []
    frames: list[Frame] | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            frames = []
            threads.append((int(m.group(2), 16), frames))
            continue
        if line.startswith("Stack (most recent call first)"):
            frames = []
            threads.append((0, frames))
            continue
        f = _FRAME.match(line)
        if f and frames is not None:
            frames.append((f.group(1), int(f.group(2)), f.group(3)))
    return threads


@dataclass
class Where:
    """One rank's position: the user's innermost frame and what it waits in."""

    user: Frame | None
    wait: str = ""  # "all_gather (FSDP unshard)", "a DataLoader worker", ""
    collective: str = ""  # the collective's name when it waits in one

    def at(self) -> str:
        if self.user is None:
            return "?"
        return f"{os.path.basename(self.user[0])}:{self.user[1]} in {self.user[2]}"


def locate(frames: list[Frame], lib: list[str]) -> Where:
    """Where a thread is: its innermost frame outside the libraries, and the collective /
    DataLoader wait the libraries are in below it."""
    user = None
    below: list[Frame] = []
    for fr in frames:
        path = fr[0]
        if path.startswith("<") or any(path.startswith(d) for d in lib):
            below.append(fr)
            continue
        user = fr
        break
    coll = ctx = ""
    for path, _, fn in below:
        p = path.replace(os.sep, "/")
        if not coll and "torch/distributed/" in p:
            coll = _collective(fn)
        if not ctx and "torch/distributed/fsdp/" in p:
            if fn in _FSDP_GATHER:
                ctx = "FSDP unshard"
                coll = coll or "all_gather"
            elif fn in _FSDP_REDUCE:
                ctx = "FSDP gradient reduce-scatter"
                coll = coll or "reduce_scatter"
        if "torch/utils/data/" in p and fn in _LOADER:
            return Where(user, "a DataLoader worker")
        if not coll and not ctx and "torch/autograd/" in p and fn == "_engine_run_backward":
            # DDP's gradient all-reduce waits inside the autograd engine (no Python frame)
            return Where(user, "backward (the gradient all_reduce)", "backward")
    if coll:
        return Where(user, f"{coll} ({ctx})" if ctx else coll, coll)
    return Where(user)


def _main_frames(d: Dump, text: str | None = None) -> list[Frame]:
    """The frames of the main thread (a forked child's too: it keeps the parent's thread id)."""
    threads = parse_threads(d.text if text is None else text)
    main = d.info.get("main_thread")
    for ident, frames in threads:
        if ident == main:
            return frames
    for _, frames in threads:  # no id match: the thread running the script's <module>
        if frames and frames[-1][2] == "<module>":
            return frames
    return threads[0][1] if threads else []


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def summarize(dumps: list[Dump]) -> list[str]:
    """A few lines: where each rank is, and which ranks are missing from the collective the
    others wait in."""
    lines: list[str] = []
    where: dict[int, Where] = {}
    world = max((int(d.info.get("world_size", 1)) for d in dumps), default=0)
    multi_node = world > len(dumps) or len({d.node for d in dumps}) > 1
    for d in dumps:
        tag = f"rank {d.rank}" + (f" (node {d.node}, {d.host})" if multi_node else "")
        tag += f" [pid {d.pid}, step {d.steps}]"
        if not d.text:
            st = d.state or "exited"
            lines.append(f"{tag}: no stack within the wait: stuck outside Python? state {st}")
            continue
        w = locate(_main_frames(d), list(d.info.get("lib", [])))
        where[d.rank] = w
        if w.wait == "a DataLoader worker":
            line = f"{tag}: waiting for a DataLoader worker from {w.at()}"
            for pid, state, text in d.children:
                cw = locate(_main_frames(d, text), list(d.info.get("lib", [])))
                line += f"; worker pid {pid}: " + (cw.at() if text else f"no stack, state {state}")
        elif w.wait:
            line = f"{tag}: waiting in {w.wait} from {w.at()}"
        else:
            line = f"{tag}: {w.at()}"
        if d.state.startswith(("D", "R")):
            line += f" (process {d.state})"
        lines.append(line)
    waiting = {r: w for r, w in where.items() if w.collective}
    if waiting:
        others = sorted(r for r in (d.rank for d in dumps) if r not in waiting)
        kinds = collections.defaultdict(list)
        for r, w in sorted(waiting.items()):
            kinds[(w.wait, w.at())].append(r)
        if others:
            (wait, _), rs = max(kinds.items(), key=lambda kv: len(kv[1]))
            lines.append(
                f"{_ranks(others)} {'is' if len(others) == 1 else 'are'} not in the {wait} that "
                f"{_ranks(rs)} {'waits' if len(rs) == 1 else 'wait'} in"
            )
        if len(kinds) > 1:
            parts = [f"{_ranks(rs)}: {wait} from {at}" for (wait, at), rs in kinds.items()]
            lines.append(
                "ranks wait in different collectives ("
                + "; ".join(parts)
                + "): a collective reached on some ranks only (e.g. under `if rank == 0`)"
            )
    seen = {d.rank for d in dumps}
    missing = [r for r in range(world) if r not in seen]
    if missing and len(missing) < world:
        lines.append(f"{_ranks(missing)}: on other nodes (their aios-run reports them)")
    return lines


def full_text(dumps: list[Dump], headline: str) -> str:
    out = [headline, ""]
    for d in dumps:
        out.append(
            f"=== rank {d.rank} (node {d.node}, host {d.host}, pid {d.pid}, step {d.steps}, "
            f"state {d.state or 'exited'}) ==="
        )
        out.append(d.text.rstrip() or "(no stack within the wait)")
        for pid, state, text in d.children:
            out.append(f"--- child process {pid} of rank {d.rank} (state {state or 'exited'}) ---")
            out.append(text.rstrip() or "(no stack: it does not handle the dump signal)")
        out.append("")
    return "\n".join(out)


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
        live = {r: w for r, w in workers.items() if _alive(w.pid)}
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
        from aios.resilience import flightrec

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

    from aios.launcher.contract import LAUNCHER_PID_ENV, LOCAL_INDEX_ENV

    status_dir = os.environ.get(STATUS_DIR_ENV)
    # the rank's parent is a launcher: torchrun's agent (TORCHELASTIC_*) or a backend's spawner
    launched = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get(LOCAL_INDEX_ENV)
    if (
        _mv is None
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


def sidecar(status_dir: str, launcher: int, record_dir: str, settings_json: str) -> int:
    """The watchdog beside a foreign launcher (see :func:`start_sidecar`): on a hang it leaves
    :data:`HUNG_MARKER`, stops the launcher (SIGTERM; not for ``action=restart``) and kills the
    ranks. Returns when the launcher is gone."""
    import fcntl

    from aios.config.schema import WatchdogSettings

    with open(os.path.join(status_dir, "watchdog.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another rank's (a restarted rank 0's) watchdog runs already
        settings = WatchdogSettings.model_validate_json(settings_json)
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
        while _alive(launcher):
            if dog._demand.wait(interval):
                dog._demand.clear()
                dog.dump("on demand (SIGUSR1)", kind="stacks")
            dog.check(dog.clock())
    return 0


if (
    __name__ == "__main__"
):  # python -m aios.resilience.watchdog STATUS_DIR LAUNCHER_PID RECORD_DIR SETTINGS
    sys.exit(sidecar(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]))
