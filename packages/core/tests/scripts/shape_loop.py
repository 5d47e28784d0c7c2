"""The 960-sample loop of issue 26, run under ``aios-run``: ``global_batch=48 micro_batch=8``,
one epoch (20 optimizer steps). Every step, rank 0 gathers the sample ids each data-parallel
rank trained on into a registered list (saved in every checkpoint), and logs the mean loss of
the step's 48 samples to ``LOSS_FILE``. At the end rank 0 writes ``{"ids": [...], "steps": N}``
to the path given as argv[1].

``STOP_AT=N``: rank 0 sends SIGTERM to aios-run after step N (a preemption notice) and slows
down until the notice stops the run. ``DATA=iterable``: an iterable dataset that keeps its own
global position (``state_dict()``/``load_state_dict()``) instead of a map-style one.
"""

import json
import os
import signal
import sys
import time

import aios
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

N = 960
_g = torch.Generator().manual_seed(1234)
X = torch.randn(N, 8, generator=_g)
Y = X @ torch.randn(8, 1, generator=_g) + 0.1 * torch.randn(N, 1, generator=_g)


class Samples(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return i, X[i], Y[i]


class Stream(IterableDataset):
    """Ids 0..N-1 in order, rank r of W taking every W-th from the global position ``pos``
    (samples all ranks have consumed together): its state is global, so it resumes at any W."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.pos = rank, world, 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = int(state["pos"])

    def __iter__(self):
        start = self.pos
        for i in range(start + self.rank, N, self.world):
            self.pos = i - self.rank + self.world  # every rank has taken its sample of this row
            yield i, X[i], Y[i]
        self.pos = 0  # the epoch is over


rt = aios.init()
data_rank, data_world = rt.strategy.data_rank, rt.strategy.data_world  # (xla: methods)
data_rank = int(data_rank() if callable(data_rank) else data_rank)
data_world = int(data_world() if callable(data_world) else data_world)
if os.environ.get("DATA") == "iterable":
    loader = DataLoader(Stream(data_rank, data_world), batch_size=rt.config.micro_batch)
else:
    loader = DataLoader(Samples(), batch_size=rt.config.micro_batch, shuffle=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if rt.config.strategy == "tp":
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    model, opt, loader = rt.setup(model, opt, loader, tp_plan=plan)
else:
    model, opt, loader = rt.setup(model, opt, loader)
print(f"model built on rank {rt.rank}", flush=True)
seen = rt.register("seen", [])
if os.environ.get("EVAL"):  # evaluation only: a checkpoint of any shape, its loss over all data
    rt.load(os.environ["EVAL"])
    with torch.no_grad():
        out = model(X)
        out = out.full_tensor() if hasattr(out, "full_tensor") else out
        print(f"eval loss {torch.nn.functional.mse_loss(out, Y).item():.10f}", flush=True)
    rt.close()
    sys.exit(0)
rt.resume()
stop_at = int(os.environ.get("STOP_AT", "0"))
loss_file = os.environ.get("LOSS_FILE")
mine: list[int] = []
losses: list[float] = []
for ids, x, y in loader:
    with rt.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        rt.backward(loss)
    mine += [int(i) for i in ids]
    value = loss.detach()
    losses.append(float(value.full_tensor() if hasattr(value, "full_tensor") else value))
    if rt.step(opt):
        step_ids = rt.gather_object((data_rank, mine))
        mean = rt.all_reduce(sum(losses) / len(losses)).item()
        mine, losses = [], []
        if rt.is_main:
            for got in dict(step_ids).values():  # one entry per data-parallel rank
                seen.extend(got)
            if loss_file:
                with open(loss_file, "a") as f:
                    f.write(json.dumps({"step": rt.global_step, "loss": mean}) + "\n")
            if stop_at and rt.global_step == stop_at:
                os.kill(int(os.environ["AIOS_RUN_LAUNCHER_PID"]), signal.SIGTERM)
            if stop_at and rt.global_step >= stop_at:
                time.sleep(0.3)  # until the notice reaches every rank
if rt.is_main:
    with open(sys.argv[1], "w") as f:
        json.dump({"ids": seen, "steps": rt.global_step}, f)
rt.close()
