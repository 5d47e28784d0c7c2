"""Resume cost at another shape: the time from relaunching ``aios-run`` to the first training
step after the resume, from a checkpoint written at another shape against one written at the
same shape (goal: at most 1.3x).

A small MLP (``--hidden`` x ``--layers``, SGD with momentum) trains ``global_batch=48
micro_batch=8`` through ``aios-run`` and ``rt.resume()``. For each target shape (processes x
strategy), two checkpoints at step 3 are made once: one by the same shape, one by another. Then
each is resumed ``--repeats`` times (fresh copy each time) and the launch-to-first-step times
are printed side by side, with their ratio (medians)::

    python bench/bench_resume_shape.py [--repeats 3] [--hidden 512] [--layers 4]

Pairs: 1 process resumed from 1 (same) vs from 2 (another world size); 2 processes from 2 vs from
1; 2 processes under fsdp from fsdp (same) vs from ddp (another strategy and format).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = r'''
import os, sys, time
import aios, torch
from torch.utils.data import DataLoader, TensorDataset

hidden, layers = int(os.environ["B_HIDDEN"]), int(os.environ["B_LAYERS"])
rt = aios.init()
torch.manual_seed(0)
mods = []
for _ in range(layers):
    mods += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
model = torch.nn.Sequential(torch.nn.Linear(16, hidden), *mods, torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(960, 16, generator=g), torch.randn(960, 1, generator=g))
loader = DataLoader(data, batch_size=rt.config.micro_batch, shuffle=True)
model, opt, loader = rt.setup(model, opt, loader)
rt.resume()
stop, first = int(os.environ["B_STEPS"]), True
while rt.global_step < stop:
    for x, y in loader:
        with rt.accumulate(model):
            rt.backward(torch.nn.functional.mse_loss(model(x), y))
        if rt.step(opt):
            if first and rt.is_main and os.environ.get("B_FIRST"):
                with open(os.environ["B_FIRST"], "w") as f:
                    f.write(repr(time.time()))
            first = False
        if rt.global_step >= stop:
            break
rt.close()
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(work: Path, nprocs: int, strategy: str, ckpt: Path, steps: int, args) -> float | None:
    """Run the loop; returns seconds from launch to the first step (when asked for)."""
    first = work / "first"
    first.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        B_HIDDEN=str(args.hidden),
        B_LAYERS=str(args.layers),
        B_STEPS=str(steps),
        B_FIRST=str(first),
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_LOGGING__RUN_DIR=str(work / "runs"),
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, "-c", "from aios.cli.run import main; main()"]
    cmd += ["--nprocs", str(nprocs), f"master_port={_port()}", f"strategy={strategy}"]
    cmd += ["global_batch=48", "micro_batch=8", f"checkpoint.dir={ckpt}", "checkpoint.every=3"]
    cmd += ["checkpoint.async_save=false", str(work / "loop.py")]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench: run failed ({' '.join(cmd[3:])}):\n{(r.stdout + r.stderr)[-3000:]}")
    return float(first.read_text()) - t0 if first.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aios-bench-resume-"))
    (work / "loop.py").write_text(SCRIPT)
    made: dict[tuple[int, str], Path] = {}

    def checkpoint(nprocs: int, strategy: str) -> Path:
        key = (nprocs, strategy)
        if key not in made:
            ckpt = work / f"src-{nprocs}-{strategy}"
            launch(work, nprocs, strategy, ckpt, 3, args)
            made[key] = ckpt
        return made[key]

    pairs = [
        ("1 proc ddp, from 2 procs", (1, "ddp"), (1, "ddp"), (2, "ddp")),
        ("2 procs ddp, from 1 proc", (2, "ddp"), (2, "ddp"), (1, "ddp")),
        ("2 procs fsdp, from ddp", (2, "fsdp"), (2, "fsdp"), (2, "ddp")),
    ]
    print(f"{'resume at':28} {'same shape s':>13} {'other shape s':>14} {'ratio':>6}")
    worst = 0.0
    for name, target, same_src, other_src in pairs:
        times: dict[str, list[float]] = {"same": [], "other": []}
        for _ in range(args.repeats):
            for kind, src in (("same", same_src), ("other", other_src)):
                ckpt = work / "resume"
                shutil.rmtree(ckpt, ignore_errors=True)
                shutil.copytree(checkpoint(*src), ckpt)
                t = launch(work, target[0], target[1], ckpt, 4, args)
                assert t is not None
                times[kind].append(t)
        same, other = statistics.median(times["same"]), statistics.median(times["other"])
        worst = max(worst, other / same)
        print(f"{name:28} {same:13.2f} {other:14.2f} {other / same:6.2f}")
    print(f"worst ratio {worst:.2f} (goal <= 1.30)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
