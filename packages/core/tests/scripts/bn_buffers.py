"""BatchNorm under a sharded strategy with different data on every rank: trains STEPS steps
(resuming from ``checkpoint.dir`` when there is a checkpoint), saves, and writes every rank's
running statistics to ``<OUT>/<phase>-rank<r>.pt``."""

import sys

import aios
import torch

out, phase, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
rt.resume()
data = torch.Generator().manual_seed(100 + rt.rank)  # every rank sees its own data
while rt.global_step < steps:
    x = torch.randn(16, 4, generator=data) * (1 + rt.rank) + 3 * rt.rank
    rt.backward(model(x).pow(2).mean())
    rt.step(opt)
    rt.save()
bn = rt.unwrap(model)[1]
stats = {k: v.detach().clone() for k, v in bn.named_buffers()}
torch.save(stats, f"{out}/{phase}-rank{rt.rank}.pt")
rt.close()
