"""The worker side of the hang watchdog, and reading processes from outside.

Each rank under ``aios-run`` (:func:`register_worker`, called by :func:`aios.init`) leaves three
files in the launch's status folder (``AIOS_RUN_STATUS_DIR``):

* ``worker-<rank>.json``: pid, rank, node, host, the main thread's id, the dump signal;
* ``progress-<rank>``: 32 bytes mapped into memory: steps taken by this process, the time of
  the last one (``time.perf_counter``, the system's monotonic clock), closing flag. ``rt.step``
  writes two doubles into the mapping (no system call);
* ``stacks-<rank>.txt``: where :func:`faulthandler.register` dumps every thread's Python stack
  on :data:`DUMP_SIGNAL` (SIGUSR2). The dump runs in a C signal handler without the GIL, so a
  rank stuck in native code or holding the GIL is still read. DataLoader workers forked by the
  rank inherit the handler and dump to the same file.

The launcher side reads them back (:func:`read_workers`) and looks at the processes through
``/proc`` (:func:`process_state`, :func:`descendants`, :func:`cpu_seconds`). Nothing here
imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aios.launcher import status as rank_status
from aios.launcher.contract import HOST_ENV, LOCAL_INDEX_ENV, NODE_RANK_ENV, STATUS_DIR_ENV

#: the signal each worker dumps its stacks on (faulthandler, no GIL needed)
DUMP_SIGNAL = int(getattr(signal, "SIGUSR2", 12))

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
            "lib": library_dirs(),
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


def registered() -> bool:
    """Whether this process registered itself with the watchdog (:func:`register_worker`)."""
    return _mv is not None


def _hostname() -> str:
    import socket

    return socket.gethostname()


def library_dirs() -> list[str]:
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


def alive(pid: int) -> bool:
    return process_state(pid)[:1] not in ("", "Z", "X")


def catches(pid: int, sig: int) -> bool:
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
