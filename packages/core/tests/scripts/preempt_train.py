"""Training script used by the preemption/resume tests: tiny MLP with dropout, Adam, LR
scheduler, shuffled data, gradient accumulation and clipping. Writes its progress (global step)
to PROGRESS_FILE and its final parameters to OUT_FILE (rank 0). ``NUM_WORKERS`` and
``PERSISTENT_WORKERS`` set the loader's worker processes; with ``PGID_DIR`` each rank writes its
process group id there (``<rank>.pgid``)."""

import os
import sys
import time

import aios
import torch

steps = int(os.environ.get("TOTAL_STEPS", "24"))
delay = float(os.environ.get("STEP_DELAY", "0"))
progress_file = os.environ.get("PROGRESS_FILE")
out_file = sys.argv[1]

rt = aios.init()
g = torch.Generator().manual_seed(1234)
x = torch.randn(256, 8, generator=g)
y = (x.sum(1, keepdim=True) > 0).float()
ds = torch.utils.data.TensorDataset(x, y)
workers = int(os.environ.get("NUM_WORKERS", "0"))
loader = torch.utils.data.DataLoader(
    ds,
    batch_size=8,
    shuffle=True,
    drop_last=True,
    num_workers=workers,
    persistent_workers=workers > 0 and os.environ.get("PERSISTENT_WORKERS") == "1",
)
if os.environ.get("PGID_DIR"):
    with open(os.path.join(os.environ["PGID_DIR"], f"{rt.rank}.pgid"), "w") as f:
        f.write(str(os.getpgid(0)))
model = torch.nn.Sequential(
    torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
model, opt, sched, loader = rt.setup(model, opt, sched, loader)
rt.resume()
while rt.global_step < steps:
    for xb, yb in loader:
        with rt.accumulate(model), rt.autocast():
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            rt.backward(loss)
        if rt.step(opt):
            sched.step()
            if progress_file and rt.is_main:
                with open(progress_file, "w") as f:
                    f.write(str(rt.global_step))
            if delay:
                time.sleep(delay)
            if rt.global_step >= steps:
                break
if rt.is_main:
    torch.save({k: v.clone() for k, v in rt.unwrap(model).state_dict().items()}, out_file)
rt.close()
