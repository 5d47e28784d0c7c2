"""A script's own samplers and seed, as public training code writes them (pytorch/examples'
ImageNet script): ``DistributedSampler(shuffle=True)`` with ``set_epoch`` for training, a
``DistributedSampler(shuffle=False, drop_last=True)`` for validation, ``torch.manual_seed(seed)``
before anything else. Run under ``aios-run`` (``rt.setup`` takes the loaders) or, with
``NO_AIOS=1``, under plain ``torchrun``/``python``. Each rank writes what it saw to
``<argv[1]>.rank<r>.json``: the training order of 3 epochs, the validation ids, its first draw.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
torch.manual_seed(seed)  # the script's --seed, set before aios.init() as scripts do
use_aios = os.environ.get("NO_AIOS") != "1"
if use_aios:
    import aios

    rt = aios.init()
    rank, world = rt.rank, rt.world_size
else:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")
first_draw = torch.rand(3).tolist()
train = TensorDataset(torch.arange(40))
val = TensorDataset(torch.arange(17))
train_sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=seed)
val_sampler = DistributedSampler(val, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
train_loader = DataLoader(train, batch_size=4, sampler=train_sampler)
val_loader = DataLoader(val, batch_size=4, sampler=val_sampler)
if use_aios:
    train_loader, val_loader = rt.setup(train_loader, val_loader)
orders = []
for epoch in range(3):
    train_sampler.set_epoch(epoch)
    orders.append([int(i) for (b,) in train_loader for i in b])
val_ids = [int(i) for (b,) in val_loader for i in b]
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
    json.dump({"orders": orders, "val": val_ids, "first_draw": first_draw}, f)
if use_aios:
    rt.close()
elif world > 1:
    dist.destroy_process_group()
