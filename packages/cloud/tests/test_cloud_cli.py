"""Cloud commands without any cloud: clear one-line errors, empty status, help without imports."""

from __future__ import annotations

import os
import subprocess
import sys


def _aios(tmp_path, *args, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    full.update(
        AIOS_HOME=str(tmp_path / "home"),
        AIOS_DISABLE_PLUGINS="aios-cloud-gcp,aios-cloud-aws,aios-cloud-slurm,aios-cloud-k8s",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cloud_cli_without_clusters_or_clouds(tmp_path):
    r = _aios(tmp_path, "status")
    assert r.returncode == 0 and "no clusters" in r.stdout
    r = _aios(tmp_path, "status", "--json")
    assert r.returncode == 0 and r.stdout.strip() == "[]"
    for args, msg in (
        (("exec", "nosuch", "ls"), "no cluster named 'nosuch'"),
        (("logs", "nosuch"), "no cluster named 'nosuch'"),
        (("down", "nosuch"), "no cluster named 'nosuch'"),
        (("catalog",), "no cloud plugin is installed"),
        (("launch", "--cloud", "gcp", "-a", "v4-8", "x.py"), "script x.py not found"),
        (("cost", "--params", "1B"), "needs --accelerator with --hours, or --params and --tokens"),
    ):
        r = _aios(tmp_path, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0], (args, r.stderr)
    (tmp_path / "x.py").write_text("")
    r = _aios(
        tmp_path, "launch", "--cloud", "gcp", "-a", "v4-8", "--workdir", str(tmp_path), "x.py"
    )
    assert (
        r.returncode == 2
        and "cloud 'gcp' is not installed; run: pip install -e './packages/core[gcp]' "
        "./packages/cloud ./packages/backend-xla ./packages/cloud-gcp"
        in r.stderr
    )
