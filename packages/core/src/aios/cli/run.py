"""``aios-run`` (and ``aios run``): launch a training script on the selected backend.

::

    aios-run [--backend auto|cpu|cuda|tpu|xla|neuron|...] [--nprocs N]
             [--nnodes N --node-rank R --master-addr A --master-port P]
             [--precision P] [--config FILE] [--max-restarts N] [--dry-run [--json]] [--debug]
             [key=value ...] SCRIPT [ARGS...]

Steps: resolve the config (file < ``AIOS_*`` env < ``key=value`` < flags), select the backend
through the registry (``auto``: highest-priority available; an explicitly requested backend that
is unavailable is an error with its install line), ask the backend for its plan
(``aios_launch_plan``), check what can be checked before starting anything (script exists,
rendezvous port free, checkpoint dir writable and not corrupt), then run the plan:

* ``direct`` (one process, no restarts): the script as a child process;
* ``elastic``: PyTorch's elastic launcher (``torch.distributed.run``) **in this process**, so
  there is no extra interpreter between ``aios-run`` and the workers; restarts (a fresh
  rendezvous per attempt, one ``aios-run: restart n/N: ...`` line each), per-rank log prefixes
  (``[rankN]:``), SIGINT/SIGTERM forwarded to every rank process (not to its process group:
  its DataLoader workers live until it has checkpointed, :mod:`aios.data.workers`), workers given
  ``checkpoint.grace_seconds`` (+5 s) to write their emergency checkpoint before SIGKILL;
* anything else a backend plans (``xla``): its command as a child process.

Workers receive the resolved config in ``AIOS_RUN_CONFIG`` (JSON of the keys that were set,
secret-looking keys dropped), ``AIOS_RUN_BACKEND`` and ``AIOS_RUN_ID``.

Workers never outlive ``aios-run``, however it dies (SIGKILL of its pid or process group too):
each is started with the parent death signal where the platform has it (Linux), and a worker
that calls ``aios.init()`` also watches the launcher pid (``aios.launcher.worker``).

Exit status: the script's own (0 on success; otherwise the code of the rank that failed first
on its own, named with its rank in one line; ranks the agent stopped afterwards are not blamed),
75 (:data:`aios.resilience.notices.EXIT_PREEMPTED`) when the workers stopped for a
preemption notice after checkpointing, 124 (:data:`aios.resilience.watchdog.EXIT_HUNG`) when the watchdog
found no rank making progress and stopped the workers, 2 for bad input (one line naming the fix;
``--debug`` shows the traceback), 128+N when killed by signal N.

Hangs: a watchdog thread (:mod:`aios.resilience.watchdog`, ``watchdog.*``) watches the ranks' step
progress; on a hang it prints where each rank is, writes every rank's stacks into the run record
and applies ``watchdog.action``. SIGUSR1 dumps the stacks of the live run without stopping it.

Port: an explicitly given ``--master-port`` (flag, config or env) that something is LISTENING
on is an error (connections of an earlier run in TIME_WAIT are not); the default port, when busy
on a single node, is replaced by a free one (noted in the output). With several nodes, node 0
hosts the rendezvous store; the others wait for it (the store's connect timeout).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress as _suppress
from typing import Any

import click

from aios.errors import LaunchError
from aios.launcher import status as rank_status
from aios.launcher import warm
from aios.launcher.worker import LAUNCHER_PID_ENV
from aios.resilience.watchdog import DEMAND_SIGNAL

PROG = "aios-run"
from aios.launcher.contract import (  # noqa: E402
    BACKEND_ENV,
    CONFIG_ENV,
    LAUNCH_TIME_ENV,
    NO_PREIMPORT_ENV,
    RUN_ID_ENV,
    STATUS_DIR_ENV,
)


def _split_argv(argv: tuple[str, ...], module: str | None) -> tuple[list[str], str, list[str]]:
    """``key=value`` overrides, then the script, then its arguments."""
    overrides: list[str] = []
    items = list(argv)
    if module:
        return (
            [a for a in items if "=" in a and not a.startswith("-")],
            module,
            [a for a in items if not ("=" in a and not a.startswith("-"))],
        )
    while (
        items and "=" in items[0] and not items[0].startswith("-") and not os.path.exists(items[0])
    ):
        overrides.append(items.pop(0))
    if not items:
        raise LaunchError(
            "no training script given", "usage: aios-run [OPTIONS] [key=value ...] SCRIPT [ARGS...]"
        )
    return overrides, items[0], items[1:]


def _refuse_saves_without_dir(script: str) -> None:
    """A script that saves into ``checkpoint.dir`` (``rt.save_best``, ``rt.save()``) with none
    set: refused before anything starts, not after its first epoch."""
    from aios.resilience.preflight import needs_checkpoint_dir

    try:
        with open(script, encoding="utf-8") as f:
            found = needs_checkpoint_dir(f.read())
    except (OSError, UnicodeDecodeError):
        return
    if found is not None:
        line, call = found
        raise LaunchError(
            f"{script}:{line} calls {call}, which writes into checkpoint.dir, but none is set",
            f"pass checkpoint.dir=PATH before the script (aios-run checkpoint.dir=ckpt {script})",
        )


def _misplaced_overrides(cfg: Any, args: list[str]) -> list[str]:
    """The script's arguments that read like aios-run's own ``key=value`` options (a top-level
    aios setting, e.g. ``strategy=fsdp``, ``checkpoint.dir=ckpt``)."""
    fields = set(type(cfg).model_fields)
    out = []
    for a in args:
        key, eq, _ = a.partition("=")
        if eq and not a.startswith("-") and key.split(".", 1)[0] in fields:
            out.append(a)
    return out


def _port_free(addr: str, port: int) -> bool:
    """Nothing is LISTENING on ``addr:port``. Bound with SO_REUSEADDR, as the c10d store binds,
    so connections of an earlier run still in TIME_WAIT do not count as in use."""
    host = "" if addr in ("0.0.0.0", "*") else addr
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return True  # not a local address: the rendezvous host checks for itself
    family, _, _, _, sockaddr = infos[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name != "nt":  # on Windows SO_REUSEADDR would let the bind steal a listening port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(sockaddr)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def _is_local(addr: str) -> bool:
    if addr in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return True
    try:
        return (
            addr in {socket.gethostname(), socket.getfqdn()}
            or addr in socket.gethostbyname_ex(socket.gethostname())[2]
        )
    except OSError:
        return False


def _check_checkpoint_dir(cfg: Any) -> None:
    """Writable, and its newest complete checkpoint (if any) is intact (sizes vs marker)."""
    if not cfg.checkpoint.dir:
        return
    from aios.checkpoint import CheckpointStore

    store = CheckpointStore(cfg.checkpoint.dir, keep=cfg.checkpoint.keep)
    store.check_writable()
    if cfg.checkpoint.resume:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            info = store.latest(warn=False)
        if info is not None:
            store.verify(info)


def build_plan(
    script: str,
    args: list[str],
    overrides: list[str],
    flags: dict[str, Any],
    config_file: str | None,
    module: bool = False,
    check: bool = True,
) -> tuple[Any, Any, Any, list[str]]:
    """``(config, backend spec, plan, notes)``; raises :class:`AiosError` for bad input."""
    from aios.config.schema import resolve
    from aios.plugins.registry import get_registry
    from aios.types import LaunchRequest

    cfg = resolve(config_file, overrides, flags)
    if not module and not os.path.isfile(script):
        hint = (
            "check the path"
            if not os.path.exists(script)
            else "pass a Python file, or use -m for a module"
        )
        raise LaunchError(f"script '{script}' not found", hint)
    reg = get_registry()
    spec = reg.select(cfg.backend, config=cfg)
    if not module and not cfg.checkpoint.dir:
        _refuse_saves_without_dir(script)
    notes: list[str] = []
    misplaced = _misplaced_overrides(cfg, args)
    if misplaced:
        name = script if module else os.path.basename(script)
        notes.append(
            f"{' '.join(misplaced)} after the script go{'es' if len(misplaced) == 1 else ''} to "
            f"{name}'s own arguments, not to aios-run; to set aios options, put them before the "
            f"script (aios-run {' '.join(misplaced)} {name} ...)"
        )
    updates: dict[str, Any] = {"backend": spec.name}
    cfg = cfg.model_copy(update=updates)
    cfg.model_fields_set.add("backend")
    request = LaunchRequest(script=script, args=list(args), module=module)
    plan = reg.call_first("aios_launch_plan", backend=spec.name, config=cfg, request=request)
    if plan is None:
        raise LaunchError(
            f"backend '{spec.name}' has no launch plan",
            f"reinstall the plugin that provides it ({spec.plugin})",
        )
    global _PORT_IS_OURS
    _PORT_IS_OURS = (
        "master_port" not in cfg.model_fields_set and cfg.nnodes == 1 and _is_local(cfg.master_addr)
    )
    if check and plan.launcher != "direct" and cfg.node_rank == 0 and _is_local(cfg.master_addr):
        if not _port_free(cfg.master_addr, cfg.master_port):
            explicit = "master_port" in cfg.model_fields_set
            if explicit or cfg.nnodes > 1:
                raise LaunchError(
                    f"port {cfg.master_port} on {cfg.master_addr} is in use (another run, or a stale process)",
                    f"pass a free port, e.g. --master-port {_free_port(cfg.master_addr)}",
                )
            port = _free_port(cfg.master_addr)
            notes.append(f"default port {cfg.master_port} is in use; using {port}")
            cfg = cfg.model_copy(update={"master_port": port})
            plan = reg.call_first(
                "aios_launch_plan", backend=spec.name, config=cfg, request=request
            )
    return cfg, spec, plan, notes


def _worker_env(cfg: Any, backend: str, run_id: str) -> dict[str, str]:
    from aios.runtime import explicit_config_json

    return {CONFIG_ENV: explicit_config_json(cfg), BACKEND_ENV: backend, RUN_ID_ENV: run_id}


def _print_plan(
    cfg: Any, spec: Any, plan: Any, env: dict[str, str], notes: list[str], as_json: bool
) -> None:
    from aios.plugins.registry import get_registry

    devices = None
    try:
        rep = get_registry().call_first("aios_discover_devices", backend=spec.name, config=cfg)
        devices = rep.to_dict() if rep is not None else None
    except Exception as exc:  # noqa: BLE001
        devices = {"error": str(exc)}
    data = plan.to_dict()
    for h in data["hosts"]:
        h["env"] = {**h["env"], **env}
        if plan.launcher == "direct":
            h["ranks"] = []  # one process, started as it is: no RANK/WORLD_SIZE/MASTER_* set
        h["shell"] = " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in sorted(h["env"].items())),
                *map(shlex.quote, h["command"]),
            ]
        )
    out = {
        "backend": spec.name,
        "plugin": spec.plugin,
        "launcher": plan.launcher,
        "world_size": plan.world_size,
        "devices": devices,
        "config": cfg.redacted_dict(),
        "hosts": data["hosts"],
        "notes": [*plan.notes, *notes],
    }
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    dev = (
        f"{devices.get('count')} x {devices.get('kind')}"
        if isinstance(devices, dict) and "count" in devices
        else "unknown"
    )
    click.echo(f"backend:    {spec.name} (plugin {spec.plugin or '?'})")
    click.echo(f"devices:    {dev}")
    click.echo(
        f"launcher:   {plan.launcher}, world size {plan.world_size}, precision {cfg.precision}"
    )
    for h in data["hosts"]:
        click.echo(f"host {h['host']['address']}: {h['nprocs']} process(es)")
        if plan.launcher == "direct":
            click.echo("  rank 0: one process (no RANK, WORLD_SIZE or MASTER_* variables are set)")
        for r in h["ranks"]:
            click.echo(
                "  rank " + r.get("RANK", "?") + ": " + " ".join(f"{k}={v}" for k, v in r.items())
            )
        click.echo(
            "  env:     " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(h["env"].items()))
        )
        click.echo("  command: " + " ".join(shlex.quote(c) for c in h["command"]))
    for n in out["notes"]:
        click.echo(f"note: {n}")


def _unjoined(status_dir: str, ranks: list[dict[str, str]], world: int) -> list[int]:
    """This node's ranks that never said (``joined-<rank>``, written by ``aios.init``) that
    they joined the launcher's process group of ``world`` ranks."""
    return [
        int(env["RANK"])
        for env in ranks
        if rank_status.joined_world(status_dir, int(env["RANK"])) != world
    ]


#: the key torch's store-based barrier counts the ranks of the default group in
#: (``init_process_group`` with ``TORCH_DIST_INIT_BARRIER=1``; the default group's store is the
#: launcher's under ``PrefixStore("default_pg")``)
JOIN_COUNT_KEY = "default_pg/store_based_barrier_key:0"


def _joined_count(store: Any) -> int | None:
    """How many ranks joined the default process group, read from the launcher's store (the
    root of torch elastic's prefixed stores), or None when it cannot be read."""
    from torch.distributed import PrefixStore

    while isinstance(store, PrefixStore):
        store = store.underlying_store
    try:
        return int(store.add(JOIN_COUNT_KEY, 0))
    except (RuntimeError, ValueError):  # the store is gone (the agent closed it)
        return None


def _name_unjoined(
    status_dir: str, ranks: list[dict[str, str]], world: int, joined: int | None = None
) -> None:
    """At the end of a run of several processes: name the ranks that never called
    ``aios.init()`` (a script that does not use aios, or gates itself out, e.g. "not enough
    GPUs", and exits 0): aios cannot tell that they trained together. ``joined``: how many
    ranks joined the launcher's default process group (a plain torchrun script that calls
    ``init_process_group`` with the launcher's ranks is no copy)."""
    if world <= 1 or (joined is not None and joined >= world):
        return
    missing = _unjoined(status_dir, ranks, world)
    if not missing:
        return
    which = ", ".join(str(r) for r in missing)
    click.echo(
        f"{PROG}: warning: rank{'s' if len(missing) > 1 else ''} {which} of {world} ended without "
        "calling aios.init(), so aios cannot tell that they joined one process group: a script "
        "that reads its own --world-size (default 1), or exits when it finds no GPU, ran as "
        f"{len(missing)} independent cop{'ies' if len(missing) > 1 else 'y'}; call aios.init() "
        "(or init_process_group with the launcher's RANK and WORLD_SIZE)",
        err=True,
    )


def _preempted_exit(cfg: Any, status: dict[int, str] | None = None) -> None:
    from aios.resilience.notices import EXIT_PREEMPTED

    paths = [v.split(" ", 1)[1] for v in (status or {}).values() if " " in v and v.split(" ", 1)[1]]
    if paths:
        click.echo(
            f"{PROG}: preempted: emergency checkpoint {paths[0]} written; relaunch the same command to resume",
            err=True,
        )
    elif status and getattr(getattr(cfg, "checkpoint", None), "dir", None):
        # this node's ranks do not write (rank 0, on another node, writes the checkpoint)
        click.echo(
            f"{PROG}: preempted: the emergency checkpoint is written by rank 0 under "
            f"{cfg.checkpoint.dir}; relaunch the same command to resume",
            err=True,
        )
    elif status:
        click.echo(
            f"{PROG}: preempted: no checkpoint.dir was configured, progress since the last start is lost",
            err=True,
        )
    else:
        click.echo(
            f"{PROG}: preempted: the workers stopped for a preemption notice; relaunch the same command to resume",
            err=True,
        )
    sys.exit(EXIT_PREEMPTED)


# errors a script dies of when it is tied to one device: the launcher points at `aios check`
_PORTABILITY_ERRORS = (
    "Distributed package doesn't have NCCL built in",  # a CPU build of torch
    "ProcessGroupNCCL is only supported with GPUs",  # a CUDA build on a machine without a GPU
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "No CUDA GPUs are available",
    "Runtime is already initialized",
    "CUDA error",
)


_HINT_TAIL = 200_000  # bytes of a failed rank's stderr searched for the traceback


def _portability_hint(script: str, logs: str, failure: Any) -> str | None:
    """When the failed rank's stderr (torch's tee file under ``logs``) ends in one of
    :data:`_PORTABILITY_ERRORS`, the ``aios check`` finding for the deepest line of ``script`` in
    its traceback (static, no torch), as a final line."""
    import glob

    files = glob.glob(os.path.join(logs, "*", "attempt_*", str(failure.local_rank), "stderr.log"))
    if not files:
        return None
    try:
        with open(max(files, key=os.path.getmtime), errors="replace") as f:
            text = f.read()[-_HINT_TAIL:]
    except OSError:
        return None
    return _hint_from_stderr(script, text)


def _hint_from_stderr(script: str, text: str) -> str | None:
    """The hint of :func:`_portability_hint` from the text a failed process wrote to stderr."""
    import re

    tb = text[text.rfind("Traceback (most recent call last)") :]
    if not any(e in tb for e in _PORTABILITY_ERRORS):
        return None
    frames = [
        (os.path.realpath(m.group(1)), int(m.group(2)))
        for m in re.finditer(r'File "([^"]+)", line (\d+)', tb)
    ]
    from aios.check.checker import CheckError, check_project

    try:
        # the script and the modules of its project it imports: the deepest frame in any of them
        by_line: dict[tuple[str, int], list[Any]] = {}
        for f in check_project(script):
            by_line.setdefault((os.path.realpath(f.path), f.line), []).append(f)
    except CheckError:
        return None
    found = next((by_line[fr] for fr in reversed(frames) if fr in by_line), None)
    if not found:
        return None
    return (
        f"{PROG}: hint: {found[0]} -- `aios check {script}` lists every line that ties it to one "
        "device, `aios check --fix` rewrites the safe ones"
    )


def _script_failed(
    script: str, rank: int | str, code: int, others: bool, hint: str | None = None
) -> None:
    if code < 0:
        name = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        click.echo(
            f"{PROG}: error: {script} was killed by {name} on rank {rank}"
            + (" (other ranks stopped)" if others else ""),
            err=True,
        )
        sys.exit(128 - code)
    click.echo(
        f"{PROG}: error: {script} exited with code {code} on rank {rank}"
        + (" (other ranks stopped)" if others else "")
        + "; see its output above",
        err=True,
    )
    if hint:
        click.echo(hint, err=True)
    sys.exit(code)


def _relay_stderr(fd: int, tail: bytearray) -> None:
    """Copy a worker's stderr (``fd``: a pipe, or a pseudo-terminal) to ours as it comes (raw
    chunks, no line buffering), keeping its last :data:`_HINT_TAIL` bytes in ``tail`` for the
    portability hint. Closes ``fd`` at the end of the output."""
    out = getattr(sys.stderr, "buffer", None)
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:  # pragma: no cover - retried by os.read since PEP 475
                continue
            except OSError:  # EIO: the pseudo-terminal's last writer is gone
                break
            if not chunk:
                break
            tail += chunk
            del tail[:-_HINT_TAIL]
            try:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:  # pragma: no cover - a replaced sys.stderr without a buffer
                    sys.stderr.write(chunk.decode(errors="replace"))
                    sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone: keep draining
                out = None
    finally:
        with _suppress(OSError):
            os.close(fd)


def _stderr_channel() -> tuple[int, int]:
    """``(read end, the worker's stderr)``: a pseudo-terminal when our stderr is a terminal (the
    script still sees one: colours, progress bars and their width stay as without aios), else a
    pipe."""
    try:
        isatty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        isatty = False
    if isatty and sys.platform != "win32":
        import fcntl
        import pty
        import termios

        master, slave = pty.openpty()
        with _suppress(OSError):
            size = fcntl.ioctl(sys.stderr.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        return master, slave
    return os.pipe()


def _run_subprocess(cmd: list[str], env: dict[str, str], tail: bytearray | None = None) -> int:
    """Run ``cmd`` forwarding SIGINT/SIGTERM/SIGHUP; return its exit status (negative = signal).
    With ``tail``, its stderr is relayed through this process and the end of it kept there."""
    import threading

    from aios.launcher.worker import child_preexec

    read_end, child_err = _stderr_channel() if tail is not None else (-1, None)
    try:
        proc = subprocess.Popen(
            cmd, env=env, preexec_fn=child_preexec(os.getpid()), stderr=child_err
        )
    except BaseException:
        if child_err is not None:
            os.close(read_end)
        raise
    finally:
        if child_err is not None:
            os.close(child_err)  # the worker holds it now
    relay = None
    if tail is not None:
        relay = threading.Thread(
            target=_relay_stderr, args=(read_end, tail), name="aios-stderr", daemon=True
        )
        relay.start()
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handled by forward()
                continue
        if relay is not None:  # the rest of its output; a process it left behind may hold the
            relay.join(5.0)  # pipe open: not waited for beyond that
        return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)


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


class _AgentWatch:
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

    def __enter__(self) -> _AgentWatch:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler as sh,
        )

        from aios.launcher.worker import child_preexec

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
                what = f"rank {rank} {_describe_exit(f.exitcode)}"
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
        self._patch(LocalElasticAgent, "_monitor_workers", _wrap_monitor(monitor, watch))
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


def _blame(failures: dict[int, Any], status: dict[int, str], watch: _AgentWatch) -> tuple[int, Any]:
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


def _wrap_monitor(monitor: Any, watch: _AgentWatch) -> Any:
    def _monitor(agent: Any, worker_group: Any) -> Any:
        result = monitor(agent, worker_group)
        if result.state.name == "SUCCEEDED" and worker_group.store is not None:
            watch.joined = _joined_count(worker_group.store)
        if result.is_failed():
            watch.last_failures = dict(result.failures)
            if watch.no_restart:  # the watchdog stopped a hung run: no restart
                agent._remaining_restarts = 0
        return result

    return _monitor


def _describe_exit(code: int) -> str:
    if code < 0:
        name = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        return f"was killed by {name}"
    return f"exited with code {code}"


#: the launch's master port is aios's choice (the default, one local node): another run that
#: takes it between the check and the store's bind is answered with another free port
_PORT_IS_OURS = False


def _port_taken(exc: BaseException) -> bool:
    """torch's store could not bind its port (``EADDRINUSE``)."""
    return "EADDRINUSE" in str(exc) or "address already in use" in str(exc)


def _with_port(targs: list[str], env: dict[str, str], port: int) -> list[str]:
    """torchrun's arguments and the workers' env with the master port replaced."""
    out = list(targs)
    for i, a in enumerate(out[:-1]):
        if a == "--master-port":
            out[i + 1] = str(port)
        elif a == "--rdzv-endpoint":
            host = out[i + 1].rsplit(":", 1)[0]
            out[i + 1] = f"{host}:{port}"
    if "MASTER_PORT" in env:
        env["MASTER_PORT"] = str(port)
    return out


def _run_elastic_inprocess(
    targs: list[str], env: dict[str, str], grace: float, watch: _AgentWatch
) -> tuple[str, Any]:
    """``torch.distributed.run`` in this process. Returns ``("ok"|"failed"|"signal", detail)``."""
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

    from aios.launcher import relay as tail

    tail.install()  # each rank's output reaches the terminal in whole lines
    try:
        with watch:
            run(parse_args(targs))
        return "ok", None
    except DistNetworkError as exc:
        if _PORT_IS_OURS and _port_taken(exc) and not watch.joined:
            return "port-taken", exc
        raise
    except ChildFailedError as exc:
        return "failed", exc.failures
    except SignalException as exc:
        return "signal", exc.sigval


def execute(cfg: Any, spec: Any, plan: Any, notes: list[str], script: str) -> None:
    """Run a plan on this host and exit with the documented status."""
    from aios.runrecord.records import new_run_id

    if len(plan.hosts) != 1:
        raise LaunchError(
            f"the plan has {len(plan.hosts)} hosts; aios-run starts the processes of this host only",
            "run aios-run on every node with --node-rank, or use `aios launch` for clusters",
        )
    host = plan.hosts[0]
    run_id = os.environ.get(RUN_ID_ENV) or new_run_id()
    status_dir = rank_status.create()
    from aios.resilience import flightrec

    env = {
        # NCCL's flight recorder, dumped by the watchdog on a hang (unless the user set it up)
        **flightrec.worker_env(status_dir, {**os.environ, **host.env}),
        **host.env,
        **_worker_env(cfg, spec.name, run_id),
        # when this attempt was launched (a cloud launcher's earlier time stands): the goodput
        # account's start-up begins here (aios.runrecord.goodput)
        LAUNCH_TIME_ENV: os.environ.get(LAUNCH_TIME_ENV) or repr(time.time()),
        STATUS_DIR_ENV: status_dir,
        LAUNCHER_PID_ENV: str(os.getpid()),
    }
    for n in [*plan.notes, *notes]:  # what the plan changed on its own is never silent
        click.echo(f"{PROG}: note: {n}", err=True)
    zygote = _WARM if cfg.launch.warm_start else None
    watch = _AgentWatch(zygote)
    dog = None
    try:
        dog = _start_watchdog(cfg, status_dir, run_id, watch, {**os.environ, **env})
        cmd = host.command
        if (
            plan.launcher == "elastic"
            and cmd[1:3] == ["-m", "torch.distributed.run"]
            and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)
        ):
            logs = os.path.join(status_dir, "logs")  # the ranks' tee'd output, removed below
            targs = ["--log-dir", logs, *cmd[3:]]
            kind, detail = _run_elastic_inprocess(targs, env, cfg.checkpoint.grace_seconds, watch)
            for _ in range(3):  # another run bound the free port aios chose before its store did
                if kind != "port-taken":
                    break
                port = _free_port(cfg.master_addr)
                click.echo(
                    f"{PROG}: note: port {cfg.master_port} was taken by another process as this "
                    f"run started; using {port}",
                    err=True,
                )
                cfg = cfg.model_copy(update={"master_port": port})
                targs = _with_port(targs, env, port)
                kind, detail = _run_elastic_inprocess(
                    targs, env, cfg.checkpoint.grace_seconds, watch
                )
            if kind == "port-taken":
                raise detail
            status = rank_status.read_ranks(status_dir)
            if kind == "ok":
                _name_unjoined(status_dir, host.ranks, plan.world_size, watch.joined)
                sys.exit(0)
            if dog is not None and dog.hang is not None and kind == "failed":
                _hung_exit(script, dog)
            if status and all(v.startswith("preempted") for v in status.values()):
                _preempted_exit(cfg, status)
            if kind == "signal":
                sig = detail
                click.echo(
                    f"{PROG}: stopped by {getattr(sig, 'name', sig)}; workers were sent the same signal",
                    err=True,
                )
                sys.exit(128 + int(sig))
            failures = detail or {}
            if failures and all(f.exitcode == 75 for f in failures.values()):
                _preempted_exit(cfg, status)
            rank, failure = _blame(failures, status, watch) if failures else (0, None)
            code = failure.exitcode if failure is not None else 1
            hint = _portability_hint(script, logs, failure) if failure is not None else None
            _script_failed(script, rank, code, plan.world_size > 1, hint)
        else:
            tail = bytearray()  # the end of its stderr, for the portability hint
            code = _run_subprocess(cmd, {**os.environ, **env}, tail)
            status = rank_status.read_ranks(status_dir)
            if code == 0:
                sys.exit(0)
            if dog is not None and dog.hang is not None:
                _hung_exit(script, dog)
            if code == 75 or (status and all(v.startswith("preempted") for v in status.values())):
                _preempted_exit(cfg, status)
            hint = _hint_from_stderr(script, tail.decode(errors="replace")) if code > 0 else None
            _script_failed(
                script, 0 if plan.world_size == 1 else "?", code, plan.world_size > 1, hint
            )
    finally:
        import shutil

        if zygote is not None:
            warm.reap_orphans()  # what the ranks left behind was reparented to this process
        if dog is not None:
            dog.stop()
            with _suppress(ValueError):
                signal.signal(DEMAND_SIGNAL, signal.SIG_DFL)
            # dumps a rank wrote by itself (a collective timed out): kept in the run record
            if not dog.hangs and dog.record_dir:
                kept = flightrec.keep_dumps(status_dir, os.path.join(dog.record_dir, "nccl"))
                if kept:
                    click.echo(
                        f"{PROG}: NCCL flight recorder dumps (a collective timed out): {kept} "
                        f"(`torchfrtrace {kept}`)",
                        err=True,
                    )
        shutil.rmtree(status_dir, ignore_errors=True)


def _start_watchdog(
    cfg: Any, status_dir: str, run_id: str, watch: _AgentWatch, rank_env: dict[str, str]
) -> Any:
    """The hang watchdog over this node's ranks (:mod:`aios.resilience.watchdog`), and SIGUSR1 for a dump
    of the live run (also with ``watchdog.enabled`` off, which only stops the hang checks).
    ``rank_env``: the environment the ranks run with (their NCCL flight recorder settings)."""
    from aios.resilience.watchdog import Watchdog, echo_err

    settings = cfg.watchdog
    record = os.path.abspath(os.path.join(cfg.logging.run_dir, run_id))
    with open(os.path.join(status_dir, "run.json"), "w") as f:
        json.dump({"run_id": run_id, "run_dir": record, "launcher": os.getpid()}, f)
    dog = Watchdog(settings, status_dir, record, echo_err)
    dog.rank_env = rank_env

    def on_hang(action: str) -> None:
        if action == "restart":
            watch.hang_note = dog.hang["why"] if dog.hang else "hang"
        else:
            watch.no_restart = True
        dog.kill_workers()

    dog.on_hang = on_hang
    with _suppress(ValueError):  # not the main thread (aios run inside a test harness)
        signal.signal(DEMAND_SIGNAL, dog.request_dump)
    return dog.start()


def _hung_exit(script: str, dog: Any) -> None:
    from aios.resilience.watchdog import EXIT_HUNG

    hang = dog.hang or {}
    where = f"; stacks: {hang['path']}" if hang.get("path") else ""
    click.echo(
        f"{PROG}: error: {script} hung: {hang.get('why', 'no progress')}; every worker was "
        f"stopped (exit {EXIT_HUNG}){where}",
        err=True,
    )
    sys.exit(EXIT_HUNG)


def _run(
    argv: tuple[str, ...],
    backend: str | None,
    nprocs: str | None,
    nnodes: int | None,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    precision: str | None,
    config_file: str | None,
    max_restarts: int | None,
    dry_run: bool,
    as_json: bool,
    module: str | None,
) -> None:
    overrides, script, args = _split_argv(argv, module)
    flags: dict[str, Any] = {
        "backend": backend,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "master_addr": master_addr,
        "master_port": master_port,
        "precision": precision,
    }
    if nprocs is not None:
        flags["nprocs"] = nprocs if nprocs == "auto" else _int_or_str(nprocs)
    if max_restarts is not None:
        flags["launch"] = {"max_restarts": max_restarts}
    _scheduler_defaults(flags, overrides, config_file)
    cfg, spec, plan, notes = build_plan(
        script, args, overrides, flags, config_file, module=bool(module), check=not dry_run
    )
    if dry_run:
        env = _worker_env(cfg, spec.name, os.environ.get(RUN_ID_ENV) or "<new at launch>")
        _print_plan(cfg, spec, plan, env, notes, as_json)
        return
    _check_checkpoint_dir(cfg)
    execute(cfg, spec, plan, notes, script)


def _scheduler_defaults(
    flags: dict[str, Any], overrides: list[str], config_file: str | None
) -> None:
    """Inside a scheduler's job (Slurm step, Kubernetes indexed Job/JobSet; see
    :mod:`aios.environments.base`), default nnodes, node rank, master address/port from it. Explicit
    flags and config win; an explicit nnodes/node rank that contradicts the scheduler is a
    one-line error. When the scheduler started one process per rank (``srun
    --ntasks-per-node=N``), this process runs the script directly as that rank."""
    from aios.environments.base import detect
    from aios.plugins.registry import get_registry

    info = detect(None, get_registry())
    if info.name in ("local", "torchelastic"):
        return
    from aios.config.schema import resolve

    cfg = resolve(config_file, overrides, {k: v for k, v in flags.items() if v is not None})
    per_rank = info.rank is not None and info.world_size is not None
    want: dict[str, Any] = {
        "nnodes": 1 if per_rank else info.nnodes,
        "node_rank": 0 if per_rank else info.node_rank,
        "master_addr": info.master_addr,
    }
    if info.master_port is not None:
        want["master_port"] = info.master_port
    if per_rank:
        want["nprocs"] = 1
    for key, value in want.items():
        if key in cfg.model_fields_set:
            if key in ("nnodes", "node_rank", "nprocs") and getattr(cfg, key) != value:
                raise LaunchError(
                    f"{key}={getattr(cfg, key)} contradicts the {info.name} job ({key} {value} there)",
                    f"drop {key} from the flags/config, or change the {info.name} job's size",
                )
            continue
        flags[key] = value
    if per_rank:
        os.environ.update(
            {
                "RANK": str(info.rank),
                "WORLD_SIZE": str(info.world_size),
                "LOCAL_RANK": str(info.local_rank or 0),
                "LOCAL_WORLD_SIZE": str(info.local_world_size or 1),
                "GROUP_RANK": str(info.node_rank),
                "MASTER_ADDR": str(
                    cfg.master_addr if "master_addr" in cfg.model_fields_set else info.master_addr
                ),
                "MASTER_PORT": str(
                    cfg.master_port
                    if "master_port" in cfg.model_fields_set or info.master_port is None
                    else info.master_port
                ),
            }
        )
    elif info.nnodes > 1 and "rdzv_backend" not in cfg.launch.model_fields_set:
        # the scheduler fixed the node ranks: keep them (c10d would assign its own)
        flags["launch"] = {**(flags.get("launch") or {}), "rdzv_backend": "static"}


def _int_or_str(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v


_OPTIONS = [
    click.option(
        "--backend",
        default=None,
        help="auto | cpu | cuda | tpu | xla | neuron | <plugin backend> (default: auto).",
    ),
    click.option(
        "--nprocs", default=None, help="Processes per node (default: one per device; 1 on CPU)."
    ),
    click.option("--nnodes", type=int, default=None, help="Number of nodes."),
    click.option("--node-rank", type=int, default=None, help="Rank of this node."),
    click.option("--master-addr", default=None, help="Rendezvous host (node 0)."),
    click.option("--master-port", type=int, default=None, help="Rendezvous port."),
    click.option("--precision", default=None, help="fp32 | bf16-mixed | fp16-mixed | bf16-true."),
    click.option("--config", "config_file", default=None, help="YAML config file."),
    click.option(
        "--max-restarts",
        type=int,
        default=None,
        help="Restart all workers up to N times after a failure.",
    ),
    click.option(
        "--dry-run",
        is_flag=True,
        help="Print the resolved plan and exit (starts nothing, no torch import).",
    ),
    click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON."),
    click.option(
        "-m", "--module", default=None, help="Run a module (python -m) instead of a script."
    ),
    click.option("--debug", is_flag=True, help="Show tracebacks for errors."),
    click.argument("argv", nargs=-1, type=click.UNPROCESSED),
]

_CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}
_VALUE_OPTS = {
    "--backend",
    "--nprocs",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--precision",
    "--config",
    "--max-restarts",
    "-m",
    "--module",
}


def reorder_args(args: list[str]) -> list[str]:
    """Options and ``key=value`` overrides may come in any order before the script; everything
    from the script on belongs to the script. Returns options first, then overrides, then the
    script and its arguments (what the click command parses)."""
    opts: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return opts + overrides + args[i + 1 :]
        if a.startswith("-"):
            name = a.split("=", 1)[0]
            opts.append(a)
            if name in _VALUE_OPTS and "=" not in a and i + 1 < len(args):
                opts.append(args[i + 1])
                i += 1
                if name in ("-m", "--module"):
                    return opts + overrides + args[i + 1 :]
            i += 1
            continue
        if "=" in a and not os.path.exists(a):
            overrides.append(a)
            i += 1
            continue
        return opts + overrides + args[i:]
    return opts + overrides


class _RunCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, reorder_args(list(args)))


def _decorate(fn: Any) -> Any:
    for opt in reversed(_OPTIONS):
        fn = opt(fn)
    return fn


@click.command(name="run", cls=_RunCommand, context_settings=_CONTEXT)
@_decorate
def run_command(argv: tuple[str, ...], debug: bool, **kw: Any) -> None:
    """Launch a training script: aios run [OPTIONS] [key=value ...] SCRIPT [ARGS...]."""
    if debug:
        os.environ["AIOS_DEBUG"] = "1"
    _run(argv, **kw)


@click.command(name=PROG, cls=_RunCommand, context_settings=_CONTEXT)
@_decorate
def _aios_run(argv: tuple[str, ...], debug: bool, **kw: Any) -> None:
    """Launch a training script on the selected backend.

    aios-run [OPTIONS] [key=value ...] SCRIPT [ARGS...]
    """
    if debug:
        os.environ["AIOS_DEBUG"] = "1"
    _run(argv, **kw)


def _likely_elastic(argv: list[str]) -> bool:
    """The arguments likely launch several processes or restarts (an elastic launch, which
    imports torch here; a direct, single-process launch needs no torch here). False for
    --dry-run and --help, which never import torch."""
    head = argv[: next((i for i, a in enumerate(argv) if a.endswith(".py")), len(argv))]
    if any(a in ("--dry-run", "-h", "--help") for a in head):
        return False
    elastic = any(
        a in ("--nnodes", "--max-restarts")
        or a.startswith(("nprocs=", "nnodes=", "launch.max_restarts="))
        for a in head
    )
    if "--nprocs" in head:
        i = head.index("--nprocs")
        elastic = elastic or (i + 1 < len(head) and head[i + 1] not in ("1",))
    return elastic


def _preimport_launcher(argv: list[str]) -> None:
    """Import torch's elastic launcher in a background thread while the config, plugins and
    plan are resolved (it is needed for every multi-process launch)."""
    if os.environ.get(NO_PREIMPORT_ENV) or not _likely_elastic(argv):
        return
    import importlib.util
    import threading

    if importlib.util.find_spec("torch") is None:
        return

    def work() -> None:
        try:
            import torch.distributed.run  # noqa: F401
        except Exception:  # noqa: BLE001 - the real import reports any problem
            pass

    threading.Thread(target=work, name="aios-preimport", daemon=True).start()


#: the zygote the ranks of this ``aios-run`` are forked from (:mod:`aios.launcher.warm`)
_WARM: warm.Zygote | None = None


def _start_zygote(argv: list[str]) -> None:
    """Before any thread starts: the zygote, for a launch that is likely elastic. In a rank it
    forked, run the script and exit (never returns there)."""
    global _WARM
    if not _likely_elastic(argv):
        return
    _WARM = warm.Zygote.start()
    if warm.is_rank():
        warm.run_rank()
        sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``aios-run`` script."""
    from aios.cli.main import fail

    args = list(sys.argv[1:] if argv is None else argv)
    _start_zygote(args)
    _preimport_launcher(args)

    try:
        _aios_run.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo(f"{PROG}: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"{PROG}: error: {exc.format_message()} (see {PROG} --help)", err=True)
        sys.exit(2)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            click.echo(f"{PROG}: interrupted", err=True)
            sys.exit(130)
        fail(exc, prog=PROG)
    finally:
        if _WARM is not None:
            _WARM.close()


if __name__ == "__main__":  # pragma: no cover
    main()
