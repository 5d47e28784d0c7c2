"""The run names what reading cannot (issue 34 item 4): a script that rewrites RANK/WORLD_SIZE
/MASTER_* after aios-run set them is named in one line with file:line before it trains, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.launcher import rewrites
from aios.launcher.contract import LAUNCHER_PID_ENV
from aios.testing.launch import aios_run

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_rewrite_is_what_differs_from_the_launchers_start_environment() -> None:
    start = {LAUNCHER_PID_ENV: "1", "RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    now = {**start, "RANK": "0", "WORLD_SIZE": "1"}
    assert rewrites.rewritten(now, start) == [("WORLD_SIZE", "2", "1"), ("RANK", "1", "0")]
    assert rewrites.rewritten(start, start) == []
    # not started by aios-run: nothing to compare with, nothing said
    plain = {k: v for k, v in start.items() if k != LAUNCHER_PID_ENV}
    assert rewrites.rewritten({**plain, "WORLD_SIZE": "1"}, plain) == []
    # no /proc: the elastic agent's own copies stand in
    agent = {LAUNCHER_PID_ENV: "1", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2"}
    assert rewrites.rewritten({**agent, "RANK": "1", "WORLD_SIZE": "1"}, None) == [
        ("WORLD_SIZE", "2", "1")
    ]


def test_the_start_environment_survives_the_scripts_writes(tmp_path: Path) -> None:
    code = (
        "import os; from aios.launcher.rewrites import initial_environ\n"
        "os.environ['WORLD_SIZE'] = '1'\n"
        "print(initial_environ()['WORLD_SIZE'], os.environ['WORLD_SIZE'])\n"
    )
    env = {**os.environ, "WORLD_SIZE": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["2", "1"], out.stderr


def test_write_line_finds_the_assignment_not_a_read() -> None:
    src = 'import os\nn = os.environ["WORLD_SIZE"]\nif n == "1":\n    os.environ["WORLD_SIZE"] = "4"\n'
    assert rewrites.write_line(src, "WORLD_SIZE") == 4
    assert rewrites.write_line("os.putenv('MASTER_PORT', '1')\n", "MASTER_PORT") == 1
    assert rewrites.write_line("os.environ.update(RANK=str(r))\n", "RANK") == 1
    assert rewrites.write_line('x = os.environ["RANK"] == "0"\n', "RANK") is None


@pytest.mark.parametrize("kind", ["aios", "plain"])
def test_aios_run_names_a_script_that_rewrites_world_size_before_it_trains(
    tmp_path: Path, free_port, kind: str
) -> None:
    """With ``aios.init`` and as a plain torchrun script (``dist.init_process_group``, no aios
    code of its own): stopped at the rewrite, before it joins anything."""
    args = ["--nprocs", "2", "--master-port", free_port(), SCRIPTS / "rewrites_world.py", kind]
    p = aios_run(args, cwd=tmp_path, timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "TRAINED" not in out and "Traceback" not in out
    named = [ln for ln in out.splitlines() if "after aios-run set it to" in ln]
    assert named and all(
        "rewrites_world.py:7: the script set WORLD_SIZE=1 after aios-run set it to 2" in ln
        for ln in named
    ), out
