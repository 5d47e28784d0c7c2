"""The SQLite state store under concurrent aios processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3

from aios_cloud.store import ClusterRecord, Store


def _claim(path: str, name: str, q) -> None:
    s = Store(path)
    q.put(
        s.claim_cluster(
            ClusterRecord(
                name=name, cloud="gcp", zone="z", accelerator="v4-8", spot=False, state="PENDING"
            )
        )
    )


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
    s.claim_cluster(
        ClusterRecord(name="c", cloud="gcp", zone="z", accelerator="v4-8", spot=True, state="READY")
    )
    job = s.add_job(
        "c", "train.py", backend="xla", managed=True, max_restarts=100, spec={"script": "train.py"}
    )
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
    rec = ClusterRecord(
        name="c",
        cloud="aws",
        zone="us-east-1a",
        accelerator="trn1.32xlarge",
        spot=True,
        state="PENDING",
        hosts=[{"worker_id": 0, "ip": "1.2.3.4"}],
        request={"name": "c"},
        ssh_user="ubuntu",
        ssh_key="/k",
    )
    assert s.claim_cluster(rec)
    s.update_cluster("c", state="READY", hosts=[{"worker_id": 0, "ip": "5.6.7.8"}])
    got = s.get_cluster("c")
    assert (
        got.state == "READY"
        and got.hosts[0]["ip"] == "5.6.7.8"
        and got.spot
        and got.ssh_key == "/k"
    )
    j = s.add_job("c", "x.py", spec={"env": {"A": "1"}})
    s.update_job(j, state="SUCCEEDED", exit_codes=[0, 0])
    assert s.latest_job("c").exit_codes == [0, 0] and s.jobs("c")[0].spec == {"env": {"A": "1"}}
    s.delete_cluster("c")
    assert s.get_cluster("c") is None
    # a failed transaction leaves nothing half-written
    try:
        with s.transaction() as db:
            db.execute(
                "INSERT INTO events(cluster, job_id, time, kind, message) VALUES ('c', NULL, 0, 'x', 'y')"
            )
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert s.events("c", kind="x") == []
    assert isinstance(s.db, sqlite3.Connection)


# ------------------------------------------------------------------ one-line failures (issue 14)
import contextlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

import pytest  # noqa: E402
from aios_cloud.store import StateError, aios_home  # noqa: E402


def _rec(name: str = "c") -> ClusterRecord:
    return ClusterRecord(
        name=name, cloud="gcp", zone="z", accelerator="v4-8", spot=False, state="READY"
    )


def test_lock_held_past_the_timeout_is_one_line(tmp_path):
    path = tmp_path / "state.db"
    Store(path).close()
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        s = Store(path, timeout=0.2)  # opening only reads: it does not need the write lock
        with pytest.raises(
            StateError, match=r"is locked by another aios process \(waited 0.2s\); retry when"
        ):
            s.claim_cluster(_rec())
        with pytest.raises(StateError, match="locked"):
            s.event("c", "x", "y")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert Store(path, timeout=0.2).claim_cluster(_rec())


def test_corrupt_database_is_one_line_naming_the_fix(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(
        StateError, match=r"state database .*state.db is corrupt .*; move it aside \(mv "
    ):
        Store(path)
    assert path.read_bytes().startswith(b"this is not sqlite")  # never touched


def test_bad_json_in_a_row_is_one_line(tmp_path):
    path = tmp_path / "state.db"
    s = Store(path)
    s.claim_cluster(_rec("broken"))
    s.db.execute("UPDATE clusters SET hosts = '{not json' WHERE name = 'broken'")
    with pytest.raises(
        StateError, match=r"corrupt record: cluster 'broken': column hosts is not valid JSON"
    ):
        s.clusters()
    j = s.add_job("broken", "x.py")
    s.db.execute("UPDATE jobs SET spec = 'nope' WHERE id = ?", (j,))
    with pytest.raises(StateError, match=rf"job {j}: column spec is not valid JSON"):
        s.get_job(j)


@contextlib.contextmanager
def _read_only(*paths):
    """Make paths read-only, also for root (the immutable attribute; chmod for others)."""
    if os.geteuid() == 0:
        r = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot make files immutable here (chattr: {r.stderr.strip()})")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, paths)], check=True)
    else:
        modes = {p: os.stat(p).st_mode for p in paths}
        for p in paths:
            os.chmod(p, 0o555 if os.path.isdir(p) else 0o444)
        try:
            yield
        finally:
            for p, m in modes.items():
                os.chmod(p, m)


def test_read_only_database_serves_reads_and_refuses_writes_in_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = home / "state.db"
    s = Store(path)
    s.claim_cluster(_rec("kept"))
    s.close()
    with _read_only(path, home):
        ro = Store(path)
        assert ro.readonly and [c.name for c in ro.clusters()] == ["kept"]
        with pytest.raises(
            StateError, match="is read-only: this command needs to write it; make .* writable"
        ):
            ro.claim_cluster(_rec("new"))
        ro.close()


def test_aios_home_pointing_at_a_file_is_one_line(tmp_path, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("AIOS_HOME", str(f))
    with pytest.raises(StateError, match=r"the aios home \(AIOS_HOME\) .*afile is not a directory"):
        aios_home()
    with pytest.raises(StateError):
        Store()


def test_cli_state_failures_exit_2_without_traceback(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env["AIOS_HOME"] = str(f)
    res = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "is not a directory" in res.stderr
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_bytes(b"garbage" * 200)
    env["AIOS_HOME"] = str(home)
    res = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2 and "is corrupt" in res.stderr and "Traceback" not in res.stderr, (
        res.stderr
    )


def test_store_threads_do_not_trip_over_each_other(tmp_path):
    s = Store(tmp_path / "state.db")
    s.claim_cluster(_rec())
    errors = []

    def work():
        try:
            t = Store(tmp_path / "state.db")
            for i in range(20):
                t.event("c", "t", str(i))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(s.events("c", kind="t")) == 80
