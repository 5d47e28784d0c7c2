"""The sbatch script and helpers, without a Slurm (the real runs are in test_slurm_e2e.py)."""

from __future__ import annotations

import re
import subprocess

from aios_cloud_slurm import testing
from aios_cloud_slurm.script import SbatchJob, render
from aios_cloud_slurm.states import parse_kv


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


def test_gpus_and_cpus_per_task_in_the_script_and_passed_on_to_srun():
    s = render(_job(gpus_per_task=None, gpus_per_node=8, cpus_per_task=12, ntasks_per_node=1))
    assert "#SBATCH --gpus-per-node=8" in s and "#SBATCH --cpus-per-task=12" in s
    assert "--gpus-per-task" not in s and "--gres" not in s and "--exclusive" not in s
    assert 'export SRUN_CPUS_PER_TASK="$cpus"' in s
    assert re.search(r'srun .*--ntasks-per-node=1 --cpus-per-task="\$cpus" python3 -m', s)
    gres = render(_job(gpus_per_task=None, gpus_per_node=4, gpu_flag="gres", exclusive=True))
    assert "#SBATCH --gres=gpu:4" in gres and "#SBATCH --exclusive" in gres
    assert "--gpus-per-node" not in gres
    # what srun gets: the job's per-task CPUs, else the node's CPUs shared among its tasks
    line = next(ln for ln in render(_job(ntasks_per_node=2)).splitlines() if ln.startswith("cpus="))
    check = next(ln for ln in s.splitlines() if ln.startswith('[ "$cpus" -ge 1 ]'))
    for slurm_env, want in (
        ({"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "64"}, "6"),
        ({"SLURM_CPUS_ON_NODE": "64"}, "32"),
        ({"SLURM_CPUS_ON_NODE": "1"}, "1"),
    ):
        r = subprocess.run(
            ["bash", "-c", f'{line}\n{check}\necho "$cpus"'],
            env={"PATH": "/usr/bin:/bin", **slurm_env},
            text=True,
            capture_output=True,
        )
        assert r.stdout.strip() == want, (slurm_env, r.stdout, r.stderr)


PART = {"name": "gpu", "gres": "gpu:a100:8(S:0-1)", "cpus_min": 96, "cpus": 128}
CONS_TRES = {"SelectType": "select/cons_tres", "GresTypes": "gpu"}


def _resources(backend="cuda", part=PART, conf=CONS_TRES, **settings):
    from aios_cloud_slurm.launch import resources
    from aios_cloud_slurm.settings import SlurmSettings

    return resources(SlurmSettings(**settings), backend, part, conf)


def test_a_cuda_job_asks_for_every_gpu_of_a_node_and_the_cpus_that_go_with_them():
    res, notes = _resources()
    assert (res["gpus_per_node"], res["gpu_flag"], res["cpus_per_task"]) == (8, "gpus-per-node", 96)
    assert notes == []
    # half the GPUs: half the node's CPUs (the smallest node's), over the tasks of a node
    res, _ = _resources(gpus_per_node=4, ntasks_per_node=2)
    assert (res["gpus_per_node"], res["cpus_per_task"]) == (4, 24)
    res, _ = _resources(conf={"SelectType": "select/cons_res", "GresTypes": "gpu"})
    assert (res["gpus_per_node"], res["gpu_flag"]) == (8, "gres")
    res, _ = _resources(gpus_per_task=1, ntasks_per_node=8)
    assert (res["gpus_per_task"], res["gpus_per_node"], res["cpus_per_task"]) == (1, None, 12)
    res, _ = _resources(exclusive=True)
    assert res["exclusive"] and res["cpus_per_task"] is None  # the whole node's, at run time
    res, _ = _resources(cpus_per_task=10, gpus_per_node=0)
    assert (res["gpus_per_node"], res["cpus_per_task"]) == (None, 10)


def test_a_cpu_job_asks_for_no_gpu_and_a_gpu_less_partition_is_named():
    res, notes = _resources(backend="cpu")
    assert res["gpus_per_node"] is None and res["cpus_per_task"] == 96 and notes == []
    cpu_part = {"name": "cpu", "gres": "(null)", "cpus_min": 32, "cpus": 32}
    res, notes = _resources(part=cpu_part)
    assert res["gpus_per_node"] is None and res["cpus_per_task"] == 32
    assert len(notes) == 1 and "partition cpu declares no GPUs" in notes[0], notes
    res, notes = _resources(part=None, conf=None)  # a dry run that reached no Slurm
    assert res["gpus_per_node"] is None and res["cpus_per_task"] is None
    assert any("slurm.gpus_per_node" in n for n in notes)
    assert any("slurm.cpus_per_task" in n for n in notes)


def test_gpus_per_node_from_sinfo_gres():
    from aios_cloud_slurm.states import gres_gpus, parse_config

    assert gres_gpus("gpu:8") == 8 and gres_gpus("gpu:a100:4(S:0-1)") == 4
    assert gres_gpus("gpu:a100:4,gpu:v100:2") == 6 and gres_gpus("(null)") == 0
    assert gres_gpus("mps:100,gpu:2") == 2 and gres_gpus(None) == 0
    conf = parse_config(
        "Configuration data as of x\nGresTypes               = gpu\nSelectType = select/cons_tres\n"
    )
    assert conf == {"GresTypes": "gpu", "SelectType": "select/cons_tres"}
