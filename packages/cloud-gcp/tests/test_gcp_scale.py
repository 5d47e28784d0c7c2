"""A launch that never hangs and leaves nothing working unwatched: the real aios CLI against the
local Cloud TPU service whose v4-16 nodes are two real sshd hosts (network namespaces). A host
that never answers is named and the cluster deleted; a host lost mid-job stops the job on the
healthy host; SIGTERM to the launcher while it watches stops the job and deletes the cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from aios_cloud_gcp.testing import FakeTpuService

pytestmark = pytest.mark.slow


def _project(tmp_path: Path) -> Path:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "sleepy.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(600)\n")
    return work


def _launch(work: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aios.cli.main",
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        name,
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--no-bundle",
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        *extra,
        "sleepy.py",
    ]


def _job_procs(host: Any) -> list[int]:
    """The job's processes still running on ``host`` (sshd hosts share this machine)."""
    tag = f"AIOS_TEST_HOST={host.name}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if b"sleepy.py" in (d / "cmdline").read_bytes() and tag in (
                d / "environ"
            ).read_bytes().split(b"\0"):
                out.append(int(d.name))
        except OSError:
            continue
    return out


class _Paused:
    """A machine whose sshd accepts connections and never answers (SIGSTOP): a hung host."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)

    def start(self, new_host_key: bool = True) -> None:
        self.host.start(new_host_key=new_host_key)
        os.killpg(self.host.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.host.proc is not None:
            os.killpg(self.host.proc.pid, signal.SIGCONT)
        self.host.stop()


def test_a_hung_host_is_named_and_the_cluster_deleted(tmp_path, sshd_hosts, gcp_env, aios_cli):
    h0, h1 = sshd_hosts.hosts
    with FakeTpuService(
        machines=[h0, _Paused(h1)], authorized_keys=sshd_hosts.authorized_keys, project="aios-test"
    ) as svc:
        env = gcp_env(tmp_path, svc, AIOS_REACH_TIMEOUT="20")
        work = _project(tmp_path)
        r = subprocess.run(
            _launch(work, "hung"), env=env, text=True, capture_output=True, timeout=240
        )
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
        err = r.stderr
        assert "1 of 2 hosts not reachable from the head host after 20s: worker 1 (" in err, err
        assert "launch failed; deleting hung so nothing is left behind" in err
        last = err.strip().splitlines()[-1]
        assert "hung was deleted, nothing is left running" in last and "aios start" not in last
        assert svc.nodes == {}


def test_a_host_lost_mid_job_stops_the_job_on_the_healthy_host(
    tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli, wait_for
):
    h0, h1 = sshd_hosts.hosts
    env = gcp_env(tmp_path, fake_tpu)
    work = _project(tmp_path)
    p = subprocess.Popen(
        _launch(work, "lost", "--down"),
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: _job_procs(h0) and _job_procs(h1), 120, "the job on both hosts")
        h1.stop()  # the host is gone: sshd and every process on it
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, err[-2000:]
    assert "stopping job 1 on the remaining hosts of lost" in err, err[-3000:]
    assert "the job was stopped on the other hosts" in err
    assert not _job_procs(h0)  # nothing keeps the healthy host busy
    assert fake_tpu.nodes == {}  # --down: the cluster is deleted too


def test_sigterm_while_watching_stops_the_job_and_deletes_the_cluster(
    tmp_path, sshd_hosts, fake_tpu, gcp_env, wait_for
):
    h0, h1 = sshd_hosts.hosts
    env = gcp_env(tmp_path, fake_tpu)
    work = _project(tmp_path)
    p = subprocess.Popen(
        _launch(work, "term"), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines: list[str] = []
    assert p.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        # the launcher is watching: the job runs on both hosts and the start phase is over
        wait_for(
            lambda: (
                any("job 1 started on 2 hosts" in ln for ln in lines)
                and _job_procs(h0)
                and _job_procs(h1)
            ),
            120,
            "the launcher to watch the job",
        )
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)
        reader.join(10)
    finally:
        if p.poll() is None:
            p.kill()
    err = "".join(lines)
    assert p.returncode == 143, err[-2000:]
    assert "terminated: stopped job 1 and deleted term (this launch created it)" in err
    assert fake_tpu.nodes == {}
    assert not _job_procs(h0) and not _job_procs(h1)
