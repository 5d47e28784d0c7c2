"""One way for tests to start ``aios-run``: :func:`aios_run` (to the end) and :func:`launch` (in
the background), with :func:`run_env` (a clean environment: no ``AIOS_*`` or torchrun variables
of the calling process, the run record under the test's folder, no TensorBoard, one OpenMP
thread).

``aios-run`` is started as ``python -c "...main()"`` of this interpreter, so the tests run the
installed source, forked from the test session's zygote (:mod:`aios.testing.zygote`), and it
forks its ranks from its own zygote (:mod:`aios.launcher.warm`) as a user's ``aios-run`` does;
pass ``warm=False`` (``AIOS_RUN_WARM_START=0``) to a test of the fresh path (both start fresh).
:func:`python` is the same for any ``python ARGS`` a test starts (a worker script).

Nothing here imports torch.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aios.launcher.contract import WARM_START_ENV
from aios.testing.zygote import python

#: the command that starts ``aios-run`` (``sys.argv[0]`` named as the console script's), forked
#: from the test session's zygote where one runs (:mod:`aios.testing.zygote`)
AIOS_RUN = tuple(
    python("-c", "import sys; sys.argv[0] = 'aios-run'; from aios.cli.run import main; main()")
)

_INHERITED: tuple[str, ...] = ("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_INHERITED += ("MASTER_", "GROUP_RANK", "TORCHELASTIC_")


def run_env(tmp: str | os.PathLike[str], warm: bool = True, **extra: str) -> dict[str, str]:
    """This process's environment without aios's and torchrun's variables, plus the run record
    under ``tmp/runs``, no TensorBoard, ``OMP_NUM_THREADS=1`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED)}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(Path(tmp) / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    if not warm:
        env[WARM_START_ENV] = "0"
    env.update(extra)
    return env


def aios_run(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """``aios-run ARGS`` to its end in ``cwd``; stdout and stderr captured apart (text).
    ``env`` defaults to :func:`run_env` of ``cwd``."""
    return subprocess.run(
        [*AIOS_RUN, *map(str, args)],
        env=dict(env) if env is not None else run_env(cwd),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        **kwargs,
    )


def launch(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.Popen[str]:
    """``aios-run ARGS`` in the background, its output merged into one text pipe."""
    return subprocess.Popen(
        [*AIOS_RUN, *map(str, args)],
        env=dict(env) if env is not None else run_env(cwd),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


__all__ = ["AIOS_RUN", "aios_run", "launch", "python", "run_env"]
