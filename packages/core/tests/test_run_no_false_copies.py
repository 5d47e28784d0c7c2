"""No false alarms from the run (issue 34 item 4): a plain torchrun script that joined its
process group is never called "independent copies", after a restart too (torch's elastic agent
bootstraps each new attempt's ranks on a fresh store, which ends with them)."""

from __future__ import annotations

from pathlib import Path

from aios.testing.launch import aios_run

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_script_that_joined_after_a_restart_is_not_called_a_copy(
    tmp_path: Path, free_port
) -> None:
    args = ["--nprocs", "2", "--max-restarts", "1", "--master-port", free_port()]
    p = aios_run([*args, SCRIPTS / "joins_after_restart.py"], cwd=tmp_path, timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "restart 1/1" in out and out.count("sum 2.0") == 2, out
    assert "independent cop" not in out, out
