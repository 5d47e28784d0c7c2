"""Async sharded checkpoint budget: a training step while a ``dcp`` checkpoint is being written
in the background costs <= 1.15x a normal step.

FSDP2 (``fully_shard``) MLP over gloo with ``--world`` processes on this machine; each rank
measures its step times with no save in flight (baseline), then during background saves
(``aios.dcp.DcpCheckpointer.save(async_save=True)``: staged to CPU, written by a thread), and
the time of a synchronous save for comparison. Rank 0 prints medians side by side.

    python bench/bench_async_ckpt.py [--world 2] [--hidden 1024] [--layers 6] [--saves 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, args: argparse.Namespace, port: int, ckpt: str) -> None:
    import torch
    import torch.distributed as dist
    from aios.dcp import DcpCheckpointer, rng_state
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.hidden)

    def step() -> float:
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    ck = DcpCheckpointer(ckpt, keep=2)
    for _ in range(5):
        step()
    ck.save(
        0, [model], [opt], {"step": 0}, {"rng": rng_state()}
    )  # warm the save path (groups, plans)
    base = [step() for _ in range(args.steps)]
    in_flight: list[float] = []
    after: list[float] = []
    staging: list[float] = []
    for i in range(args.saves):
        t0 = time.perf_counter()
        handle = ck.save(
            i + 1, [model], [opt], {"step": i + 1}, {"rng": rng_state()}, async_save=True
        )
        staging.append(time.perf_counter() - t0)
        for _ in range(args.steps):
            busy = not handle.done()
            dt = step()
            (in_flight if busy else after).append(dt)
        ck.wait()
    dist.barrier()
    t0 = time.perf_counter()
    ck.save(100, [model], [opt], {"step": 100}, {"rng": rng_state()})
    sync_s = time.perf_counter() - t0
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        size = sum(
            os.path.getsize(os.path.join(r, f))
            for r, _, fs in os.walk(ckpt)
            for f in fs
            if "ckpt-000000100" in r
        )
        med = statistics.median(base)
        print(
            f"async dcp checkpoint bench: FSDP2 over gloo, world {args.world}, "
            f"{n_params / 1e6:.1f}M params, checkpoint {size / 2**20:.0f} MiB, {args.threads} "
            "thread(s)/rank"
        )
        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (the "
            "background write needs a spare core to overlap for free)"
        )
        print(f"{'':34s}{'median step':>14s}{'ratio':>9s}{'steps':>8s}")
        print(
            f"{'normal step (no save in flight)':34s}{med * 1e3:11.1f} ms{1.0:8.2f}x{len(base):8d}"
        )
        if in_flight:
            m = statistics.median(in_flight)
            print(
                f"{'step while a save is in flight':34s}{m * 1e3:11.1f} ms{m / med:8.2f}x{len(in_flight):8d}"
            )
        else:
            print(
                f"{'step while a save is in flight':34s}{'(each save finished before the next step)':>40s}"
            )
        print(
            f"{'blocking part of an async save':34s}{statistics.median(staging) * 1e3:11.1f} "
            f"ms{statistics.median(staging) / med:8.2f}x (in steps)"
        )
        print(f"{'synchronous save':34s}{sync_s * 1e3:11.1f} ms{sync_s / med:8.2f}x (in steps)")
        if in_flight:
            ratio = statistics.median(in_flight) / med
            print(
                f"target: in-flight step <= 1.15x normal: {'met' if ratio <= 1.15 else 'NOT met'} ({ratio:.2f}x)"
            )
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--steps", type=int, default=20, help="steps measured per phase (and after each save)"
    )
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument(
        "--dir", default=None, help="checkpoint dir or URL (default: a temporary directory)"
    )
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="aios-bench-ckpt-") as tmp:
        mp.spawn(worker, args=(args, _free_port(), args.dir or tmp), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
