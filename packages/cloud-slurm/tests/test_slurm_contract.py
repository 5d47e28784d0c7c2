"""The provider contract kit (aios_cloud.testing.provider_contract) for Slurm, against a real
Slurm (slurmctld and two slurmd on this machine, munge)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.testing.provider_contract import ProviderContract


class TestSlurmContract(ProviderContract):
    cloud = "slurm"
    accelerators = {"cpu": "debug"}  # the test cluster's partition (CPU nodes)

    @pytest.fixture
    def cli_env(self, aios_env: Any) -> dict[str, str]:
        env: dict[str, str] = aios_env()
        return env

    @pytest.fixture
    def provider(self, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> CloudProvider:
        from aios.config.schema import resolve
        from aios_cloud_slurm.provider import SlurmProvider

        for k, v in cli_env.items():
            monkeypatch.setenv(k, v)
        return SlurmProvider(resolve(check_backend=False))

    @pytest.fixture
    def project(self, tmp_path: Path) -> Path:
        work = tmp_path / "kit-project"
        work.mkdir()
        (work / "train.py").write_text("print('kit on slurm', flush=True)\n")
        return work
