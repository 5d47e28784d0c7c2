"""A cluster job stopped by aios-core's hang watchdog ends with exit status 124: run.sh maps
the launcher's status when the watchdog left its marker in the job's status folder (and only
then)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from aios.resilience.watchdog import EXIT_HUNG, HUNG_MARKER
from aios_cloud.jobs import render_run_sh


@pytest.mark.parametrize("marker,expected", [(True, EXIT_HUNG), (False, 1)])
def test_run_sh_maps_a_watchdog_stop_to_124(tmp_path: Path, marker: bool, expected: int) -> None:
    touch = f'touch "$AIOS_RUN_STATUS_DIR/{HUNG_MARKER}"; ' if marker else ""
    plan = SimpleNamespace(command=["bash", "-c", f"{touch}exit 1"], nprocs=1)
    script = render_run_sh(SimpleNamespace(name="c1"), 7, plan)
    (tmp_path / "aios" / "c1" / "code").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    p = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == expected, p.stdout + p.stderr
    job = tmp_path / "aios" / "c1" / "jobs" / "7"
    assert (job / "exit_code").read_text().strip() == str(expected)
    assert ("the watchdog stopped a hung run" in p.stdout) is marker
