"""A script that shards its own model with fully_shard on its own mesh, then hands it to
rt.setup: trains STEPS steps (resuming from checkpoint.dir), saves every step, writes the full
parameters (rank 0) to OUT."""

import sys

import aios
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

out, steps = sys.argv[1], int(sys.argv[2])
rt = aios.init()
mesh = init_device_mesh("cpu", (rt.world_size,), mesh_dim_names=("shard",))  # its own mesh
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt = rt.setup(model, opt)
rt.resume()
while rt.global_step < steps:
    g = torch.Generator().manual_seed(1000 * rt.global_step + rt.rank)
    x = torch.randn(16, 8, generator=g)
    rt.backward((model(x) - x.sum(1, keepdim=True)).pow(2).mean())
    rt.step(opt)
    rt.save()
full = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
if rt.is_main:
    torch.save(full, out)
rt.close()
