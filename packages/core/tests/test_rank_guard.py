"""The rank's first frame (issue 34 item 4): every rank aios-run starts, warm or fresh, runs its
script through :mod:`aios.launcher.boot`, which stops a script that rewrites a launch variable at
that line (with or without ``aios.init``) and keeps the line a ``sys.exit`` came from for the
run's end; what the script sees of its interpreter is a fresh ``python -u``'s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.launcher import boot
from aios.testing.launch import aios_run, run_env

SCRIPTS = Path(__file__).parent / "scripts"

SHOW = """\
import os, sys
print("argv", sys.argv)
print("name", __name__, os.path.basename(__file__))
print("path0", sys.path[0])
"""


def _python(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RANK", "WORLD"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-u", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=60
    )


def test_the_boot_runs_a_script_as_python_does(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show.py").write_text(SHOW)
    plain = _python(["sub/show.py", "a", "--b"], tmp_path)
    booted = _python(["-m", boot.MODULE, "sub/show.py", "a", "--b"], tmp_path)
    assert plain.returncode == booted.returncode == 0, booted.stderr
    assert booted.stdout == plain.stdout
    assert "path0 " + str(tmp_path / "sub") in booted.stdout


def test_a_scripts_traceback_starts_at_its_own_frame_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    plain = _python(["fail.py"], tmp_path)
    booted = _python(["-m", boot.MODULE, "fail.py"], tmp_path)
    assert plain.returncode == booted.returncode == 1
    assert booted.stderr == plain.stderr
    assert "boot.py" not in booted.stderr and "runpy" not in booted.stderr


def test_the_agents_command_is_wrapped_once_and_others_left_alone() -> None:
    py = sys.executable
    assert boot.command([py, "-u", "train.py", "--lr", "1"]) == [
        py, "-u", "-m", boot.MODULE, "train.py", "--lr", "1"
    ]  # fmt: skip
    assert boot.command([py, "-u", "-m", "pkg.train", "x"]) == [
        py, "-u", "-m", boot.MODULE, "-m", "pkg.train", "x"
    ]  # fmt: skip
    assert boot.command([py, "-u", "-m", boot.MODULE, "train.py"]) is None
    assert boot.command(["/bin/sh", "-u", "train.py"]) is None  # another program: as it is
    assert boot.command([py, "train.py"]) is None


LAUNCHED = {
    "AIOS_RUN_LAUNCHER_PID": "1",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29411",
}


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            'os.environ["WORLD_SIZE"] = "1"',
            "the script set WORLD_SIZE=1 after aios-run set it to 2",
        ),
        (
            'os.putenv("MASTER_PORT", "12355")',
            "set MASTER_PORT=12355 after aios-run set it to 29411",
        ),
        ('del os.environ["RANK"]', "the script removed RANK after aios-run set it to 1"),
        ("os.environ.update(LOCAL_RANK='0')", "set LOCAL_RANK=0 after aios-run set it to 1"),
    ],
)
def test_a_rewrite_stops_the_rank_at_its_line(tmp_path: Path, line: str, said: str) -> None:
    (tmp_path / "w.py").write_text(f"import os\n\n{line}\nprint('TRAINED')\n")
    p = _python(["-m", boot.MODULE, "w.py"], tmp_path, **LAUNCHED)
    assert p.returncode == 2, p.stderr
    assert "TRAINED" not in p.stdout and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aios: error: w.py:3: ") and said in lines[0]
    assert "remove the assignment" in lines[0]


def test_writes_of_the_launchers_own_values_pass(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text(
        "import os\n"
        'os.environ["RANK"] = os.environ["RANK"]\n'
        'os.environ.setdefault("WORLD_SIZE", "1")\n'
        'os.environ["OTHER"] = "x"\n'
        "print('TRAINED')\n"
    )
    p = _python(["-m", boot.MODULE, "w.py"], tmp_path, **LAUNCHED)
    assert p.returncode == 0 and p.stdout == "TRAINED\n", p.stderr
    # outside aios-run (no launch variables given) nothing is watched
    (tmp_path / "w.py").write_text("import os\nos.environ['WORLD_SIZE'] = '1'\nprint('TRAINED')\n")
    p = _python(["-m", boot.MODULE, "w.py"], tmp_path)
    assert p.returncode == 0 and p.stdout == "TRAINED\n", p.stderr


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
def test_a_plain_torchrun_script_that_rewrites_world_size_is_named_before_it_trains(
    tmp_path: Path, free_port, warm: bool
) -> None:
    args = ["--nprocs", "2", "--master-port", free_port(), str(SCRIPTS / "rewrites_world.py")]
    p = aios_run(args, cwd=tmp_path, env=run_env(tmp_path, warm=warm), timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "TRAINED" not in out and "Traceback" not in out
    named = [ln for ln in out.splitlines() if "after aios-run set it to" in ln]
    assert len(named) == 1, out
    assert "rewrites_world.py:7: the script set WORLD_SIZE=1 after aios-run set it to 2" in named[0]


GATED = """\
import os, sys
import aios, torch

os.environ["RANK"] = os.environ["RANK"]  # the launcher's own value: no rewrite
rt = aios.init()
if torch.cuda.device_count() < 4:
    print("Unable to locate sufficient 4 gpus", flush=True)
    sys.exit(0)
"""


def test_a_run_that_gates_itself_out_names_the_line_that_ended_it(
    tmp_path: Path, free_port
) -> None:
    (tmp_path / "train.py").write_text(GATED)
    p = aios_run(["--nprocs", "2", "--master-port", free_port(), "train.py"], cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    said = [ln for ln in out.splitlines() if "without a single training step" in ln]
    assert len(said) == 1 and "train.py:8: the script exited there" in said[0], out
