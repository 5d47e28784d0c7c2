"""Preemption with DataLoader workers: a SIGTERM to ``aios-run --nprocs 2`` (and one sent to every
rank's whole process group as well, as Slurm's ``scancel`` or ``kill -TERM -PGID`` do) ends in the
emergency checkpoint and exit 75 with ``num_workers`` 0, 2 and 8, persistent or not; the relaunch
resumes bitwise equal to an uninterrupted run. Before aios.data.workers the workers died of the
signal and the rank raised "DataLoader worker (pid ...) exited unexpectedly" (exit 143, no
checkpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "preempt_train.py"
TOTAL = 24


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
            "TOTAL_STEPS": str(TOTAL),
        }
    )
    env.update(extra)
    return env


def _launch(tmp: Path, ckpt: Path, out: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        "2",
        "--master-port",
        str(port),
        f"checkpoint.dir={ckpt}",
        "grad_accum=2",
        str(SCRIPT),
        str(out),
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp
    )


def _wait_step(progress: Path, proc: subprocess.Popen, at: int, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError("run ended before the kill step:\n" + proc.stdout.read())
        try:
            if int(progress.read_text() or 0) >= at:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    raise AssertionError("run did not reach the kill step")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The uninterrupted run's final parameters (no workers: the order comes from the sampler in
    the rank, so workers change nothing)."""
    from aios.testing import find_free_port

    tmp = tmp_path_factory.mktemp("ref")
    out = tmp / "ref.pt"
    p = _launch(tmp, tmp / "ckpt", out, _env(tmp), find_free_port())
    log, _ = p.communicate(timeout=240)
    assert p.returncode == 0, log
    return torch.load(out)


@pytest.mark.parametrize(
    ("workers", "persistent", "group"),
    [
        (0, False, False),
        (2, False, False),
        (2, True, True),
        (8, False, False),
        (8, True, True),
    ],
    ids=["w0", "w2", "w2-persistent-group", "w8", "w8-persistent-group"],
)
def test_sigterm_with_loader_workers_checkpoints_and_resumes_bitwise(
    tmp_path: Path, reference: dict, free_port, workers: int, persistent: bool, group: bool
) -> None:
    progress = tmp_path / "progress"
    pgids = tmp_path / "pgid"
    pgids.mkdir()
    ckpt, got = tmp_path / "ckpt", tmp_path / "got.pt"
    loader_env = {"NUM_WORKERS": str(workers), "PERSISTENT_WORKERS": "1" if persistent else "0"}
    env = _env(
        tmp_path, STEP_DELAY="0.1", PROGRESS_FILE=str(progress), PGID_DIR=str(pgids), **loader_env
    )
    p = _launch(tmp_path, ckpt, got, env, free_port())
    _wait_step(progress, p, 5)
    p.send_signal(signal.SIGTERM)
    if group:  # the notice also reaches every process of each rank's group: its loader workers
        for f in pgids.glob("*.pgid"):
            try:
                os.killpg(int(f.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 75, out
    assert "exited unexpectedly" not in out, out
    saved = sorted(d.name for d in ckpt.iterdir() if d.name.startswith("ckpt-"))
    assert len(saved) == 1 and (ckpt / saved[0] / "aios-checkpoint.json").is_file(), saved
    stopped_at = int(saved[0].split("-")[1])
    assert 5 <= stopped_at < TOTAL

    p = _launch(tmp_path, ckpt, got, _env(tmp_path, **loader_env), free_port())
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out
    assert f"resumed from {ckpt / saved[0]} at step {stopped_at}" in out
    resumed = torch.load(got)
    assert resumed.keys() == reference.keys()
    for k in reference:
        assert torch.equal(resumed[k], reference[k]), f"{k} differs after resume at {stopped_at}"


OUTSIDE_SETUP = r"""
import os, signal, subprocess, sys
import torch
from aios.data import workers as loader_workers

class Pids(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return os.getpid()

loader_workers.install()  # what aios.init() does
for persistent in (False, True):
    loader = torch.utils.data.DataLoader(
        Pids(), batch_size=4, num_workers=2, persistent_workers=persistent
    )
    for epoch in range(2):
        for n, batch in enumerate(loader):
            if n == 1:  # a notice from another process (kill -TERM / -INT), not from the rank
                for pid in set(batch.tolist()):
                    subprocess.run(["kill", "-TERM", str(pid)], check=True)
                    subprocess.run(["kill", "-INT", str(pid)], check=True)
print("ok")
"""


def test_forked_workers_of_a_loader_outside_setup_leave_notices_to_the_rank(tmp_path: Path) -> None:
    """A loader the script never passes to rt.setup: aios.init's process-wide hook covers its
    forked workers; the rank's own shutdown of persistent workers still ends (no hang at exit)."""
    p = subprocess.run(
        [sys.executable, "-c", OUTSIDE_SETUP],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
