"""The checkpoint-directory lock is atomic: of 4 processes taking it at the same instant exactly
one wins, with no lock, a dead holder's lock and a stale heartbeat (1,000 rounds); an empty lock
is never claimed while fresh; a holder whose heartbeat cannot be written stops writing before
anyone may take over, and never writes there again (injected clock, failing writer); on S3
(moto enforces If-None-Match / If-Match) the writes are conditional."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.checkpoint import LOCK_FILE, CheckpointStore
from aios.checkpoint import lock as lockmod
from aios.errors import CheckpointError

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
ROUNDS = 1000
TAKERS = 4


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("nfs", [False, True], ids=["local", "nfs-guard-file"])
def test_four_simultaneous_takers_exactly_one_wins_every_round(tmp_path: Path, nfs: bool) -> None:
    """``nfs``: the directory cannot be flock'ed (as on NFS): the takers serialise on the guard
    file beside the lock instead, and still exactly one wins."""
    from lock_taker import take

    rounds = ROUNDS
    ck = tmp_path / "ck"
    ck.mkdir()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(TAKERS + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=take, args=(str(ck), rounds, barrier, results, i, nfs), daemon=True)
        for i in range(TAKERS)
    ]
    for p in procs:
        p.start()
    dead = _dead_pid()
    host = socket.gethostname()
    scenarios = {
        "no lock": None,
        "dead holder": {"run_id": "dead", "pid": dead, "host": host, "heartbeat": time.time()},
        "stale heartbeat": {
            "run_id": "far",
            "pid": 1,
            "host": "other-host.invalid",
            "heartbeat": time.time() - 3600,
        },
    }
    names = list(scenarios)
    bad: list[tuple[int, str, int]] = []
    try:
        for r in range(rounds):
            name = names[r % len(names)]
            lock = ck / LOCK_FILE
            lock.unlink(missing_ok=True)
            if scenarios[name] is not None:
                lock.write_text(json.dumps({**scenarios[name], "token": f"old-{r}"}))
            barrier.wait(timeout=120)
            got = [results.get(timeout=120) for _ in range(TAKERS)]
            winners = sum(won for _, won in got)
            if winners != 1:
                bad.append((r, name, winners))
            held = json.loads(lock.read_text())
            assert held["run_id"].startswith("taker-"), (r, name, held)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert bad == [], bad[:10]
    assert not [p.name for p in ck.iterdir() if p.name.endswith(".tmp")]
    # the guard file is used (and stays: deleting it while others wait on it would split them)
    assert (ck / lockmod.LOCK_GUARD).exists() == nfs


def test_empty_lock_is_held_until_old_by_mtime(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / LOCK_FILE).write_bytes(b"")  # what a writer of another version may leave mid-write
    store = CheckpointStore(str(ck))
    with pytest.raises(CheckpointError, match="locked by an unknown writer"):
        store.acquire_lock({"run_id": "me"})
    old = time.time() - lockmod.LOCK_STALE_S - 5
    os.utime(ck / LOCK_FILE, (old, old))
    store.acquire_lock({"run_id": "me"})
    assert store.read_lock()["run_id"] == "me"


class _Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def test_holder_that_cannot_refresh_stops_before_takeover_and_never_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is full for a while: A's heartbeat cannot be written. A keeps the lock
    while within LOCK_FENCE_S, then stops writing (and says why) before B may take the lock
    (LOCK_STALE_S); after B took it, A writes nothing there even once the disk has room."""
    import torch

    assert lockmod.LOCK_FENCE_S < lockmod.LOCK_STALE_S
    ck = tmp_path / "ck"
    clock = _Clock()
    a = CheckpointStore(str(ck), keep=None)
    a.clock = clock
    a.acquire_lock({"run_id": "A"})
    a.save(1, {"w": torch.ones(2)})
    full = {"on": True}
    real_put = a._put_lock

    def put(data: bytes, expect: object, replace: bool) -> bool:
        if full["on"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_put(data, expect, replace)

    monkeypatch.setattr(a, "_put_lock", put)
    for _ in range(3):  # 15 s, 30 s, 45 s: refresh fails, still within the fence
        clock.t += lockmod.LOCK_HEARTBEAT_S
        assert a.heartbeat() is True
    a.save(2, {"w": torch.ones(2)})  # still the holder: writes
    clock.t += lockmod.LOCK_HEARTBEAT_S + 1  # 61 s: past the fence, before anyone may take over
    assert a.heartbeat() is False
    assert "No space left on device" in a.lost and "writes no more checkpoints" in a.lost
    with pytest.raises(CheckpointError, match="could not be refreshed"):
        a.save(3, {"w": torch.ones(2)})
    clock.t += lockmod.LOCK_STALE_S  # now B (another host) may take over
    b = CheckpointStore(str(ck), keep=None)
    b.clock = clock
    monkeypatch.setattr(lockmod.socket, "gethostname", lambda: "host-b.invalid")
    b.acquire_lock({"run_id": "B"})
    full["on"] = False  # the disk has room again
    assert a.heartbeat() is False
    before = sorted(p.name for p in ck.iterdir())
    with pytest.raises(CheckpointError):
        a.save(4, {"w": torch.ones(2)})
    assert sorted(p.name for p in ck.iterdir()) == before  # A wrote nothing after the takeover
    assert json.loads((ck / LOCK_FILE).read_text())["run_id"] == "B"
    b.save(4, {"w": torch.ones(2)})
    assert b.latest().step == 4


def test_taken_over_holder_never_writes_again(tmp_path: Path, monkeypatch) -> None:
    ck = tmp_path / "ck"
    a = CheckpointStore(str(ck), keep=None)
    a.acquire_lock({"run_id": "A"})
    lock = json.loads((ck / LOCK_FILE).read_text())
    (ck / LOCK_FILE).write_text(json.dumps({**lock, "token": "other", "run_id": "B"}))
    assert a.heartbeat() is False and "took over" in a.lost
    with pytest.raises(CheckpointError, match="took over"):
        a.begin(1)
    assert json.loads((ck / LOCK_FILE).read_text())["run_id"] == "B"  # never overwritten


def test_s3_lock_writes_are_conditional(monkeypatch) -> None:
    """moto enforces S3's conditional writes (If-None-Match: *, If-Match: ETag) as S3 does
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html)."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    pytest.importorskip("aios_cloud_aws")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for k, v in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "AKIAAIOSTESTKEY00000",
            "AWS_SECRET_ACCESS_KEY": "aios-test-secret-never-written-0123456789",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(k, v)
        boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="aios-lock")
        a = CheckpointStore("s3://aios-lock/ck", keep=None)
        b = CheckpointStore("s3://aios-lock/ck", keep=None)
        monkeypatch.setattr(lockmod.socket, "gethostname", lambda: "host-a.invalid")
        a.acquire_lock({"run_id": "A"})
        # b read "no lock" just before a wrote: its exclusive create is refused by the store
        assert b._put_lock(b"{}", expect=None, replace=False) is False
        raw, version = b._lock_raw()
        assert json.loads(raw)["run_id"] == "A"
        assert a.heartbeat() is True  # a's conditional refresh changes the version...
        # ...so a takeover decided on the version b read is refused (compare-and-swap)
        assert b._put_lock(b'{"run_id": "B"}', expect=version, replace=True) is False
        assert b.read_lock()["run_id"] == "A"
        monkeypatch.setattr(lockmod.socket, "gethostname", lambda: "host-b.invalid")
        with pytest.raises(CheckpointError, match="in use by run A"):
            b.acquire_lock({"run_id": "B"})
        a.release_lock()
        b.acquire_lock({"run_id": "B"})
        assert a.read_lock()["run_id"] == "B"
    finally:
        server.stop()


@pytest.fixture
def gcs_with_preconditions(monkeypatch: pytest.MonkeyPatch):
    """gs://aios-lk on the Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`), which
    enforces GCS's generation preconditions (the emulator itself accepts ``ifGenerationMatch``
    and ignores it)."""
    pytest.importorskip("aios_cloud_gcp")
    from aios_cloud_gcp.testing.gcs import GCSFS_ENV, GcsEmulator

    for k, v in GCSFS_ENV.items():  # before gcsfs's first import reads it
        monkeypatch.setenv(k, v)
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    with GcsEmulator() as gcs:
        for k, v in gcs.env.items():
            monkeypatch.setenv(k, v)
        gcs.make_bucket("aios-lk")
        yield


def test_gcs_lock_writes_carry_generation_preconditions(gcs_with_preconditions, monkeypatch):
    monkeypatch.setattr(lockmod.socket, "gethostname", lambda: "host-a.invalid")
    a = CheckpointStore("gs://aios-lk/ck", keep=None)
    b = CheckpointStore("gs://aios-lk/ck", keep=None)
    a.acquire_lock({"run_id": "A"})
    assert b._put_lock(b"{}", expect=None, replace=False) is False  # ifGenerationMatch=0
    raw, version = b._lock_raw()
    assert a.heartbeat() is True
    assert b._put_lock(b'{"run_id": "B"}', expect=version, replace=True) is False  # stale read
    monkeypatch.setattr(lockmod.socket, "gethostname", lambda: "host-b.invalid")
    with pytest.raises(CheckpointError, match="in use by run A"):
        b.acquire_lock({"run_id": "B"})
    a.release_lock()
    b.acquire_lock({"run_id": "B"})
    assert a.read_lock()["run_id"] == "B" and a.heartbeat() is False
