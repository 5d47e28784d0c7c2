"""``aios-run`` (and ``aios run``): launch a training script on the selected backend.

::

    aios-run [--backend auto|cpu|cuda|tpu|xla|neuron|...] [--nprocs N]
             [--nnodes N --node-rank R --master-addr A --master-port P]
             [--precision P] [--config FILE] [--max-restarts N] [--dry-run [--json]] [--debug]
             [key=value ...] SCRIPT [ARGS...]

Steps: resolve the config (file < ``AIOS_*`` env < ``key=value`` < flags), select the backend
through the registry (``auto``: highest-priority available; an explicitly requested backend that
is unavailable is an error with its install line), ask the backend for its plan
(``BackendSpec.launch_plan``), check what can be checked before starting anything (script exists,
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

import os
import sys
import time
from typing import Any

import click

from aios.cli import run_plan
from aios.cli.main import fail
from aios.cli.run_plan import (
    build_plan,
    check_checkpoint_dir,
    int_or_str,
    print_plan,
    scheduler_defaults,
    split_argv,
)
from aios.ft import launch as ft_launch
from aios.ft import plan as ft_plan
from aios.launcher import warm
from aios.launcher.contract import LAUNCH_TIME_ENV, NO_PREIMPORT_ENV, RUN_ID_ENV
from aios.launcher.outcome import PROG
from aios.launcher.ports import free_port
from aios.launcher.supervise import execute, worker_env
from aios.launcher.worker import LAUNCHER_PID_ENV
from aios.runrecord.records import new_run_id

__all__ = ["PROG", "build_plan", "execute", "main", "reorder_args", "run_command"]


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
    overrides, script, args = split_argv(argv, module)
    flags: dict[str, Any] = {
        "backend": backend,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "master_addr": master_addr,
        "master_port": master_port,
        "precision": precision,
    }
    if nprocs is not None:
        flags["nprocs"] = nprocs if nprocs == "auto" else int_or_str(nprocs)
    if max_restarts is not None:
        flags["launch"] = {"max_restarts": max_restarts}
    scheduler_defaults(flags, overrides, config_file)
    cfg, spec, plan, notes = build_plan(
        script, args, overrides, flags, config_file, module=bool(module), check=not dry_run
    )
    groups = ft_plan.check(cfg, spec.name, plan.world_size)
    if dry_run:
        env = worker_env(cfg, spec.name, os.environ.get(RUN_ID_ENV) or "<new at launch>")
        print_plan(cfg, spec, plan, env, notes, as_json)
        if groups > 1 and not as_json:
            where = (
                "" if cfg.nnodes == 1 else f", {groups // cfg.nnodes} on each of {cfg.nnodes} hosts"
            )
            by = (
                "aios-run"
                if cfg.nnodes == 1
                else (
                    f"node 0's aios-run, found through its store on {cfg.master_addr}:{cfg.master_port}"
                )
            )
            click.echo(
                f"replica groups: {groups} of {plan.world_size // groups} processes{where}; the "
                f"lighthouse on {cfg.master_addr}:<free port>, started by {by}"
            )
        return
    check_checkpoint_dir(cfg)
    if groups > 1:  # the groups' processes are forked from the zygote too (aios.ft.launch)
        if not cfg.launch.warm_start:
            _stop_zygote()
        _run_groups(cfg, spec, plan, notes, script, module, argv)
    execute(
        cfg,
        spec,
        plan,
        notes,
        script,
        zygote=_zygote_for(cfg, plan, script),
        port_is_ours=run_plan.PORT_IS_OURS,
    )


def _run_groups(
    cfg: Any,
    spec: Any,
    plan: Any,
    notes: list[str],
    script: str,
    module: str | None,
    argv: tuple[str, ...],
) -> None:
    """``ft.replica_groups``: the groups' processes under aios-run (:mod:`aios.ft.launch`)."""
    _, _, args = split_argv(argv, module)
    for n in notes:
        click.echo(f"{PROG}: note: {n}", err=True)
    env = {
        **os.environ,
        # the plan's environment for this host's processes, as the ranks without groups get it
        # (their CPU threads among this host's processes; no device extension autoloaded)
        **plan.hosts[0].env,
        **worker_env(cfg, spec.name, os.environ.get(RUN_ID_ENV) or new_run_id()),
        LAUNCH_TIME_ENV: os.environ.get(LAUNCH_TIME_ENV) or repr(time.time()),
        LAUNCHER_PID_ENV: str(os.getpid()),
    }
    command = ft_launch.script_command(script, args, bool(module))
    groups = ft_launch.Groups(
        cfg, plan.world_size, command, env, free_port, lambda m: click.echo(m, err=True), _WARM
    )
    try:
        code = groups.run()
    finally:
        if _WARM is not None:
            warm.reap_orphans()  # what the processes left behind was reparented to aios-run
    sys.exit(code)


def _stop_zygote() -> None:
    global _WARM
    if _WARM is not None:
        _WARM.close()
        _WARM = None


def _zygote_for(cfg: Any, plan: Any, script: str) -> warm.Zygote | None:
    """The zygote, for an elastic launch, or a direct one of a plan with modules to preload
    (forked now: no thread runs yet in a direct launch), with ``launch.warm_start`` on;
    otherwise it is stopped now (it would only take CPU from the run)."""
    global _WARM
    direct = plan.launcher == "direct" and bool(plan.preload)
    if not cfg.launch.warm_start or not (plan.launcher == "elastic" or direct):
        _stop_zygote()
    elif _WARM is None and direct and warm.worth_it(script):
        _WARM = warm.Zygote.start()
        if warm.is_rank():
            warm.run_rank()
            sys.exit(0)
    return _WARM


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
        n = head[i + 1] if i + 1 < len(head) else ""
        elastic = elastic or n == "auto" or (n.isdigit() and int(n) > 1)
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
    script = next((a for a in argv if a.endswith(".py")), None)
    if script is not None and not warm.worth_it(script):
        return
    _WARM = warm.Zygote.start()
    if warm.is_rank():
        warm.run_rank()
        sys.exit(0)


def exit_now(code: object) -> None:
    """End this launcher as ``sys.exit(code)`` would, without the interpreter's teardown of
    what it imported: ``atexit`` handlers run and the streams are flushed, then the process
    ends. Freeing torch's modules object by object costs about a second of CPU per launcher
    (every ``aios-run``, every restart of a managed run) for nothing the launcher still needs.
    Raises ``SystemExit(code)`` instead (the normal exit) where another non-daemon thread
    still runs (Python would wait for it)."""
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        raise SystemExit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``aios-run`` script."""
    args = list(sys.argv[1:] if argv is None else argv)
    _start_zygote(args)
    _preimport_launcher(args)
    code: object = None
    try:
        _main(argv)
    except SystemExit as done:
        if not _ends_without_teardown(argv):
            raise
        code = done.code
    if _ends_without_teardown(argv):
        exit_now(code)


def _ends_without_teardown(argv: list[str] | None) -> bool:
    """The ``aios-run`` script's own process (not a call of :func:`main` from Python, not a
    rank forked from its zygote) with torch imported: its end skips the teardown."""
    return argv is None and "torch" in sys.modules and not warm.is_rank()


def _main(argv: list[str] | None) -> None:
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
