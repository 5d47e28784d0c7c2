"""Async sharded checkpoint budget: a training step while a ``dcp`` checkpoint is being written
in the background costs <= 1.15x a normal step.

FSDP2 (``fully_shard``) MLP over gloo with ``--world`` processes on this machine; each rank
measures its step times with no save in flight (baseline), then during background saves
(``aios.checkpoint.formats.dcp.DcpCheckpointer.save(async_save=True)``: staged to CPU, written in the background
by each writer in ``--modes``), and the time of a synchronous save for comparison. Rank 0 prints medians side by side.

    python bench/bench_async_ckpt.py [--world 2] [--hidden 1024] [--layers 6] [--saves 3]
        [--modes thread,process] [--dir DIR]

Modes: ``thread`` (DCP's writer thread inside each training process) and ``process`` (aios's
default: the state staged once into shared memory, written by DCP's checkpoint process, which
runs only on CPU time training leaves idle, SCHED_IDLE, and at the lowest best-effort I/O
priority). ``--world 1`` leaves a core free on a 2-core machine and isolates the
writer's own cost on the training process (GIL, copies) from plain CPU contention.
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
    from aios.checkpoint.formats.dcp import DcpCheckpointer, rng_state
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

    for _ in range(5):
        step()
    base = [step() for _ in range(args.steps)]
    results: dict[str, dict[str, list[float]]] = {}
    for mode in args.modes.split(","):
        ck = DcpCheckpointer(os.path.join(ckpt, mode), keep=2, async_mode=mode)
        # warm the save path (groups, plans; the checkpoint process of "process" mode)
        ck.save(0, [model], [opt], {"step": 0}, {"rng": rng_state()}, async_save=True)
        ck.wait()
        r = results[mode] = {"in_flight": [], "after": [], "blocking": [], "write": []}
        for i in range(args.saves):
            t0 = time.perf_counter()
            handle = ck.save(
                i + 1, [model], [opt], {"step": i + 1}, {"rng": rng_state()}, async_save=True
            )
            r["blocking"].append(time.perf_counter() - t0)
            for _ in range(args.steps):
                busy = not handle.done()
                dt = step()
                (r["in_flight"] if busy else r["after"]).append(dt)
            ck.wait()
            if handle.finished is not None:
                r["write"].append(handle.finished - handle.started)
        base += [step() for _ in range(args.steps // 2)]  # the baseline under the same load
    dist.barrier()
    ck = DcpCheckpointer(os.path.join(ckpt, "sync"), keep=2)
    t0 = time.perf_counter()
    ck.save(100, [model], [opt], {"step": 100}, {"rng": rng_state()})
    sync_s = time.perf_counter() - t0
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        size = sum(
            os.path.getsize(os.path.join(r, f))
            for r, _, fs in os.walk(os.path.join(ckpt, "sync"))
            for f in fs
            if "ckpt-000000100" in r
        )
        med = statistics.median(base)
        print(
            f"async dcp checkpoint bench: FSDP2 over gloo, world {args.world}, "
            f"{n_params / 1e6:.1f}M params, checkpoint {size / 2**20:.0f} MiB, "
            f"{args.threads} thread(s)/rank"
        )
        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
            f"(ranks + writer vs cores: the write overlaps for free only with a spare core)"
        )
        print(f"{'':40s}{'median step':>14s}{'ratio':>9s}{'steps':>8s}")

        def row(label: str, seconds: float, tail: str) -> None:
            print(f"{label:40s}{seconds * 1e3:11.1f} ms{seconds / med:8.2f}x{tail}")

        row("normal step (no save in flight)", med, f"{len(base):8d}")
        for mode, r in results.items():
            label = f"in flight, {mode} writer"
            if r["in_flight"]:
                m = statistics.median(r["in_flight"])
                row(label, m, f"{len(r['in_flight']):8d}")
            else:
                print(f"{label:40s}{'(each save finished before the next step)':>40s}")
            b = statistics.median(r["blocking"])
            row("  blocking part of save(), " + mode, b, " (in steps)")
            if r["write"]:
                w = statistics.median(r["write"])
                row("  save start to commit, " + mode, w, " (in steps)")
        row("synchronous save", sync_s, " (in steps)")
        for mode, r in results.items():
            if r["in_flight"]:
                ratio = statistics.median(r["in_flight"]) / med
                verdict = f"{'met' if ratio <= 1.15 else 'NOT met'} ({ratio:.2f}x)"
                print(f"target ({mode} writer): in-flight step <= 1.15x normal: {verdict}")
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
        "--modes",
        default="thread,process",
        help="background writers to compare (aios.checkpoint.formats.dcp_process.ASYNC_MODES), comma-separated",
    )
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
