"""The whole test run (``hatch run ci:all``): lint, every package in its own environment, the
cross-package tests and TorchTPU's environment.

Every step runs even when an earlier one failed, so one run reports every failing package; the
exit status is 1 when any step failed. While a step's tests run, the environment of the next step
is created (``hatch env create``) in the background: installing a torch build is mostly disk and
network time, and on a small machine that overlap is the difference between fitting the CI budget
and not. Ends with a table of each step's time (install and tests apart).

    python scripts/ci.py                 # everything
    python scripts/ci.py core cloud-gcp  # some steps (lint, cross, test-tpu or a package name)
    python scripts/ci.py -- -x -k spot   # everything, with extra pytest arguments
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = [
    "core",
    "cloud",
    "backend-cuda",
    "cloud-gcp",
    "cloud-aws",
    "backend-xla",
    "backend-neuron",
    "cloud-slurm",
    "cloud-k8s",
]


@dataclass
class Step:
    name: str
    env: str  # hatch environment (matrix entries are test.<pkg>)
    script: str  # what `hatch run` runs
    takes_args: bool = True
    created: threading.Event = field(default_factory=threading.Event)
    create_rc: int = 0
    create_s: float = 0.0
    create_log: str = ""
    run_s: float = 0.0
    rc: int | None = None


def steps() -> list[Step]:
    out = [Step("lint", "lint", "lint:run", takes_args=False)]
    out += [Step(p, f"test.{p}", f"+pkg={p} test:run") for p in PACKAGES]
    out += [Step("cross", "cross", "cross:run"), Step("test-tpu", "test-tpu", "test-tpu:run")]
    return out


def _hatch(*args: str) -> list[str]:
    # the hatch that runs this script (`hatch run ci:all`): not importable from the ci
    # environment's own interpreter, so found on PATH
    return [os.environ.get("AIOS_CI_HATCH") or shutil.which("hatch") or "hatch", *args]


def _create_all(todo: list[Step]) -> None:
    for s in todo:
        t0 = time.monotonic()
        r = subprocess.run(
            _hatch("env", "create", s.env),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        s.create_s = time.monotonic() - t0
        s.create_rc, s.create_log = r.returncode, r.stdout
        s.created.set()


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    extra = [a for a in argv if a.startswith("-")] + extra  # pytest options
    argv = [a for a in argv if not a.startswith("-")]
    todo = steps()
    if argv:
        unknown = set(argv) - {s.name for s in todo}
        if unknown:
            print(
                f"ci: unknown step(s) {', '.join(sorted(unknown))}; "
                f"choose from {', '.join(s.name for s in todo)}",
                file=sys.stderr,
            )
            return 2
        todo = [s for s in todo if s.name in argv]

    creator = threading.Thread(target=_create_all, args=(todo,), daemon=True)
    creator.start()
    t_all = time.monotonic()
    for s in todo:
        s.created.wait()
        print(f"\n== {s.name}: environment {s.env} ready in {s.create_s:.0f} s", flush=True)
        if s.create_rc != 0:
            print(s.create_log[-8000:], flush=True)
            print(f"== {s.name}: creating {s.env} failed (exit {s.create_rc})", flush=True)
            s.rc = s.create_rc
            continue
        cmd = _hatch("run", *s.script.split())
        if s.takes_args:
            cmd += extra
        t0 = time.monotonic()
        s.rc = subprocess.run(cmd, cwd=ROOT).returncode
        s.run_s = time.monotonic() - t0
        print(f"== {s.name}: exit {s.rc} after {s.run_s:.0f} s", flush=True)
    total = time.monotonic() - t_all

    print("\n== summary (install overlaps the previous step's tests)")
    print(f"{'step':<16}{'install s':>10}{'tests s':>10}  result")
    for s in todo:
        res = "passed" if s.rc == 0 else f"FAILED (exit {s.rc})"
        print(f"{s.name:<16}{s.create_s:>10.0f}{s.run_s:>10.0f}  {res}")
    failed = [s.name for s in todo if s.rc != 0]
    print(f"{'total':<16}{'':>10}{total:>10.0f}  {len(todo) - len(failed)}/{len(todo)} passed")
    if failed:
        print(f"ci: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
