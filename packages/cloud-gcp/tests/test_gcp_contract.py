"""The provider contract kit (aios_cloud.testing.provider_contract) for Cloud TPU, against the
local Cloud TPU service (the real google-cloud-tpu REST client; its rules in
aios_cloud_gcp.testing) with real sshd hosts as the slice's machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.testing.provider_contract import ProviderContract
from aios_cloud_gcp.provider import GcpProvider
from aios_cloud_gcp.settings import GcpSettings

ZONES = {"v4": ["us-central2-b", "us-central2-c"], "v5e": ["us-west4-a", "us-central1-a"]}


class _Cfg:
    def __init__(self, settings: GcpSettings) -> None:
        self.settings = settings

    def section(self, name: str) -> Any:
        return self.settings if name == "gcp" else None


class TestGcpContract(ProviderContract):
    cloud = "gcp"
    # a single-host slice, a multi-host slice (one create, several TPU VMs)
    accelerators = {"tpu": "v5litepod-8", "tpu-pod": "v4-16"}
    lifecycle_accelerator = "v5litepod-8"

    @pytest.fixture
    def provider(self, fake_tpu: Any) -> CloudProvider:
        s = GcpSettings(
            project="aios-test",
            endpoint=fake_tpu.url,
            credentials="anonymous",
            poll_interval=0.02,
            ssh_user="root",
            zones=ZONES,
        )
        return GcpProvider(_Cfg(s))

    @pytest.fixture
    def cli_env(self, fake_tpu: Any, gcp_env: Any, tmp_path: Path) -> dict[str, str]:
        env: dict[str, str] = gcp_env(tmp_path, fake_tpu)
        return env
