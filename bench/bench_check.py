"""`aios check` speed: a 2,000-line training script (the test fixtures in torchrun, torch_xla
and nanoGPT habits, repeated with renamed functions) checked in-process, side by side with the
baseline every static checker pays (`ast.parse` of the same text), and the whole command
(`aios check FILE`, a fresh interpreter) against `python -c pass`.

    python bench/bench_check.py [--runs 15] [--lines 2000]

Prints medians and ratios; budget: the whole command well under a second. Then the same per
1,000 lines over the corpus (tests/fixtures/check_corpus: original scripts reproducing the habits
of 23 public training scripts), each file
checked as `aios check` does, side by side with `ast.parse` of the same files; and the corpus's
projects (a script, the helper modules it imports, the configs it loads) read whole, as
`aios check SCRIPT` reads them. Budget: 0.2 s of CPU per 1,000 lines (exit 1 above it).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "packages" / "core" / "tests" / "scripts" / "check"
CORPUS = FIXTURES.parents[1] / "fixtures" / "check_corpus"


def big_script(lines: int) -> str:
    parts = [
        (FIXTURES / name).read_text()
        for name in ("gpu_ddp.py", "nanogpt_ddp.py", "xla_spawn.py", "neuron_trn1.py")
    ]
    out: list[str] = []
    i = 0
    while sum(p.count("\n") for p in out) < lines:
        text = parts[i % len(parts)]
        # distinct names per copy, as in one long file
        text = re.sub(r"^(def|class) (\w+)", rf"\1 \2_{i}", text, flags=re.M)
        out.append(text)
        i += 1
    return "".join(out)


def median_time(fn, runs: int) -> float:
    """Median CPU time of ``fn`` (process time: what a loaded machine does not inflate)."""
    ts = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        ts.append(time.process_time() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--lines", type=int, default=2000)
    args = ap.parse_args()
    from aios.check import check_source

    src = big_script(args.lines)
    n = src.count("\n")
    parse = median_time(lambda: ast.parse(src), args.runs)
    check = median_time(lambda: check_source(src, "big.py"), args.runs)
    found = len(check_source(src, "big.py"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.py")
        with open(path, "w") as f:
            f.write(src)
        cli = [sys.executable, "-c", "from aios.cli.main import main; main()", "check", path]
        base_cmd = [sys.executable, "-c", "pass"]
        cmd_t: list[float] = []
        base_t: list[float] = []
        for _ in range(args.runs):  # interleaved, so load on the machine hits both alike
            for cmd, ts in ((base_cmd, base_t), (cli, cmd_t)):
                t0 = time.perf_counter()
                subprocess.run(cmd, capture_output=True)
                ts.append(time.perf_counter() - t0)
    base, whole = statistics.median(base_t), statistics.median(cmd_t)
    print(f"script: {n} lines, {found} findings")
    print(f"{'what':34} {'median s':>9} {'ratio':>8}")
    print(f"{'ast.parse (baseline, CPU)':34} {parse:9.4f} {1:8.2f}")
    print(f"{'check_source (parse + rules, CPU)':34} {check:9.4f} {check / parse:8.2f}")
    print(f"{'python -c pass (baseline, wall)':34} {base:9.4f} {1:8.2f}")
    print(f"{'aios check FILE (command, wall)':34} {whole:9.4f} {whole / base:8.2f}")

    corpus = {p.name: p.read_text() for p in sorted(CORPUS.glob("*.py"))}
    total = sum(t.count("\n") for t in corpus.values())
    c_parse = median_time(lambda: [ast.parse(t) for t in corpus.values()], args.runs)
    c_check = median_time(lambda: [check_source(t, n) for n, t in corpus.items()], args.runs)
    per = 1000 / total
    print(f"corpus: {len(corpus)} scripts, {total} lines")
    print(f"{'per 1,000 lines':34} {'median s':>9} {'ratio':>8}")
    print(f"{'ast.parse (baseline, CPU)':34} {c_parse * per:9.4f} {1:8.2f}")
    print(f"{'check_source (parse + rules, CPU)':34} {c_check * per:9.4f} {c_check / c_parse:8.2f}")

    # whole-project reading (issue 34): each project's script with the modules it imports and the
    # configs it loads, as `aios check SCRIPT` reads them; per 1,000 lines of every file read
    from aios.check import check_project

    entries = []
    for labels in sorted(CORPUS.glob("**/labels/*_project.json")):
        entries.append(
            str(labels.parents[1] / labels.stem / json.loads(labels.read_text())["script"])
        )
    read = [
        p
        for e in entries
        for p in Path(e).parent.rglob("*")
        if p.suffix in (".py", ".yaml", ".yml", ".toml", ".json")
    ]
    p_lines = sum(p.read_text().count("\n") for p in read)
    p_check = median_time(lambda: [check_project(e) for e in entries], args.runs)
    p_per = p_check * 1000 / p_lines
    print(f"projects: {len(entries)} scripts, {len(read)} files, {p_lines} lines")
    print(f"{'check_project per 1,000 lines (CPU)':34} {p_per:9.4f}  (budget 0.2)")
    ok = whole < 1.0 and c_check * per < 0.2 and p_per < 0.2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
