"""The aios pytest plugin (entry point pytest11): fixtures and loud skips. The sshd fixtures
and their loud-skip test live in aios-cloud (packages/cloud/tests/test_cloud_testing_plugin.py)."""

from __future__ import annotations

import json
import os
import socket
import textwrap
from importlib.metadata import entry_points

import aios


def test_plugin_is_registered_through_pytest11():
    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("aios") == "aios.testing.plugin"


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
