"""Replica groups (``ft.replica_groups``) against plain DDP, and what a loss costs the survivor.

1. Steps/s of ``aios-run --nprocs 2 ft.replica_groups=2`` (two groups of one process; gradients
   averaged across groups by torchft's fault-tolerant all-reduce, a quorum and a commit vote each
   step) against ``aios-run --nprocs 2`` (DDP, one world), same model and batches, the two runs
   interleaved ``--rounds`` times. The default model's step takes about 230 ms on an idle 2-core
   machine (the issue asks at least 100 ms); it is measured again with ``--scale`` times the batch
   (the same parameters, so the same gradients to average, and a longer step): the difference
   of the two runs' step times, at both sizes, is what replica groups add to a step, and its
   share of the step says how a model with more work per step amortises it.
2. A run where group 1 SIGKILLs itself right after committing step ``--kill-at``: the survivor's
   stall (the longest gap between two of its committed steps, less its median step) and the heal
   time (from group 1's restart to its first committed step, aios's own line), with the
   restarted group's processes forked from aios-run's zygote (the default) and started fresh
   (``launch.warm_start=false``), interleaved ``--rounds`` times.

::

    python bench/bench_ft.py [--hidden 1024] [--layers 6] [--batch 256] [--steps 30] \
        [--rounds 2] [--scale 4]

Prints one line per figure. On a shared 2-core machine the figures move with the load (the
per-round ratios are printed beside their median).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = r"""
import json, os, signal, time
import aios, torch
from torch.utils.data import DataLoader, TensorDataset

hidden, layers = int(os.environ["B_HIDDEN"]), int(os.environ["B_LAYERS"])
batch, steps = int(os.environ["B_BATCH"]), int(os.environ["B_STEPS"])
kill_at, out = int(os.environ.get("B_KILL", "-1")), os.environ["B_OUT"]
rt = aios.init()
torch.manual_seed(0)
mods = []
for _ in range(layers):
    mods += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
model = torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
n = batch * steps * 2
ds = TensorDataset(torch.randn(n, hidden), torch.randn(n, 1))
loader = DataLoader(ds, batch_size=batch)
model, opt, loader = rt.setup(model, opt, loader)
killed = os.path.join(out, "killed")
stamps, cpu = [], []
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    rt.backward(loss)
    if rt.step():
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
    if rt.replica_group == 1 and rt.global_step == kill_at and not os.path.exists(killed):
        open(killed, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if len(stamps) >= steps:
        break
name = f"g{rt.replica_group}-r{rt.rank}-{os.getpid()}.json"
with open(os.path.join(out, name), "w") as f:
    json.dump({"t": stamps, "cpu": cpu}, f)
rt.close()
"""


def run(tmp: Path, args: argparse.Namespace, *extra: str, kill: int = -1) -> tuple[str, list[dict]]:
    script = tmp / "bench_ft_loop.py"
    script.write_text(SCRIPT)
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        B_HIDDEN=str(args.hidden),
        B_LAYERS=str(args.layers),
        B_BATCH=str(args.batch),
        B_STEPS=str(args.steps),
        B_KILL=str(kill),
        B_OUT=str(out),
        OMP_NUM_THREADS="1",
        AIOS_LOGGING__RUN_DIR=str(tmp / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
    )
    r = subprocess.run(
        [sys.executable, "-c", "from aios.cli.run import main; main()", "--nprocs", "2"]
        + [*extra, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
    )
    if r.returncode:
        sys.exit(f"bench run failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stderr, [json.loads(p.read_text()) for p in sorted(out.glob("g*.json"))]


def step_s(stamps: list[float]) -> float:
    """The median gap between two committed steps, after two of warm-up."""
    return statistics.median(b - a for a, b in zip(stamps[2:], stamps[3:], strict=False))


def compare(tmp: Path, args: argparse.Namespace, hb: str) -> tuple[float, float, float, float]:
    """DDP and replica groups interleaved ``--rounds`` times; prints both and the ratios, and
    returns the median step times (seconds) of DDP and of replica groups, then the median CPU
    seconds of a rank a step of each."""
    ddp_steps, ft_steps, ratios, cpus = [], [], [], []
    for _ in range(args.rounds):
        ddp_run = run(tmp, args)[1][0]
        ft_run = run(tmp, args, "ft.replica_groups=2", hb)[1][0]
        ddp_steps.append(step_s(ddp_run["t"]))
        ft_steps.append(step_s(ft_run["t"]))
        ratios.append(ft_steps[-1] / ddp_steps[-1] - 1)
        cpus.append((step_s(ddp_run["cpu"]), step_s(ft_run["cpu"])))
    ddp, ft = statistics.median(ddp_steps), statistics.median(ft_steps)
    ddp_cpu, ft_cpu = (statistics.median(c[i] for c in cpus) for i in (0, 1))
    rounds = ", ".join(f"{r * 100:+.1f}%" for r in ratios)
    print(
        f"batch {args.batch}: plain DDP, 2 processes: {1 / ddp:.2f} steps/s ({ddp * 1000:.0f} ms "
        f"a step); ft.replica_groups=2: {1 / ft:.2f} steps/s ({ft * 1000:.0f} ms a step); "
        f"replica groups {statistics.median(ratios) * 100:+.1f}% a step (rounds: {rounds}); "
        f"CPU of a rank a step: DDP {ddp_cpu * 1000:.0f} ms, replica groups {ft_cpu * 1000:.0f} ms"
    )
    return ddp, ft, ddp_cpu, ft_cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=int, default=4, help="the larger batch, times --batch")
    ap.add_argument("--kill-at", type=int, default=8)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ft-"))
    hb = f"ft.heartbeat_timeout_ms={args.heartbeat_ms}"
    costs, cpu_costs = [], []
    for batch, steps in (
        (args.batch, args.steps),
        (args.batch * args.scale, max(6, args.steps // 2)),
    ):
        ddp, ft, ddp_cpu, ft_cpu = compare(
            tmp, argparse.Namespace(**{**vars(args), "batch": batch, "steps": steps}), hb
        )
        cpu_costs.append(
            f"{(ft_cpu - ddp_cpu) * 1000:.0f} ms at batch {batch} "
            f"({(ft_cpu - ddp_cpu) / ft_cpu * 100:.1f}% of its CPU)"
        )
        costs.append(
            f"{(ft - ddp) * 1000:.0f} ms at batch {batch} ({(ft - ddp) / ft * 100:.0f}% of its step)"
        )
    print("replica groups' cost a step (their step less DDP's): " + ", ".join(costs))
    # on a loaded machine the wall figures carry the waits for a core; the CPU is the fixed cost
    print("replica groups' CPU a step, less DDP's: " + ", ".join(cpu_costs))
    # the loss, with the lost group's processes forked from aios-run's zygote (the default) and
    # started fresh (launch.warm_start=false), interleaved --rounds times
    stalls: list[float] = []
    heals: dict[str, list[float]] = {"true": [], "false": []}
    for _ in range(args.rounds):
        for warm in ("true", "false"):
            err, kill = run(
                tmp, args, "ft.replica_groups=2", hb, f"launch.warm_start={warm}", kill=args.kill_at
            )
            surv = kill[0]["t"]  # group 0, the only one of its name (it never restarts)
            gaps = [b - a for a, b in zip(surv, surv[1:], strict=False)]
            stalls.append(max(gaps) - statistics.median(gaps))
            m = re.search(
                r"healed from a live group at step \d+, ([0-9.]+)s after its restart", err
            )
            if m:
                heals[warm].append(float(m.group(1)))
    stall = statistics.median(stalls)
    print(f"survivor stall after the loss: {stall:.2f}s (heartbeat timeout {hb.split('=')[1]} ms)")
    if heals["true"] and heals["false"]:
        on, off = statistics.median(heals["true"]), statistics.median(heals["false"])
        print(
            f"heal, restart to first commit: {on:.1f}s forked from the zygote, {off:.1f}s started "
            f"fresh (launch.warm_start=false): {on / off:.2f}x"
        )
    else:
        print(f"heal, restart to first commit: not seen ({heals})")


if __name__ == "__main__":
    main()
