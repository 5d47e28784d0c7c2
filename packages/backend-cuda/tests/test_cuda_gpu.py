"""On a real NVIDIA GPU (marked ``cuda``; skipped with the reason elsewhere): NVML agrees with
CUDA, the DDP strategy trains in bf16/fp16 with fused AdamW and reports peak memory, fp16
overflow steps are skipped and counted, DeepSpeed ZeRO-2 and the example GPT run through aios-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "no NVIDIA GPU visible"
    return None


REASON = _gpu_reason()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(REASON is not None, reason=f"needs an NVIDIA GPU: {REASON}"),
]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).parent / "scripts" / "cuda_ds_train.py"


def _cfg(*overrides: str):
    from aios.config.schema import resolve

    return resolve(overrides=list(overrides), environ={}, check_backend=False)


def test_nvml_agrees_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from aios_backend_cuda import nvml, probe

    monkeypatch.delenv("AIOS_TEST_NVML_RECORDING", raising=False)
    inv, why = nvml.try_inventory()
    assert inv is not None, why
    assert len(inv.gpus) == torch.cuda.device_count()
    for g in inv.gpus:
        assert g.name == torch.cuda.get_device_name(g.index)
        assert g.compute_capability == torch.cuda.get_device_capability(g.index)
    assert probe.probe().available


def test_ddp_strategy_bf16_fused_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from aios_backend_cuda.accelerator import CudaAccelerator
    from aios_backend_cuda.precision import backend_precision
    from aios_backend_cuda.strategy import make_ddp

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    cfg = _cfg()
    s = make_ddp(cfg, CudaAccelerator(cfg), "cuda")
    s.setup_environment()
    p = backend_precision("bf16-mixed", cfg, s.accelerator)
    model = s.setup_module(
        torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
        ),
        p,
    )
    opt = s.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert opt.param_groups[0]["fused"] is True
    x = torch.randn(64, 256, device=s.device)
    losses = []
    for _ in range(20):
        with p.autocast():
            loss = (model(x) - x).pow(2).mean()
        assert model(x).dtype == torch.float32  # outside autocast
        s.backward(loss, model, p)
        assert s.optimizer_step(opt, p)
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    m = s.metrics()
    assert m["max_memory_allocated"] > 0 and m["peak_memory_allocated_gib"] >= 0 and m["gpu"]
    assert torch.get_float32_matmul_precision() == "high"


def test_fp16_overflow_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from aios_backend_cuda.accelerator import CudaAccelerator
    from aios_backend_cuda.precision import backend_precision
    from aios_backend_cuda.strategy import make_ddp

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = _cfg()
    s = make_ddp(cfg, CudaAccelerator(cfg), "cuda")
    s.setup_environment()
    p = backend_precision("fp16-mixed", cfg, s.accelerator)
    model = s.setup_module(torch.nn.Linear(16, 16), p)
    opt = s.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = model.weight.detach().clone()
    with p.autocast():
        loss = model(torch.randn(4, 16, device=s.device)).sum() * float("inf")
    s.backward(loss, model, p)
    assert s.optimizer_step(opt, p) is False
    assert p.skipped_steps == 1
    assert torch.equal(model.weight.detach(), before)


def test_bf16_check_agrees_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from aios.errors import ConfigError
    from aios_backend_cuda.precision import check_bf16

    monkeypatch.delenv("AIOS_TEST_NVML_RECORDING", raising=False)
    every = all(
        torch.cuda.get_device_capability(i) >= (8, 0) for i in range(torch.cuda.device_count())
    )
    if every:
        check_bf16("bf16-mixed")
    else:
        with pytest.raises(ConfigError):
            check_bf16("bf16-mixed")


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "TOTAL_STEPS": "10",
        }
    )
    return env


def test_deepspeed_zero2_on_gpu(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds.json"
    proc = subprocess.run(
        [
            *AIOS_RUN,
            "--backend",
            "cuda",
            "--nprocs",
            "1",
            "strategy=deepspeed",
            "grad_accum=2",
            "grad_clip=1.0",
            str(SCRIPT),
            str(out),
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["metrics"]["zero_stage"] == 2 and res["metrics"]["global_steps"] == 10
    assert res["losses"]["10"] < res["losses"]["1"]


def test_example_gpt_bf16_on_gpu(tmp_path: Path) -> None:
    import torch

    precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "fp16-mixed"
    proc = subprocess.run(
        [
            *AIOS_RUN,
            "--backend",
            "cuda",
            "--nprocs",
            "1",
            "--precision",
            precision,
            "checkpoint.dir=null",
            str(ROOT / "examples" / "gpt.py"),
            "--steps",
            "60",
        ],
        env={**_env(tmp_path), "GPT_SAMPLE": "0"},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tokens/s" in proc.stdout


def test_nccl_flight_recorder_dumps_through_the_pipe_aios_sets(tmp_path: Path) -> None:
    """The watchdog's side of NCCL's Flight Recorder against real ProcessGroupNCCL (one rank on
    one GPU): with the environment aios-run gives its ranks, torch makes the dump pipe, a write
    to it makes torch dump its trace, and aios reads and summarises the dump."""
    from aios.resilience import flightrec

    env = {**os.environ, **flightrec.worker_env(str(tmp_path), {}), "RANK": "0"}
    code = (
        "import os, sys, time, json, torch, torch.distributed as dist\n"
        "from aios.resilience import flightrec\n"
        "dist.init_process_group('nccl', init_method='tcp://127.0.0.1:' + sys.argv[1],"
        " rank=0, world_size=1, device_id=torch.device('cuda', 0))\n"
        "x = torch.ones(4, device='cuda')\n"
        "for _ in range(3):\n"
        "    dist.all_reduce(x)\n"
        "torch.cuda.synchronize()\n"
        "deadline = time.monotonic() + 30\n"  # torch makes the pipe when the group starts
        "while not os.path.exists(os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE'] + '0.pipe'):\n"
        "    assert time.monotonic() < deadline, 'no pipe'\n"
        "    time.sleep(0.1)\n"
        "recs = flightrec.trigger_and_collect({0: dict(os.environ)}, wait=30.0)\n"
        "print(json.dumps([r.__dict__ for r in recs]))\n"
        "print('\\n'.join(flightrec.summarize(recs)))\n"
        "dist.destroy_process_group()\n"
    )
    from aios.testing.strategy_contract import free_port

    proc = subprocess.run(
        [sys.executable, "-c", code, str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads(proc.stdout.splitlines()[0])
    assert not rec["error"] and rec["entries"] >= 3, rec
    assert rec["seq"] >= 3 and "allreduce" in rec["name"].replace("_", ""), rec
    assert "NCCL flight recorder: rank 0 at collective #" in proc.stdout, proc.stdout
    assert (tmp_path / f"{flightrec.DUMP_STEM}0").is_file()
