"""The example GPT's training step on TorchTPU's ``tpu`` device under FakeTensorMode, through
aios's real pieces: the ``tpu`` accelerator, core's precision policy and the native DDP strategy
(one rank: DDP's C++ parameter check needs allocated storage, which fake tensors lack). Called by
``tt_harness.py step`` after the device is registered; returns what was observed."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def _example_gpt():
    root = Path(__file__).resolve().parents[4]
    spec = importlib.util.spec_from_file_location("example_gpt", root / "examples" / "gpt.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["example_gpt"] = mod
    spec.loader.exec_module(mod)
    return mod


def run_step(precision_name: str = "bf16-mixed", world: str = "1") -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.pop("TORCHELASTIC_RUN_ID", None)
    from aios.config.schema import resolve
    from aios.strategies.ddp import DDPStrategy
    from aios.strategies.precision import default_precision
    from aios_backend_xla.tpu_accelerator import TpuAccelerator

    os.environ.update(
        RANK="0",
        WORLD_SIZE=world,
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE=world,
        MASTER_ADDR="localhost",
        MASTER_PORT="29500",
    )
    cfg = resolve(
        overrides=["backend=tpu", f"precision={precision_name}"],
        flags={},
        environ={},
        check_backend=False,
    )
    acc = TpuAccelerator(cfg)
    if int(world) > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=int(world))
    strategy = DDPStrategy(cfg, acc)
    strategy.setup_environment()
    precision = default_precision(precision_name, accelerator=acc)

    gpt = _example_gpt()
    vocab, block = 64, 16
    with torch.device("meta"):
        model = gpt.GPT(vocab, block, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = strategy.setup_module(model, precision)
        params = {p.device.type for p in module.parameters()}
        idx = torch.randint(0, vocab, (4, block), device=strategy.device)
        tgt = torch.randint(0, vocab, (4, block), device=strategy.device)
        with precision.autocast():
            logits = module(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
        out = {
            "strategy": type(strategy).__name__,
            "accelerator": strategy.accelerator.name,
            "device": str(strategy.device),
            "param_devices": sorted(params),
            "wrapped": type(module).__name__,
            "world": strategy.world_size,
            "dist_backend": strategy.dist_backend,
            "autocast_dtype": precision.dtype_name if hasattr(precision, "dtype_name") else None,
            "logits_dtype": str(logits.dtype),
            "logits_device": str(logits.device),
            "logits_shape": list(logits.shape),
            "loss_device": str(loss.device),
            "loss_dtype": str(loss.dtype),
            "compile_backend": acc.compile_backend,
        }
    return out
