"""The whole test run (``hatch run ci:all``): lint, every package in its own environment, the
cross-package tests and TorchTPU's environment.

Every step runs even when an earlier one failed, so one run reports every failing package; the
exit status is 1 when any step failed. Steps run side by side in ``AIOS_CI_LANES`` lanes (default
4), at most two of the steps that mostly compute (:data:`HEAVY`: multi-rank runs, XLA compiles)
at a time; lanes beyond the second start once every environment exists (pip's installs are the
other work until then). Uncapped, three lanes made the CI machine's run longer (4,703 s against
3,223 s with two), as the multi-rank ranks wait on each other's time slices; capped, with the
test zygote (:mod:`aios.testing.zygote`), three lanes took 2,751 s here where two were heading
for about 3,100, and at 4835976 four lanes took 1,889 s where three took 2,091 (the steps that
wait on ssh hosts, emulators and Slurm fill the cores the computing steps leave). Three computing
steps at once (``AIOS_CI_HEAVY=3``, five lanes) took 2,300 s against 1,879 with two, and two
timing-bound tests failed under that load. Each lane takes the longest step still waiting whose
environment is ready, a heavy one first while a heavy slot is free (the heavy steps' slots bound
the run; the expected seconds below, measured on the 2-core CI machine; environments are created
first for the steps with the most work), and every output line of a step is prefixed with its
name. Environments are created and their dependencies synced in the background while tests run,
one at a time, once each. Ends with each failed step's failures printed again, a table of each
step's time (install and tests apart) and one line with the tests counted over all steps.

    python scripts/ci.py                 # everything
    python scripts/ci.py core cloud-gcp  # some steps (lint, cross, test-tpu or a package name)
    python scripts/ci.py -- -x -k spot   # everything, with extra pytest arguments
    AIOS_CI_LANES=1 python scripts/ci.py # one step at a time, unprefixed output
    AIOS_CI_HEAVY=3 python scripts/ci.py # at most three computing steps at once (default two)
"""

from __future__ import annotations

import os
import re
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
    #: when its tests started and ended, seconds from the run's start (the closing table)
    start_s: float = 0.0
    end_s: float = 0.0
    rc: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: pytest's FAILURES/ERRORS section and its `FAILED ...`/`ERROR ...` lines, printed again
    #: just above the closing table: with fifteen steps' output interleaved, a failure printed
    #: mid-run is otherwise far from the tail a reader (or a CI page showing the last lines) sees
    failure_lines: list[str] = field(default_factory=list)
    failed_ids: list[str] = field(default_factory=list)


#: packages whose tests run in another package's environment: every test environment installs
#: all nine packages (hatch.toml), and these environments add a superset of what the package's
#: own adds (core: moto, s3fs, gcp-storage-emulator, tensorboard; backend-xla: the same torch and
#: torch_xla as backend-neuron). Each environment is ~1 GB of pip work that CI would otherwise do
#: while the first steps' tests run, on the same two cores; `hatch run +pkg=NAME test:run` still
#: tests a package in its own environment.
SHARED_ENV = {
    "cloud": "core",
    "cloud-gcp": "core",
    "cloud-aws": "core",
    "cloud-slurm": "core",
    "backend-neuron": "backend-xla",
}


#: test files that run as a step of their own, in the environment of the step they come from
#: (which runs the rest): the lanes balance only whole steps, and core's tests alone (about 30
#: minutes on the 2-core machine) would otherwise be one lane's whole run
SPLIT = {
    "core": {
        "core-runs": [
            "packages/core/tests/test_strategy_contract.py",
            "packages/core/tests/test_resume_shapes.py",
            "packages/core/tests/test_dcp.py",
            "packages/core/tests/test_strategy_fsdp.py",
            "packages/core/tests/test_watchdog.py",
            "packages/core/tests/test_dcp_runtime.py",
        ],
        # replica groups: each test starts a lighthouse and two groups, some wait out a timeout
        "core-ft": [
            "packages/core/tests/test_ft_groups.py",
            "packages/core/tests/test_ft_checkpoints.py",
        ],
    },
    "cross": {"idioms": ["tests/test_idioms.py"]},
}


def _split(name: str, env: str, runner: str, where: str) -> list[Step]:
    """The step ``name`` (pytest over ``where`` with ``runner``, a hatch script taking paths)
    and the steps :data:`SPLIT` takes out of it."""
    parts = SPLIT.get(name, {})
    taken = [f for files in parts.values() for f in files]
    rest = " ".join([where, *(f"--ignore={f}" for f in taken)])
    out = [Step(name, env, f"{runner} {rest}")]
    out += [Step(part, env, f"{runner} {' '.join(files)}") for part, files in parts.items()]
    return out


def steps() -> list[Step]:
    out = [Step("lint", "lint", "lint:run", takes_args=False)]
    for p in PACKAGES:
        host = SHARED_ENV.get(p)
        if host is None and p not in SPLIT:
            out.append(Step(p, f"test.{p}", f"+pkg={p} test:run"))
        else:
            env = host or p
            out += _split(p, f"test.{env}", f"+pkg={env} test:tests-of", f"packages/{p}/tests")
    out += _split("cross", "cross", "cross:tests-of", "tests")
    out.append(Step("test-tpu", "test-tpu", "test-tpu:run"))
    return out


def _hatch(*args: str) -> list[str]:
    # the hatch that runs this script (`hatch run ci:all`): not importable from the ci
    # environment's own interpreter, so found on PATH
    return [os.environ.get("AIOS_CI_HATCH") or shutil.which("hatch") or "hatch", *args]


# Expected test seconds of each step on a 2-core machine (the last full run's table: four
# lanes, two computing steps at most, kept environments, at 0b04994, core-ft's replica groups
# warm); the lanes take the longest first so that they end together. A step missing here counts
# as 60 s.
EXPECTED_S = {
    "core": 940,
    "cloud": 930,
    "cloud-gcp": 840,
    "core-runs": 700,
    "cloud-aws": 520,
    "backend-xla": 440,
    "cross": 330,
    "cloud-slurm": 300,
    "core-ft": 180,
    "backend-neuron": 140,
    "idioms": 130,
    "backend-cuda": 110,
    "cloud-k8s": 50,
    "test-tpu": 30,
    "lint": 10,
}


#: pytest's section headers (`==== FAILURES ====`, `==== short test summary info ====`)
SECTION = re.compile(r"^=+ (?P<title>[^=]+?) =+$")
FAILURE_SECTIONS = ("FAILURES", "ERRORS")
#: the failure section printed again is cut to its last characters (the assertion and its
#: traceback's end), per step
FAILURE_TAIL_CHARS = 6000

SUMMARY = re.compile(r"^=+ (?P<counts>.*\d+ (?:passed|failed|error|errors|skipped).*) in [\d.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def order(todo: list[Step]) -> list[Step]:
    """Longest expected step first (stable for equal estimates)."""
    return sorted(todo, key=lambda s: -EXPECTED_S.get(s.name, 60))


def _prepare_all(todo: list[Step]) -> None:
    """Create each environment and bring its dependencies in sync (``hatch run ENV:python``
    does both), one environment at a time and once per environment, before any step runs in it.
    `hatch run` syncs an environment whose dependencies changed before it runs anything; two
    steps sharing such an environment (a machine that kept its environments from an earlier
    run) would run pip into it side by side, and one of them fail."""
    done: dict[str, tuple[int, str]] = {}
    for s in todo:
        if s.env not in done:
            t0 = time.monotonic()
            r = subprocess.run(
                _hatch("run", f"{s.env}:python", "-c", ""),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            done[s.env] = (r.returncode, r.stdout)
            s.create_s = time.monotonic() - t0
        s.create_rc, s.create_log = done[s.env]
        s.created.set()
    _all_created.set()


_print_lock = threading.Lock()


def _say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


def _run_step(s: Step, extra: list[str], prefix: bool) -> None:
    s.created.wait()
    _say(f"\n== {s.name}: environment {s.env} ready in {s.create_s:.0f} s")
    if s.create_rc != 0:
        _say(s.create_log[-8000:])
        _say(f"== {s.name}: creating {s.env} failed (exit {s.create_rc})")
        s.rc = s.create_rc
        return
    cmd = _hatch("run", *s.script.split())
    if s.takes_args:
        cmd += extra
    t0 = time.monotonic()
    s.start_s = t0 - _T0[0]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert proc.stdout is not None
    tag = f"[{s.name}] " if prefix else ""
    in_failures = False
    for line in proc.stdout:
        line = line.rstrip("\n")
        sec = SECTION.match(line)
        if sec:
            in_failures = sec.group("title").strip() in FAILURE_SECTIONS
        if in_failures:
            s.failure_lines.append(line)
        elif line.startswith(("FAILED ", "ERROR ")):
            s.failed_ids.append(line)
        m = SUMMARY.match(line)
        if m:
            for n, what in COUNT.findall(m.group("counts")):
                key = "errors" if what.startswith("error") else what
                s.counts[key] = s.counts.get(key, 0) + int(n)
        _say(tag + line)
    s.rc = proc.wait()
    s.run_s = time.monotonic() - t0
    s.end_s = s.start_s + s.run_s
    _say(f"== {s.name}: exit {s.rc} after {s.run_s:.0f} s")


def env_order(todo: list[Step]) -> list[Step]:
    """The steps in the order their environments are created: the environment whose steps are
    expected to take longest in all first (core's, which seven steps share), each environment
    once, at its first step."""
    work: dict[str, float] = {}
    for s in todo:
        work[s.env] = work.get(s.env, 0) + EXPECTED_S.get(s.name, 60)
    return sorted(todo, key=lambda s: -work[s.env])


#: steps whose tests mostly compute (multi-rank runs, XLA compiles): at most :data:`MAX_HEAVY` of
#: them run at once, whatever the lanes; the others mostly wait on ssh hosts, emulators, Slurm
HEAVY = frozenset(
    {
        "core",
        "core-runs",
        "core-ft",
        "idioms",
        "cross",
        "backend-xla",
        "backend-neuron",
        "backend-cuda",
    }
)
MAX_HEAVY = 2
#: the run's start (:func:`time.monotonic`), for each step's start and end in the closing table
_T0 = [time.monotonic()]
_running: set[str] = set()
#: set once every environment exists: lanes beyond the second start then (pip's installs are
#: the other work on the machine until that point)
_all_created = threading.Event()


def set_max_heavy(n: int) -> None:
    """At most ``n`` :data:`HEAVY` steps at once (``AIOS_CI_HEAVY``; default 2)."""
    global MAX_HEAVY
    MAX_HEAVY = n


def take(queue: list[Step], running: set[str] | frozenset[str] = frozenset()) -> Step | None:
    """What a free lane runs next, among the waiting steps whose environment is ready (None if
    none is yet: a lane never idles behind a step whose environment is still installing while
    another could run). While fewer than :data:`MAX_HEAVY` heavy steps run, the longest heavy
    one: the heavy steps' two slots bound the whole run (their seconds, halved, are its
    length), so a slot never waits while a lane runs a step that mostly waits. Else the longest
    of the others."""
    heavy = len(HEAVY & set(running))
    ready = [i for i, s in enumerate(queue) if s.created.is_set()]
    if heavy < MAX_HEAVY:
        for i in ready:
            if queue[i].name in HEAVY:
                return queue.pop(i)
    for i in ready:
        if queue[i].name not in HEAVY:
            return queue.pop(i)
    return None


def _lane(queue: list[Step], extra: list[str], prefix: bool, index: int = 0) -> None:
    if index >= MAX_HEAVY:
        _all_created.wait()
    while True:
        with _print_lock:
            if not queue:
                return
            s = take(queue, frozenset(_running))
            if s is not None:
                _running.add(s.name)
        if s is None:
            time.sleep(1)
            continue
        try:
            _run_step(s, extra, prefix)
        finally:
            with _print_lock:
                _running.discard(s.name)


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
    lanes_env = os.environ.get("AIOS_CI_LANES", "4")
    if not lanes_env.isdigit() or int(lanes_env) < 1:
        print(
            f"ci: AIOS_CI_LANES={lanes_env!r} is not a positive integer; unset it or set 1, 2, ...",
            file=sys.stderr,
        )
        return 2
    heavy_env = os.environ.get("AIOS_CI_HEAVY", str(MAX_HEAVY))
    if not heavy_env.isdigit() or int(heavy_env) < 1:
        print(
            f"ci: AIOS_CI_HEAVY={heavy_env!r} is not a positive integer; unset it or set 1, 2, ...",
            file=sys.stderr,
        )
        return 2
    set_max_heavy(int(heavy_env))
    lanes = min(int(lanes_env), len(todo))
    queue = order(todo)

    creator = threading.Thread(target=_prepare_all, args=(env_order(queue),), daemon=True)
    creator.start()
    t_all = _T0[0] = time.monotonic()
    workers = [
        threading.Thread(target=_lane, args=(queue, extra, lanes > 1, i), daemon=True)
        for i in range(lanes)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total = time.monotonic() - t_all

    for s in todo:
        if s.rc != 0 and (s.failure_lines or s.failed_ids):
            print(f"\n== {s.name}: what failed (printed above, again here)")
            text = "\n".join(s.failure_lines)
            if len(text) > FAILURE_TAIL_CHARS:
                text = "[...]\n" + text[-FAILURE_TAIL_CHARS:]
            if text:
                print(text)
            for line in s.failed_ids:
                print(line)
    print(f"\n== summary ({lanes} lane(s); install overlaps the tests)")
    print(f"{'step':<16}{'install s':>10}{'tests s':>10}{'from':>7}{'to':>7}  result")
    for s in todo:
        res = "passed" if s.rc == 0 else f"FAILED (exit {s.rc})"
        span = f"{s.start_s:>7.0f}{s.end_s:>7.0f}"
        print(f"{s.name:<16}{s.create_s:>10.0f}{s.run_s:>10.0f}{span}  {res}")
    failed = [s.name for s in todo if s.rc != 0]
    print(f"{'total':<16}{'':>10}{total:>10.0f}  {len(todo) - len(failed)}/{len(todo)} passed")
    tot = {
        k: sum(s.counts.get(k, 0) for s in todo) for k in ("passed", "failed", "skipped", "errors")
    }
    print(
        f"ci: {tot['passed']} passed, {tot['failed'] + tot['errors']} failed, "
        f"{tot['skipped']} skipped"
    )
    if failed:
        print(f"ci: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
