"""A test session's zygote: the Python processes tests start (``aios-run``, worker scripts)
forked from one process that imported torch, ``torch._dynamo``, ``torch.distributed.run`` and
aios once, instead of each importing them again (about 3 s of CPU per process on the 2-core
CI machine; most of the suite's time).

* :func:`python` gives the command a test runs, ``python ARGS`` (``-c CODE``, ``-m MODULE`` or
  ``SCRIPT``, then its arguments): a small *trampoline* that hands its standard streams, working
  directory and environment to the session's zygote and waits, or, where no zygote runs, the
  plain command.
* The zygote (``python -m aios.testing.zygote_server SOCKET PID``, started by the pytest plugin
  :mod:`aios.testing.plugin` for the session, and killed with the session's process PID)
  forks a *keeper* per request, which forks the process that runs ``ARGS`` as a fresh
  ``python ARGS`` would (``sys.argv``, ``sys.path[0]``, ``__main__``, its own process group,
  the streams, the working directory and environment of
  the trampoline), reports its exit to the trampoline and kills it if the trampoline dies.
* The trampoline forwards the signals it gets (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2,
  SIGQUIT) to the process (to its group when the trampoline leads a session, as
  ``start_new_session=True`` made it) and ends as it ended: its exit status, or killed by the
  same signal. A SIGKILL of the trampoline reaches the process through its keeper.

The trampoline runs the command fresh (``exec``, as before) whenever the fork is not known to
be safe: no zygote in this session (``PYTEST_AIOS_ZYGOTE`` unset, or ``0``), a command that is
not one of the three forms above (``-u`` and ``-B`` allowed), ``AIOS_RUN_WARM_START=0`` in the
process's environment (tests of the launcher's own process handling), an environment that
differs from the zygote's in a variable that torch, Python or a library the zygote imported may
read at import time (:data:`IMPORT_TIME_PREFIXES`, unless :mod:`aios.launcher.warm` knows it as
read only when used), or a zygote that runs a thread, a CUDA or XLA runtime. A test's own
variables (``TOTAL_STEPS``, ``AIOS_*``) may differ. ``PYTEST_AIOS_ZYGOTE_LOG=FILE`` writes one
line per fresh start saying why.

The trampoline itself imports nothing of torch; the zygote's side is
:mod:`aios.testing.zygote_server`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import NoReturn

from aios.launcher.contract import WARM_START_ENV

#: the zygote's socket (set in the pytest process by :mod:`aios.testing.plugin`; ``0`` turns
#: the zygote off for a session)
ENV = "PYTEST_AIOS_ZYGOTE"
LOG_ENV = "PYTEST_AIOS_ZYGOTE_LOG"
#: in a test's environment for a process it needs as its own child, fresh (the test reads its pid
#: as the pid of aios-run or of the script: status folders, ``aios stacks --pid``, lock owners)
OFF = {ENV: "0"}
#: variables that Python, torch and the libraries the zygote imports may read at import time
#: (a process whose environment differs from the zygote's in one starts fresh)
IMPORT_TIME_PREFIXES = (
    "PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "GOMP", "LD_", "MALLOC", "CUDA",
    "NVIDIA", "XLA", "PJRT", "TPU", "NEURON", "GLOO", "LC_", "LANG", "FSSPEC", "GCSFS",
    "TRITON", "HF_", "TRANSFORMERS", "OPENBLAS", "NUMEXPR", "DS_",
)  # fmt: skip
#: read only when used, though their prefix is above
RUNTIME_VARS = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)
_MAX = 1 << 22
_TRAMPOLINE = "from aios.testing.zygote import trampoline; trampoline()"


def python(*args: str) -> list[str]:
    """The command that runs ``python ARGS`` (``-c CODE``, ``-m MODULE`` or ``SCRIPT``, then its
    arguments; more may be appended) through the session's zygote where one runs."""
    return [sys.executable, "-c", _TRAMPOLINE, *args]


def parse(args: Sequence[str]) -> tuple[str, str, list[str], bool] | None:
    """``(kind, what, argv, unbuffered)`` of ``python ARGS``: kind ``-c``, ``-m`` or ``script``;
    None for any other form of command."""
    rest = list(args)
    unbuffered = False
    while rest and rest[0] in ("-u", "-B"):
        unbuffered = unbuffered or rest[0] == "-u"
        rest.pop(0)
    if not rest:
        return None
    if rest[0] in ("-c", "-m"):
        if len(rest) < 2:
            return None
        return rest[0], rest[1], rest[2:], unbuffered
    if rest[0].startswith("-"):
        return None
    return "script", rest[0], rest[1:], unbuffered


# ------------------------------------------------------------------------------ the trampoline


def _log(reason: str, args: Sequence[str]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with suppress(OSError), open(path, "a") as f:
            f.write(json.dumps({"fresh": reason, "args": list(args)[:3]}) + "\n")


def _fresh(args: Sequence[str], reason: str) -> NoReturn:
    _log(reason, args)
    os.execv(sys.executable, [sys.executable, *args])


def trampoline() -> NoReturn:
    """``python -c ... ARGS`` (:func:`python`): run ``python ARGS`` through the zygote, or fresh."""
    args = sys.argv[1:]
    where = os.environ.get(ENV, "")
    if not where or where == "0":
        os.execv(sys.executable, [sys.executable, *args])
    if parse(args) is None:
        _fresh(args, "not python -c/-m/SCRIPT")
    if os.environ.get(WARM_START_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        _fresh(args, f"{WARM_START_ENV}=0")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(where)
        fds = [fd for fd in (0, 1, 2) if _valid(fd)]
        request = {
            "args": args,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "fds": fds,
            "session": os.getsid(0) == os.getpid(),
        }
        socket.send_fds(sock, [json.dumps(request).encode()], fds)
    except OSError as e:
        sock.close()
        _fresh(args, f"zygote unreachable: {e}")
    _Forwarder(sock, bool(request["session"])).run(args)


def _valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _Forwarder:
    """The trampoline's wait: signals it gets go to the process; it ends as the process did."""

    def __init__(self, sock: socket.socket, group: bool) -> None:
        self.sock = sock
        self.group = group
        self.pid = 0
        self.pending: list[int] = []
        for sig in FORWARDED:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, sig: int, _frame: object) -> None:
        if self.pid:
            self._send(sig)
        else:
            self.pending.append(sig)

    def _send(self, sig: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def run(self, args: Sequence[str]) -> NoReturn:
        while True:
            try:
                data = self.sock.recv(_MAX)
            except OSError:
                data = b""
            if not data:  # the keeper died: the process with it
                os._exit(1)
            msg = json.loads(data)
            if "fresh" in msg:
                self.sock.close()
                _fresh(args, str(msg["fresh"]))
            if "pid" in msg:
                self.pid = int(msg["pid"])
                for sig in self.pending:
                    self._send(sig)
                self.pending.clear()
            if "status" in msg:
                _end_as(int(msg["status"]))


def _end_as(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        for s in {*FORWARDED, sig} - {signal.SIGKILL, signal.SIGSTOP}:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


# ------------------------------------------------------------------------------ the zygote


def start(env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start a zygote for this session (in the background: it imports while the first tests
    run; requests wait for it). Returns the process and its socket's path."""
    where = tempfile.mkdtemp(prefix="aios-zygote-")
    path = os.path.join(where, "socket")
    log = open(os.path.join(where, "zygote.log"), "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aios.testing.zygote_server", path, str(os.getpid())],
        env=dict(env if env is not None else os.environ),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    for _ in range(2000):  # the socket exists before the imports start
        if os.path.exists(path) or proc.poll() is not None:
            break
        time.sleep(0.005)
    return proc, path


def stop(proc: subprocess.Popen[bytes], path: str) -> None:
    """Stop the zygote (its keepers end with the processes they keep)."""
    with suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    with suppress(OSError):
        Path(path).unlink()
    with suppress(OSError):
        (Path(path).parent / "zygote.log").unlink()
    with suppress(OSError):
        Path(path).parent.rmdir()
