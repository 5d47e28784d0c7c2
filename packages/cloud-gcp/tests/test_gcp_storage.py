"""gs:// through gcsfs against gcp-storage-emulator: the runtime's checkpoints and ``aios sync``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from aios_cloud_gcp.testing.gcs import GcsEmulator


@pytest.fixture
def gcs_local(monkeypatch, tmp_path):
    """gs://aios-bucket on the Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`)."""
    pytest.importorskip(
        "gcp_storage_emulator",
        reason="gcp-storage-emulator is not installed: pip install gcp-storage-emulator",
    )
    with GcsEmulator() as gcs:
        for k, v in gcs.env.items():
            monkeypatch.setenv(k, v)
        import gcsfs

        fs = gcsfs.GCSFileSystem(endpoint_url=gcs.url, token="anon", skip_instance_cache=True)
        fs.mkdir("aios-bucket")
        yield gcs.url, fs


def test_gcp_gs_scheme_is_registered_by_the_plugin():
    from aios.plugins.registry import Registry

    reg = Registry()
    assert reg.storage["gs"].protocol == "gs" and reg.storage["gs"].plugin == "aios-cloud-gcp"


def test_gcp_runtime_checkpoints_on_gs(gcs_local):
    torch = pytest.importorskip("torch")
    from aios.checkpoint import CheckpointStore

    _, fs = gcs_local
    store = CheckpointStore("gs://aios-bucket/run1", keep=2)
    store.check_writable()
    for step in (10, 20, 30):
        store.save(step, {"w": torch.full((3,), float(step)), "step": step})
    fs.invalidate_cache()
    latest = store.latest()
    assert latest is not None and latest.step == 30
    assert torch.equal(store.load(latest)["w"], torch.full((3,), 30.0))
    assert [c.step for c in store.list()] == [20, 30]  # keep=2 pruned the oldest
    # an interrupted save (no commit marker) is skipped on resume
    fs.pipe("aios-bucket/run1/ckpt-000000040/state.pt", b"partial")
    fs.invalidate_cache()
    assert store.latest(warn=False).step == 30


def test_gcp_sync_local_bucket_local_with_progress(gcs_local, tmp_path):
    url, fs = gcs_local
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "big.bin").write_bytes(os.urandom(9 * 2**20))  # over the progress-bar threshold
    env = {**os.environ, "AIOS_HOME": str(tmp_path / "home"), "AIOS_PLUGINS": "aios-cloud-gcp"}
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "sync", str(src), "gs://aios-bucket/data"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "copied 2 files" in r.stdout and "upload src" in r.stderr and "100%" in r.stderr
    )  # the byte progress bar
    fs.invalidate_cache()
    assert fs.cat("aios-bucket/data/a.txt") == b"alpha"
    back = tmp_path / "back"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "sync", "gs://aios-bucket/data", str(back)],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (back / "sub" / "big.bin").read_bytes() == (src / "sub" / "big.bin").read_bytes()
    assert (back / "a.txt").read_text() == "alpha"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "sync", "gs://aios-bucket/missing", str(back)],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 2 and "gs://aios-bucket/missing does not exist" in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.main",
            "sync",
            "--dry-run",
            str(src),
            "gs://aios-bucket/x",
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert r.stdout.strip().startswith("gcloud storage cp -r")
    fs.invalidate_cache()
    assert not fs.exists("aios-bucket/x")


def test_gcp_emulator_selects_the_classic_client_before_gcsfs_is_first_imported(tmp_path):
    """gcsfs picks its client class once, at import; with STORAGE_EMULATOR_HOST set, registering
    the gs:// scheme must switch off the experimental HNS/zonal client before anything imports
    gcsfs (that client spends 60 s per call failing gRPC handshakes against an emulator)."""
    pytest.importorskip("gcsfs")
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    env.update(STORAGE_EMULATOR_HOST="http://127.0.0.1:9", AIOS_PLUGINS="aios-cloud-gcp")
    code = (
        "from aios.plugins.registry import Registry\n"
        "Registry().storage['gs']\n"
        "import gcsfs\n"
        "print(gcsfs.GCSFileSystem.__module__)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "gcsfs.core", r.stdout
