"""What a rank's script does to the launcher's world, seen as it happens, with or without
``aios.init``.

:func:`install` runs in every rank ``aios-run``'s elastic agent starts (forked from the zygote,
or fresh through :mod:`aios.launcher.boot`), before the script's first line. It adds an audit
hook (:pep:`578`) on ``os.putenv`` / ``os.unsetenv``, the calls behind every ``os.environ`` write:
a script that sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT`` to another value than the launcher gave it (from MPI variables that are absent,
from its own ``--world-size`` default of 1) is stopped at that line, exit 2, before it joins
anything: one line with the script's ``file:line``, from the first rank of this host that got
there (the others stop quietly with the same status). A write of the value the launcher set is
no change and passes.

:func:`ended_at` is the script's own line a ``sys.exit`` came from (recorded by the boot), for
the line that says a run ended without a training step.

Standard library only; never imports torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import FrameType, TracebackType

from aios.launcher import status as rank_status
from aios.launcher.rewrites import LAUNCH_VARS

#: exit status of a rank stopped for rewriting a launch variable (a config error's)
EXIT_REWRITE = 2
_FIX = f"remove the assignment: aios-run sets {', '.join(LAUNCH_VARS)} for every rank"

_installed = False
_ended: tuple[str, int] | None = None
#: files whose frames are never the script's own line (this module, os, the boot, runpy)
_NOT_SCRIPT = {os.path.abspath(__file__), os.path.abspath(os.__file__)}


def _name(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _caller() -> tuple[str, int] | None:
    """``(file, line)`` of the first frame outside this module and ``os``: the script's write."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and os.path.abspath(name) not in _NOT_SCRIPT:
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def refusal(name: str, was: str, now: str | None, where: tuple[str, int] | None) -> str:
    """The one line for a launch variable the script rewrote."""
    at = f"{os.path.basename(where[0])}:{where[1]}: " if where else ""
    did = f"set {name}={now}" if now is not None else f"removed {name}"
    return (
        f"aios: error: {at}the script {did} after aios-run set it to {was}: its ranks would not "
        f"form the launcher's process group and would train as separate copies; {_FIX}"
    )


def install(handed: Mapping[str, str]) -> None:
    """Stop the script at its first write of a launch variable that differs from ``handed``
    (the environment the launcher gave this rank). Once per process; a process the launcher did
    not give launch variables gets no hook."""
    global _installed
    given = {k: handed[k] for k in LAUNCH_VARS if k in handed}
    if _installed or not given:
        return
    _installed = True
    pid = os.getpid()

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event not in ("os.putenv", "os.unsetenv") or os.getpid() != pid or not args:
            return
        name = _name(args[0])
        if name not in given:
            return
        now = _name(args[1]) if event == "os.putenv" and len(args) > 1 else None
        if now == given[name]:
            return
        if rank_status.claim_refusal(rank_status.from_env()):
            print(refusal(name, given[name], now, _caller()), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_REWRITE)

    sys.addaudithook(hook)


def record_end(tb: TracebackType | None, root: str) -> None:
    """The deepest frame of ``tb`` (a ``SystemExit``'s traceback) in the script's project (a
    file under ``root``, the script's folder, outside installed packages): the line that ended
    the run."""
    global _ended
    root = os.path.join(os.path.abspath(root), "")
    found = None
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if name.startswith(root) and "site-packages" not in name and name not in _NOT_SCRIPT:
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    if found is not None:
        _ended = found


def ended_at() -> tuple[str, int] | None:
    """``(file, line)`` of the ``sys.exit`` that ended the script, where the boot saw it."""
    return _ended


__all__ = ["EXIT_REWRITE", "ended_at", "install", "record_end", "refusal"]
