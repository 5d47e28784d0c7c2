"""On-cluster autostop/autodown, `aios cancel`, `--down` after a Ctrl-C detach: the real aios
CLI, real sshd hosts (network namespaces) behind the local Cloud TPU service. The autostop agent
runs on the head host and calls the service itself (it is reachable from the hosts), so the
cluster goes away while nothing on the launching side runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios_cloud_gcp.testing import FakeTpuService

pytestmark = pytest.mark.slow


@pytest.fixture
def reachable_tpu(sshd_hosts):
    """The TPU service on every address, so the hosts reach it at the root namespace's address."""
    with FakeTpuService(
        machines=sshd_hosts.hosts,
        authorized_keys=sshd_hosts.authorized_keys,
        project="aios-test",
        host="0.0.0.0",
    ) as svc:
        svc.host_url = (
            f"http://{sshd_hosts.subnet}.1:{svc.server.server_address[1]}"
            if sshd_hosts.use_netns
            else svc.url
        )
        yield svc


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "hello.py").write_text("print('hello', flush=True)\n")
    (work / "sleepy.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(120)\n")
    return work


def _status(aios_cli, env) -> list[dict]:
    r = aios_cli(env, "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_idle_cluster_deletes_itself_with_autodown(
    tmp_path, sshd_hosts, reachable_tpu, gcp_env, aios_cli, wait_for
):
    work = _work(tmp_path)
    env = gcp_env(tmp_path, reachable_tpu, AIOS_GCP__AGENT_ENDPOINT=reachable_tpu.host_url)
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "idle",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        "--autostop",
        "0.05",
        "--autodown",
        "hello.py",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "autostop: the agent on worker 0" in r.stderr
    # the launching process has exited: only the agent on the head host is left to act
    wait_for(lambda: reachable_tpu.nodes == {}, 120, "the idle cluster to delete itself")
    deleters = {
        ip
        for m, path, ip in reachable_tpu.callers
        if m == "DELETE" and path.endswith("/nodes/idle")
    }
    assert deleters == {sshd_hosts.hosts[0].ip}  # the head host itself called the API
    st = aios_cli(env, "status", "--refresh", "--json")
    assert json.loads(st.stdout)[0]["state"] == "NOT_FOUND"
    assert aios_cli(env, "down", "idle").returncode == 0


def test_autostop_waits_for_the_running_job_and_spot_is_refused(
    tmp_path, sshd_hosts, reachable_tpu, gcp_env, aios_cli, wait_for
):
    work = _work(tmp_path)
    env = gcp_env(tmp_path, reachable_tpu, AIOS_GCP__AGENT_ENDPOINT=reachable_tpu.host_url)
    spot = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "sp",
        "--spot",
        "--autostop",
        "1",
        "--workdir",
        str(work),
        "hello.py",
    )
    assert (
        spot.returncode == 2
        and "spot capacity cannot be stopped" in spot.stderr
        and reachable_tpu.nodes == {}
    )
    # a multi-host slice cannot be stopped (only deleted): refused before anything is created
    multi = aios_cli(
        env,
        *("launch", "--cloud", "gcp", "-a", "v4-16", "--name", "mh", "--autostop", "1"),
        *("--workdir", str(work), "hello.py"),
    )
    assert multi.returncode == 2 and "multi-host slice" in multi.stderr, multi.stderr
    assert "--autodown" in multi.stderr and reachable_tpu.nodes == {}
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-8",
        "--name",
        "busy",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        "--autostop",
        "0.02",
        "--detach",
        "sleepy.py",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    state = sshd_hosts.hosts[0].home / "aios" / "busy" / "agent.state"
    wait_for(
        lambda: state.exists() and json.loads(state.read_text())["running"],
        60,
        "the agent to see the job",
    )
    time.sleep(3)  # far past the 1.2 s idle limit: a running job keeps the cluster up
    assert reachable_tpu.node("busy").body["state"] == "READY"
    # aios cancel stops the job on every host; the agent then stops the idle cluster
    c = aios_cli(env, "cancel", "busy")
    assert c.returncode == 0 and "job 1 cancelled" in c.stderr, c.stderr
    assert _status(aios_cli, env)[0]["jobs"][0]["state"] == "CANCELLED"
    wait_for(
        lambda: reachable_tpu.node("busy").body["state"] == "STOPPED",
        120,
        "the agent to stop the cluster",
    )
    assert aios_cli(env, "down", "busy").returncode == 0 and reachable_tpu.nodes == {}


def test_agent_comes_back_after_a_reboot_and_after_aios_start(
    tmp_path, sshd_hosts, reachable_tpu, gcp_env, aios_cli, wait_for
):
    work = _work(tmp_path)
    env = gcp_env(tmp_path, reachable_tpu, AIOS_GCP__AGENT_ENDPOINT=reachable_tpu.host_url)
    r = aios_cli(
        env,
        *("launch", "--cloud", "gcp", "-a", "v4-8", "--name", "rb", "--backend", "cpu"),
        *("--python", sys.executable, "--no-setup", "--workdir", str(work), "--poll", "0.3"),
        *("--autostop", "10", "--detach", "sleepy.py"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    head = sshd_hosts.hosts[0]
    root = head.home / "aios" / "rb"
    assert "# aios-agent rb" in head.cron_table()  # the @reboot entry

    def agent_pid() -> int | None:
        try:
            pid = json.loads((root / "agent.state").read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return None
        try:  # alive: not gone, not a zombie waiting to be reaped
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            alive = False
        return pid if alive else None

    first = wait_for(agent_pid, 60, "the agent to run")
    # the head host reboots: every process on it dies; cron's @reboot entry restarts the agent
    head.stop()
    head.start(new_host_key=False)
    second = wait_for(
        lambda: (agent_pid() or first) != first and agent_pid(), 60, "the agent after the reboot"
    )
    # stopped and started by the user: aios start installs the agent again
    assert aios_cli(env, "stop", "rb").returncode == 0
    assert reachable_tpu.node("rb").body["state"] == "STOPPED"
    wait_for(lambda: agent_pid() is None, 30, "the stopped host's agent to be gone")
    st = aios_cli(env, "start", "rb")
    assert st.returncode == 0 and "autostop: the agent on worker 0" in st.stderr, st.stderr
    third = wait_for(agent_pid, 60, "the agent after aios start")
    # the started host has a new host key: aios re-pinned it, ssh keeps working
    ex = aios_cli(env, "exec", "rb", "echo ok")
    assert ex.returncode == 0 and " ok" in ex.stdout, ex.stdout + ex.stderr
    assert third not in (first, second)
    assert json.loads((root / "agent.json").read_text())["idle_seconds"] == 600
    assert aios_cli(env, "down", "rb").returncode == 0 and reachable_tpu.nodes == {}


@pytest.mark.parametrize("down", [True, False])
def test_a_foreground_launch_detached_with_ctrl_c_stays_watched_and_keeps_down(
    tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli, wait_for, down
):
    """Ctrl-C while watching detaches like --detach: a background watcher sees the job to its
    end (an unmanaged job too: nothing runs unwatched) and honours --down."""
    work = _work(tmp_path)
    (work / "short.py").write_text(
        "import time\nprint('working', flush=True)\ntime.sleep(4)\nprint('finished', flush=True)\n"
    )
    env = gcp_env(tmp_path, fake_tpu)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aios.cli.main",
            "launch",
            "--cloud",
            "gcp",
            "-a",
            "v4-16",
            "--name",
            "fg",
            "--backend",
            "cpu",
            "--python",
            sys.executable,
            "--no-setup",
            "--workdir",
            str(work),
            "--poll",
            "0.3",
            *(["--down"] if down else []),
            "short.py",
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        log = sshd_hosts.hosts[0].home / "aios" / "fg" / "jobs" / "1" / "worker.log"
        wait_for(lambda: log.exists() and "working" in log.read_text(), 120, "the job to start")
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "a background watcher (pid" in err, err
    assert ("deletes the cluster when it ends (--down)" in err) == down, err
    # the background watcher sees the job to its end (and then deletes the cluster: --down)
    watcher_log = Path(env["AIOS_HOME"]) / "clusters" / "fg" / "watcher-1.log"
    wait_for(
        lambda: watcher_log.exists() and "job 1 succeeded" in watcher_log.read_text(),
        120,
        "the background watcher to see the job end",
    )
    if down:
        wait_for(lambda: fake_tpu.nodes == {}, 120, "--down after the detach")
    else:  # the cluster stays, as without Ctrl-C; the job is over
        assert len(fake_tpu.nodes) == 1
        assert aios_cli(env, "down", "fg").returncode == 0 and fake_tpu.nodes == {}
