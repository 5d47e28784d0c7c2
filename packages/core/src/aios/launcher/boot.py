"""A rank's first frame: the script (or module) run as ``__main__`` the way ``python -u SCRIPT
ARGS`` (``python -u -m MODULE ARGS``) runs it, with :mod:`aios.launcher.guard` in place first.

Ranks forked from the zygote (:mod:`aios.launcher.warm`) call :func:`run_as_main`; a rank the
elastic agent starts fresh runs ``python -u -m aios.launcher.boot SCRIPT ARGS`` (or ``... -m
MODULE ARGS``), the command :func:`command` makes of the agent's. What the script sees is a
fresh interpreter's: ``sys.argv``, ``sys.path[0]`` (the script's folder; the working directory
for a module), ``__main__`` with its ``__file__``, a traceback that starts at the script's own
first frame, exit status 1 for an uncaught exception and death by SIGINT for an uncaught
``KeyboardInterrupt``. A ``SystemExit`` passes through, its line kept for the run's end
(:func:`aios.launcher.guard.ended_at`).

Standard library only; never imports torch.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from aios.launcher import guard

MODULE = "aios.launcher.boot"


def command(args: Sequence[str]) -> list[str] | None:
    """``python -u -m aios.launcher.boot ...`` for the agent's ``python -u SCRIPT ARGS`` / ``python
    -u -m MODULE ARGS`` run by this interpreter; None for any other command (left as it is)."""
    parsed = parse_command(args)
    if parsed is None:
        return None
    script, module, argv = parsed
    if module == MODULE:
        return None
    head = ["-m", module] if module else [script]
    return [args[0], "-u", "-m", MODULE, *head, *argv]


def parse_command(args: Sequence[str]) -> tuple[str | None, str | None, list[str]] | None:
    """``(script, module, argv)`` of ``python -u SCRIPT ARGS`` / ``python -u -m MODULE ARGS``
    run by this interpreter, None for any other command."""
    if len(args) < 3 or args[1] != "-u":
        return None
    if os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    if args[2] == "-m":
        if len(args) < 4:
            return None
        return None, args[3], list(args[4:])
    if args[2].startswith("-"):
        return None
    return args[2], None, list(args[3:])


def parse_plain(args: Sequence[str]) -> tuple[str | None, str | None, list[str]] | None:
    """``(script, module, argv)`` of ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` (the
    command of a ``direct`` plan) run by this interpreter, None for any other command."""
    if len(args) < 2 or args[1] == "-u":
        return None
    return parse_command([args[0], "-u", *args[1:]])


def run_as_main(
    script: str | None,
    module: str | None,
    argv: list[str],
    base_path: list[str],
    guarded: bool = True,
) -> None:
    """Run ``script`` (or ``module``) as ``__main__`` with ``argv`` and ``sys.path`` =
    [its folder, *base_path]; exit as Python would (``SystemExit`` raised from here unwinds
    the caller's frames to the interpreter's normal exit: threads joined, ``atexit`` handlers
    run, streams flushed). ``guarded``: with :mod:`aios.launcher.guard` installed first (a
    rank of the elastic agent; a ``direct`` plan's process runs without it)."""
    if guarded:
        guard.install(os.environ)
    root = os.getcwd() if module else os.path.dirname(os.path.realpath(script or "."))
    try:
        if module:
            import runpy

            sys.path[:] = [os.getcwd(), *base_path]
            sys.argv = ["-m", *argv]
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
        else:
            assert script is not None
            run_script(script, argv, base_path)
    except SystemExit:
        guard.record_end(sys.exc_info()[2], root)
        raise
    except KeyboardInterrupt:
        _excepthook()
        _exit_by_sigint()
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        _excepthook()
        raise SystemExit(1) from None


def run_script(script: str, argv: list[str], base_path: list[str]) -> None:
    """``script`` as ``__main__`` with ``sys.argv`` = [script, *argv] and ``sys.path`` = [its
    folder, *base_path], as ``python SCRIPT ARGS`` runs it (exceptions propagate)."""
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    with open(path, "rb") as f:
        source = f.read()
    sys.argv = [script, *argv]
    sys.path[:] = [os.path.dirname(os.path.realpath(path)), *base_path]
    main = types.ModuleType("__main__")
    main.__dict__.update(
        {
            "__file__": path,
            "__cached__": None,
            "__builtins__": __builtins__,
            "__loader__": importlib.machinery.SourceFileLoader("__main__", path),
            "__spec__": None,
            "__package__": None,
        }
    )
    sys.modules["__main__"] = main
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


#: frames a traceback skips: the boot's own, before the script's first
_OWN_FILES = {os.path.abspath(__file__)}


def _excepthook() -> None:
    """``sys.excepthook`` with the traceback from the script's first frame on."""
    kind, value, tb = sys.exc_info()
    runpy_file = sys.modules["runpy"].__file__ if "runpy" in sys.modules else None
    skip = {*_OWN_FILES, *([os.path.abspath(runpy_file)] if runpy_file else [])}
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in skip:
        tb = tb.tb_next
    assert kind is not None and value is not None
    sys.excepthook(kind, value.with_traceback(tb), tb)


def _exit_by_sigint() -> None:
    """Python's own end after an uncaught KeyboardInterrupt: killed by SIGINT."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)


def main(argv: list[str]) -> None:
    """``python -m aios.launcher.boot [-m MODULE | SCRIPT] ARGS``."""
    base_path = list(sys.path[1:])  # sys.path[0]: the working directory ``-m`` put there
    if argv[:1] == ["-m"] and len(argv) >= 2:
        run_as_main(None, argv[1], list(argv[2:]), base_path)
    elif argv:
        run_as_main(argv[0], None, list(argv[1:]), base_path)
    else:
        print(f"usage: python -m {MODULE} [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
