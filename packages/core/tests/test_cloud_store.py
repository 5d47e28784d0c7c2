"""The SQLite state store under concurrent aios processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3

from aios.cloud.store import ClusterRecord, Store


def _claim(path: str, name: str, q) -> None:
    s = Store(path)
    q.put(s.claim_cluster(ClusterRecord(name=name, cloud="gcp", zone="z", accelerator="v4-8", spot=False, state="PENDING")))


def _bump(path: str, job_id: int, n: int, cluster: str) -> None:
    s = Store(path)
    for i in range(n):
        s.bump_restarts(job_id)
        s.event(cluster, "test", f"{os.getpid()} {i}", job_id)


def test_cloud_store_one_claim_wins_under_concurrency(tmp_path):
    path = str(tmp_path / "state.db")
    Store(path).close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(path, "same", q)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = [q.get(timeout=5) for _ in procs]
    assert results.count(True) == 1 and results.count(False) == 5
    assert [c.name for c in Store(path).clusters()] == ["same"]


def test_cloud_store_no_lost_updates_across_processes(tmp_path):
    path = str(tmp_path / "state.db")
    s = Store(path)
    s.claim_cluster(ClusterRecord(name="c", cloud="gcp", zone="z", accelerator="v4-8", spot=True, state="READY"))
    job = s.add_job("c", "train.py", backend="xla", managed=True, max_restarts=100, spec={"script": "train.py"})
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_bump, args=(path, job, 25, "c")) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert s.get_job(job).restarts == 100
    assert len(s.events("c", kind="test")) == 100
    # WAL mode, so readers never block the writers
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cloud_store_records_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    s = Store()
    assert s.path == tmp_path / "home" / "state.db"
    rec = ClusterRecord(name="c", cloud="aws", zone="us-east-1a", accelerator="trn1.32xlarge", spot=True, state="PENDING",
                        hosts=[{"worker_id": 0, "ip": "1.2.3.4"}], request={"name": "c"}, ssh_user="ubuntu", ssh_key="/k")
    assert s.claim_cluster(rec)
    s.update_cluster("c", state="READY", hosts=[{"worker_id": 0, "ip": "5.6.7.8"}])
    got = s.get_cluster("c")
    assert got.state == "READY" and got.hosts[0]["ip"] == "5.6.7.8" and got.spot and got.ssh_key == "/k"
    j = s.add_job("c", "x.py", spec={"env": {"A": "1"}})
    s.update_job(j, state="SUCCEEDED", exit_codes=[0, 0])
    assert s.latest_job("c").exit_codes == [0, 0] and s.jobs("c")[0].spec == {"env": {"A": "1"}}
    s.delete_cluster("c")
    assert s.get_cluster("c") is None
    # a failed transaction leaves nothing half-written
    try:
        with s.transaction() as db:
            db.execute("INSERT INTO events(cluster, job_id, time, kind, message) VALUES ('c', NULL, 0, 'x', 'y')")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert s.events("c", kind="x") == []
    assert isinstance(s.db, sqlite3.Connection)
