"""The dcp checkpoint format end to end through the runtime and the real ``aios-run`` launcher
(gloo, FSDP2): killed at a random step with SIGKILL or SIGTERM, the relaunch resumes and ends
BITWISE equal to an uninterrupted run at the same world size; a checkpoint written by 4
processes resumes on 2 and on 1 (resharded, and the resume says so) and continues to the
uninterrupted run's loss."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aios.testing.launch import AIOS_RUN

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "dcp_runtime_train.py"
TOTAL = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    tmp: Path, nprocs: int, ckpt: Path, out: Path, every: int, **env_extra: str
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
            "TOTAL_STEPS": str(TOTAL),
        }
    )
    args = [f"checkpoint.dir={ckpt}", f"checkpoint.every={every}", "strategy=fsdp"]
    env.update(env_extra)
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        str(nprocs),
        "--master-port",
        str(_free_port()),
        *args,
        str(SCRIPT),
        str(out),
    ]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
        start_new_session=True,
    )


def _finish(p: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError("run timed out:\n" + out) from None
    return out


def _wait_step(progress: Path, proc: subprocess.Popen, at: int, timeout: float = 180) -> int:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError("run ended before the kill step:\n" + proc.stdout.read())
        try:
            step = int(progress.read_text() or 0)
            if step >= at:
                return step
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    raise AssertionError("run did not reach the kill step")


def _losses(path: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out[int(d["step"])] = float(
            d["loss"]
        )  # a resumed run rewrites the steps after its checkpoint
    return out


@pytest.fixture(scope="module")
def reference_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Uninterrupted 2-process run (dropout on: per-rank RNG matters), final params."""
    tmp = tmp_path_factory.mktemp("ref2")
    ref = tmp / "ref.pt"
    out = _finish(_launch(tmp, 2, tmp / "ckpt", ref, every=3, DROPOUT="0.1"))
    assert ref.exists(), out
    return ref


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_dcp_runtime_killed_then_resumed_is_bitwise_equal(
    reference_2: Path, tmp_path: Path, sig: str
) -> None:
    kill_at = random.Random().randint(4, TOTAL - 4)
    ckpt, got, progress, pids = (
        tmp_path / "ckpt",
        tmp_path / "got.pt",
        tmp_path / "progress",
        tmp_path / "pids",
    )
    pids.mkdir()
    p = _launch(
        tmp_path,
        2,
        ckpt,
        got,
        every=3,
        DROPOUT="0.1",
        STEP_DELAY="0.2",
        PROGRESS_FILE=str(progress),
        PID_DIR=str(pids),
    )
    reached = _wait_step(progress, p, kill_at)
    # each rank's checkpoint process was forked before the process group (aios.init on CPU),
    # not spawned (a fresh interpreter importing torch again): its command line is the rank's
    for r in range(2):
        ckproc = pids / f"ckproc{r}"
        end = time.time() + 60
        while not ckproc.exists() and time.time() < end and p.poll() is None:
            time.sleep(0.05)
        assert ckproc.exists(), f"rank {r} wrote no checkpoint process"
        cmds = json.loads(ckproc.read_text())
        assert "spawn_main" not in cmds["process"] and cmds["process"] == cmds["rank"], cmds
    if sig == "SIGKILL":  # once a periodic checkpoint is committed (background saves lag a little)
        from aios.checkpoint import CheckpointStore as _Store

        end = time.time() + 120
        while (
            _Store(str(ckpt)).latest(warn=False) is None and time.time() < end and p.poll() is None
        ):
            time.sleep(0.05)
        reached = int(progress.read_text() or 0)
        for f in pids.glob("rank*.pid"):
            with _suppress():
                os.kill(int(f.read_text()), signal.SIGKILL)
        os.killpg(p.pid, signal.SIGKILL)
        _finish(p, 60)
    else:
        p.send_signal(signal.SIGTERM)
        out = _finish(p, 180)
        assert p.returncode == 75, f"kill_at={kill_at}\n{out}"
        # DCP's own INFO lines from its checkpoint process stay out of the run's output
        assert "Checkpoint background process" not in out, out
    assert not got.exists()
    from aios.checkpoint import CheckpointStore

    latest = CheckpointStore(str(ckpt)).latest(warn=False)
    assert latest is not None and latest.meta["checkpoint_format"] == "dcp"
    if sig == "SIGTERM":
        assert latest.step >= reached  # the emergency checkpoint at the agreed step boundary
    else:
        assert (
            latest.step % 3 == 0 and latest.step <= reached + 1
        )  # the last committed periodic one
    out = _finish(_launch(tmp_path, 2, ckpt, got, every=3, DROPOUT="0.1"))
    assert got.exists(), out
    assert f"at step {latest.step} (run " in out and "world size 2, backend" in out, out
    a, b = torch.load(reference_2), torch.load(got)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), (
            f"{k} differs after {sig} at step {reached}, resumed from {latest.step}"
        )


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is ProcessLookupError


@pytest.fixture(scope="module")
def reference_4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Uninterrupted 4-process run (no dropout) with a checkpoint at step 6."""
    tmp = tmp_path_factory.mktemp("ref4")
    out = _finish(
        _launch(tmp, 4, tmp / "ckpt", tmp / "ref.pt", every=6, LOSS_FILE=str(tmp / "loss.jsonl"))
    )
    assert (tmp / "ref.pt").exists(), out
    return {"ckpt": tmp / "ckpt" / "ckpt-000000006", "losses": _losses(tmp / "loss.jsonl")}


@pytest.mark.parametrize("nprocs", [2, 1])
def test_dcp_runtime_resume_on_fewer_processes_reshards(
    reference_4: dict[str, Any], tmp_path: Path, nprocs: int
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(reference_4["ckpt"], ckpt / "ckpt-000000006")
    loss = tmp_path / "loss.jsonl"
    # without asking for resharding, a world-size mismatch is a one-line error
    p = _launch(tmp_path, nprocs, ckpt, tmp_path / "x.pt", every=6)
    out = _finish(p)
    assert (
        p.returncode == 2
        and f"was written with world size 4, this run has world size {nprocs}" in out
    ), out
    assert "Traceback" not in out and not (tmp_path / "x.pt").exists()
    out = _finish(
        _launch(
            tmp_path, nprocs, ckpt, tmp_path / "got.pt", every=6, RESHARD="1", LOSS_FILE=str(loss)
        )
    )
    assert (tmp_path / "got.pt").exists(), out
    procs = "process" if nprocs == 1 else "processes"
    assert "at step 6 (run " in out and f"resumed at step 6: 4 -> {nprocs} {procs}" in out, out
    got, ref = _losses(loss), reference_4["losses"]
    assert sorted(got) == list(range(7, TOTAL + 1))
    for s in got:
        assert got[s] == pytest.approx(ref[s], rel=1e-4, abs=1e-6), (s, got[s], ref[s])
    runs = list((tmp_path / "runs").glob("*/diagnostics.json"))
    diags = [json.loads(r.read_text()) for r in runs]
    assert any(
        d.get("resharded") == {"from_world_size": 4, "to_world_size": nprocs, "step": 6}
        for d in diags
    ), diags


def test_dcp_runtime_corrupt_shard_refuses_resume_in_one_line(
    reference_4: dict[str, Any], tmp_path: Path
) -> None:
    """4 bytes inverted inside a shard (same size): the relaunch stops in one line naming the
    file and the checkpoint ("corrupt"), no traceback, nothing trained; an older checkpoint
    whose marker is damaged does not stand in the way of a good newer one."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(reference_4["ckpt"], ckpt / "ckpt-000000006")
    shutil.copytree(reference_4["ckpt"], ckpt / "ckpt-000000003")
    (ckpt / "ckpt-000000003" / "aios-checkpoint.json").write_bytes(b"\x00garbage")
    shard = ckpt / "ckpt-000000006" / "__1_0.distcp"
    raw = shard.read_bytes()
    data = bytearray(raw)
    for k in range(4):
        data[len(data) * 35 // 100 + k] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = _launch(tmp_path, 1, ckpt, tmp_path / "x.pt", every=6, RESHARD="1")
    out = _finish(p)
    assert p.returncode == 2, out
    assert "Traceback" not in out and not (tmp_path / "x.pt").exists(), out
    lines = [ln for ln in out.splitlines() if "is corrupt" in ln]
    assert len(lines) == 1 and "ckpt-000000006' is corrupt: __1_0.distcp" in lines[0], out
    shard.write_bytes(raw)  # repaired: the damaged older one is skipped with a warning
    out = _finish(_launch(tmp_path, 1, ckpt, tmp_path / "got.pt", every=6, RESHARD="1"))
    assert (tmp_path / "got.pt").exists() and "at step 6 (run " in out, out
