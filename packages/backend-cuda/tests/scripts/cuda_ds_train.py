"""Training script for the DeepSpeed/DDP equivalence and resume tests: a small MLP regression
with AdamW, an LR scheduler, shuffled data, accumulation and clipping, through the aios runtime
API only (the same script runs under strategy ddp and deepspeed). Rank 0 writes a JSON with the
mean loss of every optimizer step, the final parameters' checksum and the backend metrics.

env: TOTAL_STEPS (default 12), STOP_AFTER (save and exit after this many steps in this run)."""

import json
import os
import sys

import aios
import torch

steps = int(os.environ.get("TOTAL_STEPS", "12"))
stop_after = int(os.environ.get("STOP_AFTER", "0"))
out_file = sys.argv[1]

rt = aios.init()
g = torch.Generator().manual_seed(1234)
x = torch.randn(512, 16, generator=g)
w = torch.randn(16, 4, generator=g)
y = torch.tanh(x @ w) + 0.05 * torch.randn(512, 4, generator=g)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=True
)
torch.manual_seed(7)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 64),
    torch.nn.GELU(),
    torch.nn.Linear(64, 64),
    torch.nn.GELU(),
    torch.nn.Linear(64, 4),
)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.8)
model, opt, sched, loader = rt.setup(model, opt, sched, loader)
start = rt.resume()
losses = {}
acc = []
done_here = 0
while rt.global_step < steps:
    for xb, yb in loader:
        with rt.accumulate(model), rt.autocast():
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            rt.backward(loss)
        acc.append(loss.detach())
        if rt.step(opt):
            sched.step()
            mean = rt.all_reduce(torch.stack(acc).mean()).item()
            acc = []
            losses[rt.global_step] = mean
            done_here += 1
            if stop_after and done_here >= stop_after:
                rt.save()
                break
            if rt.global_step >= steps:
                break
    if stop_after and done_here >= stop_after:
        break
if rt.global_step >= steps or stop_after:
    sd = rt.unwrap(model).state_dict()
    checksum = float(sum(v.double().sum() for v in sd.values()))
    if rt.is_main:
        with open(out_file, "w") as f:
            json.dump(
                {
                    "start": start,
                    "losses": losses,
                    "checksum": checksum,
                    "lr": opt.param_groups[0]["lr"],
                    "metrics": rt.strategy.metrics(),
                    "strategy": type(rt.strategy).__name__,
                    "skipped": rt.precision.skipped_steps,
                },
                f,
                default=str,
            )
rt.close()
