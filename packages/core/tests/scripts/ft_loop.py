# ruff: noqa: E402 - the imports follow the look at what was imported before the script
"""A plain aios loop for the replica-group tests (test_ft_groups.py): 64 samples whose ids are
their labels, batches of 2, one epoch. Each rank logs, per step, the step, whether it committed,
the groups in the quorum, the sample ids it trained and its parameters.

The kill is deterministic (files, never timing): with FT_KILL_MODE=between, group 1 kills
itself (its rank 0: the group's other processes are stopped by aios-run) right after
committing step FT_KILL_STEP (FT_KILL_MODE=hang: hangs there instead); with
FT_KILL_MODE=allreduce, group 1 waits at
step FT_KILL_STEP until group 0 has finished that step's backward (group 0 is then entering the
cross-group all-reduce, which waits for group 1) and kills itself. The live groups wait, before
the step after, until the restarted group 1's first quorum request is pending at torchft's
lighthouse (its status page; none of them asks meanwhile, and a lone request forms no quorum
while they heartbeat): their next requests then form a quorum with it, and the heal happens
with work left however late a loaded machine lets group 1 ask.
With FT_KILL_MODE=late, group 0 does not wait for the restarted group 1, which waits before
``aios.init`` until aios-run has seen group 0 finish (its ``group0.done``): group 1 comes back
to a run with nothing left to train. With FT_WORKERS=N the DataLoader has N workers; each sample says which one read it
(``read_by``, -1: this process). With FT_PAUSE_STEP, every rank writes
``paused-g<g>-r<rank>`` after that step and waits for the
file ``go-on``.
"""

import json
import os
import re
import signal
import sys
import time
import urllib.request

#: forked from aios-run's zygote (torch imported before the script's first line), or fresh
WARM = "torch" in sys.modules

import aios
import torch
from torch.distributed.tensor import DTensor

if os.environ.get("FT_WAIT_BEFORE_INIT"):  # started, not yet in aios.init: the pid, then wait
    with open(os.path.join(os.environ["FT_OUT"], f"pid-{os.getpid()}"), "w") as f:
        f.write(os.environ["AIOS_FT_STATE_DIR"])  # aios-run's, left by its SIGKILL
    while True:
        time.sleep(1)
late = os.environ.get("FT_KILL_MODE") == "late" and os.environ.get("AIOS_FT_GROUP") == "1"
if late and os.path.exists(os.path.join(os.environ["FT_OUT"], "killed")):
    done = os.path.join(os.environ["AIOS_FT_STATE_DIR"], "group0.done")
    while not os.path.exists(done):
        time.sleep(0.01)


def tp_plan(model, tp_mesh):
    """``mesh.tp_plan=__main__:tp_plan`` (strategy=tp): the MLP column- then row-parallel."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # state a heal must carry
ids = torch.arange(64)
workers = int(os.environ.get("FT_WORKERS", "0"))


class Samples(torch.utils.data.Dataset):
    """Sample i: (features, i, the id of the loader worker that read it, -1 in the process)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return ids[i].float().repeat(4) / 64, ids[i], -1 if info is None else info.id


loader = torch.utils.data.DataLoader(Samples(), batch_size=2, shuffle=True, num_workers=workers)
model, opt, loader = rt.setup(model, opt, loader)
out = os.environ["FT_OUT"]
g = rt.replica_group
killer = g == 1 and rt.rank == 0  # the process of group 1 that is lost
kill_at = int(os.environ.get("FT_KILL_STEP", "-1"))
mode = os.environ.get("FT_KILL_MODE", "between")
pause_at = int(os.environ.get("FT_PAUSE_STEP", "-1"))
killed = os.path.join(out, "killed")
back = os.path.join(out, "g1-back")
restarted = g == 1 and os.path.exists(killed)
if restarted:
    open(back, "w").close()
log = open(os.path.join(out, f"g{g}-r{rt.rank}-{os.getpid()}.jsonl"), "a")
with open(os.path.join(out, f"start-g{g}-r{rt.rank}-{os.getpid()}.json"), "w") as f:
    json.dump({"warm": WARM, "threads": torch.get_num_threads(), "restarted": restarted}, f)


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def pending_requests() -> int:
    """Quorum requests waiting at the lighthouse (its status page: "only have N participants";
    a restarted group alone is not enough for a quorum while another group heartbeats)."""
    page = urllib.request.urlopen(os.environ["AIOS_FT_LIGHTHOUSE"] + "/status", timeout=30)
    # "only have 1 participants, need ...", "Valid quorum with 2 participants, waiting for ..."
    found = re.search(r"Next quorum status: \D*(\d+) participants", page.read().decode())
    return int(found.group(1)) if found else 0


def wait_for_request():
    while not pending_requests():
        time.sleep(0.01)


for x, idx, read_by in loader:
    step = rt.global_step
    if killer and mode == "allreduce" and step == kill_at and not os.path.exists(killed):
        wait_for(os.path.join(out, f"g0-backward-{kill_at}"))
        open(killed, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    loss = (model(x).squeeze(1) - idx.float() / 64).pow(2).mean()
    rt.backward(loss)
    if g == 0:
        open(os.path.join(out, f"g0-backward-{step}"), "w").close()
    ok = rt.step()
    # this rank's own parameters (its shards under fsdp): the same rank of each group holds the
    # same ones
    params = [
        (t.to_local() if isinstance(t, DTensor) else t).detach().flatten().tolist()
        for t in rt.unwrap(model).parameters()
    ]
    rec = {
        "step": rt.global_step,
        "ok": ok,
        "p": rt.replica_participants,
        "idx": idx.tolist(),
        "read_by": read_by.tolist(),
        "t": time.time(),
    }
    log.write(json.dumps({**rec, "restarted": restarted, "params": params}) + "\n")
    log.flush()
    if (
        killer
        and mode in ("between", "late")
        and rt.global_step == kill_at
        and not os.path.exists(killed)
    ):
        open(killed, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if killer and mode == "hang" and rt.global_step == kill_at and not os.path.exists(killed):
        open(killed, "w").close()
        while True:  # hung after committing: aios-run's hang watch stops it
            time.sleep(1)
    if g != 1 and mode != "late" and rt.global_step == kill_at + 1:
        wait_for(back)
        if rt.rank == 0:  # no live group asks for a quorum now: a pending request is group 1's
            wait_for_request()
    if rt.global_step == pause_at:  # every rank waits here until the test says go on
        with open(os.path.join(out, f"paused-g{g}-r{rt.rank}"), "w") as f:
            f.write(os.environ.get("AIOS_RUN_STATUS_DIR", ""))  # where `aios stacks` reads it
        wait_for(os.path.join(out, "go-on"))
rt.close()
