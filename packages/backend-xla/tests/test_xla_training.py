"""Training for real on XLA:CPU (torch_xla's CPU PJRT device) through aios-run and aios.init."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytestmark = pytest.mark.xla

SCRIPT = str(Path(__file__).parent / "xla_scripts" / "xla_train_mlp.py")


def run(
    tmp_path: Path,
    backend: str,
    *extra: str,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    name: str = "out",
) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{name}.json"
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "PJRT_", "XLA_", "TPU_", "CPU_NUM"))
    }
    e.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", **(env or {}))
    cmd = [
        *python("-c", "from aios.cli.run import main; main()"),
        "--backend",
        backend,
        f"logging.run_dir={tmp_path / 'runs'}",
        *extra,
        SCRIPT,
        str(out),
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=400, cwd=tmp_path)
    data = json.loads(out.read_text()) if out.exists() else {}
    return p, data


def test_xla_cpu_trains_to_the_cpu_loss_with_two_compilations(tmp_path):
    p_cpu, cpu = run(tmp_path, "cpu", args=("--steps", "12"), name="cpu")
    assert p_cpu.returncode == 0, p_cpu.stderr
    p_xla, xla = run(tmp_path, "xla", "xla.allow_cpu=true", args=("--steps", "36"), name="xla")
    assert p_xla.returncode == 0, p_xla.stderr
    assert xla["backend"] == "xla" and xla["device"].startswith("xla:")
    # first epoch: identical data, identical math -> same losses
    for (s1, a), (s2, b) in zip(cpu["losses"], xla["losses"][:12], strict=True):
        assert s1 == s2 and b == pytest.approx(a, rel=1e-4, abs=1e-5)
    m = xla["metrics"]
    # the step graph with fresh optimizer state, then the steady-state step: nothing after
    assert (
        m["compile_guard"]["compiles"] == 2 and m["compile_guard"]["recompiles_after_warmup"] == 0
    )
    assert set(m["compile_guard"]["compiles_by_step"]) == {"1", "2"}
    # 100 samples, batch 8: drop_last gives 12 full batches per epoch, the short one is dropped
    assert xla["batch_sizes_seen"] == [96, 96, 96]
    assert (
        m["compile"]["uncached"] >= 2
        and m["execute"]["count"] >= 36
        and m["transfer_to_device"]["count"] > 0
    )
    diags = [json.loads(f.read_text()) for f in (tmp_path / "runs").glob("*/diagnostics.json")]
    (diag,) = [d for d in diags if d.get("backend") == "xla"]
    assert diag["backend_metrics"]["compile_guard"]["compiles"] == 2
    assert diag["backend_metrics"]["pjrt_device"] == "CPU"


def test_short_last_batch_without_drop_last_warns_naming_step_and_shapes(tmp_path):
    p, data = run(
        tmp_path, "xla", "xla.allow_cpu=true", "xla.drop_last=false", args=("--steps", "16")
    )
    assert p.returncode == 0, p.stderr
    assert "XLA recompiled 1 graph(s) at step 13" in p.stderr and "(8, 16) -> (4, 16)" in p.stderr
    assert data["metrics"]["compile_guard"]["recompiles_after_warmup"] == 1


def test_compile_guard_limit_fails_a_dynamic_shape_loop(tmp_path):
    p, data = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        "xla.max_recompiles=1",
        args=("--steps", "12", "--dynamic"),
    )
    assert p.returncode != 0
    assert (
        "exceed xla.max_recompiles=1" in p.stderr
        and "at step 4" in p.stderr
        and "forward[0]" in p.stderr
    )
    assert data == {}


def test_checkpoint_resume_continues_exactly(tmp_path):
    p, full = run(tmp_path, "xla", "xla.allow_cpu=true", args=("--steps", "16"), name="full")
    assert p.returncode == 0, p.stderr
    ck = tmp_path / "ckpt"
    p1, first = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        f"checkpoint.dir={ck}",
        "checkpoint.every=5",
        args=("--steps", "10"),
        name="first",
    )
    assert p1.returncode == 0, p1.stderr
    assert sorted(x.name for x in ck.iterdir() if x.name.startswith("ckpt-"))[-1].endswith("10")
    p2, second = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        f"checkpoint.dir={ck}",
        args=("--steps", "16"),
        name="second",
    )
    assert p2.returncode == 0, p2.stderr
    assert [s for s, _ in second["losses"]] == list(range(11, 17))
    for (s, a), (_, b) in zip(full["losses"][10:], second["losses"], strict=True):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6), s
    assert second["params"] == pytest.approx(full["params"], rel=1e-5)


def test_bf16_mixed_trains_close_to_fp32(tmp_path):
    p, fp32 = run(tmp_path, "xla", "xla.allow_cpu=true", args=("--steps", "6"), name="fp32")
    p2, bf16 = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        "precision=bf16-mixed",
        args=("--steps", "6"),
        name="bf16",
    )
    assert p.returncode == 0 and p2.returncode == 0, p2.stderr
    a, b = fp32["losses"][-1][1], bf16["losses"][-1][1]
    assert b == pytest.approx(a, rel=0.1) and b != a


def test_fp16_is_refused_with_one_line(tmp_path):
    p, _ = run(tmp_path, "xla", "xla.allow_cpu=true", "precision=fp16-mixed", args=("--steps", "2"))
    assert (
        p.returncode != 0
        and "fp16-mixed' is not supported on the xla backend" in p.stderr
        and "bf16-mixed" in p.stderr
    )


def test_spmd_on_four_cpu_devices_shards_the_batch_and_matches(tmp_path):
    p1, single = run(tmp_path, "xla", "xla.allow_cpu=true", args=("--steps", "6"), name="single")
    p4, spmd = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        "strategy=spmd",
        "xla.cpu_devices=4",
        args=("--steps", "6"),
        name="spmd",
    )
    assert p1.returncode == 0, p1.stderr
    assert p4.returncode == 0, p4.stderr
    assert spmd["metrics"]["spmd_devices"] == 4 and spmd["metrics"]["strategy"] == "xla-spmd"
    assert "devices=[4,1]" in spmd["sharding"] and single["sharding"] == ""
    for (s, a), (_, b) in zip(single["losses"], spmd["losses"], strict=True):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5), s
    assert spmd["metrics"]["compile_guard"]["recompiles_after_warmup"] == 0


def test_spmd_batch_must_divide_over_devices(tmp_path):
    p, _ = run(
        tmp_path,
        "xla",
        "xla.allow_cpu=true",
        "strategy=spmd",
        "xla.cpu_devices=3",
        args=("--steps", "2"),
    )
    assert (
        p.returncode != 0
        and "SPMD shards each batch over 3 devices but the batch size is 8" in p.stderr
    )
