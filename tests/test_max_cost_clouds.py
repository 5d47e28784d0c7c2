"""``aios launch --max-cost`` on clouds whose spend does not grow by the catalog's hourly price:
a batch scheduler (Slurm, Kubernetes: no prices) and an AWS Capacity Block (paid upfront when
bought, "Capacity Blocks for ML" pricing) are refused in one line, exit 2, before anything is
created (the dry run included: the launch would be refused)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("cloud", "line"),
    [
        (
            ["--cloud", "slurm"],
            "--max-cost needs prices, and --cloud slurm (a batch scheduler) has none; drop "
            "--max-cost; bound the job with the scheduler's own time limit",
        ),
        (
            ["--cloud", "k8s"],
            "--max-cost needs prices, and --cloud k8s (a batch scheduler) has none; drop "
            "--max-cost; bound the job with the scheduler's own time limit",
        ),
        (
            ["--cloud", "aws", "-a", "p5.48xlarge", "--reservation", "block:cr-0123456789abcdef0"],
            "--max-cost limits a spend that grows by the hour, and a Capacity Block "
            "(--reservation block:cr-...) is paid upfront when bought; drop --max-cost (the "
            "block's end bounds the run)",
        ),
    ],
)
def test_max_cost_is_refused_where_the_spend_is_not_hourly(tmp_path, cloud, line):
    (tmp_path / "t.py").write_text("")
    home = tmp_path / "aios-home"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "launch", *cloud, "--max-cost", "50"]
        + ["--workdir", str(tmp_path), "--dry-run", "t.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(home)},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"aios: error: {line}"]
    assert r.stdout == "" and not home.exists()
