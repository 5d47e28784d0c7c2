"""Run under aios-run --nprocs 2: every rank seeds differently before building the model (as
nanoGPT does, ``1337 + rank``); prints the model's output on a fixed input, which must be rank
0's model's under every strategy."""

import aios
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

rt = aios.init()
torch.manual_seed(1337 + rt.rank)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
model = rt.setup(model, tp_plan=plan) if rt.config.strategy == "tp" else rt.setup(model)
with torch.no_grad():
    out = model(torch.linspace(-1, 1, 16).view(2, 8))
out = out.full_tensor() if hasattr(out, "full_tensor") else out
print(f"probe {rt.config.strategy}: {out.double().square().sum().item():.8f}")
rt.close()
