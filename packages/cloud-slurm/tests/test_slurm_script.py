"""The sbatch script and helpers, without a Slurm (the real runs are in test_slurm_e2e.py)."""

from __future__ import annotations

import subprocess

from aios_cloud_slurm import testing
from aios_cloud_slurm.provider import parse_kv
from aios_cloud_slurm.script import SbatchJob, render


def _job(**kw) -> SbatchJob:
    base = dict(
        name="run",
        job_dir="/fs/run/jobs/3",
        code_dir="/fs/run/code",
        command=["python3", "-m", "aios.cli.run", "train.py", "--lr", "1e-3"],
        nodes=4,
        partition="gpu",
        gpus_per_task=8,
        time="02:00:00",
        max_restarts=3,
        signal_grace=300,
        env={"LOG_LEVEL": "debug"},
        env_file="/fs/run/jobs/3/env",
    )
    base.update(kw)
    return SbatchJob(**base)


def test_script_carries_the_plan_and_the_requeue_protocol():
    s = render(_job())
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-task=8",
        "#SBATCH --time=02:00:00",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@300",
        "#SBATCH --output=/fs/run/jobs/3/slurm-%j.out",
        "export LOG_LEVEL=debug",
        "set -a; . /fs/run/jobs/3/env; set +a",
        'scontrol requeue "$SLURM_JOB_ID"',
        '[ "$restart" -lt 3 ]',
        "python3 -m aios.cli.run train.py --lr 1e-3 &",
    ):
        assert line in s, line
    assert "#SBATCH --no-requeue" in render(_job(max_restarts=0))
    r = subprocess.run(["bash", "-n"], input=s, text=True, capture_output=True)  # valid bash
    assert r.returncode == 0, r.stderr


def test_scontrol_one_line_output_parses():
    kv = parse_kv("JobId=5 JobName=x JobState=PENDING Reason=BeginTime Restarts=1 ExitCode=0:0")
    assert kv["JobState"] == "PENDING" and kv["Restarts"] == "1" and kv["ExitCode"] == "0:0"


def test_missing_binaries_give_the_install_line(monkeypatch):
    monkeypatch.setattr(testing, "_which", lambda name: None)
    assert testing.slurm_unavailable_reason().endswith("apt-get install -y slurm-wlm munge")


def test_a_home_relative_cache_path_expands_on_the_node(tmp_path):
    env = {"TORCH_TPU_TIER2_COMPILATION_CACHE": "~/.cache/aios/torch-tpu-compile/tier2"}
    line = next(ln for ln in render(_job(env=env)).splitlines() if "TIER2" in ln and "export" in ln)
    r = subprocess.run(
        ["bash", "-c", f"{line}; echo $TORCH_TPU_TIER2_COMPILATION_CACHE"],
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
    )
    assert r.stdout.strip() == f"{tmp_path}/.cache/aios/torch-tpu-compile/tier2", line
