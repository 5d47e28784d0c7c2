"""A small deterministic training script run unchanged on every backend by the xla tests.

usage: xla_train_mlp.py OUT.json [--steps N] [--dynamic] [--bs B] [--n N]
Writes per-step losses, the backend and the strategy's metrics to OUT.json.
"""

import argparse
import json

import aios
import torch
from aios.launcher import warm

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--bs", type=int, default=8)
p.add_argument("--n", type=int, default=100)  # not a multiple of bs: a short last batch
p.add_argument("--dynamic", action="store_true", help="vary the sequence length (recompiles)")
a = p.parse_args()

rt = aios.init(defaults={"seed": 0})
g = torch.Generator().manual_seed(1234)
x = torch.randn(a.n, 16, generator=g)
w = torch.randn(16, 1, generator=g)
y = (x @ w).squeeze(-1) + 0.01 * torch.randn(a.n, generator=g)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, y), batch_size=a.bs, shuffle=True
)
model, opt, loader = rt.setup(model, opt, loader)
rt.resume()
losses = []
epoch_batches = []
while rt.global_step < a.steps:
    seen = 0
    for xb, yb in loader:
        if a.dynamic:
            xb = xb[: max(1, xb.shape[0] - rt.global_step % 4)]
            yb = yb[: xb.shape[0]]
        with rt.autocast():
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1).float(), yb)
        rt.backward(loss)
        rt.step(opt)
        losses.append((rt.global_step, loss))
        seen += xb.shape[0]
        if rt.global_step >= a.steps:
            break
    epoch_batches.append(seen)
sharding = None
if rt.backend == "xla":
    import torch_xla

    sharding = torch_xla._XLAC._get_xla_sharding_spec(xb)
out = {
    "warm": warm.is_rank(),  # forked from aios-run's zygote (aios.launcher.warm)
    "sharding": sharding,
    "world_size": rt.world_size,
    "backend": rt.backend,
    "device": str(rt.device),
    "losses": [(s, float(v.item())) for s, v in losses],
    "batch_sizes_seen": epoch_batches,
    "metrics": rt.strategy.metrics(),
    "params": [float(p.detach().float().sum().cpu()) for p in rt.unwrap(model).parameters()],
}
rt.close()
with open(a.out, "w") as f:
    json.dump(out, f, default=str)
