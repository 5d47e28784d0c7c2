"""CLI start-up budget: `aios --help` <= 0.25 s median, `aios plugins` / `aios devices` <= 1 s
with every package installed, none of them importing torch.

Runs each command N times interleaved with a bare `python -c pass` baseline (and
`accelerate --help` when installed), and prints medians and ratios.

    python bench/bench_cli.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

PROBE = (
    "import sys; sys.argv=['aios', *sys.argv[1:]]\n"
    "from aios.cli.main import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "import os; os.write(2, ('TORCH=%d\\n' % ('torch' in sys.modules)).encode())\n"
)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, res.stderr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    env = dict(os.environ, COLUMNS="120")
    aios_bin = (
        shutil.which(
            "aios", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        )
        or "aios"
    )
    cases: dict[str, list[str]] = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "aios --help": [aios_bin, "--help"],
        "aios plugins": [aios_bin, "plugins"],
        "aios devices": [aios_bin, "devices"],
    }
    acc = shutil.which("accelerate")
    if acc:
        cases["accelerate --help"] = [acc, "--help"]
    times: dict[str, list[float]] = {k: [] for k in cases}
    torch_seen: dict[str, bool] = {}
    for i in range(args.runs):
        for name, cmd in cases.items():
            if name == "accelerate --help" and i >= 3:
                continue  # ~4 s each; three runs give the median
            dt, _ = timed(cmd, env)
            times[name].append(dt)
    for name in ("aios --help", "aios plugins", "aios devices"):
        sub = name.split()[1:]
        _, err = timed([sys.executable, "-c", PROBE, *sub], env)
        torch_seen[name] = "TORCH=1" in err
    base = statistics.median(times["python -c pass (baseline)"])
    budgets = {"aios --help": 0.25, "aios plugins": 1.0, "aios devices": 1.0}
    print(f"{'command':28} {'median s':>9} {'x python':>9} {'budget':>7}  torch imported")
    ok = True
    for name, ts in times.items():
        med = statistics.median(ts)
        budget = budgets.get(name)
        flag = ""
        if budget is not None:
            good = med <= budget and not torch_seen[name]
            ok &= good
            flag = f"{budget:7.2f}  {'yes' if torch_seen[name] else 'no'}{'' if good else '  OVER BUDGET'}"
        print(f"{name:28} {med:9.3f} {med / base:9.2f} {flag}")
    if acc:
        print(
            "aios --help is "
            f"{statistics.median(times['accelerate --help']) / statistics.median(times['aios --help']):.1f}x "
            "faster than accelerate --help"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
