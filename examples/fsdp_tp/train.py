"""original.py ported to aios, the README's worked case (run: aios-run --nprocs 4 strategy=fsdp
mesh.tp=2 examples/fsdp_tp/train.py): the mesh is rt.mesh, the script's per-submodule plans go to
rt.setup(tp_plan=...), aios applies FSDP over dp; the loop uses rt.backward / rt.step. With
``--own-plan`` the script applies its plans itself on rt.mesh["tp"] and hands rt.setup the
tensor-parallel model."""

import sys

import aios
import torch
from tiny_llama import Transformer, tp_plans
from torch.distributed.tensor.parallel import parallelize_module

rt = aios.init()
torch.manual_seed(0)
model = Transformer()
root, blocks = tp_plans(model)
if "--own-plan" in sys.argv:
    model = parallelize_module(model, rt.mesh["tp"], root)
    for name, plan in blocks.items():
        parallelize_module(model.get_submodule(name), rt.mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    model, optimizer = rt.setup(model, optimizer)
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    model, optimizer = rt.setup(model, optimizer, tp_plan={**root, **blocks})
for i in range(5):
    torch.manual_seed(i + rt.dp_rank)  # the same batch on the ranks of one tp group
    inp = torch.randint(128, (4, 16))
    output = model(inp)
    loss = output.sum()
    rt.backward(loss)
    rt.step(optimizer)
    rt.print(f"loss {i} {loss.item():.6f}")
rt.close()
