"""2 ranks: a checkpoint format where every rank writes its own file into the shared staging
directory; rank 0 commits after all are durable; a failure on one rank fails the save on every
rank and leaves nothing behind."""

from __future__ import annotations

import json
import os
import sys

import aios
import torch
from aios.checkpoint.formats.base import CheckpointFormat
from aios.errors import CheckpointError


class PerRank(CheckpointFormat):
    name = "test-per-rank"
    all_ranks_write = True
    fail_on: int | None = None

    def save(self, step, ctx, staging, store):
        rank = int(os.environ["RANK"])
        if self.fail_on == rank:
            raise OSError(28, "No space left on device")
        data = json.dumps(
            {
                "rank": rank,
                "step": step,
                "w": ctx.training.strategy.unwrap(ctx.training.modules[0]).weight.tolist(),
            }
        ).encode()
        name = f"rank{rank}.json"
        return {name: store.write_file(staging, name, lambda f: f.write(data))}

    def load(self, info, store, target, rank=0, strict=True):
        data = json.loads(store.read_file(info, f"rank{rank}.json"))
        assert data["rank"] == rank
        with torch.no_grad():
            target.strategy.unwrap(target.modules[0]).weight.copy_(torch.tensor(data["w"]))
        target.step = data["step"]
        return {}


rt = aios.init(checkpoint={"dir": sys.argv[1]})
# this run's format, set on its manager (a checkpoint is read back by the format that wrote it)
rt.checkpointer.format = fmt = PerRank()
model = rt.setup(torch.nn.Linear(2, 1, bias=False))
inner = rt.unwrap(model)
with torch.no_grad():
    inner.weight.fill_(float(rt.rank + 1))
rt.training.step = 3
path = rt.save()
if rt.is_main:
    marker = json.load(open(os.path.join(path, "aios-checkpoint.json")))
    print(
        "files",
        sorted(marker["files"]),
        "world",
        marker["world_size"],
        "format",
        marker["checkpoint_format"],
        flush=True,
    )
rt.training.step = 4
fmt.fail_on = 1
try:
    rt.save()
    print("no error", flush=True)
except CheckpointError as exc:
    print("save failed:", "\n" not in str(exc), "No space left" in str(exc), flush=True)
fmt.fail_on = None
with torch.no_grad():
    inner.weight.zero_()
rt.training.step = 0
print("resumed", rt.resume(), float(inner.weight.sum()), flush=True)
rt.close()
