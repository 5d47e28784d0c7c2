"""How a run of ``aios-run`` ends: its exit status and the one line that explains it.

:func:`conclude` is the one ladder both launch paths (the in-process elastic agent and a single
child process) end through: success; a hang the watchdog stopped
(:data:`aios.resilience.watchdog.EXIT_HUNG`); a preemption
(:data:`aios.resilience.notices.EXIT_PREEMPTED`); ``aios-run`` stopped by a signal (128+N); the
script's own failure, named with the rank that failed first and, where the traceback ends in a
device-tied error, the ``aios check`` finding for the script's line. No torch.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from aios.launcher import status as rank_status
from aios.resilience.notices import EXIT_PREEMPTED
from aios.resilience.watchdog import EXIT_HUNG

PROG = "aios-run"


@dataclass
class Outcome:
    """What the workers of one launch did, for :func:`conclude`."""

    ok: bool
    #: the exit codes of the processes that failed (a negative code: killed by that signal)
    codes: list[int] = field(default_factory=list)
    #: ``aios-run`` itself was stopped by this signal (forwarded to the workers)
    signal: Any = None
    #: the rank blamed for a failure, its exit code and its hint (computed only when needed)
    blame: Callable[[], tuple[int | str, int, str | None]] = lambda: (0, 1, None)


def conclude(
    outcome: Outcome, cfg: Any, script: str, world: int, status: dict[int, str], dog: Any
) -> None:
    """Exit with the documented status of ``outcome`` (never returns). ``status``: the ranks'
    status files; ``dog``: the hang watchdog, or None."""
    if outcome.ok:
        sys.exit(0)
    if dog is not None and dog.hang is not None and outcome.signal is None:
        hung_exit(script, dog)
    if status and all(v.startswith("preempted") for v in status.values()):
        preempted_exit(cfg, status)
    if outcome.signal is not None:
        sig = outcome.signal
        click.echo(
            f"{PROG}: stopped by {getattr(sig, 'name', sig)}; workers were sent the same signal",
            err=True,
        )
        sys.exit(128 + int(sig))
    if outcome.codes and all(c == EXIT_PREEMPTED for c in outcome.codes):
        preempted_exit(cfg, status)
    rank, code, hint = outcome.blame()
    script_failed(script, rank, code, world > 1, hint)


def unjoined(status_dir: str, ranks: list[dict[str, str]], world: int) -> list[int]:
    """This node's ranks that never said (``joined-<rank>``, written by ``aios.init``) that
    they joined the launcher's process group of ``world`` ranks."""
    return [
        int(env["RANK"])
        for env in ranks
        if rank_status.joined_world(status_dir, int(env["RANK"])) != world
    ]


def name_unjoined(
    status_dir: str, ranks: list[dict[str, str]], world: int, joined: int | None = None
) -> None:
    """At the end of a run of several processes: name the ranks that never called
    ``aios.init()`` (a script that does not use aios, or gates itself out, e.g. "not enough
    GPUs", and exits 0): aios cannot tell that they trained together. ``joined``: how many
    ranks joined the launcher's default process group (a plain torchrun script that calls
    ``init_process_group`` with the launcher's ranks is no copy)."""
    if world <= 1 or (joined is not None and joined >= world):
        return
    missing = unjoined(status_dir, ranks, world)
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


def preempted_exit(cfg: Any, status: dict[int, str] | None = None) -> None:
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
PORTABILITY_ERRORS = (
    "Distributed package doesn't have NCCL built in",  # a CPU build of torch
    "ProcessGroupNCCL is only supported with GPUs",  # a CUDA build on a machine without a GPU
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "No CUDA GPUs are available",
    "Runtime is already initialized",
    "CUDA error",
)

HINT_TAIL = 200_000  # bytes of a failed rank's stderr searched for the traceback


def portability_hint(script: str, logs: str, failure: Any) -> str | None:
    """When the failed rank's stderr (torch's tee file under ``logs``) ends in one of
    :data:`PORTABILITY_ERRORS`, the ``aios check`` finding for the deepest line of ``script`` in
    its traceback (static, no torch), as a final line."""
    import glob

    files = glob.glob(os.path.join(logs, "*", "attempt_*", str(failure.local_rank), "stderr.log"))
    if not files:
        return None
    try:
        with open(max(files, key=os.path.getmtime), errors="replace") as f:
            text = f.read()[-HINT_TAIL:]
    except OSError:
        return None
    return hint_from_stderr(script, text)


def hint_from_stderr(script: str, text: str) -> str | None:
    """The hint of :func:`portability_hint` from the text a failed process wrote to stderr."""
    import re

    tb = text[text.rfind("Traceback (most recent call last)") :]
    if not any(e in tb for e in PORTABILITY_ERRORS):
        return None
    frames = [
        (os.path.realpath(m.group(1)), int(m.group(2)))
        for m in re.finditer(r'File "([^"]+)", line (\d+)', tb)
    ]
    # deferred: the checker loads for a failed run's hint only, not in every launcher
    from aios.check import CheckError, check_project

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


def script_failed(
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


def hung_exit(script: str, dog: Any) -> None:
    hang = dog.hang or {}
    where = f"; stacks: {hang['path']}" if hang.get("path") else ""
    click.echo(
        f"{PROG}: error: {script} hung: {hang.get('why', 'no progress')}; every worker was "
        f"stopped (exit {EXIT_HUNG}){where}",
        err=True,
    )
    sys.exit(EXIT_HUNG)
