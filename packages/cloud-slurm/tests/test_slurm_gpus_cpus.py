"""GPUs and CPUs on a REAL Slurm whose ``gpu`` partition declares two GPUs per node (gres with
device files made for the test, :mod:`aios_cloud_slurm.testing`) and binds every task to its CPUs
(``TaskPlugin=task/affinity``).

"Jobs will not be allocated any generic resources unless specifically requested at job submit
time" (https://slurm.schedmd.com/gres.html), and srun does not inherit sbatch's
``--cpus-per-task`` since Slurm 22.05 (https://slurm.schedmd.com/sbatch.html#OPT_cpus-per-task):
the script ``aios launch --cloud slurm`` renders for a cuda plan asks for the GPUs and the CPUs,
Slurm grants them, and every rank runs on the CPUs its task was given with ``OMP_NUM_THREADS``
from them."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[1] / "README.md"

PROBE = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
aff = sorted(os.sched_getaffinity(0))
print(
    "probe", f"rank={dist.get_rank()}", f"local={os.environ['LOCAL_RANK']}",
    f"locals={os.environ['LOCAL_WORLD_SIZE']}", f"node={os.environ['SLURMD_NODENAME']}",
    f"cpus={len(aff)}", f"omp={os.environ.get('OMP_NUM_THREADS')}",
    f"threads={torch.get_num_threads()}", f"task_cpus={os.environ.get('SLURM_CPUS_PER_TASK')}",
    f"gpus={os.environ.get('SLURM_GPUS_ON_NODE')}", f"cvd={os.environ.get('CUDA_VISIBLE_DEVICES')}",
    flush=True,
)
dist.barrier()
dist.destroy_process_group()
"""


def _no_cuda_here(tmp_path: Path) -> str:
    """``--python`` for the nodes: this machine has no CUDA, so the cuda plan's ``aios-run``
    runs its ranks on the cpu backend, one per GPU Slurm granted the node (none granted: one)."""
    wrapper = tmp_path / "python-no-cuda"
    wrapper.write_text(
        "#!/bin/bash\n"
        'args=(); for a in "$@"; do [ "$a" = cuda ] && a=cpu; args+=("$a"); done\n'
        'if [ "${args[0]}" = -m ] && [ "${args[1]}" = aios.cli.run ]; then\n'
        '  args=(-m aios.cli.run --nprocs "${SLURM_GPUS_ON_NODE:-1}" "${args[@]:2}"); fi\n'
        f'exec {sys.executable} "${{args[@]}}"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_the_readme_gpu_dry_run_as_printed_shows_the_gpus_and_cpus(slurm, aios_env, tmp_path):
    """The README's command, as printed, against the test cluster's ``gpu`` partition."""
    import subprocess

    from aios_cloud.testing.readme import readme_commands

    (cmd,) = [c for c in readme_commands(README) if c[c.index("--nodes") + 1] == "2"]
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *cmd[1:]],
        env=aios_env(), cwd=tmp_path, text=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --gpus-per-node=2" in r.stdout and "#SBATCH --cpus-per-task=2" in r.stdout
    assert '--cpus-per-task="$cpus"' in r.stdout and "--backend cuda train.py" in r.stdout


def test_dry_run_of_a_gpu_partition_asks_for_its_gpus_and_cpus(slurm, project, aios_env, run_aios):
    env = aios_env()
    base = ["launch", "--cloud", "slurm", "-a", "gpu", "--nodes", "2", "--workdir", str(project)]
    r = run_aios(env, *base, "--dry-run", "gpt.py")
    assert r.returncode == 0, r.stderr
    s = r.stdout
    # the partition's nodes declare gpu:2 and 2 CPUs (sinfo %G, %c); the cluster is cons_tres
    assert "#SBATCH --gpus-per-node=2" in s and "#SBATCH --cpus-per-task=2" in s, s
    assert 'export SRUN_CPUS_PER_TASK="$cpus"' in s
    assert re.search(
        r'srun .*--nodes=2 --ntasks-per-node=1 --cpus-per-task="\$cpus" \S+ -m aios.cli.run '
        r"--backend cuda gpt.py",
        s,
    ), s
    # a CPU partition: no GPU asked for, its CPUs are
    r = run_aios(env, *base[:4], "debug", *base[5:], "--dry-run", "gpt.py")
    assert r.returncode == 0, r.stderr
    assert "--gpus" not in r.stdout and "--gres" not in r.stdout
    assert "#SBATCH --cpus-per-task=2" in r.stdout and "--backend cpu" in r.stdout
    # the user's own choice: no GPUs, with a cuda backend (the flag for a cons_res cluster aside)
    r = run_aios(aios_env(AIOS_SLURM__GPUS_PER_NODE="0"), *base, "--dry-run", "gpt.py")
    assert "--gpus-per-node" not in r.stdout and "--backend cuda" in r.stdout


def test_slurm_grants_the_gpus_and_each_rank_runs_on_its_tasks_cpus(
    slurm, project, aios_env, run_aios, tmp_path
):
    (project / "probe.py").write_text(PROBE)
    env = aios_env()
    env.pop("OMP_NUM_THREADS")  # aios decides it (a user's own setting would win)
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "slurm",
        "-a",
        "gpu",
        "--nodes",
        "2",
        "--name",
        "gpus",
        "--workdir",
        str(project),
        "--python",
        _no_cuda_here(tmp_path),
        "--poll",
        "0.5",
        "probe.py",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    # one line per rank, each behind its "[rankN]:" prefix
    ranks = [dict(kv.split("=", 1) for kv in m.group(1).split())
             for m in re.finditer(r"probe (.*)", out)]  # fmt: skip
    assert sorted(int(p["rank"]) for p in ranks) == [0, 1, 2, 3], out[-4000:]
    assert len({p["node"] for p in ranks}) == 2
    for p in ranks:
        # Slurm granted the node's two GPUs (gres/gpu sets the step's visible devices) ...
        assert p["gpus"] == "2" and p["cvd"] == "0,1", p
        # ... and the task its two CPUs (not one), which its two ranks share
        assert p["task_cpus"] == "2" and p["cpus"] == "2", p
        assert p["locals"] == "2" and p["omp"] == str(int(p["cpus"]) // 2), p
        assert p["threads"] == p["omp"], p
    assert run_aios(env, "down", "gpus").returncode == 0
