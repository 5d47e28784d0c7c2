"""``aios launch --max-cost`` where the spend is not the catalog's hourly price: a batch
scheduler (Slurm, Kubernetes: no prices) is refused in one line, exit 2, before anything is
created (the dry run included: the launch would be refused); an AWS Capacity Block (paid upfront
when bought, "Capacity Blocks for ML" pricing) is projected at its fee per hour, read at launch
(a dry run calls no cloud), and the dry run says so."""

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
            "--max-cost is not supported by --cloud slurm (hourly prices to bound the spend "
            "with); drop --max-cost; bound the job with the scheduler's own time limit "
            "(slurm.time)",
        ),
        (
            ["--cloud", "k8s"],
            "--max-cost is not supported by --cloud k8s (hourly prices to bound the spend "
            "with); drop --max-cost; bound the job with the scheduler's own limits",
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


def test_max_cost_on_a_capacity_block_is_projected_at_its_fee(tmp_path):
    (tmp_path / "t.py").write_text("")
    home = tmp_path / "aios-home"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "aws", "-a", "p5.48xlarge"]
        + ["--reservation", "block:cr-0123456789abcdef0", "--max-cost", "500", "--down"]
        + ["--workdir", str(tmp_path), "--dry-run", "t.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("# cost limit")]
    assert line == (
        "# cost limit: --max-cost $500.00: the watcher projects the job's spend (the "
        "reservation's upfront fee per hour of its term, read at launch); before it passes the "
        "limit the job is checkpointed (SIGTERM, the checkpoint.grace_seconds notice) and "
        "stopped and the cluster deleted (--down)"
    )
    assert "$55.04" not in line  # never the on-demand price the block is not billed at
    assert not home.exists()
