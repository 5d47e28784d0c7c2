"""A test session's zygote: the Python processes tests start (``aios-run``, worker scripts)
forked from one process that imported torch, ``torch._dynamo``, ``torch.distributed.run`` and
aios once, instead of each importing them again (about 3 s of CPU per process on the 2-core
CI machine; most of the suite's time).

* :func:`python` gives the command a test runs, ``python ARGS`` (``-c CODE``, ``-m MODULE`` or
  ``SCRIPT``, then its arguments): a small *trampoline* that hands its standard streams, working
  directory and environment to the session's zygote and waits, or, where no zygote runs, the
  plain command.
* The zygote (``python -m aios.testing.zygote serve SOCKET PID``, started by the pytest plugin
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

The trampoline itself imports nothing of torch; :func:`serve` is the only part that does.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

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


def refusal(base: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """Why a process with ``env`` must start fresh rather than fork from a zygote whose
    environment is ``base``; None where it may fork."""
    from aios.launcher import warm

    if env.get(WARM_START_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return f"{WARM_START_ENV}=0"
    keys = sorted(k for k in set(base) | set(env) if base.get(k) != env.get(k))
    bad = [
        k
        for k in keys
        if k.upper().startswith(IMPORT_TIME_PREFIXES)
        and k not in warm.RUNTIME_VARS | RUNTIME_VARS
        and not k.startswith(warm.RUNTIME_PREFIXES)
    ]
    return f"environment differs in {', '.join(bad)}" if bad else None


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
        [sys.executable, "-m", "aios.testing.zygote", "serve", path, str(os.getpid())],
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


def serve(path: str, session: int) -> dict[str, Any]:
    """The zygote's loop: a keeper per request. Returns only in a forked process, with its
    request (then set up to run it); the zygote itself ends in ``_exit``, and dies with the
    test session's process (``session``), however that ends."""
    from aios.launcher import warm
    from aios.launcher.worker import set_parent_death_signal

    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != session:
        os._exit(0)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(128)
    base_env = dict(os.environ)
    base_path = list(sys.path[1:])  # without ``-m``'s working directory
    try:
        warm._preload()
        import aios.cli.run  # noqa: F401 - what every aios-run imports first

        ok = warm._safe_to_fork() and not warm.user_startup_hooks()
    except BaseException:  # noqa: BLE001 - every request then starts fresh
        ok = False
    gc.freeze()  # as aios.launcher.warm's zygote: the forks' collections copy no shared page
    while True:
        while True:  # reap the keepers that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, _MAX, 3)
        except OSError:
            continue
        request = json.loads(data) if data else {}
        why = None if ok and warm._safe_to_fork() else "the zygote cannot fork safely"
        why = why or refusal(base_env, request.get("env", {}))
        if why is None and parse(request.get("args", [])) is None:
            why = "not python -c/-m/SCRIPT"
        if why is not None:
            with suppress(OSError):
                conn.send(json.dumps({"fresh": why}).encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the keeper
            listener.close()
            request["base_path"] = base_path
            return _keep(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def _keep(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """The keeper: fork the process, tell the trampoline its pid, then its exit status; kill it
    when the trampoline goes away first. Returns only in the process."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become(request, fds)
        return request
    for fd in fds:
        os.close(fd)
    group = bool(request.get("session"))

    def watch() -> None:  # the trampoline's end (it closes the socket only by ending)
        with suppress(OSError):
            while conn.recv(_MAX):
                pass
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)

    with suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    threading.Thread(target=watch, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    with suppress(OSError):
        conn.send(json.dumps({"status": status}).encode())
    os._exit(0)


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: what ``subprocess.Popen`` of ``python ARGS`` would have given it."""
    from aios.launcher import warm

    if request.get("session"):
        os.setsid()
    else:
        os.setpgid(0, 0)
    for fd, target in zip(fds, request.get("fds", []), strict=False):
        if fd != target:
            os.dup2(fd, target)
    for fd in fds:
        if fd not in (0, 1, 2):
            os.close(fd)
    for sig in (*FORWARDED, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    warm._fresh_state()
    parsed = parse(request["args"])
    assert parsed is not None
    if parsed[3]:
        sys.stdout = sys.__stdout__ = warm._unbuffered(1, sys.stdout)  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = warm._unbuffered(2, sys.stderr)  # type: ignore[misc]


def run(request: dict[str, Any]) -> None:
    """In the forked process: run its command as ``__main__``, exit as Python would."""
    import runpy
    import types

    kind, what, argv, _ = parse(request["args"]) or ("", "", [], False)
    base = list(request["base_path"])
    try:
        if kind == "-m":
            sys.path[:] = [os.getcwd(), *base]
            sys.argv = ["-m", *argv]
            runpy._run_module_as_main(what, alter_argv=True)  # type: ignore[attr-defined]
            return
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        if kind == "-c":
            sys.argv = ["-c", *argv]
            sys.path[:] = ["", *base]
            source, name = what.encode(), "<string>"
        else:
            path = os.path.abspath(what)
            with open(path, "rb") as f:
                source = f.read()
            sys.argv = [what, *argv]
            sys.path[:] = [os.path.dirname(os.path.realpath(path)), *base]
            main.__dict__.update({"__file__": path, "__cached__": None, "__spec__": None})
            name = path
        sys.modules["__main__"] = main
        exec(compile(source, name, "exec", dont_inherit=True), main.__dict__)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        from aios.launcher import boot

        _report()
        boot._exit_by_sigint()
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        _report()
        raise SystemExit(1) from None


def _report() -> None:
    """``sys.excepthook`` with the traceback from the command's own first frame on."""
    kind, value, tb = sys.exc_info()
    runpy_file = sys.modules["runpy"].__file__ if "runpy" in sys.modules else ""
    skip = {os.path.abspath(__file__), os.path.abspath(runpy_file or "")}
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in skip:
        tb = tb.tb_next
    assert kind is not None and value is not None
    sys.excepthook(kind, value.with_traceback(tb), tb)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4 and sys.argv[3].isdigit():
        run(serve(sys.argv[2], int(sys.argv[3])))
    else:
        print("usage: python -m aios.testing.zygote serve SOCKET SESSION_PID", file=sys.stderr)
        raise SystemExit(2)
