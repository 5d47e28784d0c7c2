"""Warm start: ranks forked from a process that already imported torch.

A fresh rank spends seconds importing ``torch``, ``torch._dynamo`` and ``aios`` before the
script's first line runs; every rank of every attempt pays it again. ``aios-run`` instead forks,
first thing (before it starts any thread), a *zygote*: a process that imports ``torch``,
``torch._dynamo``, ``torch.distributed.run`` and ``aios`` once, while ``aios-run`` resolves the
config and the plan, and then forks one rank per request of the elastic agent. The rank sets its
environment, arguments, working directory, session and output files and runs the script as
``__main__`` the way ``python -u SCRIPT ARGS`` (or ``python -u -m MODULE ARGS``) would.

The ranks are children of ``aios-run``, as fresh ones are: the zygote forks an intermediate
process that forks the rank and exits, and ``aios-run`` is the ranks' *subreaper*
(``PR_SET_CHILD_SUBREAPER``), so the rank is reparented to it before the zygote answers with its
pid. The agent waits for it, signals it and reads its exit status as for a ``Popen`` child.

A plan may name modules its ranks import besides (:attr:`aios.types.LaunchPlan.preload`, e.g.
the xla backend's ``torch_xla``): ``aios-run`` sends them to the zygote once the plan is resolved
with the ranks' environment, which the zygote takes as its own before it imports them
(:meth:`Zygote.preload`). A ``direct`` plan with such modules (one process, e.g. XLA:CPU) starts
its process from a zygote too, forked then; that process runs as ``python SCRIPT ARGS`` would
(its group, buffered streams, no launch guard). What the zygote's imports wrote into its
environment (``import torch_xla`` completes ``XLA_FLAGS``, for one) a forked rank writes into its
own, as its own imports would have.

A rank is started fresh, as before, whenever the warm start is not known to be safe: not on
Linux, the zygote runs a Python thread or has a CUDA or XLA runtime (torch_xla imported is fine:
its runtime starts at the first use of a device), the rank's environment
differs from the zygote's in a variable that may be read at import time (only those in
:data:`RUNTIME_VARS` / :data:`RUNTIME_PREFIXES` are read when used), the command is not
``python -u`` of a script or module, or the warm start is turned off (``launch.warm_start=false``
or ``AIOS_RUN_WARM_START=0``). Either way the run prints nothing more.

Nothing here imports torch outside the zygote.
"""

from __future__ import annotations

import gc
import io
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from aios.launcher import boot, rewrites
from aios.launcher.boot import parse_command
from aios.launcher.contract import CONTROL_PREFIX, WARM_START_ENV
from aios.launcher.worker import PR_SET_PDEATHSIG, set_parent_death_signal
from aios.plugins.registry import GROUP

PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 20

#: variables torch and aios read when they are used, never at import: a rank's environment may
#: differ from the zygote's in these (and in :data:`RUNTIME_PREFIXES`) and still start warm
RUNTIME_VARS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",  # applied with torch.set_num_threads in the rank
        "TORCH_DIST_INIT_BARRIER",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_FR_DUMP_TEMP_FILE",
        "CUDA_VISIBLE_DEVICES",  # the zygote never initialises CUDA
        "PYTHONUNBUFFERED",
    }
)
RUNTIME_PREFIXES = (CONTROL_PREFIX, "TORCHELASTIC_", "TORCH_NCCL_", "NCCL_")
#: what the zygote imports torch with unless the user set it: no device extension autoloaded
#: (the launch plan of the cpu and cuda backends starts its ranks so; a rank of a backend that
#: autoloads one differs in it and starts fresh)
ZYGOTE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The warm start may be used here: Linux with ``os.fork``, not turned off by
    ``AIOS_RUN_WARM_START=0`` (or ``AIOS_LAUNCH__WARM_START=false``)."""
    env = os.environ if environ is None else environ
    off = ("0", "false", "no", "off")
    if env.get(WARM_START_ENV, "").strip().lower() in off:
        return False
    if env.get("AIOS_LAUNCH__WARM_START", "").strip().lower() in off:
        return False
    if user_startup_hooks():
        return False
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def user_startup_hooks() -> list[str]:
    """The interpreter start-up modules this Python ran from outside its standard library
    (``sitecustomize``/``usercustomize`` on ``PYTHONPATH`` or in site-packages). A fresh rank
    runs them with its own environment (they may read ``RANK``); a rank forked from the zygote
    would only inherit what they did once, in the zygote, so such a launch starts fresh."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    found = []
    for name in ("sitecustomize", "usercustomize"):
        mod = sys.modules.get(name)
        path = mod.__file__ if mod is not None else None
        if path and not os.path.realpath(path).startswith(stdlib + os.sep):
            found.append(path)
    return found


def worth_it(script: str) -> bool:
    """The script names torch or aios (a rank of it imports them): a script that does not
    starts faster fresh than it would wait for the zygote's imports. True where unreadable."""
    try:
        with open(script, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return True
    return b"torch" in text or b"aios" in text


def env_is_warm_safe(
    base: Mapping[str, str], env: Mapping[str, str], runtime: Collection[str] = ()
) -> bool:
    """Every variable in which ``env`` (a rank's) differs from ``base`` (the zygote's) is read
    only when used, never at import time (``runtime``: more such variables, the plan's
    :attr:`~aios.types.LaunchPlan.runtime_env`)."""
    keys = {k for k in set(base) | set(env) if base.get(k) != env.get(k)}
    return all(k in RUNTIME_VARS or k in runtime or k.startswith(RUNTIME_PREFIXES) for k in keys)


class WarmProcess:
    """A rank forked by the zygote and reparented to this process: the part of
    :class:`subprocess.Popen` the elastic agent uses."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                except ChildProcessError:
                    break
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode if self.returncode is not None else 0
        end = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            delay = min(delay * 2, left, 0.05)
            time.sleep(delay)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The launcher's handle on its zygote (see the module docstring)."""

    def __init__(self, pid: int, sock: socket.socket, base_env: dict[str, str]) -> None:
        self.pid = pid
        self.sock = sock
        self.base_env = base_env
        self.lock = threading.Lock()
        self.broken = False
        self.runtime: frozenset[str] = frozenset()  # the plan's runtime_env, once preloaded

    @classmethod
    def start(cls) -> Zygote | None:
        """Fork the zygote; None where the warm start is off or not safe here (this process
        already runs a Python thread, or cannot be the ranks' subreaper)."""
        if not enabled() or threading.active_count() != 1:
            return None
        if not _set_subreaper():
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        base_env = {**ZYGOTE_ENV, **os.environ}
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote
            ours.close()
            for key, value in ZYGOTE_ENV.items():
                os.environ.setdefault(key, value)
            _zygote_main(theirs, os.getppid())  # returns only in a rank, to run its script
            return None
        theirs.close()
        return cls(pid, ours, base_env)

    def spawn(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        stdout: Any,
        stderr: Any,
        plain: bool = False,
        runtime: Collection[str] = (),
    ) -> WarmProcess | None:
        """A rank running ``args`` (``python -u ...``) with ``env`` and the given output files
        (open files, file descriptors, or None to inherit ours), or None when it must start
        fresh. ``plain``: the single process of a ``direct`` plan, ``python SCRIPT ARGS`` (or
        ``-m MODULE``) as ``subprocess.Popen`` starts it: in this process's group and session,
        its streams buffered as Python's (unless ``PYTHONUNBUFFERED``), no launch guard.
        ``runtime``: more variables the rank's environment may differ in, read only when used
        (a replica group's, :data:`aios.ft.RANK_RUNTIME_VARS`)."""
        cmd = boot.parse_plain(args) if plain else parse_command(args)
        known = self.runtime | frozenset(runtime)
        if cmd is None or self.broken or not env_is_warm_safe(self.base_env, env, known):
            return None
        script, module, argv = cmd
        fds = [_fileno(stdout, 1), _fileno(stderr, 2)]
        request = {
            "script": script,
            "module": module,
            "argv": argv,
            "env": dict(env),
            "cwd": os.getcwd(),
            "launcher": os.getpid(),
            "plain": plain,
        }
        reply = self._ask(request, fds)
        if reply is None:
            return None
        pid = int(reply["pid"])
        return WarmProcess(pid, args) if pid > 0 else None

    def _ask(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any] | None:
        """Send the zygote ``request`` (with ``fds``) and return its answer; None, and the
        zygote marked broken (later ranks start fresh), where it cannot be reached."""
        data = json.dumps(request).encode()
        with self.lock:
            try:
                if fds:
                    socket.send_fds(self.sock, [data], list(fds))
                else:
                    self.sock.send(data)
                reply = self.sock.recv(_MAX_MESSAGE)
            except OSError:
                reply = b""
        if not reply:
            self.broken = True
            return None
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def preload(
        self, modules: Sequence[str], env: Mapping[str, str], runtime: Collection[str] = ()
    ) -> bool:
        """Have the zygote import ``modules`` (a plan's :attr:`~aios.types.LaunchPlan.preload`:
        what its ranks import, e.g. torch_xla) with ``env`` (the ranks' common environment)
        as its own, before it forks a rank. ``runtime``: the plan's variables read only when
        used (:attr:`~aios.types.LaunchPlan.runtime_env`). Refused (False; the ranks then
        start fresh) where ``env`` differs from the zygote's in a variable that may be read at
        import time, and where the imports leave the zygote unsafe to fork (a runtime started,
        a thread more). True when done: ranks are compared with ``env`` from here on."""
        if self.broken or not env_is_warm_safe(self.base_env, env, runtime):
            self.broken = True  # the ranks differ from the zygote as much: they start fresh
            return False
        reply = self._ask({"preload": list(modules), "env": dict(env)})
        if reply is None or not reply.get("ok"):
            self.broken = True
            return False
        self.base_env = dict(env)
        self.runtime = frozenset(runtime)
        return True

    def close(self) -> None:
        """Stop the zygote and reap it. It holds nothing to finish (it never runs a script, and
        the ranks it forked are this process's children): killed at once, so a launch that
        ends early does not wait for its imports."""
        with self.lock:
            self.sock.close()
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        _prctl(PR_SET_CHILD_SUBREAPER, 0)


def _fileno(f: Any, default: int) -> int:
    if f is None:
        return default
    if isinstance(f, int):
        return f
    f.flush()
    return int(f.fileno())


def _prctl(option: int, arg: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _set_subreaper() -> bool:
    return sys.platform.startswith("linux") and _prctl(PR_SET_CHILD_SUBREAPER, 1)


def reap_orphans() -> None:
    """Reap what was reparented to this process (a subreaper) and exited: the processes a rank
    left behind. Only call when no child of this process is waited for elsewhere."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


#: what ``aios.init()`` and ``rt.setup`` import in every rank (the zygote imports them once)
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed.run",
    "torch.nn.parallel",
    "aios",
    "aios.runtime",
    "aios.config.schema",
    "aios.plugins.registry",
    "aios.plugins.builtin",
    "aios.checkpoint",
    "aios.data",
    "aios.devices",
    "aios.environments",
    "aios.resilience.preflight",
    "aios.resilience.watchdog",
    "aios.runrecord.records",
    "aios.strategies.ddp",
    "yaml",
)


def _preload() -> None:
    """Import :data:`PRELOAD` and the modules of the installed aios plugins (imported only: the
    registry itself is built in the rank, from the rank's own settings)."""
    import importlib
    from importlib.metadata import entry_points

    for name in PRELOAD:
        importlib.import_module(name)
    if os.environ.get("AIOS_PLUGINS") or os.environ.get("AIOS_DISABLE_PLUGINS"):
        return  # a chosen set of plugins: the rank imports those it loads
    for ep in entry_points(group=GROUP):
        try:
            importlib.import_module(ep.module)
        except Exception:  # noqa: BLE001 - the rank's registry reports a broken plugin
            continue


def _safe_to_fork() -> bool:
    """No Python thread besides this one, no CUDA or XLA runtime in this process (torch_xla
    imported is fine: its runtime client, with its threads, is only created on first use)."""
    if threading.active_count() != 1 or _xla_runtime_started():
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def _xla_runtime_started() -> bool:
    """torch_xla's PJRT client exists in this process (created by the first use of an XLA
    device); False where torch_xla is not imported (core never imports it)."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None:
        return False
    try:
        return bool(torch_xla._XLAC._xla_runtime_is_initialized())
    except Exception:  # noqa: BLE001 - unknown: taken as started
        return True


def native_threads() -> int:
    """The threads of this process, native ones included (``/proc/self/task``); 0 where it
    cannot be read."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _do_preload(modules: Sequence[str], env: Mapping[str, str]) -> bool:
    """In the zygote: take ``env`` as its own and import ``modules`` (see
    :meth:`Zygote.preload`); whether it may still fork."""
    import importlib

    threads = native_threads()
    os.environ.clear()
    os.environ.update(env)
    try:
        with _env_edits():
            for name in modules:
                importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - the ranks start fresh and report the problem
        return False
    return _safe_to_fork() and native_threads() <= threads


#: what the zygote's imports did to its environment, ``{name: (before, after)}`` (None: unset);
#: e.g. ``import torch_xla`` completes ``XLA_FLAGS`` and sets ``PJRT_DYNAMIC_PLUGINS``. A fresh
#: rank's imports would do the same to its own environment: a forked rank repeats each edit
#: where its handed environment has the value the zygote's had before the import.
_ENV_EDITS: dict[str, tuple[str | None, str | None]] = {}


@contextmanager
def _env_edits() -> Iterator[None]:
    before = dict(os.environ)
    try:
        yield
    finally:
        after = dict(os.environ)
        for key in set(before) | set(after):
            if before.get(key) != after.get(key):
                _ENV_EDITS[key] = (before.get(key), after.get(key))


def _repeat_env_edits(handed: Mapping[str, str]) -> None:
    """In a forked rank: the zygote's imports' edits of the environment (see :data:`_ENV_EDITS`)."""
    for key, (old, new) in _ENV_EDITS.items():
        if handed.get(key) != old:
            continue
        if new is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = new


def _zygote_main(sock: socket.socket, launcher: int) -> None:
    """The zygote's loop: one rank per request, until the launcher closes the socket. Returns
    only in a forked rank (which then runs its script); the zygote itself ends in ``_exit``."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(0)
    # the interpreter's path without the launcher's own entry (python puts the script's there)
    safe_path = sys.version_info >= (3, 11) and sys.flags.safe_path
    _BASE_PATH[:] = sys.path[0 if safe_path else 1 :]
    try:
        with _env_edits():
            _preload()
        ok = _safe_to_fork()
    except BaseException:  # noqa: BLE001 - ranks then start fresh and report the problem
        ok = False
    # what the imports made stays out of the collector's passes: a rank's collections and its
    # interpreter's end then do not write to (and copy) every page it shares with the zygote
    gc.freeze()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)
        request = json.loads(data)
        if "preload" in request:  # the plan's modules, once it is resolved
            ok = ok and _do_preload(request["preload"], request["env"])
            if not _send(sock, {"ok": ok}):
                os._exit(0)
            continue
        pid = _fork_rank(sock, request, fds) if ok and _safe_to_fork() else 0
        if pid is None:  # in the rank
            return
        for fd in fds:
            os.close(fd)
        if not _send(sock, {"pid": pid}):
            os._exit(0)


def _send(sock: socket.socket, message: dict[str, Any]) -> bool:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        return False
    return True


def _fork_rank(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> int | None:
    """Fork the rank through an intermediate process that exits at once, so that the rank is
    reparented to the launcher (its subreaper). The rank's pid in the zygote; None in the
    rank, which is set up to run its script."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        try:
            rank = os.fork()
        except OSError:
            os._exit(1)
        if rank == 0:
            os.close(write)
            sock.close()
            _become_rank(request, fds)
            return None
        os.write(write, str(rank).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(middle, 0)  # the rank is the launcher's child from here on
    with os.fdopen(read, "rb") as f:
        raw = f.read()
    return int(raw) if raw.isdigit() else 0


def _become_rank(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked rank: what ``subprocess.Popen(start_new_session=True, stdout=.., stderr=..,
    env=..)`` of ``python -u`` would have given it."""
    launcher = int(request["launcher"])
    for _ in range(5000):  # reparented when the intermediate process exits
        if os.getppid() == launcher:
            break
        time.sleep(0.001)
    if os.getppid() != launcher or not set_parent_death_signal(signal.SIGKILL):
        os._exit(1)
    if os.getppid() != launcher:  # the launcher died meanwhile
        os.kill(os.getpid(), signal.SIGKILL)
    plain = bool(request.get("plain"))
    if not plain:
        os.setsid()
    for fd, target in zip(fds, (1, 2), strict=False):
        if fd != target:
            os.dup2(fd, target)
    for fd in fds:
        if fd not in (0, 1, 2):
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _prctl(PR_SET_CHILD_SUBREAPER, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _repeat_env_edits(request["env"])
    rewrites.record_handed(request["env"])
    _fresh_state()
    if plain and not os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout = sys.__stdout__ = _buffered(1, sys.stdout)  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = _buffered(2, sys.stderr)  # type: ignore[misc]
    else:
        sys.stdout = sys.__stdout__ = _unbuffered(1, sys.stdout)  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = _unbuffered(2, sys.stderr)  # type: ignore[misc]
    _RANK.update(request)


#: the request of the rank this process became (empty in the launcher and the zygote)
_RANK: dict[str, Any] = {}
_BASE_PATH: list[str] = []


def _unbuffered(fd: int, old: Any) -> io.TextIOWrapper:
    """``python -u``'s stream on ``fd``: unbuffered binary layer, write-through text."""
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding=getattr(old, "encoding", None) or "utf-8",
        errors=getattr(old, "errors", None) or "strict",
        line_buffering=False,
        write_through=True,
    )


def _buffered(fd: int, old: Any) -> io.TextIOWrapper:
    """A fresh interpreter's stream on ``fd``: block-buffered, line-buffered on a terminal
    (stderr: line-buffered always, as Python's)."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=getattr(old, "encoding", None) or "utf-8",
        errors=getattr(old, "errors", None) or "strict",
        line_buffering=fd == 2 or raw.isatty(),
    )


def _fresh_state() -> None:
    """What a fresh interpreter has of its own: random seeds, thread count from the env."""
    import random

    import torch

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def run_rank() -> None:
    """In a forked rank: run the script or module as ``__main__`` and exit as Python would
    (:func:`aios.launcher.boot.run_as_main`)."""
    script, module, argv = _RANK.get("script"), _RANK.get("module"), list(_RANK.get("argv", []))
    boot.run_as_main(script, module, argv, list(_BASE_PATH), not _RANK.get("plain"))


def is_rank() -> bool:
    """This process is a rank the zygote forked (it must run its script, not the launcher)."""
    return bool(_RANK)


__all__ = [
    "PR_SET_PDEATHSIG",
    "RUNTIME_PREFIXES",
    "RUNTIME_VARS",
    "WarmProcess",
    "Zygote",
    "enabled",
    "env_is_warm_safe",
    "is_rank",
    "parse_command",
    "worth_it",
    "reap_orphans",
    "run_rank",
]
