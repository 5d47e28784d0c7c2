"""An AiosError escaping a user script ends it with one line and exit status 2."""

from __future__ import annotations

import os
import subprocess

from aios.testing.zygote import python

SCRIPT = """
import aios
from aios.errors import ConfigError
rt = aios.init()
print("started", flush=True)
raise ConfigError("widget limit exceeded at step 4", "raise widget.limit")
"""


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"), **extra)
    return env


def test_aios_error_in_script_is_one_line_exit_2(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    res = subprocess.run(
        [*python(), str(script)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stdout.strip() == "started"
    assert (
        res.stderr.strip().splitlines()[-1]
        == "aios: error: widget limit exceeded at step 4; raise widget.limit"
    )
    assert "Traceback" not in res.stderr


def test_aios_error_in_script_keeps_traceback_with_debug(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    res = subprocess.run(
        [*python(), str(script)],
        capture_output=True,
        text=True,
        env=_env(tmp_path, AIOS_DEBUG="1"),
        timeout=120,
    )
    assert res.returncode == 1 and "Traceback" in res.stderr and "ConfigError" in res.stderr
