"""Cloud layer overheads against their naive baselines, side by side in one run:

* SSH fan-out: aios's parallel runner (one command on every host at once, prefixed output)
  against a sequential ``for host in hosts: ssh host cmd`` loop, on N real sshd hosts
  (aios_cloud.testing.sshd, network namespaces; needs root + openssh-server).
* Code sync: aios's tarball (gitignore honoured, data excluded) against tarring the whole
  working directory as naive scripts do (``tar czf - .``), on a project with a data directory.
* State store: read-modify-write transactions from 4 concurrent processes against 1 process,
  with ``aios status``-style reads running alongside (no update may be lost).

    python bench/bench_cloud.py [--hosts 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def bench_ssh(n_hosts: int, repeats: int) -> None:
    from aios_cloud.provider import ClusterHost
    from aios_cloud.ssh import SshRunner
    from aios_cloud.testing.sshd import SshdCluster, sshd_unavailable_reason

    if sshd_unavailable_reason():
        print(f"ssh fan-out: skipped ({sshd_unavailable_reason()})")
        return
    cmd = "python3 -c 'import time; time.sleep(0.2); print(1)'"
    with tempfile.TemporaryDirectory() as d, SshdCluster(n_hosts, Path(d) / "sshd") as c:
        hosts = [
            ClusterHost(h.worker_id, h.ip, ssh_user=c.user, ssh_key=str(c.client_key), port=h.port)
            for h in c.hosts
        ]
        runner = SshRunner(hosts, Path(d) / "kh", alias="bench")
        runner.run("true", stream=False)  # pin host keys
        par, seq = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            res = runner.run(cmd, stream=False)
            par.append(time.perf_counter() - t)
            assert all(r.ok for r in res)
            t = time.perf_counter()
            for h in hosts:
                subprocess.run(runner.argv(h, cmd), capture_output=True, check=True)
            seq.append(time.perf_counter() - t)
        p, s = statistics.median(par), statistics.median(seq)
        print(
            f"ssh fan-out on {n_hosts} hosts: aios parallel {p * 1000:.0f} ms, sequential "
            f"loop {s * 1000:.0f} ms, speed-up x{s / p:.2f}"
        )


def _project(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    for i in range(50):
        (root / "src" / f"m{i}.py").write_text("x = 1\n" * 200)
    (root / "data").mkdir()
    (root / "data" / "shard.bin").write_bytes(os.urandom(64 * 2**20))
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "state.pt").write_bytes(os.urandom(32 * 2**20))
    (root / ".gitignore").write_text("*.log\n")
    (root / "run.log").write_bytes(b"l" * 2**20)


def bench_sync(repeats: int) -> None:
    from aios_cloud.codesync import make_tarball

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "proj"
        _project(root)
        a, b = [], []
        for i in range(repeats):
            t = time.perf_counter()
            tb = make_tarball(root, Path(d) / f"aios{i}.tgz")
            a.append(time.perf_counter() - t)
            t = time.perf_counter()
            with tarfile.open(Path(d) / f"naive{i}.tgz", "w:gz", compresslevel=6) as tar:
                tar.add(str(root), arcname=".")
            b.append(time.perf_counter() - t)
        naive_size = (Path(d) / "naive0.tgz").stat().st_size
        print(
            f"code sync: aios {statistics.median(a) * 1000:.0f} ms / "
            f"{tb.path.stat().st_size / 1024:.0f} KiB ({tb.files} files), "
            f"naive tar {statistics.median(b) * 1000:.0f} ms / {naive_size / 2**20:.1f} MiB; "
            f"time x{statistics.median(b) / statistics.median(a):.1f}, bytes x{naive_size / tb.path.stat().st_size:.0f}"
        )


def _writer(path: str, n: int) -> None:
    from aios_cloud.store import Store

    s = Store(path)
    job = s.jobs("c")[0].id
    for _ in range(n):
        s.bump_restarts(job)


def _store_ops(writers: int, n: int) -> tuple[float, float]:
    """``writers`` processes doing ``n`` read-modify-write transactions each while this process
    reads like ``aios status``; returns (writes/s, reads/s)."""
    from aios_cloud.store import ClusterRecord, Store

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "state.db")
        s = Store(path)
        s.claim_cluster(ClusterRecord("c", "gcp", "z", "v4-8", False, "READY"))
        s.add_job("c", "x")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_writer, args=(path, n)) for _ in range(writers)]
        for p in procs:
            p.start()
        t = time.perf_counter()
        reads = 0
        while any(p.is_alive() for p in procs):
            s.clusters()
            s.jobs("c")
            reads += 1
        for p in procs:
            p.join()
        el = time.perf_counter() - t
        assert s.jobs("c")[0].restarts == writers * n  # no lost update
        return writers * n / el, reads / el


def bench_store() -> None:
    w1, r1 = _store_ops(1, 1200)
    w4, r4 = _store_ops(4, 300)
    print(
        f"state store (WAL, BEGIN IMMEDIATE): 1 writer process {w1:.0f} writes/s; 4 concurrent writer processes "
        f"{w4:.0f} writes/s in total (x{w4 / w1:.2f}), no lost update; concurrent status "
        f"reads {r1:.0f}/s and {r4:.0f}/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    bench_ssh(a.hosts, a.repeats)
    bench_sync(a.repeats)
    bench_store()


if __name__ == "__main__":
    sys.exit(main())
