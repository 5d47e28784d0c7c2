"""The CUDA DDP strategy's generic parts, run on CPU over gloo: DDP wrapping and gradient
averaging, fused optimizers, opt-in torch.compile, metrics; and its refusal to run on a torch
build without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from aios.config.schema import resolve  # noqa: E402
from aios.devices.accelerator import CpuAccelerator  # noqa: E402
from aios.errors import BackendUnavailable  # noqa: E402
from aios.strategies.precision import Precision  # noqa: E402
from aios_backend_cuda.strategy import CudaDDPStrategy, check_cuda_runtime, fuse_optimizer  # noqa: E402


def _cfg(*overrides: str):
    return resolve(overrides=list(overrides), environ={}, check_backend=False)


def test_fused_when_left_to_torch() -> None:
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    assert fuse_optimizer(opt) == "fused"
    assert opt.param_groups[0]["fused"] is True and opt._step_supports_amp_scaling
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert opt.state[m.weight]["step"].item() == 1


def test_explicit_choices_are_respected() -> None:
    m = torch.nn.Linear(4, 4)
    assert fuse_optimizer(torch.optim.AdamW(m.parameters(), foreach=True)) == "foreach"
    assert fuse_optimizer(torch.optim.AdamW(m.parameters(), fused=False)) == "default"
    assert fuse_optimizer(torch.optim.RMSprop(m.parameters())) == "default"
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.state[m.weight]["momentum_buffer"] = torch.zeros(4, 4)
    assert fuse_optimizer(opt) == "default"  # existing state: left alone


def test_fused_optimizer_off_by_config() -> None:
    s = CudaDDPStrategy(_cfg("cuda.fused_optimizer=false"), CpuAccelerator())
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    s.setup_optimizer(opt)
    assert opt.param_groups[0]["fused"] is None
    assert s.metrics()["optimizers"] == ["Adam:default"]


def test_compile_is_opt_in_and_unwraps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plain = CudaDDPStrategy(_cfg(), CpuAccelerator())
    plain.setup_environment()
    m = torch.nn.Linear(3, 3)
    assert plain.setup_module(m, Precision("cpu")) is m
    s = CudaDDPStrategy(
        _cfg("cuda.compile=true", "cuda.compile_mode=max-autotune-no-cudagraphs"), CpuAccelerator()
    )
    s.setup_environment()
    wrapped = s.setup_module(m, Precision("cpu"))
    assert wrapped is not m and hasattr(wrapped, "_orig_mod")
    assert s.unwrap(wrapped) is m
    assert s.metrics()["compiled"] is True


def test_ddp_settings_reach_the_wrapper() -> None:
    s = CudaDDPStrategy(_cfg("cuda.bucket_cap_mb=50", "cuda.static_graph=true"), CpuAccelerator())
    assert s.ddp_kwargs["bucket_cap_mb"] == 50 and s.ddp_kwargs["static_graph"] is True
    assert s.dist_backend == "gloo" and CudaDDPStrategy(_cfg()).dist_backend == "nccl"


def test_cpu_torch_is_refused_for_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(BackendUnavailable) as err:
        check_cuda_runtime()
    assert "CPU-only build" in err.value.message or "not available" in err.value.message


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    torch.set_num_threads(1)
    s = CudaDDPStrategy(_cfg(), CpuAccelerator())
    s.setup_environment()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    p = Precision("cpu")
    model = s.setup_module(model, p)
    opt = s.setup_optimizer(opt)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
        xs, ys = x[rank * 4 : (rank + 1) * 4], y[rank * 4 : (rank + 1) * 4]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        s.backward(loss, model, p)
        s.optimizer_step(opt, p)
        opt.zero_grad()
    if rank == 0:
        torch.save({"state": s.unwrap(model).state_dict(), "metrics": s.metrics()}, out)
    s.teardown()


def test_two_ranks_over_gloo_match_one_full_batch(tmp_path: Path, free_port) -> None:
    out = str(tmp_path / "ddp.pt")
    torch.multiprocessing.spawn(_worker, args=(2, free_port(), out), nprocs=2, join=True)
    got = torch.load(out)
    assert got["metrics"]["optimizers"] == ["AdamW:fused"] and got["metrics"]["world_size"] == 2
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6)
