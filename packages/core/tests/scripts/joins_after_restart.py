"""A plain torchrun-style script (no aios.init) that joins the launcher's process group
correctly: rank 1 fails in the first attempt, every rank trains in the second."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and dist.get_rank() == 1:
    raise SystemExit(3)
for _ in range(3):  # a few steps long enough to be seen running (monitor interval 0.5 s)
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.5)
print("sum", t.item(), flush=True)
dist.destroy_process_group()
