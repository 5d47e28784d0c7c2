"""The third-party cloud template (examples/cloud-plugin-template), installed with pip, is a
cloud of aios without any change to aios: it passes the provider contract kit against real
sshd machines (its pool), and `aios launch --cloud pool` trains on two of them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.testing.provider_contract import ProviderContract, run_aios

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def template_site(install_plugin, root: Path) -> Path:
    target = install_plugin(root / "examples" / "cloud-plugin-template")
    return target


@pytest.fixture
def pool(sshd_cluster: Any) -> Any:
    cluster = sshd_cluster(2, netns=True)
    for h in cluster.hosts:  # the machines' python3 has torch, as a lab's training machines do
        tool = h.confdir / "bin" / "python3"
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        tool.chmod(0o755)
    return cluster


def pool_env(pool: Any, site: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_HOME": str(tmp_path / "aios-home"),
            "AIOS_PLUGINS": "aios-cloud,aios-cloud-template",
            "AIOS_POOL__HOSTS": json.dumps([f"{pool.user}@{h.ip}:{h.port}" for h in pool.hosts]),
            "AIOS_POOL__IDENTITY": str(pool.client_key),
            "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "COLUMNS": "200",
        }
    )
    return env


class TestCloudTemplateContract(ProviderContract):
    cloud = "pool"
    accelerators = {"cpu": "cpu"}

    @pytest.fixture
    def cli_env(self, pool: Any, template_site: Path, tmp_path: Path) -> dict[str, str]:
        return pool_env(pool, template_site, tmp_path)

    @pytest.fixture
    def provider(
        self, cli_env: dict[str, str], template_site: Path, monkeypatch: pytest.MonkeyPatch
    ) -> CloudProvider:
        monkeypatch.syspath_prepend(str(template_site))
        for k, v in cli_env.items():
            monkeypatch.setenv(k, v)
        from aios.config.schema import resolve
        from aios.plugins.registry import reset_registry

        reset_registry()
        from aios_cloud.records import get_provider

        return get_provider("pool", resolve(check_backend=False))

    def cluster_request(self, provider: CloudProvider, name: str) -> ClusterRequest:
        return provider.validate(
            ClusterRequest(name=name, accelerator="cpu", nodes=2, labels={"aios-cluster": name})
        )


def test_cloud_template_launch_trains_on_two_leased_machines(
    pool: Any, template_site: Path, tmp_path: Path
) -> None:
    env = pool_env(pool, template_site, tmp_path)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(
        "import aios, torch\nrt = aios.init()\n"
        "t = rt.all_reduce(torch.full((1,), float(rt.rank + 1)), op='sum')\n"
        "print('pool rank', rt.rank, 'of', rt.world_size, 'sum', int(t.item()), flush=True)\n"
    )
    r = run_aios(
        env, "launch", "--cloud", "pool", "-a", "cpu", "--nodes", "2", "--name", "lab",
        "--workdir", str(work), "--poll", "0.5", "train.py", timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pool rank 0 of 2 sum 3" in r.stdout and "pool rank 1 of 2 sum 3" in r.stdout
    # the machines carry the cluster's key while leased; down takes it back and ends the lease
    assert all("aios-pool-lab" in (h.home / ".ssh/authorized_keys").read_text() for h in pool.hosts)
    assert run_aios(env, "down", "lab").returncode == 0
    for h in pool.hosts:
        assert "aios-pool-lab" not in (h.home / ".ssh/authorized_keys").read_text()
    leases = json.loads((tmp_path / "aios-home" / "pool-leases.json").read_text())
    assert leases == {}
