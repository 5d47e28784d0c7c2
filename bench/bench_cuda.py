"""aios on an NVIDIA GPU against a hand-written PyTorch loop, side by side in one process.

    python bench/bench_cuda.py [--steps 30] [--repeats 3] [--batch-size auto] [--json OUT]
    python bench/bench_cuda.py --smoke-cpu      # exercise the code path on CPU (tiny model; not a GPU figure)

The example GPT (``examples/gpt.py``'s ``GPT``: pre-LN blocks, tied embeddings, plain masked
attention) at a size that fills the GPU (24 layers, d=1024, 16 heads, context 1024, char vocab;
the largest batch from ``--batch-sizes`` whose two warm-up steps, plus the second model's
resident state, fit in 90% of the memory) trains on the same synthetic batches, bf16 autocast,
fused AdamW, TF32 on, no torch.compile, in two ways:

* ``hand``: ``model.cuda()``, ``torch.autocast("cuda", torch.bfloat16)``, ``loss.backward()``,
  ``opt.step()``, ``opt.zero_grad(set_to_none=True)``;
* ``aios``: ``aios.init(backend="cuda", precision="bf16-mixed")``, ``rt.setup``,
  ``rt.accumulate``/``rt.autocast``/``rt.backward``/``rt.step`` (the runtime API the example uses).

The two alternate ``--repeats`` times (each timing ``--steps`` steps after warm-up, CUDA-synchronised);
reported: tokens/s of each (median), the ratio aios/hand (budget: >= 0.98), model FLOPs
utilisation (6N + 12·L·d·T FLOPs per token against the GPU's dense bf16 peak), peak memory.
Exit status 1 when the budget is missed. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT_FILE = ROOT / "examples" / "gpt.py"
BUDGET = 0.98

# Dense bf16 tensor-core peaks (FLOP/s), from NVIDIA's data sheets.
PEAK_BF16 = {
    "H200": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 756e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 6000 Ada": 364e12,
    "RTX A6000": 155e12,
    "GH200": 989e12,
    "B200": 2250e12,
}


def peak_flops(name: str) -> float | None:
    for key in sorted(PEAK_BF16, key=len, reverse=True):
        if key in name:
            return PEAK_BF16[key]
    return None


def no_gpu_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "no NVIDIA GPU is visible to torch"
    return None


def load_gpt():
    spec = importlib.util.spec_from_file_location("aios_example_gpt", GPT_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GPT


def flops_per_token(n_params: int, n_layer: int, d: int, t: int) -> float:
    return 6 * n_params + 12 * n_layer * d * t


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n-layer", type=int, default=24)
    p.add_argument("--n-embd", type=int, default=1024)
    p.add_argument("--n-head", type=int, default=16)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch-size", default="auto")
    p.add_argument("--batch-sizes", default="64,48,32,24,16,12,8,4,2,1")
    p.add_argument(
        "--peak-tflops", type=float, default=None, help="override the GPU's dense bf16 peak"
    )
    p.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="run the same code on CPU with a tiny model (checks the bench, measures nothing about GPUs)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()

    if args.smoke_cpu:
        device_type, backend = "cpu", "cpu"
        args.n_layer, args.n_embd, args.n_head, args.block_size = 2, 64, 4, 32
        args.steps, args.warmup = min(args.steps, 10), 2
        if args.batch_size == "auto":
            args.batch_size = "8"
    else:
        why = no_gpu_reason()
        if why:
            print(
                f"bench_cuda: no GPU here ({why}): nothing measured. Run it on a machine with an NVIDIA GPU "
                "(or --smoke-cpu to check the code path)."
            )
            return 0
        device_type, backend = "cuda", "cuda"

    import aios
    import torch
    import torch.nn.functional as F

    GPT = load_gpt()  # noqa: N806 (a class, loaded from examples/gpt.py)
    dev = torch.device(device_type)
    if device_type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    T, V = args.block_size, args.vocab  # noqa: N806 (sequence length T, vocabulary V)

    def make(seed: int = 0):
        torch.manual_seed(seed)
        return GPT(V, T, args.n_layer, args.n_head, args.n_embd, 0.0)

    def fits(bs: int) -> bool:
        import gc

        state: dict = {}
        try:
            state["model"] = model = make().to(dev)
            state["opt"] = opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            x = torch.randint(0, V, (bs, T), device=dev)
            torch.cuda.reset_peak_memory_stats()
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x).float().view(-1, V), x.view(-1))
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            total = torch.cuda.get_device_properties(dev).total_memory
            # the other contestant's weights, gradients and AdamW state stay resident too
            resident = 16 * sum(q.numel() for q in model.parameters())
            return torch.cuda.max_memory_reserved() + resident < 0.9 * total
        except torch.OutOfMemoryError:
            return False
        finally:
            state.clear()
            gc.collect()
            torch.cuda.empty_cache()

    if args.batch_size == "auto":
        bs = next((b for b in map(int, args.batch_sizes.split(",")) if fits(b)), None)
        if bs is None:
            print("bench_cuda: even batch size 1 does not fit; use a smaller --n-layer/--n-embd")
            return 1
    else:
        bs = int(args.batch_size)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, V, (bs, T + 1), generator=g).to(dev) for _ in range(8)]

    # ---- hand-written loop
    hand_model = make().to(dev)
    hand_opt = torch.optim.AdamW(
        hand_model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True
    )

    def hand_step(i: int) -> torch.Tensor:
        b = batches[i % len(batches)]
        x, y = b[:, :-1], b[:, 1:]
        with torch.autocast(device_type, dtype=torch.bfloat16):
            logits = hand_model(x)
            loss = F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))
        loss.backward()
        hand_opt.step()
        hand_opt.zero_grad(set_to_none=True)
        return loss

    # ---- the same through aios
    rt = aios.init(
        backend=backend,
        precision="bf16-mixed",
        overrides=[
            "logging.tensorboard=false",
            "logging.progress=false",
            "checkpoint.dir=null",
            "seed=null",
        ],
    )
    aios_model = make()
    aios_opt = torch.optim.AdamW(
        aios_model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1
    )
    aios_model, aios_opt = rt.setup(aios_model, aios_opt)

    def aios_step(i: int) -> torch.Tensor:
        b = batches[i % len(batches)]
        x, y = b[:, :-1], b[:, 1:]
        with rt.accumulate(aios_model), rt.autocast():
            logits = aios_model(x)
            loss = F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))
            rt.backward(loss)
        rt.step(aios_opt)
        return loss

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    def timed(step_fn) -> float:
        for i in range(args.warmup):
            step_fn(i)
        sync()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step_fn(i)
        sync()
        return time.perf_counter() - t0

    tokens = args.steps * bs * T
    res: dict[str, list[float]] = {"hand": [], "aios": []}
    for r in range(args.repeats):
        order = (
            [("hand", hand_step), ("aios", aios_step)]
            if r % 2 == 0
            else [("aios", aios_step), ("hand", hand_step)]
        )
        for name, fn in order:
            res[name].append(tokens / timed(fn))
    hand_tps, aios_tps = statistics.median(res["hand"]), statistics.median(res["aios"])
    ratio = aios_tps / hand_tps
    n_params = sum(q.numel() for q in hand_model.parameters())
    fpt = flops_per_token(n_params, args.n_layer, args.n_embd, T)
    name = torch.cuda.get_device_name(dev) if device_type == "cuda" else "CPU"
    peak = (
        args.peak_tflops * 1e12
        if args.peak_tflops
        else (peak_flops(name) if device_type == "cuda" else None)
    )
    out = {
        "device": name,
        "params": n_params,
        "batch_size": bs,
        "context": T,
        "steps": args.steps,
        "repeats": args.repeats,
        "tokens_per_s": {"hand": hand_tps, "aios": aios_tps},
        "all": res,
        "ratio_aios_over_hand": ratio,
        "budget": BUDGET,
        "mfu": {"hand": hand_tps * fpt / peak, "aios": aios_tps * fpt / peak} if peak else None,
        "peak_flops": peak,
        "backend_metrics": rt.strategy.metrics(),
        "smoke_cpu": bool(args.smoke_cpu),
    }
    print(
        f"bench_cuda on {name}: GPT {n_params / 1e6:.1f}M params, batch {bs} x {T} tokens, "
        f"bf16-mixed, {args.steps} steps x {args.repeats} repeats"
    )
    print(f"  hand-written loop: {hand_tps:,.0f} tokens/s")
    print(
        f"  aios runtime:      {aios_tps:,.0f} tokens/s   ratio aios/hand = {ratio:.4f} (budget >= {BUDGET})"
    )
    if out["mfu"]:
        print(
            f"  MFU: hand {out['mfu']['hand']:.1%}, aios {out['mfu']['aios']:.1%} (peak "
            f"{peak / 1e12:.0f} TFLOP/s bf16 dense)"
        )
    if device_type == "cuda":
        print(
            f"  peak memory allocated (aios): {out['backend_metrics'].get('peak_memory_allocated_gib')} GiB"
        )
    if args.smoke_cpu:
        print(
            "  (smoke run on CPU: checks the bench's code path; the GPU budget is not measured here)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    rt.close()
    if args.smoke_cpu:
        return 0
    return 0 if ratio >= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
