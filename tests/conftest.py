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
    "aios-cloud": "cloud",
    "aios-cloud-gcp": "cloud-gcp",
    "aios-cloud-aws": "cloud-aws",
    "aios-cloud-slurm": "cloud-slurm",
    "aios-cloud-k8s": "cloud-k8s",
}


@pytest.fixture
def clean_env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "PJRT_", "TPU_", "NEURON_"))
    }
    env["AIOS_HOME"] = str(tmp_path / "aios-home")
    env["COLUMNS"] = "200"
    return env


# aios_cli (the CLI in a subprocess with a clean environment, AIOS_HOME under tmp_path) comes from
# the aios pytest plugin (aios.testing.plugin)


@pytest.fixture(scope="session")
def first_party():
    return dict(FIRST_PARTY)


@pytest.fixture(scope="session")
def root():
    return ROOT


def _pip_install_target(source: Path, target: Path) -> Path:
    """A plugin from ``source`` installed with pip into the folder ``target`` (put it on
    PYTHONPATH to load it), as a third party would install theirs; offline, no dependencies."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return target


@pytest.fixture(scope="session")
def install_plugin(tmp_path_factory):
    """``install_plugin(source)``: the plugin folder ``source`` pip-installed into a fresh folder,
    returned (see :func:`_pip_install_target`)."""
    return lambda source: _pip_install_target(
        Path(source), tmp_path_factory.mktemp(Path(source).name + "-site")
    )
