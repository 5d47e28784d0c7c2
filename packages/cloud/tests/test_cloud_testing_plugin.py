"""aios-cloud's pytest plugin (entry point pytest11): real sshd hosts, skipped loudly by aios's
end-of-session summary when sshd is missing, and a failure under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

INNER = """
import aios_cloud.testing.sshd as sshd

sshd.SSHD = "/nonexistent/sshd"  # as on a bare machine without openssh-server


def test_needs_hosts(sshd_cluster):
    sshd_cluster(1)


def test_needs_slice(sshd_hosts):
    pass


def test_plain():
    pass
"""


def _pytest(tmp_path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
    }
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plugin_is_registered_through_pytest11():
    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("aios-cloud") == "aios_cloud.testing.plugin"
    assert eps.get("aios") == "aios.testing.plugin"  # core's: loud skips, free_port, aios_cli


def test_missing_sshd_skips_loudly_and_ci_turns_it_into_a_failure(tmp_path):
    r = _pytest(tmp_path, {})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "aios: skipped tests (2)" in r.stdout
    assert "2 skipped: sshd not found: apt-get install openssh-server" in r.stdout
    ci = _pytest(tmp_path, {"CI": "true"})
    assert ci.returncode == 1, ci.stdout
    # the factory fails in the test, the sshd_hosts fixture errors in setup: neither passes
    assert "1 failed, 1 passed, 1 error" in ci.stdout and "CI is set" in ci.stdout
