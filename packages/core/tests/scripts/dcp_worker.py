"""One rank of a hand-written FSDP2 training run (gloo, CPU) checkpointing with aios.checkpoint.formats.dcp.

Launched once per rank by tests/test_dcp.py with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set;
argv[1] is a JSON job:

    ckpt      checkpoint dir (path or URL)         steps   train until this global step
    save_at   steps after which to save            async   save with async_save=True
    resume    resume from the newest complete one  out     directory for per-rank results
    gate      "overlap": each rank's shard write waits until the step after the save finished
              "die":     rank 1 exits inside its shard write of the save at step ``die_at``
              "signals": the checkpoint process gets SIGTERM/SIGINT/SIGHUP inside its write
    async_mode      "process" (default) or "thread"
    kill_writer_at  SIGKILL this rank's checkpoint process before this step's save
    die_hard        SIGKILL this rank after its last save (its checkpoint process must follow)
    standby         fork the checkpoint process before the process group, as aios.init does
                    on CPU (aios.checkpoint.formats.dcp_process.fork_standby), instead of spawning

Global batch 16 of a fixed dataset; rank r of W takes the DistributedSampler-style interleaved
slice (positions r, r+W, ...), so the global batch is the same samples on any world size. Each
step every rank also draws from torch's and Python's RNG (recorded, not used in the math) to
check per-rank RNG restoration.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from aios.checkpoint.formats import dcp as adcp
from aios.data.loaders import reshard_loader_state
from aios.data.rng import reseed
from torch.distributed.fsdp import fully_shard

GLOBAL_BATCH = 16
N_SAMPLES = 512


class Position:
    """A loader position like aios.data.loaders.DeviceLoader's: (epoch, batches of this rank)."""

    def __init__(self, batch_size: int) -> None:
        self.epoch, self.batch, self.batch_size = 0, 0, batch_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "batch_size": self.batch_size}


def main() -> None:
    job = json.loads(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    standby_pid = None
    if job.get("standby"):
        from aios.checkpoint.formats import dcp_process

        assert dcp_process.fork_standby(), "no standby: this process already runs threads"
        assert dcp_process._STANDBY is not None
        standby_pid = dcp_process._STANDBY.process.pid
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.97**s)
    g = torch.Generator().manual_seed(1234)
    X = torch.randn(N_SAMPLES, 8, generator=g)
    Y = torch.sin(X.sum(1, keepdim=True))
    per_rank = GLOBAL_BATCH // world
    pos = Position(per_rank)
    random.seed(100 + rank)
    torch.manual_seed(200 + rank)  # per-rank RNG streams (as a per-rank dropout seed would be)

    gate_open = os.path.join(job["out"], f"gate-open-{rank}")
    saving = [0]
    if job.get("gate"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from dcp_gate import GatedWriter

        def gated_writer(url: str):  # type: ignore[no-untyped-def]
            w = GatedWriter(url, sync_files=True, single_file_per_rank=True, overwrite=True)
            return w.configure(job, rank, saving[0])

        adcp._make_writer = gated_writer

    ck = adcp.DcpCheckpointer(
        job["ckpt"], keep=job.get("keep", 3), async_mode=job.get("async_mode", "process")
    )
    step = 0
    message = ""
    if job.get("resume"):
        info = ck.store.latest()
        assert info is not None, "no checkpoint to resume"
        common, states, saved_world = ck.load(info, [model], [opt])
        sched.load_state_dict(common["sched"])
        step = int(common["step"])
        mine = adcp.rank_state_for(rank, states)
        if mine is not None:
            adcp.set_rng_state(mine["rng"])
            loader = mine["loaders"][0]
        else:
            reseed(0, step, rank)
            loader = common["loader0"]
        st = reshard_loader_state(loader, saved_world, world, loader.get("batch_size"), per_rank)
        pos.epoch, pos.batch = st["epoch"], st["batch"]
        message = f"resumed from step {step}: saved by {saved_world} ranks, loaded on {world} ranks"
        if rank == 0:
            print(message, flush=True)

    losses: dict[int, float] = {}
    draws: dict[int, list[float]] = {}
    step_s: dict[int, float] = {}
    overlap: dict[str, object] = {}
    handle = None
    while step < job["steps"]:
        t0 = time.perf_counter()
        start = (pos.batch * per_rank * world) % N_SAMPLES
        idx = torch.arange(start + rank, start + GLOBAL_BATCH, world)
        loss = torch.nn.functional.mse_loss(model(X[idx]), Y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        pos.batch += 1
        step += 1
        draws[step] = [torch.rand(1).item(), random.random()]
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses[step] = mean.item() / world
        step_s[step] = time.perf_counter() - t0
        if handle is not None and "in_flight_after_next_step" not in overlap:
            overlap["in_flight_after_next_step"] = not handle.done()
            overlap["next_step_s"] = step_s[step]
            open(gate_open, "w").close()
        if step == job.get("kill_writer_at"):
            # the checkpoint process dies between saves (OOM killer, an operator): the next
            # save must still be written
            from torch.distributed.checkpoint import _async_process_executor as ape

            ck.wait()
            proc = ape._CHECKPOINT_PROCESS._save_process
            os.kill(proc.pid, 9)
            proc.join(30)
        if step in job.get("save_at", []):
            common = {"step": step, "sched": sched.state_dict(), "loader0": pos.state_dict()}
            per = {"rng": adcp.rng_state(), "loaders": [pos.state_dict()]}
            t_save = time.perf_counter()
            saving[0] = step
            handle = ck.save(
                step,
                [model],
                [opt],
                common,
                per,
                meta={"run": "dcp-test"},
                async_save=bool(job.get("async")),
            )
            overlap.setdefault("save_call_s", time.perf_counter() - t_save)
            if not job.get("async"):
                handle = None
    ck.wait()
    if job.get("die_hard"):  # SIGKILLed with its checkpoint process idle: it must not outlive us
        from torch.distributed.checkpoint import _async_process_executor as ape

        with open(os.path.join(job["out"], f"writer-pid-{rank}"), "w") as f:
            f.write(str(ape._CHECKPOINT_PROCESS._save_process.pid))
        dist.barrier()
        os.kill(os.getpid(), 9)
    overlap["gate_timed_out"] = os.path.exists(os.path.join(job["out"], f"gate-timed-out-{rank}"))
    overlap["rank_pid"] = os.getpid()
    overlap["standby_pid"] = standby_pid
    if job.get("async") and job.get("async_mode", "process") == "process":
        from torch.distributed.checkpoint import _async_process_executor as ape

        if ape._CHECKPOINT_PROCESS is not None:
            overlap["process_pid"] = ape._CHECKPOINT_PROCESS._save_process.pid
    with contextlib.suppress(FileNotFoundError):
        with open(os.path.join(job["out"], f"writer-pid-{rank}")) as f:
            overlap["writer_pid"] = int(f.read())
    with open(os.path.join(job["out"], f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "losses": losses,
                "draws": draws,
                "message": message,
                "overlap": overlap,
                "step_s": step_s,
            },
            f,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
