"""The start of DCP's checkpoint process on CPU: the standby that ``aios.init`` forks before the
process group (:func:`aios.checkpoint.formats.dcp_process.fork_standby`) against DCP's own
``spawn`` (a fresh interpreter that imports torch again), interleaved, N rounds each.

    python bench/bench_ckpt_process_start.py [--rounds 3] [--nprocs 2]

Each round runs ``aios-run --nprocs N strategy=fsdp checkpoint.every=2`` on a small MLP (6
steps; background saves at steps 2, 4, 6) and reports:

* the step that starts the first background save (it waits until every rank's checkpoint
  process has joined its group);
* the whole run's wall time and CPU time (aios-run and everything it started, checkpoint
  processes included: they are all reaped).

The baseline turns the standby off inside the script (``aios.runtime.fork_standby`` replaced),
so the only difference is how the checkpoint process starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """
import json, os, sys, time
import torch
import aios

if os.environ.get("BENCH_SPAWN") == "1":  # the baseline: DCP spawns its checkpoint process
    import aios.runtime

    aios.runtime.fork_standby = lambda: False
rt = aios.init()
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = rt.setup(model, opt)
steps = []
for _ in range(6):
    t0 = time.perf_counter()
    loss = model(torch.randn(16, 256, device=rt.device)).square().mean()
    rt.backward(loss)
    rt.step(opt)
    steps.append(time.perf_counter() - t0)
if rt.is_main:
    with open(os.environ["BENCH_OUT"], "w") as f:
        json.dump(steps, f)
rt.close()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(kind: str, nprocs: int, tmp: Path, n: int) -> dict[str, float]:
    work = tmp / f"{kind}-{n}"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        BENCH_OUT=str(work / "steps.json"),
        BENCH_SPAWN="1" if kind == "spawn" else "0",
        AIOS_LOGGING__TENSORBOARD="false",
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable, "-c",
        "import sys; sys.argv[0] = 'aios-run'; from aios.cli.run import main; main()",
        "--nprocs", str(nprocs), "--master-port", str(_port()),
        "strategy=fsdp", f"checkpoint.dir={work / 'ckpt'}", "checkpoint.every=2", "train.py",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{r.stdout}\n{r.stderr}")
    steps = json.loads((work / "steps.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first_save_step": steps[1], "wall": wall, "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nprocs", type=int, default=2)
    args = ap.parse_args()
    got: dict[str, list[dict[str, float]]] = {"spawn": [], "standby": []}
    with tempfile.TemporaryDirectory(prefix="aios-bench-ckproc-") as tmp:
        for n in range(args.rounds):
            for kind in ("spawn", "standby"):  # interleaved: both see the same machine
                got[kind].append(one(kind, args.nprocs, Path(tmp), n))
    print(
        f"DCP checkpoint process start, aios-run --nprocs {args.nprocs} strategy=fsdp, "
        f"{args.rounds} rounds each, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'median':34s}{'spawn (DCP)':>14s}{'standby':>12s}{'ratio':>8s}")
    for key, label in (
        ("first_save_step", "step that starts the first save"),
        ("wall", "whole run, wall"),
        ("cpu", "whole run, CPU (all processes)"),
    ):
        a = statistics.median(r[key] for r in got["spawn"])
        b = statistics.median(r[key] for r in got["standby"])
        print(f"{label:34s}{a:12.2f} s{b:10.2f} s{b / a:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
