"""s3:// through fsspec/s3fs against moto: the registered scheme, checkpoints, copy with
progress, and ``aios sync``."""

from __future__ import annotations

import os
import subprocess
import sys

import boto3
import pytest


@pytest.fixture
def bucket(aws):
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=aws.endpoint)
    s3.create_bucket(Bucket="aios-ckpt")
    return s3


def _fresh_registry():
    from aios.plugins.registry import get_registry, reset_registry

    reset_registry()
    return get_registry()


def test_s3_scheme_registered_with_endpoint_and_no_secrets(aws):
    spec = _fresh_registry().storage["s3"]
    assert spec.protocol == "s3" and spec.requires == "s3fs" and spec.plugin == "aios-cloud-aws"
    opts = spec.storage_options("s3://aios-ckpt/run")
    assert opts["endpoint_url"] == aws.endpoint
    flat = repr(opts)
    assert aws.env["AWS_SECRET_ACCESS_KEY"] not in flat and aws.env["AWS_ACCESS_KEY_ID"] not in flat


def test_checkpoint_store_round_trip_on_s3(aws, bucket):
    torch = pytest.importorskip("torch")
    from aios.checkpoint import CheckpointStore

    _fresh_registry()
    store = CheckpointStore("s3://aios-ckpt/runs/r1", keep=2)
    store.check_writable()
    for step in (10, 20, 30):
        store.save(step, {"w": torch.full((4,), float(step))}, meta={"reason": "test"})
    latest = store.latest()
    assert latest is not None and latest.step == 30
    assert torch.equal(store.load(latest)["w"], torch.full((4,), 30.0))
    assert [c.step for c in store.list()] == [20, 30]  # keep=2 pruned step 10 on S3
    keys = [
        o["Key"]
        for o in bucket.list_objects_v2(Bucket="aios-ckpt", Prefix="runs/r1/").get("Contents", [])
    ]
    assert keys and not any("step-00000010" in k or "000010" in k for k in keys)


def test_copy_up_and_down_with_progress(aws, bucket, tmp_path):
    from aios_cloud_aws.storage import RichProgress, copy

    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(300_000))
    (src / "sub" / "b.txt").write_text("hello s3\n")
    n = copy(str(src), "s3://aios-ckpt/data", progress=False)
    assert n == 300_000 + 9
    keys = sorted(
        o["Key"] for o in bucket.list_objects_v2(Bucket="aios-ckpt", Prefix="data/")["Contents"]
    )
    assert keys == ["data/a.bin", "data/sub/b.txt"]
    dst = tmp_path / "back"
    copy("s3://aios-ckpt/data", str(dst), progress=False)
    assert (dst / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dst / "sub" / "b.txt").read_text() == "hello s3\n"
    bar = RichProgress("one file", enabled=False)
    import fsspec
    from aios_cloud_aws.storage import storage_options

    fs = fsspec.filesystem("s3", **storage_options())
    fs.put_file(str(src / "a.bin"), "s3://aios-ckpt/one.bin", callback=bar.callback)
    assert bar.last == (300_000, 300_000)


def test_aios_sync_to_and_from_s3(aws, bucket, tmp_path):
    src = tmp_path / "proj"
    src.mkdir()
    (src / "x.txt").write_text("x" * 1000)
    env = {**os.environ, "AIOS_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "sync", str(src), "s3://aios-ckpt/proj"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert bucket.get_object(Bucket="aios-ckpt", Key="proj/x.txt")["Body"].read() == b"x" * 1000
    out = tmp_path / "down"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "sync", "s3://aios-ckpt/proj", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "x.txt").read_text() == "x" * 1000
    assert aws.env["AWS_SECRET_ACCESS_KEY"] not in r.stdout + r.stderr
