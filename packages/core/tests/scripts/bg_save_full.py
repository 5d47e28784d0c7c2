"""Run under aios-run --nprocs 2 strategy=fsdp checkpoint.dir=<a small disk>: background (dcp)
saves every step of a model whose shards do not fit: the background write fails with ENOSPC."""

import aios
import torch

rt = aios.init(defaults={"checkpoint": {"every": 1}})
model = torch.nn.Sequential(torch.nn.Linear(400, 400), torch.nn.Linear(400, 400))
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
for i in range(3):
    rt.backward(model(torch.ones(2, 400)).sum())
    rt.step(opt)
    rt.print(f"step {i}")
rt.close()
