"""Each rank's output reaches aios-run's terminal one whole line at a time, also when the
ranks' streams are unbuffered (``PYTHONUNBUFFERED=1``: many container images and CI systems
set it, and ``print`` then writes its text and its newline apart)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from aios.launcher.relay import tail_whole_lines


class _Out:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)


def _tail(path: Path, finished: threading.Event, out: _Out, **kw) -> threading.Thread:
    t = threading.Thread(
        target=tail_whole_lines,
        args=("[rank1]:", str(path), out, finished, 0.01),
        kwargs=kw,
        daemon=True,
    )
    t.start()
    return t


def test_a_line_written_in_two_pieces_is_relayed_as_one(tmp_path):
    log = tmp_path / "stdout.log"
    with open(log, "w", buffering=1) as f:
        f.write("init model 627")  # print's text, then (later) its newline
        f.flush()
        finished, out = threading.Event(), _Out()
        t = _tail(log, finished, out, clock=lambda: 0.0)  # the hold never runs out
        time.sleep(0.3)  # the tail has read the piece (or not yet: then it reads it whole)
        assert out.parts == []
        f.write("\nsecond\nlast without newline")
        f.flush()
    finished.set()
    t.join(10)
    assert out.parts == [
        "[rank1]:init model 627\n",
        "[rank1]:second\n",
        "[rank1]:last without newline\n",
    ]


def test_a_piece_held_longer_than_the_hold_is_shown_as_it_is(tmp_path):
    """A line that takes long to finish (a progress bar drawn without newlines) still shows."""
    log = tmp_path / "stderr.log"
    now = [0.0]
    log.write_text("epoch 1: 10%|#")
    finished, out = threading.Event(), _Out()
    t = _tail(log, finished, out, hold=5.0, clock=lambda: now[0])
    time.sleep(0.3)
    assert out.parts == []
    now[0] = 6.0
    deadline = time.monotonic() + 10
    while not out.parts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out.parts == ["[rank1]:epoch 1: 10%|#"]
    finished.set()
    t.join(10)


def test_a_filter_drops_lines_as_torchs_does(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("keep\ndrop\n")
    finished, out = threading.Event(), _Out()
    finished.set()
    tail_whole_lines("[rank0]:", str(log), out, finished, 0.01, lambda line: "keep" in line)
    assert out.parts == ["[rank0]:keep\n"]


SCRIPT = """
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
for i in range(3):  # a line finished later, as scripts print "loading ..." then " done"
    print(f"line {i} from rank {r}", end="", flush=True)
    time.sleep(0.3)
    print(" done", flush=True)
for i in range(3, 300):
    print(f"line {i} from rank {r} done", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_two_unbuffered_ranks_print_whole_lines_under_aios_run(tmp_path):
    """The user's path: ``aios-run --nprocs 2 train.py`` in a shell with PYTHONUNBUFFERED=1."""
    aios_run = Path(sys.executable).parent / "aios-run"
    if not aios_run.exists():
        pytest.fail(f"aios-run is not installed next to {sys.executable}")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC_")
        )
    }
    env.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
    )
    r = subprocess.run(
        [str(aios_run), "--nprocs", "2", "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln]
    bad = [ln for ln in lines if not re.fullmatch(r"\[rank([01])\]:line \d+ from rank \1 done", ln)]
    assert not bad, bad[:5]
    assert len(lines) == 600
