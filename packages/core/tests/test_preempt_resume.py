"""Preemption: SIGTERM at a random step -> all ranks stop at the same step boundary, write an
emergency checkpoint, exit 75; the relaunch resumes and ends BITWISE equal to an uninterrupted
run (same seed, deterministic data order). Through the real aios-run launcher, 1 and 2 processes
(gloo)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "preempt_train.py"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra)
    return env


def _launch(
    tmp: Path, nprocs: int, ckpt: Path, out: Path, env: dict[str, str], port: int
) -> subprocess.Popen:
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        str(nprocs),
        "--master-port",
        str(port),
        f"checkpoint.dir={ckpt}",
        "grad_accum=2",
        "grad_clip=1.0",
        str(SCRIPT),
        str(out),
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp
    )


def _wait_step(progress: Path, proc: subprocess.Popen, at: int, timeout: float = 90) -> None:
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


@pytest.mark.parametrize("nprocs", [1, 2])
def test_preempt_sigterm_resume_is_bitwise_equal(tmp_path: Path, nprocs: int, free_port) -> None:
    total = 24
    # uninterrupted reference
    ref = tmp_path / "ref.pt"
    p = _launch(
        tmp_path,
        nprocs,
        tmp_path / "ckpt-ref",
        ref,
        _env(tmp_path, TOTAL_STEPS=str(total)),
        free_port(),
    )
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out

    # interrupted at a random step, then resumed
    kill_at = random.Random().randint(3, total - 6)
    progress = tmp_path / "progress"
    got = tmp_path / "got.pt"
    ckpt = tmp_path / "ckpt"
    env = _env(tmp_path, TOTAL_STEPS=str(total), STEP_DELAY="0.15", PROGRESS_FILE=str(progress))
    p = _launch(tmp_path, nprocs, ckpt, got, env, free_port())
    _wait_step(progress, p, kill_at)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 75, f"kill_at={kill_at}\n{out}"
    assert "preempted" in out and "relaunch" in out
    assert not got.exists()
    saved = sorted(d.name for d in ckpt.iterdir() if d.name.startswith("ckpt-"))
    assert len(saved) == 1 and (ckpt / saved[0] / "aios-checkpoint.json").is_file()
    stopped_at = int(saved[0].split("-")[1])
    assert kill_at <= stopped_at < total

    p = _launch(tmp_path, nprocs, ckpt, got, _env(tmp_path, TOTAL_STEPS=str(total)), free_port())
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out
    assert f"resumed from {ckpt / saved[0]} at step {stopped_at}" in out

    a, b = torch.load(ref), torch.load(got)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume (killed at step {stopped_at})"
