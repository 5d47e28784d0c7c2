"""Run under aios-run --nprocs 2: checks the DDP strategy's collectives, sharding and wrapper,
printing one line per check that passes (the test asserts on them)."""

import sys

import aios
import torch

rt = aios.init(seed=0)
r, w = rt.rank, rt.world_size
assert w == 2, w
print(f"ok identity rank={r} local={rt.local_rank} world={w} main={rt.is_main} device={rt.device}")

t = torch.tensor([float(r + 1)])
assert rt.all_reduce(t, "sum").item() == 3.0 and t.item() == r + 1  # input untouched
assert rt.all_reduce(t, "mean").item() == 1.5
assert rt.all_reduce(t, "max").item() == 2.0 and rt.all_reduce(t, "min").item() == 1.0
assert rt.all_reduce(2.5, "sum").item() == 5.0
print("ok all_reduce")
g = rt.all_gather(torch.tensor([r, 10 * r]))
assert g.tolist() == [[0, 0], [1, 10]], g
print("ok all_gather")
assert rt.broadcast({"from": r}) == {"from": 0}
assert rt.gather_object(r * 3) == [0, 3]
print("ok objects")
assert rt.strategy.any_rank(r == 1) is True and rt.strategy.any_rank(False) is False
print("ok any_rank")
rt.barrier()

ds = torch.utils.data.TensorDataset(torch.arange(40).float().unsqueeze(1))
loader = rt.setup(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, drop_last=True))
seen = [int(v) for (b,) in loader for v in b.flatten().tolist()]
assert len(loader) == 5 and len(seen) == 20
allseen = rt.gather_object(seen)
assert sorted(allseen[0] + allseen[1]) == list(range(40)), allseen  # disjoint, complete shards
epoch1 = [int(v) for (b,) in loader for v in b.flatten().tolist()]
assert epoch1 != seen and sorted(epoch1) != sorted(seen) or epoch1 != seen  # new epoch, new order
print("ok sharding")

model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
model, opt = rt.setup(model, opt)
assert type(model).__name__ == "AiosDDP" and model.in_features == 3  # attribute forwarding
x = torch.full((2, 3), float(r + 1))
rt.backward(model(x).sum())
grads = rt.all_gather(model.module.weight.grad.flatten())
assert torch.equal(grads[0], grads[1]) and torch.allclose(
    grads[0], torch.full((3,), 3.0)
)  # averaged: (2+4)/2
rt.step(opt)
ws = rt.all_gather(model.module.weight.detach().flatten())
assert torch.equal(ws[0], ws[1])
print("ok ddp")

# accumulation: no_sync on the first micro-step -> local grads differ; the last syncs
rt.close()
rt = aios.init(grad_accum=2, seed=0)
model = torch.nn.Linear(3, 1, bias=False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
with rt.accumulate(model):
    rt.backward(model(torch.full((1, 3), float(r + 1))).sum())
g1 = rt.all_gather(model.module.weight.grad.flatten().clone())
assert not torch.equal(g1[0], g1[1]), g1  # not synchronised yet
assert rt.step(opt) is False
with rt.accumulate(model):
    rt.backward(model(torch.full((1, 3), float(r + 1))).sum())
g2 = rt.all_gather(model.module.weight.grad.flatten().clone())
assert torch.equal(g2[0], g2[1]), g2
assert rt.step(opt) is True
print("ok no_sync")
rt.close()
sys.exit(0)
