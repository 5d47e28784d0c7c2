"""The plugin module imports fast; dry runs and the catalog never import torch or google."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_gcp_plugin_import_and_dry_run_stay_light(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    code = textwrap.dedent(f"""
        import sys
        import aios_cloud_gcp.plugin
        assert not [m for m in sys.modules if m.startswith(("google", "torch", "gcsfs"))], "plugin import"
        from click.testing import CliRunner
        from aios.cli.main import cli
        r = CliRunner().invoke(cli, ["launch", "--cloud", "gcp", "-a", "v5litepod-8", "--spot",
                                     "--workdir", {str(tmp_path)!r}, "--dry-run", "train.py"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(cli, ["catalog", "--cloud", "gcp"])
        assert r.exit_code == 0, r.output
        heavy = sorted(m for m in sys.modules if m.startswith(("google.cloud", "google.auth", "torch", "gcsfs")))
        assert not heavy, heavy
        print("light")
    """)
    env = {
        **os.environ,
        "AIOS_HOME": str(tmp_path / "home"),
        "AIOS_GCP__PROJECT": "p",
        "AIOS_PLUGINS": "aios-cloud-gcp,aios-backend-xla",
    }
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("light"), r.stdout + r.stderr
