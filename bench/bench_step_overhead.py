"""Per-step overhead of the aios runtime over a hand-written PyTorch loop (tiny CPU model, steps
of about 0.5 ms), interleaved in one process; Accelerate and Lightning Fabric in the same run
when importable (``--extra PATH`` adds a directory holding them to sys.path).

    python bench/bench_step_overhead.py [--rounds 30] [--steps 200] [--extra /work/venvs/bench-extra]

Each round runs every contender for ``--steps`` steps in a shuffled order; the figure is the
median over rounds of the mean step time, and the ratio is against the hand-written loop.
Target: aios <= 1.02x.

The watchdog's progress reporting (:mod:`aios.resilience.watchdog`: two stores into a mapped file per
step) is measured the same way: the aios loop with it (``aios``, as under aios-run) against the
same loop without it (``aios-no-progress``), interleaved, plus the per-step cost of the report
alone (a million calls) as a fraction of the hand-written step. Target: <= 0.5%.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument(
        "--extra", default=os.environ.get("AIOS_BENCH_EXTRA", "/work/venvs/bench-extra")
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.extra and os.path.isdir(args.extra):
        sys.path.append(args.extra)
    os.environ.setdefault("AIOS_LOGGING__TENSORBOARD", "false")
    os.environ.setdefault("AIOS_LOGGING__RUN_DIR", "/tmp/aios-bench-runs")

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    W, B = args.width, args.batch  # noqa: N806 (width W, batch B: the shapes' letters)

    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(W, W), torch.nn.ReLU(), torch.nn.Linear(W, W))
        return m, torch.optim.SGD(m.parameters(), lr=1e-3)

    data = [(torch.randn(B, W), torch.randn(B, W)) for _ in range(16)]

    # -- hand-written
    hm, ho = make()

    def hand(n: int) -> None:
        for i in range(n):
            x, y = data[i & 15]
            loss = F.mse_loss(hm(x), y)
            loss.backward()
            ho.step()
            ho.zero_grad(set_to_none=True)

    contenders = {"torch": hand}

    # -- aios, watched as under aios-run (a status folder: the watchdog's progress file)
    import shutil
    import tempfile

    status_dir = tempfile.mkdtemp(prefix="aios-bench-status-")
    os.environ["AIOS_RUN_STATUS_DIR"] = status_dir
    import aios

    rt = aios.init(seed=0)
    stamp_on, stamp_off = rt._stamp, rt.timer.append
    assert stamp_on is not stamp_off, "the watchdog did not register this process"
    am, ao = make()
    am, ao = rt.setup(am, ao)

    def aios_loop(n: int) -> None:
        for i in range(n):
            x, y = data[i & 15]
            with rt.accumulate(am), rt.autocast():
                loss = F.mse_loss(am(x), y)
                rt.backward(loss)
            rt.step(ao)

    contenders["aios"] = aios_loop

    def aios_no_progress(n: int) -> None:
        rt._stamp = stamp_off
        try:
            aios_loop(n)
        finally:
            rt._stamp = stamp_on

    contenders["aios-no-progress"] = aios_no_progress

    # -- HF Accelerate
    try:
        from accelerate import Accelerator

        acc = Accelerator(cpu=True)
        cm, co = make()
        cm, co = acc.prepare(cm, co)

        def acc_loop(n: int) -> None:
            for i in range(n):
                x, y = data[i & 15]
                with acc.autocast():
                    loss = F.mse_loss(cm(x), y)
                acc.backward(loss)
                co.step()
                co.zero_grad(set_to_none=True)

        contenders["accelerate"] = acc_loop
    except ImportError as exc:
        print(f"(accelerate not measured: {exc})")

    # -- Lightning Fabric
    try:
        from lightning.fabric import Fabric

        fab = Fabric(accelerator="cpu", devices=1)
        fm, fo = make()
        fm, fo = fab.setup(fm, fo)

        def fab_loop(n: int) -> None:
            for i in range(n):
                x, y = data[i & 15]
                with fab.autocast():
                    loss = F.mse_loss(fm(x), y)
                fab.backward(loss)
                fo.step()
                fo.zero_grad(set_to_none=True)

        contenders["fabric"] = fab_loop
    except ImportError as exc:
        print(f"(lightning fabric not measured: {exc})")

    for fn in contenders.values():  # warm up
        fn(50)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    order = list(contenders)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            contenders[name](args.steps)
            times[name].append((time.perf_counter() - t0) / args.steps)
    base = statistics.median(times["torch"])
    result = {}
    print(
        f"step overhead: {W}x{W} MLP, batch {B}, 1 thread, {args.rounds} rounds x {args.steps} steps (interleaved)"
    )
    for name in contenders:
        med = statistics.median(times[name])
        result[name] = {"median_step_ms": med * 1e3, "ratio": med / base}
        print(f"  {name:<17} {med * 1e3:8.4f} ms/step   {med / base:6.3f}x")
    # the paired ratio: per round, aios / torch (robust to drift in machine load)
    paired = statistics.median(a / t for a, t in zip(times["aios"], times["torch"], strict=True))
    print(f"  aios/torch paired-round median ratio: {paired:.3f}x (target <= 1.02x)")
    result["aios_paired_ratio"] = paired
    prog = statistics.median(
        a / b for a, b in zip(times["aios"], times["aios-no-progress"], strict=True)
    )
    print(f"  watchdog progress: aios / aios-no-progress paired-round median ratio: {prog:.4f}x")
    result["progress_paired_ratio"] = prog
    n = 1_000_000
    t0 = time.perf_counter()
    for _ in range(n):
        stamp_off(0.0)
    t1 = time.perf_counter()
    for _ in range(n):
        stamp_on(0.0)
    t2 = time.perf_counter()
    cost = ((t2 - t1) - (t1 - t0)) / n
    print(
        f"  watchdog progress report alone: {cost * 1e9:.0f} ns/step = {100 * cost / base:.3f}% "
        f"of the {base * 1e3:.3f} ms hand-written step (target <= 0.5%)"
    )
    result["progress_ns"] = cost * 1e9
    result["progress_fraction"] = cost / base
    # absolute framework cost per step: the same loops on a 1x1 model (the model's own work is
    # ~0), as a fraction of the tiny model's hand-written step
    import copy

    m1 = torch.nn.Linear(1, 1)
    x1, y1 = torch.randn(1, 1), torch.randn(1, 1)
    hm2 = copy.deepcopy(m1)
    ho2 = torch.optim.SGD(hm2.parameters(), lr=1e-3)
    am2 = rt.setup_module(copy.deepcopy(m1))
    ao2 = rt.setup_optimizer(torch.optim.SGD(am2.parameters(), lr=1e-3))

    def hand1(n: int) -> None:
        for _ in range(n):
            loss = F.mse_loss(hm2(x1), y1)
            loss.backward()
            ho2.step()
            ho2.zero_grad(set_to_none=True)

    def aios1(n: int) -> None:
        for _ in range(n):
            with rt.accumulate(am2), rt.autocast():
                loss = F.mse_loss(am2(x1), y1)
                rt.backward(loss)
            rt.step(ao2)

    diffs = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        hand1(500)
        t1 = time.perf_counter()
        aios1(500)
        t2 = time.perf_counter()
        diffs.append(((t2 - t1) - (t1 - t0)) / 500)
    over = statistics.median(diffs)
    print(
        f"  aios framework cost: {over * 1e6:.2f} us/step = {1 + over / base:.4f}x of the "
        f"{base * 1e3:.3f} ms hand-written step"
    )
    result["aios_overhead_us"] = over * 1e6
    result["aios_overhead_ratio"] = 1 + over / base
    if args.json:
        import json

        print(json.dumps(result))
    rt.close()
    shutil.rmtree(status_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
