"""The DDP strategy with 2 processes over gloo, launched by aios-run: collectives, rank
sharding, the DDP wrapper (gradient averaging, attribute forwarding) and no_sync accumulation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.testing.launch import aios_run, run_env

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "ddp_checks.py"


def _aios_run(tmp_path, port, script, nprocs="2"):
    return aios_run(
        ["--nprocs", nprocs, "--master-port", port, script],
        cwd=tmp_path,
        env=run_env(tmp_path),
        timeout=240,
    )


def test_runtime_ddp_two_processes(tmp_path, free_port):
    r = _aios_run(tmp_path, free_port(), SCRIPT)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert (
            f"[rank{rank}]:ok identity rank={rank} local={rank} world=2 main={rank == 0} device=cpu"
            in r.stdout
        )
        for check in (
            "all_reduce",
            "all_gather",
            "objects",
            "any_rank",
            "sharding",
            "ddp",
            "no_sync",
        ):
            assert f"[rank{rank}]:ok {check}" in r.stdout, r.stdout


def test_no_rank_finalizes_while_a_gloo_worker_still_holds_its_collective(tmp_path, free_port):
    """Rank 0 ends its script while a collective it launched during backward (whose Work holds
    a Python object, torch >= 2.13) is still running on gloo's worker thread; rank 1 joins it
    later; DDP keeps the group object alive, so destroying the group does not wait for its
    worker threads. aios's exit handler lets the worker finish before the interpreter finalizes: the
    result is in place when the script's own exit handler (registered before aios.init, so it
    runs after aios's) reads it, and neither rank dies of std::terminate."""
    script = tmp_path / "late_peer.py"
    script.write_text(
        "import atexit, time, torch, torch.distributed as dist, aios\n"
        "t = torch.ones(1)\n"
        "atexit.register(lambda: print(f'at exit: result={t.item():.0f}', flush=True))\n"
        "rt = aios.init()\n"
        "model = rt.setup(torch.nn.Linear(2, 1))  # DDP holds the group past its destruction\n"
        "x = torch.ones(2, requires_grad=True)\n"
        "def launch(grad):\n"
        "    if rt.rank == 0:\n"
        "        dist.all_reduce(t, async_op=True)  # still in flight when the script ends\n"
        "    return grad\n"
        "x.register_hook(launch)\n"
        "x.sum().backward()\n"
        "if rt.rank == 1:\n"
        "    time.sleep(1.5)\n"
        "    dist.all_reduce(t)\n"
    )
    r = _aios_run(tmp_path, free_port(), script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "terminate called" not in r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[rank{rank}]:at exit: result=2" in r.stdout, r.stdout + r.stderr


def test_gloo_worker_threads_are_found_and_seen_parked_on_this_torch(tmp_path, free_port):
    """The exit drain relies on gloo naming its worker threads and parking them in an untimed
    condition-variable wait; if a torch release changes either, this fails instead of the drain
    silently doing nothing. Nothing here counts on timing: a worker names itself after it
    starts, so the test waits for the names (the limits only bound a failure), and it asks
    only that workers exist, not how many a torch release starts."""
    code = (
        "import time, threading, torch, torch.distributed as dist\n"
        "from aios.launcher import gloo as _gloo\n"
        "assert _gloo.runloop_threads() == []\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "t = torch.ones(3)\n"
        "dist.all_reduce(t)\n"
        "deadline = time.monotonic() + 120\n"
        "while not _gloo.runloop_threads() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "tids = _gloo.runloop_threads()\n"
        "assert tids, 'no thread named ' + _gloo.RUNLOOP_THREAD\n"
        "assert _gloo.wait_for_idle_workers(timeout=120), [open(f'/proc/self/task/{i}/syscall').read() for i in tids]\n"
        "assert not _gloo.is_parked(threading.get_native_id())  # this thread is running\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_init_returns_once_every_ranks_group_is_made(tmp_path):
    """``aios.init()`` returns on no rank before every rank's process group is made. Under
    torchrun (what ``aios launch`` runs on each host) a rank that ended right after init (a
    script that only prints its rank) used to close its sockets while a slower rank's gloo was
    still connecting to it: "Gloo connectFullMesh failed ... Connection closed by peer" (seen on
    two sshd hosts under load). (aios-run's ranks also wait for each other in its status folder.)"""
    script = Path(__file__).parent / "scripts" / "slow_group_rank.py"
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script), str(tmp_path)],
        cwd=tmp_path, env=run_env(tmp_path), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "rank0-saw").read_text() == "made"
