"""A run for the goodput report: logs its loss every step, sleeps STEP_DELAY per step, writes
its step to PROGRESS_FILE; TOTAL_STEPS in all (resumes from checkpoint.dir)."""

import os
import time

import aios
import torch

total = int(os.environ.get("TOTAL_STEPS", "60"))
delay = float(os.environ.get("STEP_DELAY", "0.02"))
progress = os.environ["PROGRESS_FILE"]

rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt = rt.setup(model, opt)
rt.resume()
x, y = torch.randn(64, 8), torch.randn(64, 1)
while rt.global_step < total:
    loss = torch.nn.functional.mse_loss(model(x), y)
    rt.backward(loss)
    rt.step(opt)
    rt.log({"loss": loss.item()})
    with open(progress, "w") as f:
        f.write(str(rt.global_step))
    time.sleep(delay)
rt.close()
