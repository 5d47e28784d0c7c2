"""``--cloud ssh`` (hosts the user already has): host lists, the master address, and what aios does
to the hosts, on real sshd hosts in network namespaces (no torch here: one host runs the script
directly)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.errors import AiosError
from aios_cloud.provider.errors import CloudError
from aios_cloud.request import LaunchRequest
from aios_cloud.sshhosts.hosts import HostSpec, parse_hosts, read_hosts_file
from aios_cloud.sshhosts.probe import Probe, internal_addresses


def aios(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def environ(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update({"AIOS_HOME": str(tmp_path / "aios-home"), "AIOS_PLUGINS": "aios-cloud"})
    return env


def test_cloud_sshhosts_bad_host_lists_are_one_line_and_exit_2(tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    (work / "t.py").write_text("print('x')\n")
    comments = tmp_path / "only-comments"
    comments.write_text("# the lab\n\n   # nothing else\n")
    env = environ(tmp_path)
    cases = [
        (["--hosts", ""], "--hosts: no hosts given"),
        (["--hosts", "root@a@b"], "'root@a@b' is not USER@HOST[:PORT]"),
        (["--hosts", "root@a:70000"], "has port '70000', not a number from 1 to 65535"),
        (["--hosts", "root@box,ubuntu@BOX:22"], "host box:22 is listed twice"),
        (["--hosts-file", str(tmp_path / "nope")], "cannot be read (No such file or directory)"),
        ([], "--cloud ssh needs the hosts to run on"),
    ]
    for args, msg in cases:
        r = aios(env, "launch", "--cloud", "ssh", *args, "--workdir", str(work), "t.py")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr
    # --hosts alone picks the ssh cloud; the host options are refused elsewhere
    r = aios(env, "launch", "--hosts", "root@a:0", "--workdir", str(work), "t.py")
    assert r.returncode == 2 and "has port '0'" in r.stderr
    assert not (tmp_path / "aios-home" / "clusters").exists()  # nothing recorded


def test_cloud_sshhosts_option_checks(tmp_path):
    from aios.errors import AiosError
    from aios_cloud.provider.data import ClusterRequest
    from aios_cloud.sshhosts.provider import SshHostsProvider

    comments = tmp_path / "only-comments"
    comments.write_text("# the lab\n\n   # nothing else\n")
    p = SshHostsProvider()
    for params, msg in (
        ({"hosts": "root@a,,root@b"}, "has an empty entry"),
        ({"hosts": "root@a:0"}, "has port '0'"),
        ({"hosts": "root@a:22x"}, "has port '22x'"),
        ({"hosts_file": str(comments)}, "lists no hosts"),
        ({"hosts": "a", "hosts_file": str(comments)}, "--hosts and --hosts-file both"),
        ({"hosts": "a", "nprocs_per_host": 0}, "--nprocs-per-host must be at least 1"),
        ({"hosts": "a", "network": "10.0.0.0/33"}, "is not an IPv4 network"),
        ({"hosts": "a", "max_restarts": 1, "checkpoint_dir": "ckpt"}, "is relative"),
    ):
        with pytest.raises(AiosError, match=msg):
            p.launch_extra(LaunchRequest("train.py", **params))
    extra = p.launch_extra(
        LaunchRequest(
            "train.py", hosts="a, b", ssh_user="me", max_restarts=1, checkpoint_dir="/nfs/c"
        )
    )
    assert extra["hosts"] == ["me@a", "me@b"] and extra["shared_checkpoint_dir"] == "/nfs/c"
    req = ClusterRequest("c", "auto", nodes=3, extra=extra)
    with pytest.raises(AiosError, match="--nodes 3 does not match the 2 hosts listed"):
        p.validate(req)
    assert p.validate(ClusterRequest("c", "auto", extra=extra)).nodes == 2
    assert (
        p.launch_extra(LaunchRequest("train.py"), existing=True) == {}
    )  # reusing a cluster: its hosts are recorded


def test_cloud_sshhosts_hosts_file_and_entries():
    assert parse_hosts(["box", "ubuntu@10.0.0.5:2222", "Lab-1.example.org"], "me") == [
        HostSpec("me", "box", 0),  # no port written: ~/.ssh/config (or ssh's 22) decides
        HostSpec("ubuntu", "10.0.0.5", 2222),
        HostSpec("me", "Lab-1.example.org", 0),  # as written (~/.ssh/config names)
    ]
    # no user written and no --ssh-user: none is passed (ssh_config's User, else ssh's default)
    assert parse_hosts(["labbox"], "") == [HostSpec("", "labbox", 0)]
    assert HostSpec("", "labbox", 0).target == "labbox"
    assert HostSpec("ubuntu", "10.0.0.5", 2222).target == "ubuntu@10.0.0.5:2222"
    # the same machine on another port is another sshd (NAT port forwards)
    assert len(parse_hosts(["a@h:2201", "a@h:2202"], "me")) == 2


def test_cloud_sshhosts_a_host_entry_may_name_its_own_worker_port(tmp_path):
    """Behind NAT each entry's :PORT is the gateway's forward; ``/WORKER_PORT`` is the port the
    other hosts reach that host's sshd at inside (else --worker-port, else 22): the head's hops
    use it, never the external port."""
    assert parse_hosts(["root@gw:2201", "root@gw:2203/2222", "box/2022"], "") == [
        HostSpec("root", "gw", 2201, 0),
        HostSpec("root", "gw", 2203, 2222),
        HostSpec("", "box", 0, 2022),
    ]
    spec = HostSpec("root", "gw", 2203, 2222)
    assert spec.target == "root@gw:2203" and spec.entry == "root@gw:2203/2222"
    for bad, msg in (
        ("root@gw:2203/0", "has worker port '0', not a number from 1 to 65535"),
        ("root@gw:2203/x", "has worker port 'x'"),
        ("root@gw/2222/22", re.escape("is not USER@HOST[:PORT][/WORKER_PORT]")),
    ):
        with pytest.raises(AiosError, match=msg):
            parse_hosts([bad], "")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "t.py").write_text("print('x')\n")
    hosts = "root@gw:2201,root@gw:2202,root@gw:2203/2222"
    r = aios(
        environ(tmp_path),
        *("launch", "--cloud", "ssh", "--hosts", hosts, "--worker-port", "2200", "--name", "nat"),
        *("--python", "python3", "--no-setup", "--workdir", str(work), "--dry-run", "t.py"),
    )
    assert r.returncode == 0, r.stderr
    hops = re.findall(r"known_hosts -p (\d+) root@gw '", r.stdout)
    # worker 1: --worker-port; worker 2: its own /2222 (code copy, setup, the job: 3 hops each)
    assert sorted(set(hops)) == ["2200", "2222"] and hops.count("2222") == hops.count("2200")
    assert not re.search(r"known_hosts -p 220[23] ", r.stdout)  # never the gateway's ports
    r = aios(
        environ(tmp_path),
        *("launch", "--cloud", "ssh", "--hosts", "root@gw:2203/70000", "--workdir", str(work)),
        "t.py",
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "has worker port '70000'" in lines[0]


def test_cloud_sshhosts_hosts_file_comments(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the lab\nroot@gpu-1:2222   # the big one\n\n  ubuntu@gpu-2\n")
    assert read_hosts_file(str(f)) == ["root@gpu-1:2222", "ubuntu@gpu-2"]


def _probe(*addrs: str) -> Probe:
    return Probe(addrs=[ipaddress.IPv4Interface(a) for a in addrs])


def test_cloud_sshhosts_master_address_is_worker_0_as_the_other_hosts_see_it():
    # reached from the laptop at NAT'd public addresses; every host also has docker0 with the
    # same 172.17.0.1 (not a network between them); the hosts' own network is 10.0.0.0/24
    probes = [
        _probe("172.17.0.1/16", "10.0.0.5/24"),
        _probe("172.17.0.1/16", "10.0.0.6/24"),
        _probe("10.0.0.7/24", "172.17.0.1/16"),
    ]
    addrs, how = internal_addresses(probes, ["198.51.100.7", "198.51.100.8", "198.51.100.9"])
    assert addrs == ["10.0.0.5", "10.0.0.6", "10.0.0.7"] and how == "on 10.0.0.0/24"
    # two shared networks: the one the laptop reaches worker 0 on comes first
    two = [_probe("192.168.1.5/24", "10.0.0.5/24"), _probe("10.0.0.6/24", "192.168.1.6/24")]
    assert internal_addresses(two, ["10.0.0.5", "10.0.0.6"])[0] == ["10.0.0.5", "10.0.0.6"]
    assert internal_addresses(two, [None, None], "192.168.1.0/24")[0] == [
        "192.168.1.5",
        "192.168.1.6",
    ]
    # nothing shared: the caller falls back to the SSH addresses (and says so)
    apart = [_probe("10.1.0.5/24"), _probe("10.2.0.6/24")]
    assert internal_addresses(apart, ["a", "b"])[0] == [None, None]
    with pytest.raises(CloudError, match=r"worker 1 has no address in --network 10.1.0.0/24"):
        internal_addresses(apart, ["a", "b"], "10.1.0.0/24")


@pytest.fixture
def one_host(sshd_cluster):
    return sshd_cluster(1, netns=True)


def _launch(env, cluster, work: Path, *extra: str) -> subprocess.CompletedProcess:
    h = cluster.hosts[0]
    return aios(
        env,
        "launch",
        "--cloud",
        "ssh",
        "--hosts",
        f"{cluster.user}@{h.ip}:{h.port}",
        "--identity",
        str(cluster.client_key),
        "--name",
        "box",
        "--python",
        sys.executable,
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        *extra,
    )


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _wait(cond, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_cloud_sshhosts_cancel_stop_start_down_touch_only_what_aios_wrote(tmp_path, one_host):
    h = one_host.hosts[0]
    work = tmp_path / "proj"
    work.mkdir()
    (work / "sleepy.py").write_text(
        "import os, time\nos.makedirs('out', exist_ok=True)\n"
        "open('out/result.txt', 'w').write('mine')\nprint('working', flush=True)\ntime.sleep(300)\n"
    )
    (h.home / "notes.txt").write_text("the user's own file")
    env = environ(tmp_path)
    root = h.home / "aios" / "box"
    r = _launch(env, one_host, work, "--detach", "sleepy.py")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"worker 0 {h.ip} (" in r.stderr and "CPUs, 1 proc)" in r.stderr  # the probe
    # after setup: the version-set check and aios's own device discovery ran on the host
    assert f"(worker 0, {h.ip}) [aios] {h.hostname}: 1 x CPU (cpu)" in r.stdout, r.stdout[-2000:]
    pid = root / "jobs" / "1" / "pid"
    _wait(lambda: (root / "code" / "out" / "result.txt").exists(), "the job to run")
    # cancel: the job's processes end, the cluster stays
    r = aios(env, "cancel", "box")
    assert r.returncode == 0 and "job 1 cancelled" in r.stderr, r.stderr
    assert not _alive(pid)
    earlier = root / "code" / "out" / "earlier.txt"  # what a finished job left in code/
    earlier.write_text("job 1's")
    # the cluster's hosts are recorded: relaunching with another plan is refused, not ignored
    r = _launch(env, one_host, work, "--nprocs-per-host", "3", "sleepy.py")
    assert r.returncode == 2 and "cluster box exists with other --nprocs-per-host" in r.stderr
    # a second aios (another laptop) must not take over a host where this name runs a job
    r = _launch(env, one_host, work, "--detach", "sleepy.py")
    assert r.returncode == 0, r.stderr
    pid2 = root / "jobs" / "2" / "pid"
    _wait(lambda: pid2.exists() and _alive(pid2), "the second job")
    assert earlier.read_text() == "job 1's"  # the relaunch's code sync kept the job's output
    other = dict(env, AIOS_HOME=str(tmp_path / "other-laptop"))
    r = _launch(other, one_host, work, "sleepy.py")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "already runs aios job 2 of a cluster named 'box'" in last
    assert _alive(pid2) and (root / "code" / ".aios-site").is_dir()  # nothing was touched
    # stop: only aios's processes end; every file stays; the host keeps running
    r = aios(env, "stop", "box")
    assert r.returncode == 0, r.stderr
    assert not _alive(pid2) and h.running
    assert (root / "code" / "sleepy.py").exists() and (root / "jobs" / "2" / "worker.log").exists()
    st = json.loads(aios(env, "status", "--json").stdout)[0]
    assert st["state"] == "STOPPED" and st["cloud"] == "ssh"
    r = aios(env, "start", "box")
    assert r.returncode == 0 and "started box" in r.stderr, r.stderr
    # autostop set later: refused in one line, nothing installed on the host
    r = aios(env, "autostop", "box", "10")
    assert r.returncode == 2 and "aios never stops hosts it did not create" in r.stderr, r.stderr
    assert not (root / "agent.json").exists()
    # down: aios's files go (listed in the dry run), the job's output and the user's files stay
    r = aios(env, "down", "box", "--dry-run")
    assert r.returncode == 0 and "remove aios's files" in r.stdout and h.ip in r.stdout
    assert (root / "jobs").exists()
    r = aios(env, "down", "box")
    assert r.returncode == 0, r.stderr
    assert "kept 2 files the job wrote" in r.stderr and "./out" in r.stderr, r.stderr
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "code",
        "code/out",
        "code/out/earlier.txt",
        "code/out/result.txt",
    ]
    assert (h.home / "notes.txt").read_text() == "the user's own file" and h.running
    assert json.loads(aios(env, "status", "--json").stdout) == []


def test_cloud_sshhosts_a_host_that_does_not_answer_is_named_and_nothing_is_left(
    tmp_path, sshd_cluster
):
    cluster = sshd_cluster(2, netns=True)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "t.py").write_text("print('x')\n")
    env = environ(tmp_path)
    cluster.hosts[1].stop()
    r = aios(
        env,
        "launch",
        "--cloud",
        "ssh",
        "--hosts",
        ",".join(f"{cluster.user}@{h.ip}" for h in cluster.hosts),
        "--identity",
        str(cluster.client_key),
        "--name",
        "half",
        "--host-wait",
        "1",
        "--python",
        sys.executable,
        "--workdir",
        str(work),
        "t.py",
    )
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert (
        f"1 of 2 hosts did not answer over SSH within 1s (worker 1, {cluster.hosts[1].ip}" in line
    )
    assert json.loads(aios(env, "status", "--json").stdout) == []
    assert not (cluster.hosts[0].home / "aios").exists()


def test_cloud_sshhosts_a_host_with_a_new_key_is_never_trusted(tmp_path, one_host):
    h = one_host.hosts[0]
    work = tmp_path / "proj"
    work.mkdir()
    (work / "sleepy.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(300)\n")
    env = environ(tmp_path)
    r = _launch(
        env,
        one_host,
        work,
        "--max-restarts",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--host-wait",
        "1",
        "--no-setup",
        "--detach",
        "sleepy.py",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = h.home / "aios" / "box" / "jobs" / "1" / "worker.log"
    _wait(lambda: log.exists() and "working" in log.read_text(), "the job to run")
    h.stop()
    h.start(new_host_key=True)  # another machine answers at the address (or someone in between)

    def final():
        j = json.loads(aios(env, "status", "--json").stdout)[0]["jobs"][-1]
        return j if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    _wait(final, "the job to end", timeout=120)
    watcher = (tmp_path / "aios-home" / "clusters" / "box" / "watcher-1.log").read_text()
    assert final()["state"] == "FAILED", watcher[-3000:]
    assert "hosts replaced (worker 0: new host key)" in watcher
    assert "changed since aios first connected; aios does not trust it by itself" in watcher
    assert "reconnected to the replaced hosts" not in watcher
    # down forgets the cluster but does not touch the host it no longer trusts
    r = aios(env, "down", "box")
    assert r.returncode == 0 and "its host key changed: not touched" in r.stderr, r.stderr
    assert (h.home / "aios" / "box" / "code" / "sleepy.py").exists()


def test_cloud_sshhosts_a_host_without_torch_is_one_line_and_the_launch_undone(tmp_path, one_host):
    bare = tmp_path / "bare"  # an interpreter without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "t.py").write_text("print('x')\n")
    env = environ(tmp_path)
    h = one_host.hosts[0]
    r = aios(
        env,
        "launch",
        "--cloud",
        "ssh",
        "--hosts",
        f"{one_host.user}@{h.ip}",
        "--identity",
        str(one_host.client_key),
        "--name",
        "bare",
        "--python",
        str(bare / "bin" / "python"),
        "--no-setup",
        "--workdir",
        str(work),
        "t.py",
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert f"torch is not installed for {bare / 'bin' / 'python'}" in last and "(worker 0" in last
    assert json.loads(aios(env, "status", "--json").stdout) == []
    assert not (h.home / "aios").exists()  # the failed launch removed what it had written


def test_cloud_sshhosts_the_probe_counts_tpu_chips_by_device_id_not_gvnic(tmp_path, sshd_cluster):
    """gVNIC has Google's PCI vendor id 0x1ae0 (device 0x0042) and is on every third-generation
    and later GCE VM (https://cloud.google.com/compute/docs/networking/using-gvnic): a TPU chip is
    a TPU device id under the vendor (aios.devices.pci, the table backend-xla's discovery uses)."""
    from aios.devices.pci import GOOGLE_PCI_VENDOR, GVNIC_PCI_DEVICE
    from aios_cloud.testing.sshd import GCE_VM_PCI

    v6e = (GOOGLE_PCI_VENDOR, "0x006f")
    assert (GOOGLE_PCI_VENDOR, GVNIC_PCI_DEVICE) in GCE_VM_PCI
    # worker 0: a GCE CPU VM (gVNIC only); worker 1: a v6e-4 TPU VM (gVNIC and 4 chips)
    cluster = sshd_cluster(2, netns=True, pci=[list(GCE_VM_PCI), [*GCE_VM_PCI, *[v6e] * 4]])
    work = tmp_path / "proj"
    work.mkdir()
    (work / "t.py").write_text("print('ran on a GCE VM', flush=True)\n")
    env = environ(tmp_path)
    cpu_vm, tpu_vm = cluster.hosts

    def launch(h, name, *extra):
        return aios(
            env,
            "launch",
            "--cloud",
            "ssh",
            "--hosts",
            f"{cluster.user}@{h.ip}",
            "--identity",
            str(cluster.client_key),
            "--name",
            name,
            "--python",
            sys.executable,
            "--no-setup",
            "--workdir",
            str(work),
            *extra,
            "t.py",
        )

    r = launch(cpu_vm, "cpuvm")  # -a auto: a GCE CPU VM is a CPU host
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TPU chips" not in r.stderr and "ran on a GCE VM" in r.stdout, r.stderr[-2000:]
    r = launch(tpu_vm, "tpuvm")  # the TPU VM: its 4 chips, not 5
    assert r.returncode == 2 and "has 4 TPU chips; -a auto trains on CPU only" in r.stderr, (
        r.stderr[-2000:]
    )
    assert aios(env, "down", "cpuvm").returncode == 0


def test_cloud_sshhosts_installs_into_aios_own_environment_never_a_system_python(tmp_path):
    """Debian 12 / Ubuntu 24.04 refuse pip installs into the system interpreter (PEP 668,
    https://peps.python.org/pep-0668/), and elsewhere they would change the user's machine: the
    setup creates aios's own venv in the cluster's directory (system site packages visible, so a
    torch the host has is used as it is), installs only what it lacks there, and `aios down`
    removes it. With --python nothing is installed."""
    from aios_cloud.request import LaunchRequest
    from aios_cloud.sshhosts.provider import SshHostsProvider
    from aios_cloud.sshhosts.shell import VENV_PYTHON, cleanup_command

    p = SshHostsProvider()
    p.launch_extra(LaunchRequest(script="t.py", hosts="me@box"))
    assert p.python("cpu") == VENV_PYTHON
    lines = p.setup_commands("cpu", ["pip"])
    text = "\n".join(lines)
    assert "-m venv --system-site-packages .aios-venv" in text
    assert not any(ln.lstrip().startswith("python3 -m pip") for ln in lines)
    # run the setup as a host would, in the cluster's code directory, with the host's python3
    code = tmp_path / "aios" / "box" / "code"
    code.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = "/usr/bin:/bin"  # the host's python3, no uv: the venv module's path
    r = subprocess.run(["bash", "-c", text], cwd=code, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (code / VENV_PYTHON).exists() and "installing" not in r.stdout  # pip was there
    r = subprocess.run(
        [str(code / VENV_PYTHON), "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "True"  # a virtual environment, not the system interpreter
    # aios down removes it with aios's other files
    env["HOME"] = str(tmp_path)
    r = subprocess.run(["bash", "-c", cleanup_command("box", True)], env=env, text=True)
    assert not (code / ".aios-venv").exists()
    # the user's --python: used as it is, nothing installed
    mine = SshHostsProvider()
    mine.launch_extra(LaunchRequest(script="t.py", hosts="me@box", python="/opt/py/bin/python"))
    assert mine.python("cpu") == "/opt/py/bin/python" and mine.setup_commands("cpu", ["x"]) == []


def _fake_venv(root, pip_ok: bool) -> None:
    """``.aios-venv/bin/python`` with no torch whose pip either installs it (writes the marker
    the metadata check reads) or fails as pip does when no index has the build."""
    bindir = root / ".aios-venv" / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    have = root / "have-torch"
    install = (
        f'touch {have}; exit 0' if pip_ok
        else 'echo "ERROR: No matching distribution found for torch==2.13.0" >&2; exit 1'
    )  # fmt: skip
    py.write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = -c ]; then [ -f {have} ]; exit $?; fi\n'
        'if [ "$1 $2 $3" = "-m pip --version" ]; then exit 0; fi\n'
        f'if [ "$1 $2 $3" = "-m pip install" ]; then echo "$@" > {root}/pip-args; {install}; fi\n'
        "exit 3\n"
    )
    py.chmod(0o755)


@pytest.mark.parametrize("pip_ok", [True, False], ids=["installs", "cannot"])
def test_cloud_ssh_setup_installs_torch_into_its_own_venv_or_says_what_to_pass(tmp_path, pip_ok):
    """Setup on a host whose python3 has no torch: the CPU torch goes into aios's own venv with
    that venv's pip (the host's pip configuration applies), said in one line with the time it
    took; when pip cannot, one line with pip's reason and the --requirements to pass, exit 2."""
    from aios_cloud.sshhosts.shell import torch_setup

    _fake_venv(tmp_path, pip_ok)
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + torch_setup("cpu")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = r.stdout.splitlines()
    assert (tmp_path / "pip-args").read_text().split() == [
        "-m", "pip", "install", "--quiet", "torch==2.13.0"
    ]  # fmt: skip
    assert len(lines) == 1, r.stdout + r.stderr
    if pip_ok:
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(
            r"\[aios\] \S+: python3 has no torch: installed torch==2\.13\.0 \(cpu\) into "
            r"\.aios-venv in \d+s",
            lines[0],
        ), lines
    else:
        assert r.returncode == 2
        assert "installing torch==2.13.0 into .aios-venv failed (ERROR: No matching " in lines[0]
        assert (
            "echo 'torch==2.13.0' > requirements.txt and --requirements requirements.txt"
            in (lines[0])
        )


def test_cloud_ssh_setup_leaves_a_torch_already_there_alone(tmp_path):
    from aios_cloud.sshhosts.shell import torch_setup

    _fake_venv(tmp_path, pip_ok=False)
    (tmp_path / "have-torch").touch()
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + torch_setup("cpu")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout == "" and not (tmp_path / "pip-args").exists()
