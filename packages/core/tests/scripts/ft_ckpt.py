"""A plain aios loop with checkpoints for the replica-group checkpoint tests
(test_ft_checkpoints.py): 64 samples whose ids are their labels, batches of 2, one epoch,
``rt.resume()`` after setup. Each rank logs, per step, the step, whether it committed, the groups
in the quorum and the sample ids it trained (FT_TAG names the run in the log's name).

Deterministic (files, never timing): FT_KILL_GROUP is SIGKILLed right after committing step
FT_KILL_STEP, and the other groups wait, after the step after, until it has restarted. At step
FT_TERM_STEP every rank says so with a file and waits until its own stop notice (the SIGTERM the
test sends to aios-run, forwarded to each rank) has arrived: every group then stops at the next
step boundary.
"""

import json
import os
import signal
import time

import aios
import torch

rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ids = torch.arange(64)
ds = torch.utils.data.TensorDataset(ids.float().unsqueeze(1).repeat(1, 4) / 64, ids)
loader = torch.utils.data.DataLoader(ds, batch_size=2, shuffle=True)
model, opt, loader = rt.setup(model, opt, loader)
rt.resume()
out = os.environ["FT_OUT"]
tag = os.environ.get("FT_TAG", "a")
g = rt.replica_group
kill_group = int(os.environ.get("FT_KILL_GROUP", "-1"))
kill_at = int(os.environ.get("FT_KILL_STEP", "-1"))
term_at = int(os.environ.get("FT_TERM_STEP", "-1"))
killed = os.path.join(out, "killed")
back = os.path.join(out, "back")
restarted = g == kill_group and os.path.exists(killed)
if restarted:
    open(back, "w").close()
log = open(os.path.join(out, f"{tag}-g{g}-r{rt.rank}-{os.getpid()}.jsonl"), "a")


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


for x, idx in loader:
    loss = (model(x).squeeze(1) - idx.float() / 64).pow(2).mean()
    rt.backward(loss)
    ok = rt.step()
    healing = rt.replica is not None and rt.replica.participant_rank is None
    rec = {"step": rt.global_step, "ok": ok, "p": rt.replica_participants, "idx": idx.tolist()}
    rec["counted"] = ok and not healing  # a healing group's batch trains nothing (torchft)
    log.write(json.dumps({**rec, "restarted": restarted}) + "\n")
    log.flush()
    if g == kill_group and rt.global_step == kill_at and not os.path.exists(killed):
        open(killed, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if g != kill_group and kill_at >= 0 and rt.global_step == kill_at + 1:
        wait_for(back)
    if ok and rt.global_step == term_at:
        open(os.path.join(out, f"at-g{g}-r{rt.rank}"), "w").close()
        while rt.preemption.reason is None:
            time.sleep(0.01)
rt.close()
