"""The rank status folder: the one place its files are named, written and read.

``aios-run`` makes one folder per host (``AIOS_RUN_STATUS_DIR``, :data:`~aios.launcher.contract.
STATUS_DIR_ENV`); a cloud job's wrapper script makes ``<job>/status``. What lives in it:

* ``launcher``: ``<pid> <start time> <pid namespace>`` of the aios-run that made it, so a folder
  whose launcher was SIGKILLed can be told from a live one and swept (:func:`sweep`);
* ``rank<N>``: how rank N ended, when it ended on aios's terms: ``failed <CLOCK_MONOTONIC ns>``
  (an exception reached the excepthook; the earliest is blamed), ``stopped`` (another rank
  failed) or ``preempted <checkpoint>`` (it wrote its emergency checkpoint);
* ``joined-<N>``: the world size of the process group rank N joined (``aios.init``);
* ``worker-<N>.json``, ``progress-<N>`` (32 bytes, mmapped: steps, last step time, state) and
  ``stacks-<N>.txt``: what the watchdog reads (:mod:`aios.resilience.watchdog`);
* ``hung``: the watchdog stopped a hung run;
* ``refused``: a rank of this host was stopped for rewriting a launch variable and printed the
  line (:mod:`aios.launcher.guard`); the others stop quietly.

Standard library only; never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile

from aios.launcher.contract import STATUS_DIR_ENV
from aios.launcher.worker import process_alive, process_start

PREFIX = "aios-run-status-"
OWNER = "launcher"
HUNG = "hung"
REFUSED = "refused"


def from_env() -> str | None:
    """The status folder this process was given by its launcher, if any."""
    return os.environ.get(STATUS_DIR_ENV) or None


def claim_refusal(status_dir: str | None) -> bool:
    """Whether this rank is the first of its host to be refused (it prints the one line);
    True without a status folder or where the folder cannot be written."""
    if not status_dir:
        return True
    try:
        fd = os.open(os.path.join(status_dir, REFUSED), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.close(fd)
    return True


def rank_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f"rank{rank}")


def joined_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f"joined-{rank}")


def worker_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f"worker-{rank}.json")


def worker_tmp_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f".worker-{rank}.json.{os.getpid()}")


def progress_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f"progress-{rank}")


def stacks_file(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, f"stacks-{rank}.txt")


def is_worker_file(name: str) -> bool:
    return name.startswith("worker-") and name.endswith(".json")


def has_workers(status_dir: str) -> bool:
    try:
        return any(is_worker_file(n) for n in os.listdir(status_dir))
    except OSError:
        return False


def mark_rank(text: str, rank: int | str | None = None, status_dir: str | None = None) -> None:
    """Write this rank's end (``rank<N>``); nothing without a status folder or a rank."""
    status_dir = status_dir or from_env()
    rank = os.environ.get("RANK") if rank is None else rank
    if status_dir and rank is not None:
        with contextlib.suppress(OSError), open(rank_file(status_dir, rank), "w") as f:
            f.write(text)


def mark_joined(world_size: int) -> None:
    """This rank joined a process group of ``world_size`` ranks (``joined-<rank>``)."""
    status_dir, rank = from_env(), os.environ.get("RANK")
    if status_dir and rank is not None:
        with contextlib.suppress(OSError), open(joined_file(status_dir, rank), "w") as f:
            f.write(str(world_size))


def read_ranks(status_dir: str) -> dict[int, str]:
    """Every ``rank<N>`` record: rank -> its text."""
    out: dict[int, str] = {}
    try:
        for name in os.listdir(status_dir):
            if name.startswith("rank") and name[4:].isdigit():
                with open(os.path.join(status_dir, name)) as f:
                    out[int(name[4:])] = f.read().strip()
    except OSError:
        pass
    return out


def joined_world(status_dir: str, rank: int) -> int | None:
    """The world size rank ``rank`` said it joined, or ``None``."""
    try:
        with open(joined_file(status_dir, rank)) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]", "-" where unknown); pids mean nothing
    across namespaces (containers sharing a /tmp)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def create() -> str:
    """A new status folder for this host's ranks, marked with this launcher's identity; folders
    left by launchers that were SIGKILLed are removed first."""
    sweep()
    path = tempfile.mkdtemp(prefix=PREFIX)
    pid = os.getpid()
    with open(os.path.join(path, OWNER), "w") as f:
        f.write(f"{pid} {process_start(pid) or '-'} {pid_namespace()}\n")
    return path


def sweep() -> None:
    """Remove status folders whose launcher is gone (a SIGKILLed aios-run cannot clean up). Only
    folders carrying aios-run's owner file are judged; anything else is left alone."""
    tmp, namespace = tempfile.gettempdir(), pid_namespace()
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue  # a link, a file, or another user's
            with open(os.path.join(path, OWNER)) as f:
                pid_s, start, ns = f.read().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            continue
        if ns != namespace or pid == os.getpid():
            continue  # another container's launcher, or this one
        if process_alive(pid):
            now = process_start(pid)
            if start == "-" or not now or now == start:
                continue  # its launcher (or a process we cannot tell from it) is running
        shutil.rmtree(path, ignore_errors=True)
