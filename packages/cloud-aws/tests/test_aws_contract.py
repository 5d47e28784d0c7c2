"""The provider contract kit (aios_cloud.testing.provider_contract) for EC2, against moto's EC2,
IAM and SSM behind the proxy that enforces EC2's own rules (aios_cloud_aws.testing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.testing.provider_contract import ProviderContract


class TestAwsContract(ProviderContract):
    cloud = "aws"
    # a GPU instance type and a Trainium one (Neuron DLAMI), each on its own image
    accelerators = {"gpu": "p4d.24xlarge", "trainium": "trn1.2xlarge"}
    lifecycle_accelerator = "trn1.2xlarge"
    pubkey = ""

    @pytest.fixture
    def provider(self, make_provider: Any, pubkey: str) -> CloudProvider:
        self.pubkey = pubkey
        p: CloudProvider = make_provider()
        return p

    @pytest.fixture
    def cli_env(self, aws: Any, tmp_path: Path) -> dict[str, str]:
        # the process environment points boto3 at moto (aws fixture); the CLI inherits it
        return {**os.environ, "AIOS_HOME": str(tmp_path / "aios-home"), "COLUMNS": "200"}

    def cluster_request(self, provider: CloudProvider, name: str) -> ClusterRequest:
        return provider.validate(
            ClusterRequest(
                name=name,
                accelerator=self.lifecycle_accelerator or "trn1.2xlarge",
                zone="us-east-1b",
                labels={"aios-cluster": name},
                ssh_public_key=self.pubkey,
            )
        )
