"""Every `aios launch` command packages/cloud/README.md prints, run as printed: the one whose
hosts and key a test can give (a hosts file of real sshd hosts, the key at ~/.ssh/lab_ed25519)
for real, the others (hosts that are not here, GPUs, an NFS mount) as dry runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.testing.readme import as_dry_run, readme_commands

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = readme_commands(README)


def run(env: dict[str, str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert argv[:1] == ["aios"]
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *argv[1:]],
        env=env, cwd=cwd, text=True, capture_output=True, timeout=600,
    )  # fmt: skip


@pytest.fixture
def lab(sshd_cluster: Any, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A user's home (~/.ssh/lab_ed25519), a project with lab.txt listing two real hosts whose
    python3 has torch."""
    cluster = sshd_cluster(2, netns=True)
    for h in cluster.hosts:
        tool = h.confdir / "bin" / "python3"
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        tool.chmod(0o755)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(cluster.client_key, home / ".ssh" / "lab_ed25519")
    os.chmod(home / ".ssh" / "lab_ed25519", 0o600)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "lab.txt").write_text(
        "# the lab\n" + "".join(f"{cluster.user}@{h.ip}:{h.port}\n" for h in cluster.hosts)
    )
    (work / "train.py").write_text(
        "import aios\nrt = aios.init()\n"
        "print('readme rank', rt.rank, 'of', rt.world_size, flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "SSH_AUTH"))}
    env.update(
        {
            "HOME": str(home),
            "AIOS_HOME": str(tmp_path / "aios-home"),
            # -a gpu: the GPU hosts a user has run the cuda backend, installed with it
            "AIOS_PLUGINS": "aios-cloud,aios-backend-cuda",
        }
    )
    return env, work


def test_the_readme_prints_these_commands() -> None:
    assert len(COMMANDS) == 5, COMMANDS


def test_readme_hosts_file_command_trains_as_printed(lab: tuple[dict[str, str], Path]) -> None:
    env, work = lab
    (cmd,) = [c for c in COMMANDS if "--identity" in c]
    r = run(env, cmd, work)
    # the lines that say why, wherever they are (a host's shutdown noise can fill any tail)
    why = [
        ln for ln in (r.stdout + r.stderr).splitlines() if "error" in ln.lower() or "failed" in ln
    ]
    assert r.returncode == 0, "\n".join(why[:40]) + "\n...\n" + r.stderr[-2000:]
    # 2 hosts x --nprocs-per-host 2
    for rank in range(4):
        assert f"readme rank {rank} of 4" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize(
    "which",
    ["--hosts ubuntu@", "--max-restarts 3 --checkpoint", "--min-hosts", "--hosts root@gw:2201"],
)
def test_readme_commands_needing_other_hosts_as_dry_runs(
    lab: tuple[dict[str, str], Path], which: str
) -> None:
    env, work = lab
    (cmd,) = [c for c in COMMANDS if which in " ".join(c)]
    r = run(env, as_dry_run(cmd), work)
    assert r.returncode == 0, r.stderr
    assert "# dry run" in r.stdout and "torch.distributed.run" in r.stdout
    assert not Path(env["AIOS_HOME"]).exists()
    if "/2222" in " ".join(cmd):  # the head reaches the last host on its own port inside
        assert "known_hosts -p 2222 root@gw " in r.stdout and "known_hosts -p 2203 " not in r.stdout
