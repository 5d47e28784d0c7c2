"""How an error escaping a worker's script ends it: an :class:`aios.errors.AiosError` (bad
config, unavailable backend, the XLA compile guard's limit, a corrupt checkpoint) in one line
with its exit code (2) after the normal exit handlers; ``AIOS_DEBUG=1`` keeps the traceback.
The rank's status marker says it failed (or stopped because another rank failed)."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any

from aios.errors import AiosError
from aios.launcher import status as rank_status

_failing = False  # set when an exception escapes the script (see install)


def failing() -> bool:
    """An exception escaped the script: its error stays the last line the run prints."""
    return _failing


def without_torch_prefix(hook: Any) -> Any:
    """``hook`` without the ``[rankN]:`` prefix torch's ``init_process_group`` wraps around the
    excepthook, when the launcher (``aios-run``, torchrun with a log-line prefix) already
    prefixes every line of the worker: one prefix, not ``[rank0]:[rank0]:``."""
    if getattr(hook, "__name__", "") != "_distributed_excepthook" or not os.environ.get(
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
    ):
        return hook
    try:
        cells = dict(
            zip(hook.__code__.co_freevars, (c.cell_contents for c in hook.__closure__), strict=True)
        )
    except (AttributeError, TypeError, ValueError):
        return hook
    return cells.get("old_hook", hook)


def _stderr() -> Any:
    out = sys.stderr
    try:
        out.fileno()
    except Exception:  # noqa: BLE001 - torch.distributed's excepthook captures sys.stderr around ours
        out = sys.__stderr__ or out
    return out


def install() -> None:
    """The hook (once per process; a hook torch wrapped around it is unwrapped)."""
    previous = without_torch_prefix(sys.excepthook)
    if getattr(previous, "_aios", False):
        sys.excepthook = previous
        return

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        global _failing
        _failing = True  # the error stays the last line: no "where it went" lines after it
        quiet = bool(getattr(exc, "quiet", False))
        rank_status.mark_rank(
            "stopped (another rank failed)" if quiet else f"failed {time.monotonic_ns()}"
        )
        if not issubclass(exc_type, AiosError) or os.environ.get("AIOS_DEBUG", "") not in ("", "0"):
            previous(exc_type, exc, tb)
            return
        if quiet:  # another rank failed and prints the one line
            atexit._run_exitfuncs()
            os._exit(getattr(exc, "exit_code", 2))
        rank = os.environ.get("RANK")
        where = (
            f" (rank {rank})"
            if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1"
            else ""
        )
        out = _stderr()
        out.write(f"aios: error{where}: {exc}\n")
        out.flush()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(getattr(exc, "exit_code", 2))

    hook._aios = True  # type: ignore[attr-defined]
    sys.excepthook = hook
