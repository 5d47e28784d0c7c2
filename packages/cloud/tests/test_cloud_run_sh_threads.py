"""The ranks' OMP_NUM_THREADS on a cloud host: counted there (``nproc``: the CPUs the host lets
the run use), shared among the host's ranks; a plan built on the launching machine never carries
that machine's count, and the user's ``--env OMP_NUM_THREADS`` wins."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from aios_cloud.jobs import render_run_sh


def _run(tmp_path: Path, nprocs: int, cpus: set[int], env_file: str = "") -> str:
    plan = SimpleNamespace(command=["bash", "-c", "echo omp=$OMP_NUM_THREADS"], nprocs=nprocs)
    script = render_run_sh(SimpleNamespace(name="c1"), 7, plan)
    (tmp_path / "aios" / "c1" / "code").mkdir(parents=True, exist_ok=True)
    job = tmp_path / "aios" / "c1" / "jobs" / "7"
    job.mkdir(parents=True, exist_ok=True)
    (job / "env").write_text(env_file)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    p = subprocess.run(
        ["bash", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),  # the host's CPUs for the run
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return next(ln for ln in p.stdout.splitlines() if ln.startswith("omp="))


def test_run_sh_counts_the_hosts_cpus_for_its_ranks(tmp_path: Path) -> None:
    cpus = os.sched_getaffinity(0)
    assert _run(tmp_path, 1, cpus) == f"omp={len(cpus)}"
    assert _run(tmp_path, 1, {min(cpus)}) == "omp=1"
    assert _run(tmp_path, len(cpus) * 2, cpus) == "omp=1"  # never 0
    assert _run(tmp_path, 1, cpus, "OMP_NUM_THREADS=5\n") == "omp=5"
