"""Training script for the runtime-level dcp tests (tests/test_dcp_runtime.py): a tiny MLP under
``strategy=fsdp`` (FSDP2), AdamW, an LR scheduler, a shuffled sharded loader whose per-rank batch
is GLOBAL_BATCH / world size (the same global batch on any world size), checkpoints through
rt.step (checkpoint.every) and rt.resume(). Writes its progress (global step) to PROGRESS_FILE,
every step's global mean loss to LOSS_FILE (rank 0, one JSON line per step), each rank's pid to
PID_DIR/rank<r>.pid (and its command line beside its DCP checkpoint process's, once that runs,
to PID_DIR/ckproc<r>), and its final full parameters to argv[1] (rank 0).
"""

from __future__ import annotations

import json
import os
import sys
import time

import aios
import torch

steps = int(os.environ.get("TOTAL_STEPS", "12"))
delay = float(os.environ.get("STEP_DELAY", "0"))
global_batch = int(os.environ.get("GLOBAL_BATCH", "16"))
progress_file = os.environ.get("PROGRESS_FILE")
loss_file = os.environ.get("LOSS_FILE")
dropout = float(os.environ.get("DROPOUT", "0"))
reshard = os.environ.get("RESHARD", "0") == "1"
out_file = sys.argv[1]


rt = aios.init()
world = rt.world_size
pid_dir = os.environ.get("PID_DIR")
if pid_dir:
    with open(os.path.join(pid_dir, f"rank{rt.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))


def record_checkpoint_process() -> bool:
    """Write the command line of this rank's DCP checkpoint process, once it runs."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = ape._CHECKPOINT_PROCESS
    if proc is None:
        return False
    cmds = {}
    for name, pid in (("rank", os.getpid()), ("process", proc._save_process.pid)):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmds[name] = f.read().replace(b"\0", b" ").decode()
    with open(os.path.join(str(pid_dir), f"ckproc{rt.rank}"), "w") as f:
        json.dump(cmds, f)
    return True


recorded = not pid_dir
g = torch.Generator().manual_seed(1234)
x = torch.randn(512, 8, generator=g)
y = torch.sin(x.sum(1, keepdim=True))
ds = torch.utils.data.TensorDataset(x, y)
loader = torch.utils.data.DataLoader(
    ds, batch_size=global_batch // world, shuffle=True, drop_last=True
)
layers: list[torch.nn.Module] = [torch.nn.Linear(8, 32), torch.nn.Tanh()]
if dropout:
    layers.append(torch.nn.Dropout(dropout))
layers += [torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)]
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.9)
model, opt, sched, loader = rt.setup(model, opt, sched, loader)
rt.resume(reshard=reshard)
while rt.global_step < steps:
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        rt.backward(loss)
        if rt.step(opt):
            sched.step()
            mean = rt.all_reduce(loss.detach(), "mean").item()
            if rt.is_main:
                if loss_file:
                    with open(loss_file, "a") as f:
                        f.write(json.dumps({"step": rt.global_step, "loss": mean}) + "\n")
                if progress_file:
                    with open(progress_file, "w") as f:
                        f.write(str(rt.global_step))
            if not recorded:
                recorded = record_checkpoint_process()
            if delay:
                time.sleep(delay)
            if rt.global_step >= steps:
                break
full = {}
for k, v in rt.unwrap(model).state_dict().items():
    full[k] = v.full_tensor() if hasattr(v, "full_tensor") else v  # collective for DTensors
if rt.is_main:
    torch.save({k: v.detach().clone() for k, v in full.items()}, out_file)
rt.close()
