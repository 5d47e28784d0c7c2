"""Every `aios launch` command packages/cloud-gcp/README.md prints, run as printed against the
local Cloud TPU service, as dry runs (a real launch needs Google's TPUs; test_gcp_e2e.py runs the
launch itself on the stand-in)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.testing.readme import as_dry_run, readme_commands

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = readme_commands(README)


def test_the_readme_prints_these_commands() -> None:
    assert len(COMMANDS) == 3, COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[2:6]))
def test_readme_launch_command_as_a_dry_run(
    cmd: list[str], bare_tpu: Any, gcp_env: Any, tmp_path: Path
) -> None:
    env = gcp_env(tmp_path, bare_tpu)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *as_dry_run(cmd)[1:]],
        env=env, cwd=work, text=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "# dry run" in r.stdout and "gcloud compute tpus" in r.stdout
    assert not bare_tpu.nodes, "a dry run created a TPU"
