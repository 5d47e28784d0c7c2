"""The training script of the notice acceptance test (tests/test_notice_sources.py): a tiny MLP
with dropout, AdamW and a step LR schedule on shuffled data, written the way the README ports a
script (``aios.init``, ``rt.setup``, ``rt.resume``, ``rt.step``).

``TOTAL_STEPS`` optimizer steps; rank 0 writes the step it reached to ``PROGRESS_FILE``, a line
``STEP SHA256`` of the parameters after every step to ``DIGEST_FILE`` and the final parameters
to argv[1]. ``HOLD_AT``: at that step each rank waits (at most
``HOLD_SECONDS``) until its own notice has arrived (``rt.should_stop``), so that the step at
which the run stops does not depend on the machine's speed; the next step boundary acts."""

import hashlib
import os
import sys
import time

import aios
import torch

steps = int(os.environ.get("TOTAL_STEPS", "8"))
hold_at = int(os.environ.get("HOLD_AT", "0"))
hold_s = float(os.environ.get("HOLD_SECONDS", "120"))
progress = os.environ.get("PROGRESS_FILE")
digests = os.environ.get("DIGEST_FILE")

rt = aios.init()
g = torch.Generator().manual_seed(1234)
x = torch.randn(128, 8, generator=g)
y = (x.sum(1, keepdim=True) > 0).float()
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=True
)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
model, opt, sched, loader = rt.setup(model, opt, sched, loader)
rt.resume()
while rt.global_step < steps:
    for xb, yb in loader:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
        rt.backward(loss)
        rt.step(opt)
        sched.step()
        if progress and rt.is_main:
            with open(progress + ".tmp", "w") as f:
                f.write(str(rt.global_step))
            os.replace(progress + ".tmp", progress)
        if digests and rt.is_main:
            h = hashlib.sha256()
            for v in rt.unwrap(model).state_dict().values():
                h.update(v.detach().contiguous().numpy().tobytes())
            with open(digests, "a") as f:
                f.write(f"{rt.global_step} {h.hexdigest()}\n")
        if rt.global_step == hold_at:
            end = time.monotonic() + hold_s
            while not rt.should_stop and time.monotonic() < end:
                time.sleep(0.01)
        if rt.global_step >= steps:
            break
if rt.is_main:
    torch.save({k: v.clone() for k, v in rt.unwrap(model).state_dict().items()}, sys.argv[1])
rt.close()
