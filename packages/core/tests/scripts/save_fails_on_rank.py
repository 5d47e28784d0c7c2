"""Run under aios-run --nprocs 2 with argv RANK: from the first save on, that rank's file
writes fail as on a full disk (RLIMIT_FSIZE: the OS says EFBIG); or, with argv ``exists``,
the second rt.save to one path is refused."""

import resource
import signal
import sys

import aios
import torch

rt = aios.init(defaults={"checkpoint": {"dir": "ck", "every": 0}})
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
if sys.argv[1] != "exists" and rt.rank == int(sys.argv[1]):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
for i in range(3):
    rt.backward(model(torch.ones(2, 64)).sum())
    rt.step(opt)
    rt.save("named" if sys.argv[1] == "exists" else None)
    rt.print(f"saved {i}")
