"""A script that parallelizes its model on its own mesh (names of its own, not aios's) and hands
it, its optimizer and its loader to rt.setup with no strategy flag, then reads one epoch.

``2d``: a (replicas, model) mesh, tensor parallel on ``model`` and fully_shard on ``replicas``
(4 processes). ``tp``: tensor parallel over every rank (2 processes). Rank 0 writes, per rank,
the dataset indices it read, its coordinate on the script's mesh and the losses, to OUT."""

import json
import sys

import aios
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

kind, out = sys.argv[1], sys.argv[2]
rt = aios.init()
if kind == "2d":
    mesh = init_device_mesh("cpu", (2, rt.world_size // 2), mesh_dim_names=("replicas", "model"))
    tp_mesh, coord = mesh["model"], mesh.get_coordinate()
else:
    mesh = tp_mesh = init_device_mesh("cpu", (rt.world_size,), mesh_dim_names=("model",))
    coord = mesh.get_coordinate()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
if kind == "2d":
    fully_shard(model, mesh=mesh["replicas"])
data = torch.utils.data.TensorDataset(
    torch.arange(16), torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
)
loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, loader = rt.setup(model, opt, loader)
seen, losses = [], []
for idx, x in loader:
    seen += idx.tolist()
    loss = model(x).pow(2).mean()
    rt.backward(loss)
    rt.step(opt)
    losses.append(
        round(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss), 6)
    )
rows = [None] * rt.world_size
dist.all_gather_object(rows, {"seen": seen, "coord": coord, "losses": losses})
if rt.is_main:
    with open(out, "w") as f:
        json.dump({"rows": rows, "dp": [rt.dp_rank, rt.dp_size]}, f)
rt.close()
