"""A training loop that records which samples it trained on, for the runs that follow capacity
(issue 26): launched by ``aios launch``, stopped on one shape and resumed on another.

``SAMPLES`` samples (default 64), one epoch, shuffled by the DataLoader as a user's script does;
``global_batch``/``micro_batch`` come from aios's config (``--env AIOS_GLOBAL_BATCH=...``). Every
optimizer step rank 0 gathers the sample ids each rank trained on into a registered list, which
every checkpoint keeps, with the number of processes that took each step; at the end rank 0
writes ``{"ids": [...], "steps": N, "world": W, "worlds": {step: processes}}`` to argv[1].

``PAUSE=N:PATH,M:PATH2,...``: at step N, once its checkpoint is committed (``checkpoint.every=1``:
aios saves it at the batch boundary, as the loader hands out the next batch), every rank waits
while PATH exists, so a test changes the hosts at a known step whatever the machine's speed. A
run resumed at step N waits there too while PATH exists; a stop notice (SIGTERM) ends the wait,
as a step ends when the run is stopped.
"""

import json
import os
import sys
import time

import aios
import torch
from torch.utils.data import DataLoader, Dataset

N = int(os.environ.get("SAMPLES", "64"))
_g = torch.Generator().manual_seed(7)
X = torch.randn(N, 4, generator=_g)
Y = X.sum(dim=1, keepdim=True)


class Samples(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return i, X[i], Y[i]


rt = aios.init()
loader = DataLoader(Samples(), batch_size=rt.config.micro_batch, shuffle=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, loader = rt.setup(model, opt, loader)
seen = rt.register("seen", [])
worlds = rt.register("worlds", [])
rt.resume()
pauses = {
    int(step): path
    for step, _, path in (p.partition(":") for p in os.environ.get("PAUSE", "").split(",") if p)
}
mine: list[int] = []
waited = -1
for ids, x, y in loader:
    if waited != rt.global_step:  # the first micro-batch after a step: step N is saved by now
        waited = rt.global_step
        while rt.global_step in pauses and os.path.exists(pauses[rt.global_step]):
            if rt.should_stop:  # stopped (SIGTERM): the step boundary checkpoints and ends it
                break
            time.sleep(0.1)
    with rt.accumulate(model):
        rt.backward(torch.nn.functional.mse_loss(model(x), y))
    mine += [int(i) for i in ids]
    if rt.step(opt):
        got = rt.gather_object(mine)
        mine = []
        if rt.is_main:
            for ranks_ids in got:
                seen.extend(ranks_ids)
            worlds.append([rt.global_step, rt.world_size])
            print(f"samples: step {rt.global_step} on {rt.world_size} processes", flush=True)
if rt.is_main:
    with open(sys.argv[1], "w") as f:
        result = {"ids": seen, "steps": rt.global_step, "world": rt.world_size}
        json.dump({**result, "worlds": {str(s): w for s, w in worlds}}, f)
rt.close()
