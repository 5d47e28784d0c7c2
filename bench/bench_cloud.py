"""Cloud layer overheads against their naive baselines, side by side in one run:

* SSH fan-out: aios's parallel runner (one command on every host at once, prefixed output)
  against a sequential ``for host in hosts: ssh host cmd`` loop, on N real sshd hosts
  (aios_cloud.testing.sshd, network namespaces; needs root + openssh-server).
* Code sync: aios's tarball (gitignore honoured, data excluded) against tarring the whole
  working directory as naive scripts do (``tar czf - .``), on a project with a data directory.
* State store: read-modify-write transactions from 4 concurrent processes against 1 process,
  with ``aios status``-style reads running alongside (no update may be lost).
* Launch at scale (``--scale 1,8,32``): the launch phases (reach, code sync, setup, job start,
  status polls, a relaunch's sync with one changed file, cancel) through the head host on N
  real sshd hosts in network namespaces, with what the launching machine sent (bytes counted on
  the root end of the hosts' veth, ``/proc/net/dev``: TCP/IP headers included) and the most
  TCP connections it held to the hosts at once (sampled from ``/proc/net/tcp``), against the
  per-host upload aios did before (the bundle tarball piped to every host from here).

    python bench/bench_cloud.py [--hosts 4] [--repeats 5] [--scale 1,8,32,64,128]
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
    from aios_cloud.provider.data import ClusterHost
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


def _tx_bytes(ifname: str) -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == ifname:
            return int(rest.split()[8])
    raise RuntimeError(f"no interface {ifname}")


class _ConnSampler:
    """The most ESTABLISHED TCP connections from this namespace to ``subnet``.* at once."""

    def __init__(self, subnet: str) -> None:
        import threading

        a, b, c = (int(x) for x in subnet.split("."))
        self.prefix = f"{c:02X}{b:02X}{a:02X}"  # /proc/net/tcp: little-endian hex address
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def count(self) -> int:
        n = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and f[2][2:8] == self.prefix:
                n += 1
        return n

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.count())
            time.sleep(0.05)

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def bench_scale(ns: list[int], nofile: int = 0) -> None:
    """Launch phases through the head host against N, with the launcher's bytes/connections."""
    from aios_cloud.testing.sshd import SshdCluster, netns_available, sshd_unavailable_reason

    if sshd_unavailable_reason() or not netns_available():
        print("launch at scale: skipped (needs sshd and network namespaces: root + iproute2)")
        return
    print(
        "launch at scale (head-relay; bytes = what this machine sent, incl. TCP/IP headers; "
        "conns = most TCP connections to the hosts at once)"
    )
    for n in ns:
        with tempfile.TemporaryDirectory() as d:
            os.environ["AIOS_HOME"] = str(Path(d) / "aios-home")
            try:
                with SshdCluster(n, Path(d) / "sshd", netns=True) as c:
                    import resource

                    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
                    if nofile:  # the launcher's limit only (the hosts started with the old one)
                        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, saved[1]))
                    try:
                        _scale_one(n, c, Path(d))
                    finally:
                        resource.setrlimit(resource.RLIMIT_NOFILE, saved)
            except Exception as exc:  # noqa: BLE001 - report and go on with the next N
                print(f"  N={n}: failed: {type(exc).__name__}: {exc}")


def _scale_one(n: int, c, d: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from aios_cloud import ops
    from aios_cloud.bundle import build
    from aios_cloud.codesync import make_manifest, make_tarball
    from aios_cloud.provider.data import ClusterHost
    from aios_cloud.ssh import SshRunner, close_masters
    from aios_cloud.store import ClusterRecord, Store

    store = Store()
    # the key a launch creates for the cluster (authorized on its hosts; the head holds a copy)
    key = ops.cluster_key("bench")
    key.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(c.client_key, key)
    shutil.copyfile(f"{c.client_key}.pub", f"{key}.pub")
    key.chmod(0o600)
    hosts = [
        dict(worker_id=h.worker_id, ip=h.ip, internal_ip=h.internal_ip, port=h.port)
        for h in c.hosts
    ]
    store.claim_cluster(
        ClusterRecord(
            "bench",
            "gcp",
            "z",
            "v4-8",
            False,
            "READY",
            hosts=hosts,
            ssh_user=c.user,
            ssh_key=str(key),
        )
    )
    rec = store.get_cluster("bench")
    assert rec is not None
    work = d / "proj"
    work.mkdir()
    (work / "train.py").write_text("import os\nprint('rank', os.environ.get('RANK'))\n")
    (work / "util.py").write_text("x = 1\n" * 100)
    spec = ops.JobSpec(script="train.py", workdir=str(work), backend="cpu", python="python3")
    b = build(spec.backend, rec.cloud)
    manifest = make_manifest(work, extra_files=b.files, generated=b.generated)
    bundle = len(manifest.blob_tar(list(manifest.blobs)))
    quiet = lambda m: None  # noqa: E731
    phases: dict[str, float] = {}
    tx0 = _tx_bytes(c.root_if)
    sampler = _ConnSampler(c.subnet)

    sent: dict[str, int] = {}

    def phase(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        t, b = time.perf_counter(), _tx_bytes(c.root_if)
        fn()
        phases[name] = time.perf_counter() - t
        sent[name] = _tx_bytes(c.root_if) - b

    phase("reach", lambda: ops.reach(rec, None, quiet))
    phase("sync", lambda: ops.sync_code(rec, spec, None, quiet))
    spec.setup_lines = ["true"]
    phase("setup", lambda: ops.run_setup(rec, spec, None, quiet))
    info = ops._info_from(rec)
    from aios.config.schema import resolve

    config = resolve(environ={}, check_backend=False)
    phase("start", lambda: ops.start_job(rec, 1, spec, config, {}, None, quiet))

    def until_done() -> None:
        while not all(s == "EXIT" for s, _ in ops.poll_job(rec, 1)):
            time.sleep(0.2)

    phase("poll", until_done)
    launch_tx = _tx_bytes(c.root_if) - tx0
    (work / "util.py").write_text("x = 2\n" * 100)
    tx1 = _tx_bytes(c.root_if)
    phase("resync", lambda: ops.sync_code(rec, spec, None, quiet))
    resync_tx = _tx_bytes(c.root_if) - tx1
    phase("cancel", lambda: ops.cancel_job(rec, 1))
    conns = sampler.close()
    close_masters()
    del info
    # before: the bundle tarball piped from here to every host
    tar = make_tarball(work, d / "code.tgz", extra_files=b.files, generated=b.generated)
    runner = SshRunner(
        [
            ClusterHost(h.worker_id, h.ip, ssh_user=c.user, ssh_key=str(c.client_key), port=h.port)
            for h in c.hosts
        ],
        d / "kh-old",
        alias="old",
        max_parallel=64,
    )
    sampler = _ConnSampler(c.subnet)
    tx2 = _tx_bytes(c.root_if)
    t = time.perf_counter()
    try:
        runner.check(
            runner.run("mkdir -p old && tar xzf - -C old", stdin_path=str(tar.path), stream=False),
            "old",
        )
        old_err = ""
    except OSError as exc:  # the per-host fan-out needs several descriptors per host
        old_err = f" FAILED ({exc.strerror})"
    old_t = time.perf_counter() - t
    old_tx = _tx_bytes(c.root_if) - tx2
    old_conns = sampler.close()
    print(
        f"  N={n:4d}: "
        + " ".join(f"{k} {v:.1f}s" for k, v in phases.items())
        + f" | sent {launch_tx / 1024:.0f} KiB for a {bundle / 1024:.0f} KiB bundle "
        f"(x{launch_tx / bundle:.2f}), relaunch sync {resync_tx / 1024:.1f} KiB, conns {conns}"
        f" | before: per-host upload {old_tx / 1024:.0f} KiB (x{old_tx / bundle:.1f}) in "
        f"{old_t:.1f}s, conns {old_conns}{old_err}"
    )
    print(
        "         KiB sent per phase: " + " ".join(f"{k} {v / 1024:.1f}" for k, v in sent.items())
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scale", default="", help="comma-separated host counts, e.g. 1,8,32")
    ap.add_argument("--nofile", type=int, default=0, help="the launcher's open-file limit")
    a = ap.parse_args()
    if a.scale:
        bench_scale([int(x) for x in a.scale.split(",")], a.nofile)
        return
    bench_ssh(a.hosts, a.repeats)
    bench_sync(a.repeats)
    bench_store()


if __name__ == "__main__":
    sys.exit(main())
