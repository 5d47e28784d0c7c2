"""The zygote's side of :mod:`aios.testing.zygote`: ``python -m aios.testing.zygote_server SOCKET
SESSION_PID`` imports what every torch process of the tests imports, then forks a keeper per
request and the process from the keeper (see :mod:`aios.testing.zygote`). Apart from the
trampoline so that a trampoline's start imports none of this.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import aios.cli.run  # noqa: F401 - what every aios-run imports first
from aios.launcher import boot, warm
from aios.launcher.contract import WARM_START_ENV
from aios.launcher.worker import set_parent_death_signal
from aios.testing.zygote import (
    _MAX,
    FORWARDED,
    IMPORT_TIME_PREFIXES,
    RUNTIME_VARS,
    parse,
)


def refusal(base: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """Why a process with ``env`` must start fresh rather than fork from a zygote whose
    environment is ``base``; None where it may fork."""
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


def serve(path: str, session: int) -> dict[str, Any]:
    """The zygote's loop: a keeper per request. Returns only in a forked process, with its
    request (then set up to run it); the zygote itself ends in ``_exit``, and dies with the
    test session's process (``session``), however that ends."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != session:
        os._exit(0)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(128)
    base_env = dict(os.environ)
    base_path = list(sys.path[1:])  # without ``-m``'s working directory
    try:
        with warm._env_edits():
            warm._preload()
        ok = warm._safe_to_fork() and not warm.user_startup_hooks()
    except BaseException:  # noqa: BLE001 - every request then starts fresh
        ok = False
    gc.freeze()  # as aios.launcher.warm's zygote: the forks' collections copy no shared page
    while True:
        warm.reap_orphans()  # the keepers that ended (no child of the zygote is waited elsewhere)
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
    warm._repeat_env_edits(request["env"])
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
        if kind == "script":
            boot.run_script(what, argv, base)
            return
        sys.argv = ["-c", *argv]
        sys.path[:] = ["", *base]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(compile(what, "<string>", "exec", dont_inherit=True), main.__dict__)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        _report()
        boot._exit_by_sigint()
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        _report()
        raise SystemExit(1) from None


def _report() -> None:
    """``sys.excepthook`` with the traceback from the command's own first frame on."""
    kind, value, tb = sys.exc_info()
    runpy_file = sys.modules["runpy"].__file__ if "runpy" in sys.modules else ""
    skip = {os.path.abspath(f) for f in (__file__, boot.__file__ or "", runpy_file or "")}
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in skip:
        tb = tb.tb_next
    assert kind is not None and value is not None
    sys.excepthook(kind, value.with_traceback(tb), tb)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[2].isdigit():
        run(serve(sys.argv[1], int(sys.argv[2])))
    else:
        print("usage: python -m aios.testing.zygote_server SOCKET SESSION_PID", file=sys.stderr)
        raise SystemExit(2)
