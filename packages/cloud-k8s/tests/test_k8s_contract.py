"""The provider contract kit (aios_cloud.testing.provider_contract) for Slurm, against a real
Kubernetes API server stand-in (FakeKubeApi: the real client, the API's
validation rules and the JobSet CRD)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider
from aios_cloud.testing.provider_contract import ProviderContract


class TestK8sContract(ProviderContract):
    cloud = "k8s"
    accelerators = {"tpu": "v5litepod-16", "cpu": "cpu"}

    @pytest.fixture(autouse=True)
    def _cli_in_process(self, run_aios: Any) -> None:
        self._run_aios = run_aios

    def aios(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        # the stand-in serves from this process: the CLI runs here too (conftest's run_aios)
        result: subprocess.CompletedProcess[str] = self._run_aios(env, *args)
        return result

    @pytest.fixture
    def cli_env(self, kube: Any, k8s_env: Any) -> dict[str, str]:
        env: dict[str, str] = k8s_env(kube)
        return env

    @pytest.fixture
    def provider(self, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> CloudProvider:
        from aios.config.schema import resolve
        from aios_cloud_k8s.provider import K8sProvider

        for k, v in cli_env.items():
            monkeypatch.setenv(k, v)
        return K8sProvider(resolve(check_backend=False))

    @pytest.fixture
    def project(self, tmp_path: Path) -> Path:
        work = tmp_path / "kit-project"
        work.mkdir()
        (work / "train.py").write_text("print('kit on kubernetes', flush=True)\n")
        return work


def test_kubeconfig_is_read_when_the_provider_connects_not_when_kubernetes_was_imported(
    kube: Any, k8s_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the kubernetes client fixes its default kubeconfig path at its first import; a process
    # (a notebook, a test session, a tool embedding aios) that sets KUBECONFIG afterwards
    # must still reach the cluster it names
    import importlib

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "not-there"))
    import kubernetes.config.kube_config as kc

    importlib.reload(kc)
    try:
        from aios.config.schema import resolve
        from aios_cloud_k8s.provider import K8sProvider

        for k, v in k8s_env(kube).items():
            monkeypatch.setenv(k, v)
        provider = K8sProvider(resolve(check_backend=False))
        assert provider.describe_credentials().startswith("kubeconfig context")
        assert isinstance(provider.catalog(), list)
    finally:
        monkeypatch.undo()
        importlib.reload(kc)
