"""A rank's launch variables, as the launcher set them and as the script left them.

``aios-run`` (through torch's elastic agent) gives every rank ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. A script that writes
them itself (from MPI variables, from its own ``--world-size`` default of 1) turns N ranks into N
unsynchronised copies of rank 0, or into a group that never forms. The environment a process was
started with stays readable in ``/proc/self/environ`` (Linux) whatever the script later writes
into ``os.environ``; elsewhere the elastic agent's own copies (``ROLE_RANK``,
``ROLE_WORLD_SIZE``) stand in for ``RANK`` and ``WORLD_SIZE``.

Standard library only; never imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aios.launcher.contract import LAUNCHER_PID_ENV

#: the variables the launcher sets for every rank, which a script must leave as they are
LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: where ``/proc/self/environ`` is unreadable: the agent's copies of two of them
_AGENT_COPIES = {"RANK": "ROLE_RANK", "WORLD_SIZE": "ROLE_WORLD_SIZE"}


#: the environment a rank forked from the zygote was handed (:mod:`aios.launcher.warm`): its
#: ``/proc/self/environ`` is the zygote's, so the handed one is what the launcher set
_handed: dict[str, str] | None = None


def record_handed(env: Mapping[str, str]) -> None:
    """In a rank forked from the zygote: the environment the launcher handed it."""
    global _handed
    _handed = dict(env)


def initial_environ(path: str = "/proc/self/environ") -> dict[str, str] | None:
    """The environment this process was started with (as handed by the launcher, for a rank
    forked from the zygote), or ``None`` where it cannot be read."""
    if _handed is not None:
        return dict(_handed)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def rewritten(
    environ: Mapping[str, str], initial: Mapping[str, str] | None
) -> list[tuple[str, str, str]]:
    """``(name, launcher's value, script's value)`` for each launch variable the script changed,
    in :data:`LAUNCH_VARS` order; empty outside ``aios-run`` (nothing to compare with)."""
    if initial is not None:
        if LAUNCHER_PID_ENV not in initial:
            return []
        before = {k: initial[k] for k in LAUNCH_VARS if k in initial}
    else:
        if LAUNCHER_PID_ENV not in environ:
            return []
        before = {k: environ[c] for k, c in _AGENT_COPIES.items() if c in environ}
    return [
        (k, before[k], environ.get(k, "(unset)"))
        for k in LAUNCH_VARS
        if k in before and environ.get(k) != before[k]
    ]


def write_line(source: str, name: str) -> int | None:
    """The first line of ``source`` that assigns ``name`` in ``os.environ`` (``environ["NAME"] =
    ...``, ``putenv("NAME", ...)``, ``environ.update(NAME=...)``), or ``None``."""
    pattern = re.compile(
        rf"""environ\s*\[\s*['"]{name}['"]\s*\]\s*=(?!=)|putenv\(\s*['"]{name}['"]"""
        rf"""|environ\.update\([^)]*\b{name}\s*="""
    )
    for i, line in enumerate(source.splitlines(), 1):
        if pattern.search(line.split("#", 1)[0]):
            return i
    return None
