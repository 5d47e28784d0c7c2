"""scripts/ci.py (what `hatch run ci:all` runs) covers every hatch environment the README's test
command promises, and refuses an unknown step by name."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _ci():
    spec = importlib.util.spec_from_file_location("aios_ci_runner", ROOT / "scripts" / "ci.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_ci_runs_every_matrix_package_and_every_other_test_environment():
    hatch = tomllib.loads((ROOT / "hatch.toml").read_text())
    matrix = hatch["envs"]["test"]["matrix"][0]["pkg"]
    steps = {s.name: s for s in _ci().steps()}
    assert [n for n in steps if n in matrix] == matrix  # all of them, in the matrix's order
    packages = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "tests").is_dir())
    assert sorted(matrix) == packages  # every package with tests is in the matrix
    for name in ("lint", "cross", "test-tpu"):
        env = steps[name].env
        assert env in hatch["envs"] and "run" in hatch["envs"][env]["scripts"], name
    assert hatch["envs"]["ci"]["scripts"]["all"].startswith("python scripts/ci.py")


def test_ci_unknown_step_is_one_line_exit_2():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "kore"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ci: unknown step(s) kore; choose from lint, core, core-runs, core-ft, cloud, backend-cuda, "
        "cloud-gcp, cloud-aws, backend-xla, backend-neuron, cloud-slurm, cloud-k8s, cross, "
        "idioms, test-tpu"
    ], r.stderr


def test_ci_runs_steps_side_by_side_and_counts_every_steps_tests(tmp_path):
    """Two lanes: each step's lines carry its name, a failing step fails the run without
    stopping the other, and the closing line adds up pytest's counts over all steps."""
    hatch = tmp_path / "hatch"
    hatch.write_text(
        "#!/usr/bin/env python3\n"
        "import sys\n"
        "args = sys.argv[1:]\n"
        "if args[:2] == ['env', 'create'] or args[2:3] == ['-c']:\n"
        "    sys.exit(0)\n"
        "if 'cloud-k8s' in ' '.join(args):\n"
        "    print('===== FAILURES =====')\n"
        "    print('____ test_apply ____')\n"
        "    print('E   assert 3 == 4')\n"
        "    print('===== short test summary info =====')\n"
        "    print('FAILED packages/cloud-k8s/tests/test_x.py::test_apply - assert 3 == 4')\n"
        "    print('===== 1 failed, 3 passed, 2 skipped in 1.50s =====')\n"
        "    sys.exit(1)\n"
        "print('===== 7 passed in 0.20s =====')\n"
    )
    hatch.chmod(0o755)
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "cloud-k8s", "lint"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "AIOS_CI_HATCH": str(hatch), "AIOS_CI_LANES": "2"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[cloud-k8s] ===== 1 failed, 3 passed, 2 skipped in 1.50s =====" in r.stdout
    assert "[lint] ===== 7 passed in 0.20s =====" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "ci: 10 passed, 1 failed, 2 skipped"
    assert "ci: failed: cloud-k8s" in r.stderr
    # the failure is printed again just above the closing table, where the tail shows it
    again = r.stdout.split("== cloud-k8s: what failed")[1].split("== summary")[0]
    assert again.splitlines()[1:] == [
        "===== FAILURES =====",
        "____ test_apply ____",
        "E   assert 3 == 4",
        "FAILED packages/cloud-k8s/tests/test_x.py::test_apply - assert 3 == 4",
        "",
    ], again
    assert "[lint]" not in again
    # the closing table says when each step ran, from the run's start
    table = r.stdout.split("== summary")[1].splitlines()
    assert table[1].split() == ["step", "install", "s", "tests", "s", "from", "to", "result"]
    rows = {line.split()[0]: line.split() for line in table[2:4]}
    for name in ("cloud-k8s", "lint"):
        start, end = float(rows[name][3]), float(rows[name][4])
        assert 0 <= start <= end, rows


def test_ci_lanes_take_the_longest_step_first_and_refuse_a_bad_lane_count():
    ci = _ci()
    names = [s.name for s in ci.order(ci.steps())]
    longest = max(ci.EXPECTED_S, key=lambda n: ci.EXPECTED_S[n])
    assert names[0] == longest and names[-1] == "lint"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "lint"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "AIOS_CI_LANES": "zero"},
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ci: AIOS_CI_LANES='zero' is not a positive integer; unset it or set 1, 2, ..."
    ]
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "lint"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "AIOS_CI_HEAVY": "0"},
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ci: AIOS_CI_HEAVY='0' is not a positive integer; unset it or set 1, 2, ..."
    ]


def test_ci_keeps_at_most_the_chosen_number_of_computing_steps_at_once():
    ci = _ci()
    heavy = sorted(ci.HEAVY)
    for cap in (1, 2, 3):
        ci.set_max_heavy(cap)
        queue = [s for s in ci.steps() if s.name in ci.HEAVY]
        for s in queue:
            s.created.set()
        running = set(heavy[:cap])
        assert ci.take(queue, running) is None  # the cap is reached: the lane waits
        assert ci.take(queue, set(heavy[: cap - 1])).name in ci.HEAVY
    ci.set_max_heavy(2)


def test_a_package_tested_in_another_environment_has_everything_its_own_would_add():
    """scripts/ci.py runs some packages' tests in another matrix environment (fewer installs on
    CI's two cores). That environment must add every dependency and variable the package's own
    adds (hatch.toml's overrides), and the step must run that package's tests only."""
    hatch = tomllib.loads((ROOT / "hatch.toml").read_text())
    overrides = hatch["envs"]["test"]["overrides"]["matrix"]["pkg"]
    ci = _ci()
    steps = {s.name: s for s in ci.steps()}
    assert ci.SHARED_ENV, "nothing shared: this test checks nothing"
    for pkg, host in ci.SHARED_ENV.items():
        for kind in ("dependencies", "env-vars"):
            for entry in overrides[kind]:
                if pkg in entry["if"]:
                    assert host in entry["if"], (pkg, host, entry)
        step = steps[pkg]
        assert step.env == f"test.{host}"
        assert step.script.split()[:3] == [f"+pkg={host}", "test:tests-of", f"packages/{pkg}/tests"]
        assert all(a.startswith("--ignore=") for a in step.script.split()[3:])
    assert "tests-of" in hatch["envs"]["test"]["scripts"]


FAKE_HATCH_WITH_PIP = """#!/usr/bin/env python3
# hatch as it behaves with an environment kept from an earlier run whose dependencies changed:
# `env create` leaves it as it is, and the first `hatch run` in it syncs it (pip). Two pips in
# one environment at once fail, as pip does when one removes files the other is installing.
import os, sys, time
state = os.environ["FAKE_STATE"]
args = sys.argv[1:]
def sync(env):
    if os.path.exists(f"{state}/{env}.synced"):
        return
    try:
        os.mkdir(f"{state}/{env}.pip")
    except FileExistsError:
        print("ERROR: Could not install packages due to an OSError: [Errno 2] No such file")
        sys.exit(1)
    with open(f"{state}/syncs", "a") as f:
        f.write(env + "\\n")
    time.sleep(1.0)
    open(f"{state}/{env}.synced", "w").close()
    os.rmdir(f"{state}/{env}.pip")
if args[:2] == ["env", "create"]:
    sys.exit(0)
if args[0] == "run" and args[1].endswith(":python"):
    sync(args[1].split(":")[0])
    sys.exit(0)
if args[0] == "run" and args[1].startswith("+pkg="):
    env = "test." + args[1].split("=")[1]
else:
    env = args[1].split(":")[0]
sync(env)
print("===== 2 passed in 0.10s =====")
"""


def test_steps_sharing_an_environment_do_not_sync_it_side_by_side(tmp_path):
    """A machine that kept its environments from an earlier run, whose dependencies changed
    since: the two longest steps (core, and cloud-gcp in core's environment) start together.
    Left to `hatch run`, both would run pip into that environment at once and one would fail
    (CI of stop 31's follow-up: cloud-gcp failed after 50 s). Each environment is synced once,
    before any step runs in it."""
    hatch = tmp_path / "hatch"
    hatch.write_text(FAKE_HATCH_WITH_PIP)
    hatch.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci.py"), "core", "cloud-gcp", "lint"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "AIOS_CI_HATCH": str(hatch),
            "AIOS_CI_LANES": "2",
            "FAKE_STATE": str(state),
        },
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == "ci: 6 passed, 0 failed, 0 skipped"
    assert sorted((state / "syncs").read_text().split()) == ["lint", "test.core"]


def test_a_split_step_and_its_rest_run_every_test_file_once():
    """scripts/ci.py runs some test files as steps of their own (the lanes balance whole steps):
    each split file exists, belongs to its step's folder, and the rest step ignores exactly
    those files, so every test file of the folder runs in one step, once."""
    ci = _ci()
    steps = {s.name: s for s in ci.steps()}
    assert ci.SPLIT, "nothing split: this test checks nothing"
    for name, parts in ci.SPLIT.items():
        rest = steps[name].script.split()
        at = next(i for i, a in enumerate(rest) if a.endswith(":tests-of")) + 1
        folder = rest[at]
        ignored = sorted(a.removeprefix("--ignore=") for a in rest if a.startswith("--ignore="))
        taken = sorted(f for files in parts.values() for f in files)
        assert ignored == taken and len(set(taken)) == len(taken), name
        for part, files in parts.items():
            assert steps[part].env == steps[name].env
            script = steps[part].script.split()
            assert script[script.index(rest[at - 1]) + 1 :] == files
            for f in files:
                assert (ROOT / f).is_file() and f.startswith(folder + "/"), f
        every = {str(p.relative_to(ROOT)) for p in (ROOT / folder).glob("test_*.py")}
        assert set(taken) <= every


#: step seconds where the longest step is a heavy one outside core's environment (as in the
#: run at e3d6a2e), so that the ordering rules below are tested whatever the last run measured
SHAPED_S = {"backend-xla": 1120, "core-runs": 970, "cloud-gcp": 910, "cloud": 870, "core": 740}


def test_environments_for_the_most_work_first_and_lanes_take_only_ready_steps(monkeypatch):
    """The environment most steps share (core's) is created first, however the steps are
    ordered; a lane takes the longest waiting step whose environment is ready, not the longest
    step, so it does not wait behind an environment still installing."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ci
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(ci, "EXPECTED_S", SHAPED_S)
    queue = ci.order(ci.steps())
    assert queue[0].env != "test.core"  # the longest step lives elsewhere (backend-xla)
    envs = list(dict.fromkeys(s.env for s in ci.env_order(queue)))
    assert envs[0] == "test.core" and len(envs) == len({s.env for s in queue})
    assert ci.take(queue) is None  # nothing created yet
    for s in queue:
        if s.env == "test.core":
            s.created.set()
    first = ci.take(queue)
    assert first is not None and first.env == "test.core"
    assert (
        first.name
        == max(
            (s for s in ci.steps() if s.env == "test.core"),
            key=lambda s: ci.EXPECTED_S.get(s.name, 60),
        ).name
    )
    assert all(s.name != first.name for s in queue)


def test_at_most_two_computing_steps_at_once(monkeypatch):
    """With two heavy steps running, a lane passes over the longer heavy steps for a step that
    mostly waits; with one running, it takes the longest."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ci
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(ci, "EXPECTED_S", SHAPED_S)
    queue = ci.order(ci.steps())
    for s in queue:
        s.created.set()
    assert queue[0].name in ci.HEAVY
    light = ci.take(queue, frozenset({"core", "idioms"}))
    assert light is not None and light.name not in ci.HEAVY
    assert light.name == next(s.name for s in ci.order(ci.steps()) if s.name not in ci.HEAVY)
    heavy = ci.take(queue, frozenset({"core"}))
    assert heavy is not None and heavy.name == ci.order(ci.steps())[0].name


def test_a_free_heavy_slot_takes_a_heavy_step_before_a_longer_light_one(monkeypatch):
    """The heavy steps' slots bound the run: while one is free, a lane takes the longest heavy
    step, even with a longer step that mostly waits in the queue; with both slots taken, that
    longer one."""
    ci = _ci()
    monkeypatch.setattr(ci, "EXPECTED_S", {"cloud": 2000, "cloud-gcp": 1900, "core": 300})
    queue = ci.order(ci.steps())
    for s in queue:
        s.created.set()
    assert queue[0].name == "cloud" and "cloud" not in ci.HEAVY
    first = ci.take(queue, frozenset({"core-runs"}))
    assert first is not None and first.name == "core"
    second = ci.take(queue, frozenset({"core-runs", "core"}))
    assert second is not None and second.name == "cloud"
