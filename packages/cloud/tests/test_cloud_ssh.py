"""The parallel SSH runner against real sshd hosts (aios_cloud.testing.sshd)."""

from __future__ import annotations

import io
import os
import random
import subprocess
from pathlib import Path

import pytest
from aios_cloud.provider.data import ClusterHost
from aios_cloud.ssh import LinePrinter, SshError, SshRunner, ensure_client_key
from aios_cloud.testing.sshd import SshdCluster


@pytest.fixture
def cluster(sshd_cluster):
    return sshd_cluster(2)  # the aios pytest plugin: skips (fails with CI=true) without sshd


def hosts_of(c: SshdCluster) -> list[ClusterHost]:
    return [
        ClusterHost(
            h.worker_id,
            h.ip,
            h.internal_ip,
            ssh_user=c.user,
            ssh_key=str(c.client_key),
            port=h.port,
        )
        for h in c.hosts
    ]


def test_cloud_ssh_runs_everywhere_in_parallel_with_prefixes(cluster, tmp_path):
    out = io.StringIO()
    r = SshRunner(hosts_of(cluster), tmp_path / "kh", alias="aios-t", printer=LinePrinter(out))
    res = r.run(lambda h: f"echo one-{h.worker_id}; echo $HOME; sleep 1; echo two-{h.worker_id}")
    assert [x.host.worker_id for x in res] == [0, 1] and all(x.ok for x in res)
    lines = out.getvalue().splitlines()
    for h in cluster.hosts:
        assert f"(worker {h.worker_id}, {h.ip}) one-{h.worker_id}" in lines
        assert f"(worker {h.worker_id}, {h.ip}) {h.home}" in lines  # each host has its own home
    # both slept in parallel: the whole run took about 1 s, not 2
    import time

    t = time.monotonic()
    r.run("sleep 1", stream=False)
    assert time.monotonic() - t < 1.9
    res = r.run("exit 5", stream=False)
    assert [x.returncode for x in res] == [5, 5]
    with pytest.raises(SshError, match="step failed on 2 of 2 hosts"):
        r.check(res, "step")


def test_cloud_ssh_pins_host_keys_and_refuses_a_changed_one(cluster, tmp_path):
    kh = tmp_path / "kh"
    r = SshRunner(hosts_of(cluster), kh, alias="aios-pin")
    assert all(x.ok for x in r.run("true", stream=False))
    pinned = kh.read_text()
    assert "aios-pin-w0" in pinned and "aios-pin-w1" in pinned
    h0 = cluster.hosts[0]
    h0.stop()
    h0.start(new_host_key=True)  # as after a cloud stop/start
    with pytest.raises(SshError, match="host key of worker 0, .* changed unexpectedly"):
        r.run("true", stream=False)
    r.reset_host_keys()  # what aios does after it stopped/started or recreated the hosts
    assert all(x.ok for x in r.run("true", stream=False))
    assert kh.read_text() != pinned


def test_cloud_ssh_retries_transient_exit_255_with_backoff(cluster, tmp_path):
    h0 = cluster.hosts[0]
    h0.stop()  # connection refused, like a VM whose sshd is not up yet
    delays: list[float] = []

    def sleep(d: float) -> None:
        delays.append(d)
        if len(delays) == 2:
            h0.start(new_host_key=False)

    out = io.StringIO()
    r = SshRunner(
        hosts_of(cluster)[:1],
        tmp_path / "kh",
        alias="aios-r",
        backoff=0.5,
        sleep=sleep,
        rng=random.Random(0),
        printer=LinePrinter(out),
    )
    res = r.run("echo up")
    assert res[0].ok and res[0].attempts == 3 and res[0].stdout == ["up"]
    assert len(delays) == 2 and delays[1] > delays[0]  # exponential backoff (with jitter)
    assert "ssh exit 255" in out.getvalue() and "retry 1/5" in out.getvalue()
    # a remote command that itself printed output and exited 255 is not re-run
    res = r.run("echo ran; exit 255", stream=False)
    assert res[0].returncode == 255 and res[0].attempts == 1
    # retries are bounded
    h0.stop()
    r2 = SshRunner(
        hosts_of(cluster)[:1],
        tmp_path / "kh",
        alias="aios-r",
        retries=2,
        backoff=0.01,
        sleep=lambda d: None,
    )
    res = r2.run("true", stream=False)
    assert res[0].returncode == 255 and res[0].attempts == 3


def test_cloud_ssh_key_problems_are_one_line_errors(cluster, tmp_path):
    with pytest.raises(SshError, match="SSH key /nonexistent/key does not exist"):
        SshRunner(hosts_of(cluster), tmp_path / "kh", key="/nonexistent/key")
    other = ensure_client_key(tmp_path / "keys" / "other")
    assert ensure_client_key(tmp_path / "keys" / "other") == other  # created once
    hosts = [
        ClusterHost(h.worker_id, h.ip, ssh_user=cluster.user, ssh_key=str(other), port=h.port)
        for h in cluster.hosts
    ]
    with pytest.raises(SshError, match="was refused"):
        SshRunner(hosts, tmp_path / "kh", alias="aios-k").run("true", stream=False)


def test_cloud_sshd_hosts_reach_each_other(cluster):
    h0, h1 = cluster.hosts
    cmd = (
        f"python3 -c \"import socket; socket.create_connection(('{h1.internal_ip}', {h1.port}), "
        "3); print('reached')\""
    )
    r = subprocess.run(cluster.ssh_argv(h0) + [cmd], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "reached", r.stderr


def test_an_agent_is_used_once_it_listens_not_once_its_socket_exists(tmp_path, monkeypatch):
    """ssh-agent binds its socket (the file appears) before it listens; an ``ssh-add`` in
    between is refused. Here the real ssh-agent runs behind a wrapper that holds the socket
    bound and not listening for 2 s first (the window a loaded machine stretches): the key
    still reaches the agent. Before, ``agent_env`` took the socket's file for a live agent and
    returned no agent at all (CI at 6878ec0: the 4th of 8 agents)."""
    import shutil
    import sys

    from aios_cloud import ssh

    real = shutil.which("ssh-agent")
    if real is None or shutil.which("ssh-add") is None:
        pytest.skip("ssh-agent/ssh-add (openssh-client) are not installed")
    wrap = tmp_path / "bin" / "ssh-agent"
    wrap.parent.mkdir()
    wrap.write_text(
        f"#!{sys.executable}\n"
        "import os, socket, sys, time\n"
        "path = sys.argv[sys.argv.index('-a') + 1]\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind(path)  # there, not listening\n"
        "time.sleep(2)\n"
        "s.close()\n"
        "os.unlink(path)\n"
        f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n"
    )
    wrap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrap.parent}:{os.environ['PATH']}")
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    try:
        env = ssh.agent_env(str(key))
        assert env, "no agent: the socket's file was taken for a listening agent"
        listed = subprocess.run(
            ["ssh-add", "-L"], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True
        )
        assert listed.stdout.split()[:2] == key.with_suffix(".pub").read_text().split()[:2]
    finally:
        ssh.close_masters()


def test_cloud_ssh_forwarded_agent_reaches_a_host_after_many_other_clusters_keys(cluster, tmp_path):
    """A process that reached other clusters before (a long-lived watcher, a test session)
    forwards an agent holding only this cluster's key: an agent with every key it ever used
    offers them in turn, and sshd ends the login after MaxAuthTries (6) wrong ones."""
    from aios_cloud import ssh

    try:
        for i in range(7):  # seven other clusters' keys, each added to this process's agents
            other = tmp_path / f"other{i}"
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True
            )
            assert ssh.agent_env(str(other))
        env = ssh.agent_env(str(cluster.client_key))
        listed = subprocess.run(
            ["ssh-add", "-L"], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True
        )
        pub = cluster.client_key.with_suffix(".pub").read_text().split()[:2]
        assert listed.stdout.split()[:2] == pub, listed.stdout
        assert len(listed.stdout.splitlines()) == 1, listed.stdout
        h0, h1 = cluster.hosts
        r = SshRunner(
            hosts_of(cluster)[:1],
            tmp_path / "kh",
            key=str(cluster.client_key),
            alias="aios-fa",
            forward_agent=True,
        ).run(
            # from worker 0 to worker 1 with the forwarded agent alone (no key file there)
            f"ssh -p {h1.port} -o BatchMode=yes -o StrictHostKeyChecking=no "
            f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR {cluster.user}@{h1.internal_ip} "
            "echo reached-w1",
            stream=False,
        )
        assert r[0].ok and "reached-w1" in r[0].stdout, r[0].stderr
    finally:
        ssh.close_masters()
    assert not Path(env["SSH_AUTH_SOCK"]).exists()  # this process's agents end with it
