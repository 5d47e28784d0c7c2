"""Fixtures for aios-cloud-k8s: the JobSet CRD schema (vendored), the local API service."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from aios_cloud_k8s.testing import FakeKubeApi

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def jobset_crd() -> dict:
    return json.loads((FIXTURES / "jobset-v1alpha2-schema.json").read_text())


def _node(name: str, pool: str, labels: dict[str, str], alloc: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": pool, **labels}},
        "status": {"allocatable": alloc},
    }


TPU_NODES = [
    *[
        _node(
            f"v5e-16-{i}",
            "tpu-v5e-16",
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                "cloud.google.com/gke-tpu-topology": "4x4",
                "node.kubernetes.io/instance-type": "ct5lp-hightpu-4t",
            },
            {"cpu": "112", "google.com/tpu": "4"},
        )
        for i in range(4)
    ],
    _node(
        "cpu-0",
        "default-pool",
        {"node.kubernetes.io/instance-type": "e2-standard-8"},
        {"cpu": "7910m"},
    ),
]


@pytest.fixture
def kube(jobset_crd):
    with FakeKubeApi(nodes=TPU_NODES, jobset_crd=jobset_crd) as api:
        yield api


@pytest.fixture
def kube_no_crd():
    with FakeKubeApi(nodes=TPU_NODES) as api:
        yield api


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hello from the pod')\n")
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(b"0" * 4096)
    return work


@pytest.fixture
def k8s_env(tmp_path: Path):
    def make(api: FakeKubeApi | None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "KUBECONFIG"))}
        env.update(
            {
                "AIOS_HOME": str(tmp_path / "aios-home"),
                "AIOS_PLUGINS": "aios-cloud-k8s,aios-backend-xla",
                "AIOS_K8S__IMAGE": "registry.example/train:1",
                "AIOS_K8S__POLL_INTERVAL": "0.2",
                "COLUMNS": "200",
                "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))
                if api
                else str(tmp_path / "no-such-kubeconfig"),
            }
        )
        env.update(extra)
        return env

    return make


@pytest.fixture
def run_aios(aios_cli):
    """``aios ARGS`` with ``env`` as its whole environment, run in this process (the aios
    plugin's ``aios_cli(..., in_process=True)``: the real CLI, its real ``kubernetes`` client and
    HTTP to the stand-in, without a fresh interpreter importing aios and the kubernetes client's
    models for each of the ~40 commands; no case here is about process handling)."""

    def run(
        env: dict[str, str], *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        del timeout  # in process: pytest's own --timeout bounds it
        return aios_cli(*args, env=env, in_process=True)

    return run
