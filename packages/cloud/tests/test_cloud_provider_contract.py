"""The provider contract kit (aios_cloud.testing.provider_contract) for the ssh cloud, against
real sshd hosts in network namespaces (the hosts are the user's machines: no stand-in). The
hosts' ``python3`` has torch, as a user's training hosts do, so no launch passes ``--python``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.sshhosts.provider import SshHostsProvider
from aios_cloud.testing.provider_contract import ProviderContract

pytestmark = pytest.mark.slow


def give_hosts_python3(cluster: Any) -> None:
    """``python3`` on the hosts' PATH is this interpreter (it has torch), as on a user's GPU box."""
    for h in cluster.hosts:
        bindir = h.confdir / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        tool = bindir / "python3"
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        tool.chmod(0o755)


@pytest.fixture
def lab(sshd_cluster: Any) -> Any:
    cluster = sshd_cluster(2, netns=True)
    give_hosts_python3(cluster)
    return cluster


class TestSshHostsContract(ProviderContract):
    cloud = "ssh"
    accelerators = {"cpu": "cpu", "auto": "auto"}
    lab: Any = None

    @pytest.fixture(autouse=True)
    def _hosts(self, lab: Any) -> None:
        self.lab = lab
        hosts = ",".join(f"{lab.user}@{h.ip}:{h.port}" for h in lab.hosts)
        self.launch_args = ["--hosts", hosts, "--identity", str(lab.client_key)]

    def launch_options(self) -> dict[str, Any]:
        return {"hosts": self.launch_args[1], "ssh_key": self.launch_args[3]}

    @pytest.fixture
    def provider(self) -> CloudProvider:
        return SshHostsProvider()

    @pytest.fixture
    def cli_env(self, tmp_path: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
        env.update({"AIOS_HOME": str(tmp_path / "aios-home"), "AIOS_PLUGINS": "aios-cloud"})
        return env
