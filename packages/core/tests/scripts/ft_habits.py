"""Replica groups with the habits of public training code: gradient accumulation
(``grad_accum=2`` on the command line) and a validation pass after each epoch (``model.eval()``,
``torch.no_grad()``, the mean over ``len(val_loader)``), 2 epochs. Each rank of each group logs to
``<FT_OUT>/h-g<g>-r<rank>-<pid>.jsonl``: each committed training step's batches (``[epoch,
ids]`` of its micro-batches: the last step of an epoch may end in the next one) and the groups
in its quorum, each validation pass's sample ids and ``len(val_loader)``, and at the end the
batches read in no step that ended.

With FT_FORGET_TRAIN=1 the script forgets ``model.train()`` after the first validation pass.
With FT_KILL_STEP, group 1 SIGKILLs itself right after committing that step of epoch 0; group 0
waits, after the step after, until the restarted group 1's first quorum request is pending at
torchft's lighthouse (its status page), so the heal happens with work left.
"""

import json
import os
import re
import signal
import time
import urllib.request

import aios
import torch

rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ids = torch.arange(44)
train = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(ids.float().unsqueeze(1) / 44, ids), batch_size=2, shuffle=True
)
vids = torch.arange(100, 114)
val = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(vids.float().unsqueeze(1) / 44, vids), batch_size=2
)
model, opt, train, val = rt.setup(model, opt, train, val)
out = os.environ["FT_OUT"]
g = rt.replica_group
kill_at = int(os.environ.get("FT_KILL_STEP", "-1"))
killed, back = os.path.join(out, "killed"), os.path.join(out, "g1-back")
restarted = g == 1 and os.path.exists(killed)
if restarted:
    open(back, "w").close()
log = open(os.path.join(out, f"h-g{g}-r{rt.rank}-{os.getpid()}.jsonl"), "a")


def pending_requests() -> int:
    page = urllib.request.urlopen(os.environ["AIOS_FT_LIGHTHOUSE"] + "/status", timeout=30)
    found = re.search(r"Next quorum status: \D*(\d+) participants", page.read().decode())
    return int(found.group(1)) if found else 0


read = []  # [epoch, ids] of each batch read since the last committed step (a step may span
for epoch in range(2):  # the end of an epoch: its batches are then of two)
    if epoch == 0 or not os.environ.get("FT_FORGET_TRAIN"):  # the bug of forgetting it after
        model.train()  # the first validation pass, with FT_FORGET_TRAIN
    for x, y in train:
        read.append([epoch, y.tolist()])
        before = rt.global_step
        rt.backward((model(x).squeeze(1) - y.float() / 44).pow(2).mean())
        rt.step()
        if rt.global_step == before:
            continue  # a micro-batch (grad_accum=2): the step goes on
        rec = {"batches": read, "p": rt.replica_participants, "step": rt.global_step}
        log.write(json.dumps({"train": {**rec, "restarted": restarted}}) + "\n")
        log.flush()
        read = []
        if g == 1 and rt.rank == 0 and rt.global_step == kill_at and not os.path.exists(killed):
            open(killed, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if g != 1 and rt.global_step == kill_at + 1:  # every live group waits
            while not os.path.exists(back):
                time.sleep(0.01)
            while rt.rank == 0 and not pending_requests():
                time.sleep(0.01)
    model.eval()
    seen, total = [], 0.0
    with torch.no_grad():
        for x, y in val:
            seen += y.tolist()
            total += (model(x).squeeze(1) - y.float() / 44).pow(2).mean().item()
    log.write(json.dumps({"val": {"epoch": epoch, "ids": seen, "len": len(val)}}) + "\n")
    log.flush()
    rt.print(f"epoch {epoch}: validation loss {total / len(val):.4f}")
log.write(json.dumps({"dangling": read}) + "\n")  # read, in no step that ended
rt.close()
