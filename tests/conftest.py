"""Cross-package tests: they run with every local package installed (hatch env `cross`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {
    "aios-core": "core",
    "aios-backend-xla": "backend-xla",
    "aios-backend-neuron": "backend-neuron",
    "aios-backend-cuda": "backend-cuda",
    "aios-cloud-gcp": "cloud-gcp",
    "aios-cloud-aws": "cloud-aws",
}


@pytest.fixture
def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "PJRT_", "TPU_", "NEURON_"))}
    env["AIOS_HOME"] = str(tmp_path / "aios-home")
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def aios_cli(clean_env, tmp_path):
    def run(*args, env=None, prog="aios", pythonpath=None, timeout=300):
        full = dict(clean_env)
        if pythonpath:
            full["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + [full.get("PYTHONPATH", "")])
        full.update(env or {})
        mod = "aios.cli.main" if prog == "aios" else "aios.cli.run"
        code = f"import sys; sys.argv[0] = {prog!r}; from {mod} import main; main()"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full, cwd=tmp_path, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def first_party():
    return dict(FIRST_PARTY)


@pytest.fixture(scope="session")
def root():
    return ROOT
