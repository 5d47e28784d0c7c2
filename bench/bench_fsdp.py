"""FSDP2 step through aios (``strategy=fsdp``) against the SAME hand-written FSDP2 loop
(``fully_shard`` per block and on the root, forward, backward, step, zero_grad), 2 processes on
CPU over gloo, interleaved in one run.

    python bench/bench_fsdp.py [--rounds 20] [--steps 20] [--nprocs 2]

Run as is, it starts itself under ``aios-run --nprocs N strategy=fsdp fsdp.wrap=[Block]``; both
contenders then share the process group. Each round runs both for ``--steps`` steps in a shuffled
order (the same order on every rank); the figure is the median over rounds of the mean step time,
with the paired per-round ratio aios/hand. Target: <= 1.02x.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nprocs", type=int, default=2)
    return ap.parse_args()


def launch(args: argparse.Namespace) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ, AIOS_LOGGING__TENSORBOARD="false", AIOS_LOGGING__RUN_DIR="/tmp/aios-bench-runs"
    )
    cmd = [
        sys.executable,
        "-c",
        "from aios.cli.run import main; main()",
        "--nprocs",
        str(args.nprocs),
        f"master_port={port}",
        "strategy=fsdp",
        "fsdp.wrap=[Block]",
        "launch.log_prefix=false",
        __file__,
        *sys.argv[1:],
    ]
    raise SystemExit(subprocess.call(cmd, env=env))


def worker(args: argparse.Namespace) -> None:
    import aios
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    W, B = args.width, args.batch  # noqa: N806 (width W, batch B: the shapes' letters)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(W, 2 * W), torch.nn.Linear(2 * W, W)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(x)))

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[Block() for _ in range(args.blocks)])

    rt = aios.init(seed=0)
    assert rt.strategy.name == "fsdp", rt.strategy
    data = [(torch.randn(B, W), torch.randn(B, W)) for _ in range(8)]

    # -- hand-written FSDP2 on the same process group
    hm = make()
    for b in hm:
        fully_shard(b)
    fully_shard(hm)
    ho = torch.optim.AdamW(hm.parameters(), lr=1e-3)

    def hand(n: int) -> None:
        for i in range(n):
            x, y = data[i & 7]
            loss = F.mse_loss(hm(x), y)
            loss.backward()
            ho.step()
            ho.zero_grad(set_to_none=True)

    # -- aios
    am = make()
    ao = torch.optim.AdamW(am.parameters(), lr=1e-3)
    am, ao = rt.setup(am, ao)

    def aios_loop(n: int) -> None:
        for i in range(n):
            x, y = data[i & 7]
            with rt.accumulate(am), rt.autocast():
                loss = F.mse_loss(am(x), y)
                rt.backward(loss)
            rt.step(ao)

    contenders = {"hand": hand, "aios": aios_loop}
    for fn in contenders.values():
        fn(5)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    order = list(contenders)
    rng = random.Random(0)  # same order on every rank: the collectives pair up
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            rt.barrier()
            t0 = time.perf_counter()
            contenders[name](args.steps)
            times[name].append((time.perf_counter() - t0) / args.steps)
    if rt.is_main:
        base = statistics.median(times["hand"])
        print(
            f"fsdp step: {args.blocks} blocks of {W}->{2 * W}->{W}, batch {B}, {rt.world_size} processes over gloo, "
            f"{args.rounds} rounds x {args.steps} steps (interleaved)"
        )
        for name in contenders:
            med = statistics.median(times[name])
            print(f"  {name:<5} {med * 1e3:8.3f} ms/step   {med / base:6.3f}x")
        paired = statistics.median(a / h for a, h in zip(times["aios"], times["hand"], strict=True))
        print(f"  aios/hand paired-round median ratio: {paired:.3f}x (target <= 1.02x)")
    rt.close()


if __name__ == "__main__":
    a = parse()
    if "RANK" not in os.environ:
        launch(a)
    else:
        worker(a)
