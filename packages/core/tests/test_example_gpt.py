"""examples/gpt.py through aios-run (small settings, CPU): learns below the unigram baseline,
writes periodic checkpoints and a run record, prints the summary, and resumes when relaunched."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
SMALL = [
    "--steps",
    "300",
    "--n-embd",
    "48",
    "--batch-size",
    "16",
    "--block-size",
    "32",
    "--lr",
    "1e-2",
    "--warmup",
    "10",
    "--eval-every",
    "150",
    "--eval-batches",
    "4",
]


def _run(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update({"AIOS_LOGGING__TENSORBOARD": "false", "GPT_SAMPLE": "0", "OMP_NUM_THREADS": "1"})
    return subprocess.run(
        [
            *python("-c", "from aios.cli.run import main; main()"),
            "checkpoint.every=150",
            *extra,
            str(EXAMPLE),
            *SMALL,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=400,
    )


def test_example_gpt_trains_checkpoints_and_resumes(tmp_path):
    assert (EXAMPLE.parent / "data" / "corpus.txt").stat().st_size > 200_000
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    base = float(
        re.search(
            r"unigram baseline \(validation loss of a context-free model\): ([0-9.]+)", r.stdout
        ).group(1)
    )
    m = re.search(
        r"done 300 steps \(300 this run\) in [0-9.]+s: ([0-9.]+) steps/s, ([0-9,]+) tokens/s; "
        r"train loss ([0-9.]+), val loss ([0-9.]+)",
        r.stdout,
    )
    assert m, r.stdout
    val = float(m.group(4))
    assert 2.5 < base < 4.0
    assert val < base - 0.8, (val, base)
    ck = tmp_path / "checkpoints" / "gpt"
    assert sorted(p.name for p in ck.iterdir()) == ["ckpt-000000150", "ckpt-000000300"]
    (run,) = (tmp_path / "runs").iterdir()
    diag = json.loads((run / "diagnostics.json").read_text())
    assert (
        diag["status"] == "finished"
        and diag["steps"] == 300
        and diag["step_timing"]["count"] == 299
    )
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val/loss" in x for x in metrics) and any("train/loss" in x for x in metrics)

    # relaunch: resumes at the end, trains nothing more and says so (no summary of nothing with
    # a nan train loss), evaluates the same model
    r2 = _run(tmp_path)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert f"resumed from {ck / 'ckpt-000000300'} at step 300" in r2.stdout
    assert "gpt: done" not in r2.stdout and "nan" not in r2.stdout, r2.stdout
    m2 = re.search(
        r"gpt: nothing left to train: the checkpoint in checkpoints/gpt is at step 300 of "
        r"--steps 300 .*; val loss ([0-9.]+)",
        r2.stdout,
    )
    assert m2 and abs(float(m2.group(1)) - val) < 1e-4, r2.stdout
