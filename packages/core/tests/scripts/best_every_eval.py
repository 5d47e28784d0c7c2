"""Run under aios-run --nprocs 2: "save when validation improves" after every one of 10
evaluations (the metric improves every time), periodic checkpoints every 2 steps, a plain
value registered without a wrapper. Prints each best save and, at the end, the best so far."""

import sys

import aios
import torch

rt = aios.init(defaults={"checkpoint": {"dir": sys.argv[1], "every": 2}})
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
rt.register("steps_seen", 0)
rt.resume()
while True:
    if rt.global_step % 2 == 0 and rt.global_step > 0:  # evaluation at the top of the loop
        val = 10.0 - rt.global_step / 2  # improves at every evaluation
        if rt.save_best(val):
            rt.print(f"best {val} at step {rt.global_step}")
    if rt.global_step >= 20:
        break
    rt.backward(model(torch.ones(2, 4)).square().mean())
    rt.step(opt)
    rt.values["steps_seen"] += 1  # after rt.step: in the next checkpoint, never counted twice
rt.print(
    f"done at step {rt.global_step}: best {rt.values['best/best']} steps {rt.values['steps_seen']}"
)
rt.close()
