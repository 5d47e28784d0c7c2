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
        "ci: unknown step(s) kore; choose from lint, core, cloud, backend-cuda, cloud-gcp, "
        "cloud-aws, backend-xla, backend-neuron, cloud-slurm, cloud-k8s, cross, test-tpu"
    ], r.stderr
