"""Every `aios launch` command packages/cloud-slurm/README.md prints, run as printed, as dry
runs from a machine that reaches no Slurm (the README's `gpu` partition with 4 nodes needs the
user's cluster): the sbatch script, with the note that it is not checked against a cluster.
test_slurm_e2e.py launches on the real test Slurm; test_slurm_gpus_cpus.py runs the README's
GPU dry run as printed against its `gpu` partition."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios_cloud.testing.readme import as_dry_run, readme_commands

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = readme_commands(README)


def test_the_readme_prints_these_commands() -> None:
    assert len(COMMANDS) == 4, COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[6:9]))
def test_readme_launch_command_as_a_dry_run(cmd: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "SLURM_"))}
    env.update(
        {
            "AIOS_HOME": str(tmp_path / "aios-home"),
            "AIOS_PLUGINS": "aios-cloud-slurm",
            "SLURM_CONF": str(tmp_path / "no-slurm.conf"),  # no cluster reachable from here
        }
    )
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *as_dry_run(cmd)[1:]],
        env=env, cwd=work, text=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    nodes = cmd[cmd.index("--nodes") + 1]
    assert f"#SBATCH --nodes={nodes}" in r.stdout and "#SBATCH --partition=gpu" in r.stdout, (
        r.stdout
    )
    # the partition's GPUs and CPUs are unknown here: said, with the settings that give them
    assert "set slurm.cpus_per_task" in r.stdout and "pass --backend cuda" in r.stdout, r.stdout
    assert "not checked against the cluster" in r.stdout
    # the missing SLURM_CONF is named at once, not after the client tools' minute of retries
    assert "no-slurm.conf does not exist" in r.stdout, r.stdout
    if "--max-restarts" in cmd:
        assert "--requeue" in r.stdout
    if "--epochs" in cmd:
        assert "--epochs 3" in r.stdout
