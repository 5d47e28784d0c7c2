"""aios on XLA:CPU against a hand-written torch_xla loop (and HF Accelerate), side by side.

    PJRT_DEVICE=CPU /work/venvs/xla/bin/python bench/bench_xla.py [--steps 200] [--block 10] [--json OUT]

The same small GPT (2 layers, d=128, seq 64, vocab 256, batch 16, tied embeddings) trains for
``--steps`` steps on a data set whose size is not a multiple of the batch (a short last batch
every epoch) in three ways:

* ``hand``: the torch_xla loop a user would write (``MpDeviceLoader`` over a ``drop_last``
  DataLoader, ``loss.backward()``, ``optimizer.step()``, ``torch_xla.sync()``);
* ``aios``: the same model through ``aios.init()`` / ``rt.setup`` / ``rt.backward`` / ``rt.step``
  with ``--backend xla`` and the XLA:CPU opt-in;
* ``accelerate``: ``Accelerator().prepare`` / ``accelerator.backward`` (when installed).

Phase 1 runs each contestant in a fresh process (a cold compilation cache) and reports
uncached compilations (torch_xla's ``UncachedCompile`` counter), how many came after the 2-step
warm-up, and the final loss. Phase 2 times them side by side in one process: blocks of
``--block`` steps alternate between the contestants, so load from other processes hits all of
them alike. Other processes only ever add time, so the budget uses the mean of each
contestant's fastest quarter of blocks; the median of block-by-block ratios is printed too.
Budgets checked for aios against hand: the same compilations, zero recompiles after warm-up,
step time <= 1.03x, the same final loss. Exit status 1 when a budget is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB, SEQ, DIM, LAYERS, HEADS, BATCH = 256, 64, 128, 2, 4, 16
N_SAMPLES = BATCH * 13 + 5  # 13 full batches and a short one of 5 per epoch
WARMUP = 2
STEADY_FROM = 20


def build():
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(DIM)
            self.qkv = torch.nn.Linear(DIM, 3 * DIM)
            self.proj = torch.nn.Linear(DIM, DIM)
            self.ln2 = torch.nn.LayerNorm(DIM)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM)
            )

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (
                self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
            )
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, DIM))
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(VOCAB, DIM)
            self.pos = torch.nn.Parameter(torch.zeros(1, SEQ, DIM))
            self.blocks = torch.nn.Sequential(*[Block() for _ in range(LAYERS)])
            self.ln = torch.nn.LayerNorm(DIM)
            self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
            self.head.weight = self.tok.weight  # tied, as in GPT-2

        def forward(self, idx):
            return self.head(self.ln(self.blocks(self.tok(idx) + self.pos)))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (N_SAMPLES, SEQ + 1), generator=g)
    ds = torch.utils.data.TensorDataset(data[:, :-1].contiguous(), data[:, 1:].contiguous())
    model = GPT()
    return model, ds


def loss_fn(logits, y):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


class Clock:
    """Per-step compile counts and the steady-state wall time."""

    def __init__(self, steps: int):
        import torch_xla.debug.metrics as met

        self.met = met
        self.steps = steps
        self.start = self.last = self.read()
        self.by_step: dict[int, int] = {}
        self.t0 = None

    def read(self) -> int:
        return int(self.met.counter_value("UncachedCompile") or 0)

    def step(self, step: int) -> None:
        now = self.read()
        if now != self.last:
            self.by_step[step] = now - self.last
            self.last = now
        if step == STEADY_FROM:
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
            self.t0 = time.perf_counter()

    def result(self, loss: float) -> dict:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()
        dt = (time.perf_counter() - self.t0) / (self.steps - STEADY_FROM)
        self.step(self.steps + 1)
        return {
            "compiles": self.last - self.start,
            "compiles_after_warmup": sum(v for k, v in self.by_step.items() if k > WARMUP),
            "compiles_by_step": self.by_step,
            "step_ms": dt * 1000,
            "final_loss": loss,
        }


def worker_hand(steps: int) -> dict:
    import torch
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    model, ds = build()
    model = model.to(device)
    model.head.weight = model.tok.weight  # .to() on XLA unties weights: re-tie by hand
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False, drop_last=True)
    dl = pl.MpDeviceLoader(loader, device)
    clock = Clock(steps)
    step = 0
    while step < steps:
        for x, y in dl:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch_xla.sync()
            step += 1
            clock.step(step)
            if step >= steps:
                break
    return clock.result(float(loss.item()))


def worker_aios(steps: int) -> dict:
    import aios
    import torch

    rt = aios.init(
        config={
            "backend": "xla",
            "xla": {"allow_cpu": True},
            "seed": 0,
            "logging": {
                "run_dir": tempfile.mkdtemp(prefix="aios-bench-"),
                "progress": False,
                "tensorboard": False,
            },
        }
    )
    model, ds = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False)
    model, opt, loader = rt.setup(model, opt, loader)
    clock = Clock(steps)
    while rt.global_step < steps:
        for x, y in loader:
            with rt.autocast():
                loss = loss_fn(model(x), y)
            rt.backward(loss)
            rt.step(opt)
            clock.step(rt.global_step)
            if rt.global_step >= steps:
                break
    out = clock.result(float(loss.item()))
    out["guard"] = rt.strategy.metrics()["compile_guard"]
    rt.close()
    return out


def worker_accelerate(steps: int) -> dict:
    import torch
    from accelerate import Accelerator

    acc = Accelerator()
    model, ds = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False, drop_last=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    clock = Clock(steps)
    step = 0
    while step < steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            clock.step(step)
            if step >= steps:
                break
    out = clock.result(float(loss.item()))
    out["device"] = str(acc.device)
    return out


WORKERS = {"hand": worker_hand, "aios": worker_aios, "accelerate": worker_accelerate}


# ------------------------------------------------------------------------------ timing duel


def _cycle(loader):
    while True:
        yield from loader


def stepper_hand():
    import torch
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    model, ds = build()
    model = model.to(device)
    model.head.weight = model.tok.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = _cycle(
        pl.MpDeviceLoader(
            torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False, drop_last=True), device
        )
    )

    def step():
        x, y = next(batches)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch_xla.sync()

    return step


def stepper_aios():
    import aios
    import torch

    rt = aios.init(
        config={
            "backend": "xla",
            "xla": {"allow_cpu": True},
            "seed": 0,
            "logging": {
                "run_dir": tempfile.mkdtemp(prefix="aios-bench-"),
                "progress": False,
                "tensorboard": False,
            },
        }
    )
    model, ds = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = rt.setup(
        model, opt, torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False)
    )
    batches = _cycle(loader)

    def step():
        x, y = next(batches)
        with rt.autocast():
            loss = loss_fn(model(x), y)
        rt.backward(loss)
        rt.step(opt)

    return step


def stepper_accelerate():
    import torch
    from accelerate import Accelerator

    acc = Accelerator()
    model, ds = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(
        model, opt, torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False, drop_last=True)
    )
    batches = _cycle(loader)

    def step():
        x, y = next(batches)
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


STEPPERS = {"hand": stepper_hand, "aios": stepper_aios, "accelerate": stepper_accelerate}


def duel(names: list[str], steps: int, block: int) -> dict:
    """All contestants in this one process; blocks of ``block`` steps alternate between them so
    that machine load hits each alike. Returns per-block ms/step for each."""
    import torch_xla.core.xla_model as xm

    fns = {n: STEPPERS[n]() for n in names}
    for fn in fns.values():  # warm-up: compile (cache hits for all but the first) and settle
        for _ in range(5):
            fn()
    xm.wait_device_ops()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(max(1, steps // block)):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            for _ in range(block):
                fns[n]()
            xm.wait_device_ops()
            times[n].append((time.perf_counter() - t0) / block * 1000)
    return times


def have_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


def _env() -> dict:
    return {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "AIOS_XLA__ALLOW_CPU": "1",
        "AIOS_TEST_DMI_PRODUCT": "/nonexistent",
    }


def run_child(args: list[str]) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=_env(), timeout=1800
    )
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--block", type=int, default=5, help="steps per timing block in the duel")
    ap.add_argument("--worker", choices=list(WORKERS))
    ap.add_argument("--duel", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a.steps)))
        return 0
    if a.duel:
        print(json.dumps(duel(a.duel.split(","), a.steps, a.block)))
        return 0
    names = ["hand", "aios"] + (["accelerate"] if have_accelerate() else [])
    print(f"phase 1: compilations, each contestant in a fresh process, {a.steps} steps", flush=True)
    fresh = {n: run_child(["--worker", n, "--steps", str(a.steps)]) for n in names}
    for n, r in fresh.items():
        print(
            f"  {n:10s} "
            + (
                r.get("error")
                or f"compiles {r['compiles']} (after warm-up {r['compiles_after_warmup']}), "
                f"final loss {r['final_loss']:.4f}"
            ),
            flush=True,
        )
    print(
        f"phase 2: step time, all contestants in one process, alternating blocks of {a.block} "
        f"steps, {a.steps} steps each",
        flush=True,
    )
    times = run_child(
        [
            "--duel",
            ",".join(n for n in names if "error" not in fresh[n]),
            "--steps",
            str(a.steps),
            "--block",
            str(a.block),
        ]
    )
    if "error" in times:
        print(f"  duel failed: {times['error']}")
        return 1

    def fast(t: list[float]) -> float:  # mean of the fastest quarter: least disturbed by other load
        k = max(1, len(t) // 4)
        return statistics.fmean(sorted(t)[:k])

    med = {n: statistics.median(t) for n, t in times.items()}
    fastq = {n: fast(t) for n, t in times.items()}
    paired = {
        n: statistics.median(x / h for x, h in zip(t, times["hand"], strict=False))
        for n, t in times.items()
    }
    ratio_fast = {n: fastq[n] / fastq["hand"] for n in times}
    hand, ours = fresh["hand"], fresh["aios"]
    ratio = ratio_fast["aios"]
    checks = {
        "same uncached compilations as hand": ours["compiles"] == hand["compiles"],
        "zero recompiles after warm-up": ours["compiles_after_warmup"] == 0,
        "step time <= 1.03x hand": ratio <= 1.03,
        "same final loss as hand (1e-4)": abs(ours["final_loss"] - hand["final_loss"])
        <= 1e-4 * max(1.0, abs(hand["final_loss"])),
    }
    print(
        f"\nXLA:CPU, {a.steps} steps, batch {BATCH}, {N_SAMPLES} samples per epoch (short "
        f"last batch of {N_SAMPLES % BATCH})"
    )
    print(
        f"{'':12s}{'fast ms':>9s}{'ratio':>8s}{'median ms':>11s}{'ratio':>8s}"
        f"{'compiles':>10s}{'after warm-up':>15s}{'final loss':>12s}"
    )
    for n in times:
        f = fresh[n]
        print(
            f"{n:12s}{fastq[n]:9.2f}{ratio_fast[n]:8.3f}{med[n]:11.2f}{paired[n]:8.3f}{f['compiles']:10d}{f['compiles_after_warmup']:15d}{f['final_loss']:12.4f}"
        )
    print(
        "(fast: mean ms/step of the fastest quarter of blocks, the budget's figure; median: "
        "median block, ratio = median of block-by-block ratios)"
    )
    for k, v in checks.items():
        print(f"{'PASS' if v else 'FAIL'}  aios: {k}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "fresh": fresh,
                    "block_ms": times,
                    "fast_ms": fastq,
                    "ratio_fast": ratio_fast,
                    "median_ms": med,
                    "ratio_median_paired": paired,
                    "checks": checks,
                },
                fh,
                indent=2,
            )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
