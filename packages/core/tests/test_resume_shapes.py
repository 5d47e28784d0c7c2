"""Issue 26: a run stopped on one shape resumes on another with every sample trained on exactly
once. The 960-sample loop (``global_batch=48 micro_batch=8``, one epoch of 20 steps) is stopped
by SIGTERM to ``aios-run`` after step 6 on 2 processes (gloo, as a user runs it), then relaunched
on 1 and 3 processes and under another strategy (ddp to fsdp and back, fsdp to tp). Each relaunch
finishes the epoch with every sample id once, and its loss at every later step is the loss of the
uninterrupted 2-process run (the same 48 samples make each step at any shape: only float
rounding differs). What cannot hold is refused in one line, before any rank builds the model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from aios.testing import launch

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "shape_loop.py"
N = 960
STEPS = 20
STOP_AT = 6
#: relative loss difference allowed against the uninterrupted run: float summation order only
#: (measured: at most 3e-7)
LOSS_REL = 1e-5


def aios_run(tmp: Path, nprocs: int, *args: str, env: dict[str, str] | None = None):
    from aios.testing.strategy_contract import free_port

    return launch.aios_run(
        [
            "--nprocs",
            nprocs,
            f"master_port={free_port()}",
            "global_batch=48",
            "micro_batch=8",
            *args,
        ],
        cwd=tmp,
        env=launch.run_env(tmp, **(env or {})),
    )


def _losses(path: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[int(rec["step"])] = float(rec["loss"])
    return out


def _run_loop(tmp: Path, nprocs: int, ckpt: Path, *args: str, **env: str) -> dict[str, Any]:
    out, loss = tmp / "out.json", tmp / "loss.jsonl"
    r = aios_run(
        tmp,
        nprocs,
        f"checkpoint.dir={ckpt}",
        *args,
        str(SCRIPT),
        str(out),
        env={"LOSS_FILE": str(loss), **env},
    )
    text = r.stdout + r.stderr
    return {
        "rc": r.returncode,
        "text": text,
        "result": json.loads(out.read_text()) if out.exists() else None,
        "losses": _losses(loss) if loss.exists() else {},
    }


def _stopped(tmp: Path, *args: str, **env: str) -> Path:
    """The loop on 2 processes, stopped by SIGTERM to aios-run after step 6: its checkpoint."""
    ckpt = tmp / "ckpt"
    got = _run_loop(tmp, 2, ckpt, *args, STOP_AT=str(STOP_AT), **env)
    assert got["rc"] == 75, got["text"][-4000:]
    saved = [d for d in ckpt.iterdir() if d.name.startswith("ckpt-")]
    assert len(saved) == 1, saved
    return saved[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The uninterrupted 2-process ddp run: its loss at every step."""
    tmp = tmp_path_factory.mktemp("ref")
    got = _run_loop(tmp, 2, tmp / "ckpt")
    assert got["rc"] == 0, got["text"][-4000:]
    assert sorted(got["result"]["ids"]) == list(range(N))
    assert sorted(got["losses"]) == list(range(1, STEPS + 1))
    return got["losses"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints of the loop stopped after step 6 on 2 processes, per strategy (made once)."""
    made: dict[str, Path] = {}

    class Lazy(dict):
        def __missing__(self, strategy: str) -> Path:
            tmp = tmp_path_factory.mktemp(f"stopped-{strategy}")
            made[strategy] = _stopped(tmp, f"strategy={strategy}")
            return made[strategy]

    return Lazy()


def _resume(tmp: Path, source: Path, nprocs: int, *args: str, **env: str) -> dict[str, Any]:
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    shutil.copytree(source, ckpt / source.name)
    return _run_loop(tmp, nprocs, ckpt, *args, **env)


@pytest.mark.parametrize(
    ("saved_by", "nprocs", "strategy", "change"),
    [
        ("ddp", 1, "ddp", "2 -> 1 process, global batch 48 kept (grad_accum 3 -> 6)"),
        ("ddp", 3, "ddp", "2 -> 3 processes, global batch 48 kept (grad_accum 3 -> 2)"),
        ("ddp", 2, "fsdp", "strategy ddp -> fsdp, global batch 48 kept"),
        ("fsdp", 2, "ddp", "strategy fsdp -> ddp, global batch 48 kept"),
        (
            "fsdp",
            2,
            "tp",
            "strategy fsdp -> tp, data-parallel ranks 2 -> 1, global batch 48 kept "
            "(grad_accum 3 -> 6)",
        ),
    ],
)
def test_a_run_stopped_on_one_shape_finishes_the_epoch_on_another_exactly_once(
    tmp_path: Path,
    reference: dict[int, float],
    stopped: dict[str, Path],
    saved_by: str,
    nprocs: int,
    strategy: str,
    change: str,
) -> None:
    source = stopped[saved_by]
    step = int(source.name.split("-")[1])
    assert step >= STOP_AT
    got = _resume(tmp_path, source, nprocs, f"strategy={strategy}")
    assert got["rc"] == 0, got["text"][-4000:]
    assert f"aios: resumed at step {step}: {change}" in got["text"], got["text"][-4000:]
    ids = got["result"]["ids"]
    assert len(ids) == N and sorted(ids) == list(range(N)), (len(ids), len(set(ids)))
    assert got["result"]["steps"] == STEPS
    losses = got["losses"]
    assert sorted(losses) == list(range(step + 1, STEPS + 1))
    for s, value in losses.items():
        assert value == pytest.approx(reference[s], rel=LOSS_REL), (s, value, reference[s])


def test_an_iterable_dataset_with_state_dict_resumes_on_more_processes_exactly_once(
    tmp_path: Path,
) -> None:
    """An iterable dataset that keeps its own global position (``state_dict()``): stopped on 2
    processes, resumed on 3; the losses are the uninterrupted run's."""
    (tmp_path / "ref").mkdir()
    ref = _run_loop(tmp_path / "ref", 2, tmp_path / "ref" / "ckpt", DATA="iterable")
    assert ref["rc"] == 0, ref["text"][-4000:]
    assert sorted(ref["result"]["ids"]) == list(range(N))
    (tmp_path / "stop").mkdir()
    source = _stopped(tmp_path / "stop", DATA="iterable")
    step = int(source.name.split("-")[1])
    (tmp_path / "resume").mkdir()
    got = _resume(tmp_path / "resume", source, 3, DATA="iterable")
    assert got["rc"] == 0, got["text"][-4000:]
    assert f"aios: resumed at step {step}: 2 -> 3 processes" in got["text"]
    ids = got["result"]["ids"]
    assert len(ids) == N and sorted(ids) == list(range(N)), (len(ids), len(set(ids)))
    for s, value in got["losses"].items():
        assert value == pytest.approx(ref["losses"][s], rel=LOSS_REL), (s, value)


def test_a_global_batch_the_new_world_cannot_divide_is_refused_before_the_model_is_built(
    tmp_path: Path, stopped: dict[str, Path]
) -> None:
    """48 samples per step cannot be micro-batches of 8 on 4 processes: one line, exit 2,
    before any rank builds the model; the checkpoint is untouched."""
    source = stopped["ddp"]
    got = _resume(tmp_path, source, 4)
    assert got["rc"] == 2, got["text"][-4000:]
    errors = [ln for ln in got["text"].splitlines() if "aios: error" in ln]
    assert len(errors) == 1, got["text"]
    assert (
        "global_batch=48 is not a multiple of micro_batch=8 x 4 data-parallel ranks = 32"
        in errors[0]
    )
    assert "model built" not in got["text"] and "Traceback" not in got["text"]
    saved = sorted(d.name for d in (tmp_path / "ckpt").iterdir() if d.name.startswith("ckpt"))
    assert saved == [source.name]


def test_reshard_false_refuses_another_shape_in_one_line(
    tmp_path: Path, stopped: dict[str, Path]
) -> None:
    got = _resume(tmp_path, stopped["ddp"], 1, "checkpoint.reshard=false")
    assert got["rc"] == 2, got["text"][-4000:]
    errors = [ln for ln in got["text"].splitlines() if "aios: error" in ln]
    assert len(errors) == 1 and "Traceback" not in got["text"], got["text"]
    assert "was written with world size 2, this run has world size 1" in errors[0]
    assert "checkpoint.reshard=true" in errors[0]


def test_a_full_checkpoint_of_2_processes_evaluates_on_1_and_on_2_alike(
    tmp_path: Path, stopped: dict[str, Path]
) -> None:
    """Issue 30: evaluation-only loads (``rt.load(path)``) of a ``full`` checkpoint work at any
    world size and give the same model."""
    source = stopped["ddp"]
    values = []
    for n in (1, 2):
        (tmp_path / str(n)).mkdir()
        r = aios_run(tmp_path / str(n), n, str(SCRIPT), "unused.json", env={"EVAL": str(source)})
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        found = [ln.split("eval loss ")[1] for ln in r.stdout.splitlines() if "eval loss" in ln]
        assert len(found) == n, r.stdout
        values.append(set(found))
    assert values[0] == values[1] and len(values[0]) == 1, values
