"""A script's own samplers, as public training code writes them: a train/validation split by
``SubsetRandomSampler`` over one dataset (the pattern of many tutorials), class weights by
``WeightedRandomSampler``, and, with ``RANKED=1``, a sampler class of its own that shards by rank
itself. Run under ``aios-run`` (``rt.setup`` takes the loaders). Each rank writes what it saw to
``<argv[1]>.rank<r>.json``: the ids of each of 2 epochs of the training subset, of one epoch of
the weighted sampler, and its replica group.
"""

import json
import os
import sys

import aios
import torch
from torch.utils.data import (
    DataLoader,
    Sampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

torch.manual_seed(0)
rt = aios.init()
data = TensorDataset(torch.arange(40))
train_ids = list(range(0, 40, 5)) + list(range(1, 40, 5)) + list(range(2, 40, 5))  # 24 of 40
weights = torch.tensor([0.0 if i % 4 == 0 else 1.0 for i in range(40)])  # never the 4th ones


class Ranked(Sampler):
    """A sampler that shards by rank itself (num_replicas, rank), not a DistributedSampler."""

    def __init__(self, n, num_replicas, rank):
        self.n, self.num_replicas, self.rank = n, num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.n, self.num_replicas))


train = DataLoader(data, batch_size=2, sampler=SubsetRandomSampler(train_ids))
weighted = DataLoader(
    data, batch_size=2, sampler=WeightedRandomSampler(weights, num_samples=16, replacement=True)
)
if os.environ.get("RANKED") == "1":
    rt.setup(DataLoader(data, batch_size=2, sampler=Ranked(40, rt.world_size, rt.rank)))
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, train, weighted = rt.setup(model, opt, train, weighted)
epochs = []
for _epoch in range(2):
    seen = []
    for (x,) in train:
        seen += x.tolist()
        rt.backward(model(x.float().unsqueeze(1)).sum())
        rt.step()
    epochs.append(seen)
drawn = [i for (x,) in weighted for i in x.tolist()]
with open(f"{sys.argv[1]}.rank{rt.rank}.g{rt.replica_group}.json", "w") as f:
    json.dump({"epochs": epochs, "weighted": drawn, "group": rt.replica_group}, f)
rt.close()
