"""Training under checkpoint.max_lost with an injected clock: each step takes STEP_S seconds
of the clock, each save SAVE_S more; at KILL_AT (a step) the process SIGKILLs itself half-way
through the next step, unannounced; at TERM_AT it sends itself SIGTERM (a notice whose deadline
is the clock plus the grace). Appends ``step clock`` per step to TIMES_FILE and, on a
start, ``resumed <step>`` (the step it resumed at)."""

import os
import signal

import aios
import torch

step_s = float(os.environ["STEP_S"])
save_s = float(os.environ["SAVE_S"])
kill_at = int(os.environ.get("KILL_AT", "0"))
term_at = int(os.environ.get("TERM_AT", "0"))
total = int(os.environ.get("TOTAL_STEPS", "400"))
times = open(os.environ["TIMES_FILE"], "a", buffering=1)

now = [0.0]
clock = lambda: now[0]  # noqa: E731

rt = aios.init()
rt.clock = rt.checkpointer.clock = rt.preemption.clock = clock
fmt = rt.checkpointer.format
real_save = fmt.save


def save(*a, **k):
    now[0] += save_s  # the save's cost, on the same clock
    return real_save(*a, **k)


fmt.save = save
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = rt.setup(model, opt)
rt.resume()
times.write(f"resumed {rt.global_step}\n")
x = torch.randn(8, 4)
while rt.global_step < total:
    if kill_at and rt.global_step == kill_at:
        now[0] += step_s / 2
        times.write(f"killed {now[0]}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    if term_at and rt.global_step == term_at:
        os.kill(os.getpid(), signal.SIGTERM)  # the notice: its deadline is the clock + grace
    loss = model(x).pow(2).mean()
    rt.backward(loss)
    now[0] += step_s
    rt.step(opt)
    times.write(f"{rt.global_step} {now[0]}\n")
rt.close()
