"""Fixtures for aios-cloud-slurm: a REAL Slurm (slurm-wlm + munge) started once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from aios_cloud_slurm.testing import SlurmCluster, slurm_unavailable_reason

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = slurm_unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no real Slurm: {reason} (.ci/run installs slurm-wlm munge)")
        msg = f"REAL SLURM TESTS SKIPPED: {reason}"
        warnings.warn(msg, stacklevel=1)
        print(f"\n*** {msg} ***", file=sys.stderr)
        pytest.skip(msg)
    # debug: two CPU nodes; gpu: two more nodes with two (test) GPUs each
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpu_nodes=2) as cluster:
        yield cluster


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if not (EXAMPLES / "gpt.py").is_file():
        pytest.skip("examples/gpt.py is not in this checkout")
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(EXAMPLES / "gpt.py", work / "gpt.py")
    shutil.copy(EXAMPLES / "data" / "corpus.txt", work / "corpus.txt")
    (work / "data").mkdir()
    (work / "data" / "shard.bin").write_bytes(b"0" * 4096)  # untracked data stays home
    return work


@pytest.fixture
def aios_env(slurm, tmp_path: Path):
    """``aios_env(**extra)``: environment for the aios CLI and srun against the test Slurm."""

    def make(**extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in slurm.env().items()
            if not k.startswith(("AIOS_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))
        }
        env.update(
            {
                "AIOS_HOME": str(tmp_path / "aios-home"),
                "AIOS_SLURM__REMOTE_DIR": str(tmp_path / "cluster-fs"),
                "AIOS_SLURM__PYTHON": sys.executable,
                "AIOS_SLURM__POLL_INTERVAL": "0.5",
                "AIOS_PLUGINS": "aios-cloud-slurm",
                "OMP_NUM_THREADS": "1",
                "GPT_SAMPLE": "0",
                "COLUMNS": "200",
            }
        )
        env.update(extra)
        return env

    return make


def _run_aios(
    env: dict[str, str], *args: str, timeout: float = 600, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
    )


def _wait_for(cond, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def run_aios():
    """``run_aios(env, *args)``: the real aios CLI in a subprocess."""
    return _run_aios


@pytest.fixture
def wait_for():
    return _wait_for
