"""The shape of pytorch/examples' ``distributed/tensor_parallelism/fsdp_tp_example.py`` (BSD-3-Clause,
Copyright (c) Meta Platforms, Inc.), rewritten for CPU/gloo and the tiny model: its own 2-D mesh
(dp x tp), its per-submodule plans with parallelize_module, fully_shard over dp, AdamW, inputs
seeded by the dp rank, ``output.sum()`` as the loss. Run with torchrun (torchrun --standalone
--nproc-per-node 4 examples/fsdp_tp/original.py); prints one loss per line."""

import sys

import torch
import torch.distributed as dist
from tiny_llama import Transformer, tp_plans
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

tp_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2  # the example's tp size
dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
dp_rank = dp_mesh.get_local_rank()

torch.manual_seed(0)
model = Transformer()
root, blocks = tp_plans(model)
model = parallelize_module(model, tp_mesh, root)
for name, plan in blocks.items():
    parallelize_module(model.get_submodule(name), tp_mesh, plan)
model = fully_shard(model, mesh=dp_mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
for i in range(5):
    torch.manual_seed(i + dp_rank)  # the same batch on the ranks of one tp group
    inp = torch.randint(128, (4, 16))
    output = model(inp)
    loss = output.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"loss {i} {loss.item():.6f}", flush=True)
dist.destroy_process_group()
