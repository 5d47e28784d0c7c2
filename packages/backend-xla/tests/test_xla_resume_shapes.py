"""Issue 26 on XLA:CPU (real torch_xla): the 960-sample loop of
``packages/core/tests/scripts/shape_loop.py`` (``global_batch=48 micro_batch=8``) stopped by
SIGTERM after step 6 on 2 cpu processes resumes on XLA:CPU through aios's XLA loader, and one
stopped on XLA:CPU resumes on 2 cpu processes: every sample of the epoch once, the loss at every
later step that of the uninterrupted 2-process cpu run (float rounding only). The same for an
iterable dataset with ``state_dict()`` read through the XLA loader's background transfer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aios.testing.zygote import python

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parents[2] / "core" / "tests" / "scripts" / "shape_loop.py"
N, STEPS, STOP_AT = 960, 20, 6
LOSS_REL = 1e-5  # measured: 3e-7


def run_loop(tmp: Path, backend: str, nprocs: int, ckpt: Path, **env: str) -> dict[str, Any]:
    out, loss = tmp / "out.json", tmp / "loss.jsonl"
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "PJRT_", "XLA_", "TPU_", "CPU_NUM"))
    }
    e.update(
        AIOS_TEST_DMI_PRODUCT="/nonexistent",
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_LOGGING__RUN_DIR=str(tmp / "runs"),
        OMP_NUM_THREADS="1",
        LOSS_FILE=str(loss),
        **env,
    )
    cmd = [*python("-c", "from aios.cli.run import main; main()")]
    cmd += ["--backend", backend, "--nprocs", str(nprocs)]
    if backend == "xla":
        cmd.append("xla.allow_cpu=true")
    cmd += ["global_batch=48", "micro_batch=8", f"checkpoint.dir={ckpt}", str(SCRIPT), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600, cwd=tmp)
    losses = {}
    if loss.exists():
        for line in loss.read_text().splitlines():
            rec = json.loads(line)
            losses[int(rec["step"])] = float(rec["loss"])
    return {
        "rc": p.returncode,
        "text": p.stdout + p.stderr,
        "result": json.loads(out.read_text()) if out.exists() else None,
        "losses": losses,
    }


def stop_then_resume(
    tmp: Path, first: tuple[str, int], then: tuple[str, int], **env: str
) -> tuple[int, dict[str, Any]]:
    (tmp / "a").mkdir()
    stopped = run_loop(tmp / "a", *first, tmp / "a" / "ckpt", STOP_AT=str(STOP_AT), **env)
    assert stopped["rc"] == 75, stopped["text"][-4000:]
    (source,) = [d for d in (tmp / "a" / "ckpt").iterdir() if d.name.startswith("ckpt-")]
    (tmp / "b").mkdir()
    shutil.copytree(source, tmp / "b" / "ckpt" / source.name)
    got = run_loop(tmp / "b", *then, tmp / "b" / "ckpt", **env)
    assert got["rc"] == 0, got["text"][-4000:]
    return int(source.name.split("-")[1]), got


def exactly_once(got: dict[str, Any]) -> None:
    ids = got["result"]["ids"]
    assert len(ids) == N and sorted(ids) == list(range(N)), (len(ids), len(set(ids)))
    assert got["result"]["steps"] == STEPS


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    tmp = tmp_path_factory.mktemp("ref")
    got = run_loop(tmp, "cpu", 2, tmp / "ckpt")
    assert got["rc"] == 0, got["text"][-4000:]
    exactly_once(got)
    return got["losses"]


@pytest.mark.parametrize(
    ("first", "then", "change"),
    [
        (
            ("cpu", 2),
            ("xla", 1),
            "2 -> 1 process, strategy ddp -> xla, backend cpu -> xla, global batch 48 kept "
            "(grad_accum 3 -> 6)",
        ),
        (
            ("xla", 1),
            ("cpu", 2),
            "1 -> 2 processes, strategy xla -> ddp, backend xla -> cpu, global batch 48 kept "
            "(grad_accum 6 -> 3)",
        ),
    ],
)
def test_the_loop_moves_between_cpu_and_xla_cpu_with_every_sample_once(
    tmp_path: Path, reference: dict[int, float], first, then, change
) -> None:
    step, got = stop_then_resume(tmp_path, first, then)
    assert f"aios: resumed at step {step}: {change}" in got["text"], got["text"][-3000:]
    exactly_once(got)
    assert sorted(got["losses"]) == list(range(step + 1, STEPS + 1))
    for s, value in got["losses"].items():
        assert value == pytest.approx(reference[s], rel=LOSS_REL), (s, value, reference[s])


def test_an_iterable_dataset_with_state_dict_resumes_on_xla_cpu_exactly_once(
    tmp_path: Path,
) -> None:
    """The dataset's position is read after each batch the loop receives, although the XLA
    loader's transfer thread reads ahead."""
    step, got = stop_then_resume(tmp_path, ("cpu", 2), ("xla", 1), DATA="iterable")
    assert f"aios: resumed at step {step}: 2 -> 1 process" in got["text"]
    exactly_once(got)
    # a second stop, now on XLA:CPU (the loader reads ahead of the step), resumed on cpu
    (tmp_path / "c").mkdir()
    step2, again = stop_then_resume(tmp_path / "c", ("xla", 1), ("cpu", 2), DATA="iterable")
    assert step2 >= STOP_AT
    exactly_once(again)
