"""Time to first step: ``aios-run --nprocs 2`` vs ``torchrun --nproc_per_node 2`` on the same
script (an aios script: under torchrun the runtime auto-detects the torchrun environment),
interleaved, N rounds each. Target: aios-run <= 0.8x torchrun (its ranks start warm:
:mod:`aios.launcher.warm`).

    python bench/bench_launch.py [--rounds 5] [--nprocs 2]

The script records the wall-clock time when its first optimizer step finished on rank 0; the
figure is that time minus the moment the launcher process was started.
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

SCRIPT = """
import os, time
import torch
import aios

rt = aios.init()
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
loss = model(torch.randn(8, 32, device=rt.device)).square().mean()
rt.backward(loss)
rt.step(opt)
if rt.is_main:
    with open(os.environ["FIRST_STEP_FILE"], "w") as f:
        f.write(repr(time.time()))
rt.close()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(cmd: list[str], env: dict[str, str], stamp: Path) -> tuple[float, float]:
    stamp.unlink(missing_ok=True)
    t0 = time.time()
    p = subprocess.run(
        cmd,
        env={**env, "FIRST_STEP_FILE": str(stamp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    t_end = time.time()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return float(stamp.read_text()) - t0, t_end - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nprocs", type=int, default=2)
    args = ap.parse_args()
    bindir = Path(sys.executable).parent
    torchrun = shutil.which("torchrun", path=str(bindir)) or "torchrun"
    aios_run = shutil.which("aios-run", path=str(bindir)) or "aios-run"
    tmp = Path(tempfile.mkdtemp(prefix="aios-bench-launch-"))
    script = tmp / "first_step.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    results: dict[str, list[tuple[float, float]]] = {"torchrun": [], "aios-run": []}
    for r in range(args.rounds + 1):  # round 0 warms the page cache, not counted
        order = ["torchrun", "aios-run"] if r % 2 == 0 else ["aios-run", "torchrun"]
        for name in order:
            port = str(free_port())
            if name == "torchrun":
                cmd = [
                    torchrun,
                    "--nproc_per_node",
                    str(args.nprocs),
                    "--master-port",
                    port,
                    str(script),
                ]
            else:
                cmd = [aios_run, "--nprocs", str(args.nprocs), "--master-port", port, str(script)]
            res = one(cmd, env, tmp / "stamp")
            if r:
                results[name].append(res)
    tr = statistics.median(x[0] for x in results["torchrun"])
    ar = statistics.median(x[0] for x in results["aios-run"])
    print(
        f"time to first step, {args.nprocs} processes, {args.rounds} interleaved rounds (median):"
    )
    print(
        f"  torchrun --nproc_per_node {args.nprocs}: {tr:6.3f} s  (total "
        f"{statistics.median(x[1] for x in results['torchrun']):.3f} s)"
    )
    print(
        f"  aios-run --nprocs {args.nprocs}:         {ar:6.3f} s  (total "
        f"{statistics.median(x[1] for x in results['aios-run']):.3f} s)"
    )
    print(f"  ratio aios-run / torchrun: {ar / tr:.3f}x (target <= 0.8x)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
