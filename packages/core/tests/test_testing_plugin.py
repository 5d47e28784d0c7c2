"""The aios pytest plugin (entry point pytest11): fixtures and loud skips."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import aios

INNER = """
import aios.testing.sshd as sshd

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
    assert eps.get("aios") == "aios.testing.plugin"


def test_missing_sshd_skips_loudly_and_ci_turns_it_into_a_failure(tmp_path):
    r = _pytest(tmp_path, {})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "aios: skipped tests (2)" in r.stdout
    assert "2 skipped: sshd not found: apt-get install openssh-server" in r.stdout
    ci = _pytest(tmp_path, {"CI": "true"})
    assert ci.returncode == 1, ci.stdout
    # the factory fails in the test, the sshd_hosts fixture errors in setup: neither passes
    assert "1 failed, 1 passed, 1 error" in ci.stdout and "CI is set" in ci.stdout


def test_free_port_is_bindable(free_port):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert free_port() > 0


def test_aios_cli_subprocess_and_in_process_agree(aios_cli, monkeypatch):
    monkeypatch.setenv("AIOS_PRECISION", "fp16-mixed")  # a clean environment: not seen by the CLI
    sub = aios_cli("config", "show", "--json", "seed=7")
    inproc = aios_cli("config", "show", "--json", "seed=7", in_process=True)
    for r in (sub, inproc):
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["seed"] == 7 and data["precision"] == "fp32"
    bad = aios_cli("config", "validate", "strategy=bogus", in_process=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().startswith("aios: error: invalid value 'bogus' for 'strategy'")
    assert os.environ["AIOS_PRECISION"] == "fp16-mixed"  # restored after the in-process run
    version = aios_cli("--version", in_process=True)
    assert version.returncode == 0 and aios.__version__ in version.stdout


def test_aios_cli_runs_aios_run(aios_cli, tmp_path):
    (tmp_path / "t.py").write_text(textwrap.dedent("print('hi')\n"))
    r = aios_cli("--dry-run", "--json", "t.py", prog="aios-run", env={"AIOS_PLUGINS": "aios-core"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["backend"] == "cpu"
