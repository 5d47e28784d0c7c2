"""Fixtures for aios-cloud-gcp tests: the real google-cloud-tpu client against a local Cloud TPU
REST service, real sshd hosts (network namespaces) behind its nodes, gcp-storage-emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios_cloud.testing.sshd import SshdCluster
from aios_cloud_gcp.testing import FakeTpuService

# gcsfs reads this once, at its first import, whichever test does it; every gs:// here is the
# emulator, which speaks only the classic JSON API (the experimental HNS/zonal client times out
# against it for 60 s a call)
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

ZONES = {"v4": ["us-central2-b", "us-central2-c"], "v5e": ["us-west4-a", "us-central1-a"]}


# sshd_hosts (two real sshd hosts in network namespaces: the machines of a slice) comes from the
# aios pytest plugin (aios.testing.plugin)


@pytest.fixture
def fake_tpu(sshd_hosts: SshdCluster):
    with FakeTpuService(
        machines=sshd_hosts.hosts, authorized_keys=sshd_hosts.authorized_keys, project="aios-test"
    ) as svc:
        yield svc


@pytest.fixture
def bare_tpu():
    """The TPU service without machines behind it (API-level tests)."""
    with FakeTpuService(project="aios-test") as svc:
        yield svc


def _gcp_env(tmp_path: Path, svc: FakeTpuService, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "GOOGLE_", "CLOUDSDK_"))
    }
    env.update(
        {
            "AIOS_HOME": str(tmp_path / "aios-home"),
            "AIOS_GCP__PROJECT": "aios-test",
            "AIOS_GCP__ENDPOINT": svc.url,
            "AIOS_GCP__CREDENTIALS": "anonymous",
            "AIOS_GCP__POLL_INTERVAL": "0.05",
            "AIOS_GCP__SSH_USER": "root",
            "AIOS_GCP__ZONES": json.dumps(ZONES),
            "AIOS_PLUGINS": "aios-cloud-gcp,aios-backend-xla",
            "COLUMNS": "200",
        }
    )
    env.update(extra)
    return env


def _run_aios(
    env: dict[str, str], *args: str, timeout: float = 300, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture
def gcp_env():
    """``gcp_env(tmp_path, service, **extra)``: environment for the aios CLI pointed at the service."""
    return _gcp_env


@pytest.fixture
def aios_cli():
    """``aios_cli(env, *args)``: run the real ``aios`` CLI in a subprocess."""
    return _run_aios


@pytest.fixture
def gcs(sshd_hosts: SshdCluster):
    """The Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`: gcp-storage-emulator with
    the real service's preconditions and objects.move), reachable from this machine and from
    every sshd host."""
    pytest.importorskip(
        "gcp_storage_emulator",
        reason="gcp-storage-emulator is not installed: pip install gcp-storage-emulator",
    )
    port = 9023
    sshd_hosts.popen_service(
        [sys.executable, "-m", "aios_cloud_gcp.testing.gcs", str(port), sshd_hosts.service_ip]
    )
    sshd_hosts.wait_port(port)
    url = f"http://{sshd_hosts.service_ip}:{port}"
    old = {
        k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
    }
    os.environ["STORAGE_EMULATOR_HOST"] = url
    yield url
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def gcs_fs(gcs: str):
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=gcs, token="anon", skip_instance_cache=True)


def _wait_for(cond, timeout: float, what: str, interval: float = 0.5):
    """Poll ``cond`` until it is true. The pause grows from ``interval`` to 4x it: most
    conditions here run the aios CLI (a Python process each), and on CI's loaded 2-core machine
    polling at a fixed short pause took CPU from the other lane's tests."""
    deadline = time.monotonic() + timeout
    pause = interval
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(pause)
        pause = min(pause * 1.5, interval * 4)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def wait_for():
    return _wait_for
