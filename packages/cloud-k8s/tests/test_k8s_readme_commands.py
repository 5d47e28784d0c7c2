"""Every `aios launch` command packages/cloud-k8s/README.md prints, run as printed (with the
image it exports), as dry runs against the Kubernetes API stand-in: the manifests a launch
applies (a real launch on GKE TPU slices or EKS Trainium needs those clusters;
test_k8s_cli.py launches on the stand-in)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aios_cloud.testing.readme import as_dry_run, readme_commands, readme_exports

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = readme_commands(README)


def test_the_readme_prints_these_commands() -> None:
    assert len(COMMANDS) == 3, COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[4])
def test_readme_launch_command_as_a_dry_run(
    cmd: list[str], kube: Any, k8s_env: Any, tmp_path: Path
) -> None:
    exports = readme_exports(README)
    env = {**k8s_env(kube), **exports}
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *as_dry_run(cmd)[1:]],
        env=env, cwd=work, text=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout.split("\n", 1)[1]) if d]
    assert {d["kind"] for d in docs} & {"JobSet", "Job"}, r.stdout[:2000]
    assert exports["AIOS_K8S__IMAGE"] in r.stdout
