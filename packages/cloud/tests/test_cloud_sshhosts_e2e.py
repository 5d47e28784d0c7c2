"""End to end: ``aios launch --cloud ssh`` on real sshd hosts in network namespaces (no stand-in:
the hosts are the user's machines). examples/gpt.py trains with 2 processes per host over gloo
on 2 and on 4 hosts; one host is killed mid-run and the managed job resumes from the newest
checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TINY = [
    "--data",
    "corpus.txt",
    "--n-layer",
    "1",
    "--n-embd",
    "16",
    "--n-head",
    "2",
    "--batch-size",
    "4",
    "--block-size",
    "16",
    "--warmup",
    "2",
    "--eval-batches",
    "1",
]
DONE_RE = re.compile(r"gpt: done (\d+) steps \((\d+) this run\)")


def project(tmp_path: Path) -> Path:
    if not (EXAMPLES / "gpt.py").is_file():
        pytest.skip("examples/gpt.py is not in this checkout")
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(EXAMPLES / "gpt.py", work / "gpt.py")
    shutil.copy(EXAMPLES / "data" / "corpus.txt", work / "corpus.txt")
    return work


def aios(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def environ(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_HOME": str(tmp_path / "aios-home"),
            "AIOS_PLUGINS": "aios-cloud",
            "COLUMNS": "200",
        }
    )
    return env


def hosts_arg(cluster) -> str:
    return ",".join(f"{cluster.user}@{h.ip}:{h.port}" for h in cluster.hosts)


def launch(cluster, work: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [
        "launch",
        "--cloud",
        "ssh",
        "--hosts",
        hosts_arg(cluster),
        "--identity",
        str(cluster.client_key),
        "--name",
        name,
        "--python",
        sys.executable,
        "--nprocs-per-host",
        "2",
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        "--env",
        "OMP_NUM_THREADS=1",
        "--env",
        "GPT_SAMPLE=0",
        *extra,
        "gpt.py",
        "--",
        *TINY,
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
    ]


def job(env: dict[str, str]) -> dict:
    r = aios(env, "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def wait_for(cond, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def committed(ckpt: Path) -> list[int]:
    return sorted(
        int(m.group(1))
        for p in ckpt.glob("ckpt-*/aios-checkpoint.json")
        if (m := re.search(r"ckpt-(\d+)", str(p)))
    )


def freeze_at_checkpoint(cluster, name: str, ckpt: Path, steps: int) -> int:
    """Pause the job on every host (SIGSTOP to its process group) as soon as a checkpoint is
    committed, so the kill lands mid-run whatever the machine's speed. Returns that step."""
    pids = [h.home / "aios" / name / "jobs" / "1" / "pid" for h in cluster.hosts]
    wait_for(lambda: all(p.exists() for p in pids), 120, "the job to start on every host")
    groups = [int(p.read_text()) for p in pids]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for g in groups:
            os.killpg(g, signal.SIGSTOP)
        done = committed(ckpt)
        if done:
            assert max(done) < steps, "the job ended before the host could be killed"
            return max(done)
        for g in groups:
            os.killpg(g, signal.SIGCONT)
        time.sleep(0.2)
    raise AssertionError("no checkpoint was committed")


@pytest.mark.parametrize("n", [2, 4])
def test_cloud_ssh_hosts_resume_after_a_host_is_killed_and_comes_back(tmp_path, sshd_cluster, n):
    cluster = sshd_cluster(n, netns=True)
    work = project(tmp_path)
    env = environ(tmp_path)
    ckpt = tmp_path / "shared-ckpt"  # the hosts share this filesystem (as over NFS)
    steps = 40
    r = aios(
        env,
        *launch(
            cluster,
            work,
            "lab",
            steps,
            "--max-restarts",
            "1",
            "--checkpoint-dir",
            str(ckpt),
            "--env",
            "AIOS_CHECKPOINT__EVERY=5",
            "--detach",
        ),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "master address" in r.stderr and cluster.hosts[0].ip in r.stderr
    at = freeze_at_checkpoint(cluster, "lab", ckpt, steps)
    h0, lost = cluster.hosts[0], cluster.hosts[-1]
    lost.stop()  # the machine dies: sshd and every process on it
    for h in cluster.hosts[:-1]:
        os.killpg(int((h.home / "aios" / "lab" / "jobs" / "1" / "pid").read_text()), signal.SIGCONT)
    wait_for(
        lambda: any(e["kind"] == "preempted" for e in job(env)["recoveries"]),
        120,
        "the watcher to notice the lost host",
        interval=0.5,
    )
    lost.start(new_host_key=False)  # the machine reboots (same host key)
    final = wait_for(
        lambda: (
            lambda j: (
                j if j["state"] not in ("RUNNING", "RECOVERING", "SETTING_UP", "PENDING") else None
            )
        )(job(env)["jobs"][-1]),
        300,
        "the managed job to finish",
        interval=1,
    )
    watcher = (Path(env["AIOS_HOME"]) / "clusters" / "lab" / "watcher-1.log").read_text()
    assert final["state"] == "SUCCEEDED" and final["restarts"] == 1, watcher[-4000:]
    assert f"hosts lost (worker {n - 1}: unreachable)" in watcher
    logs = aios(env, "logs", "lab")
    m = DONE_RE.search(logs.stdout)
    assert m and int(m.group(1)) == steps and int(m.group(2)) <= steps - at, logs.stdout[-3000:]
    assert f"{2 * n} x cpu" in logs.stdout  # every host again, 2 processes each
    r = aios(env, "down", "lab")
    assert r.returncode == 0, r.stderr
    # aios's own files are gone; what the job wrote (its run directory) is kept and named
    assert "kept" in r.stderr and "runs" in r.stderr, r.stderr
    for h in cluster.hosts:
        root = h.home / "aios" / "lab"
        assert not (root / "jobs").exists() and not (root / "code" / ".aios-site").exists()
        assert not (root / "code" / "gpt.py").exists() and not (root / "setup.sha").exists()
    assert (h0.home / "aios" / "lab" / "code" / "runs").is_dir()
    assert committed(ckpt)  # the checkpoints are the user's: never removed


def test_cloud_ssh_four_hosts_plan_applied_as_printed_then_train(tmp_path, sshd_cluster):
    cluster = sshd_cluster(4, netns=True)
    work = project(tmp_path)
    (work / "hello.py").write_text(
        "import os\nprint('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
        "flush=True)\n"
    )
    env = environ(tmp_path)
    base = ["--cloud", "ssh", "--hosts", hosts_arg(cluster), "--identity", str(cluster.client_key)]
    r = aios(
        env,
        "launch",
        *base,
        "--name",
        "plan",
        "--python",
        sys.executable,
        "--nprocs-per-host",
        "1",
        "--no-setup",
        "--no-bundle",
        "--workdir",
        str(work),
        "--dry-run",
        "hello.py",
    )
    assert r.returncode == 0, r.stderr
    # the dry run touched nothing, here or on the hosts
    assert not Path(env["AIOS_HOME"]).exists()
    assert not any((h.home / "aios").exists() for h in cluster.hosts)
    assert str(cluster.client_key) in r.stdout and "--rdzv-endpoint" in r.stdout
    # applied as printed (the user's ssh decides host keys: here a wrapper accepts new ones),
    # the plan runs the job on the 4 hosts together
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\nexec "
        + shutil.which("ssh")
        + f' -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={tmp_path / "kh"} "$@"\n'
    )
    wrapper.chmod(0o755)
    applied = subprocess.run(
        ["bash", "-e", "-c", r.stdout],
        env={**env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"},
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
    ranks = sorted(int(x) for x in re.findall(r"hello from rank (\d) of 4", applied.stdout))
    assert ranks == [0, 1, 2, 3], applied.stdout[-2000:] + applied.stderr[-2000:]

    # the real launch: 2 processes per host, node ranks in host order, the master address
    # worker 0's on the hosts' own network
    steps = 4
    r = aios(env, *launch(cluster, work, "lab4", steps), timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    h0 = cluster.hosts[0]
    assert f"master address {h0.internal_ip} (worker 0 as the other hosts see it" in r.stderr
    assert re.search(rf"\(worker 0, {re.escape(h0.ip)}\) .*gpt: done {steps} steps", r.stdout)
    assert "8 x cpu" in r.stdout  # 4 hosts x 2 processes
    for h in cluster.hosts:
        assert f"(worker {h.worker_id}, {h.ip}) " in r.stdout
    st = job(env)
    assert st["jobs"][0]["state"] == "SUCCEEDED" and st["jobs"][0]["exit_codes"] == [0] * 4
    # exec runs on the hosts of the cluster, each line prefixed
    r = aios(env, "exec", "lab4", "echo up")
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split(",")[0] for ln in r.stdout.splitlines() if ln.endswith(" up")) == [
        f"(worker {i}" for i in range(4)
    ]
    # the head reached the other hosts with a key of its own, authorized on them by one line
    assert all(
        "aios-head lab4" in (h.home / ".ssh" / "authorized_keys").read_text()
        for h in cluster.hosts[1:]
    )
    assert aios(env, "down", "lab4").returncode == 0
    for h in cluster.hosts:  # down takes that line and the head's key back, nothing else
        keys = h.home / ".ssh" / "authorized_keys"
        assert not keys.exists() or "aios-head lab4" not in keys.read_text(), h.name
        assert not (h.home / "aios" / "lab4" / "fleet").exists(), h.name


def test_cloud_ssh_launch_without_python_dry_run_and_real_on_two_hosts(tmp_path, sshd_cluster):
    """The README's command for hosts a user has, with nothing else: ``aios launch --cloud ssh
    --hosts U@H1,U@H2 train.py``. The key comes from the user's SSH setup (an ssh-agent here),
    the interpreter is the hosts' ``python3`` (it has torch, as on a user's training box). It
    once stopped at once with ``TypeError: SshHostsProvider.python() takes 2 positional
    arguments but 3 were given``."""
    cluster = sshd_cluster(2, netns=True)
    for h in cluster.hosts:
        tool = h.confdir / "bin" / "python3"
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        tool.chmod(0o755)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(
        "import aios, torch\nrt = aios.init()\n"
        "t = rt.all_reduce(torch.full((1,), float(rt.rank + 1)), op='sum')\n"
        "print('ssh rank', rt.rank, 'of', rt.world_size, 'sum', int(t.item()), flush=True)\n"
    )
    env = environ(tmp_path)
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    for key, value in re.findall(r"(SSH_AUTH_SOCK|SSH_AGENT_PID)=([^;]+);", agent.stdout):
        env[key] = value
    try:
        subprocess.run(["ssh-add", "-q", str(cluster.client_key)], env=env, check=True)
        hosts = ",".join(f"{cluster.user}@{h.ip}:{h.port}" for h in cluster.hosts)
        r = subprocess.run(
            [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "ssh", "--hosts", hosts,
             "--dry-run", "train.py"],
            env=env, cwd=work, text=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        # aios's own environment on the hosts (made from their python3, which stays visible)
        assert "TypeError" not in r.stderr
        assert ".aios-venv/bin/python -m torch.distributed.run" in r.stdout
        assert "--nnodes 2" in r.stdout and "have|put" not in r.stdout  # runs as printed
        r = subprocess.run(
            [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "ssh", "--hosts", hosts,
             "train.py"],
            env=env, cwd=work, text=True, capture_output=True, timeout=600,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "ssh rank 0 of 2 sum 3" in r.stdout and "ssh rank 1 of 2 sum 3" in r.stdout
        st = job(env)
        assert st["jobs"][0]["state"] == "SUCCEEDED"
        assert aios(env, "down", st["name"]).returncode == 0
    finally:
        subprocess.run(["ssh-agent", "-k"], env=env, capture_output=True)


def test_cloud_ssh_hosts_behind_a_gateways_port_forwards(tmp_path, sshd_cluster):
    """Hosts behind one NAT gateway: this machine reaches them at GATEWAY:2201/2202/2203, while
    inside hosts 0 and 1 listen on 22 and host 2 on 2222; the head reaches the other hosts at
    their internal address on their own sshd port (22, or --worker-port, or the entry's
    /WORKER_PORT: ``USER@gw:2203/2222``), never the user's external port."""
    cluster = sshd_cluster(3, netns=True, forwarded=True, ports={2: 2222})
    gw = cluster.hosts[0].ip
    assert {h.ip for h in cluster.hosts} == {gw} and [h.port for h in cluster.hosts] == [
        2201,
        2202,
        2203,
    ]
    work = project(tmp_path)
    (work / "hello.py").write_text(
        "import os\nprint('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
        "flush=True)\n"
    )
    env = environ(tmp_path)
    hosts = hosts_arg(cluster) + "/2222"  # the last host's own sshd port inside
    base = ["--cloud", "ssh", "--hosts", hosts, "--identity", str(cluster.client_key)]
    r = aios(
        env,
        "launch",
        *base,
        *("--name", "nat", "--python", sys.executable, "--nprocs-per-host", "1"),
        *("--no-setup", "--workdir", str(work), "hello.py"),
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the head copied the code to the other hosts over the cluster network (22 and 2222 inside)
    assert "which copied the changes to 2 other hosts over the cluster network" in r.stderr
    ranks = sorted(int(x) for x in re.findall(r"hello from rank (\d) of 3", r.stdout))
    assert ranks == [0, 1, 2], r.stdout[-2000:]
    assert job(env)["jobs"][0]["exit_codes"] == [0, 0, 0]
    assert aios(env, "down", "nat").returncode == 0


def test_cloud_ssh_an_alias_of_ssh_config_decides_port_and_user(tmp_path, sshd_cluster):
    """``-p``/``user@`` only when the user wrote them: the command line wins over
    ~/.ssh/config (ssh_config(5)), so an alias keeps its own Port and User; the dry run names
    the alias."""
    cluster = sshd_cluster(1, netns=True)
    h = cluster.hosts[0]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host labbox\n  HostName {h.ip}\n  Port {h.port}\n  User {cluster.user}\n"
        f"  IdentityFile {cluster.client_key}\n"
    )
    # the user's ssh reads this config (ssh reads ~/.ssh/config of the passwd entry: a wrapper
    # passes it with -F, the rest of the argv is aios's)
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {cfg} "$@"\n')
    wrapper.chmod(0o755)
    work = project(tmp_path)
    (work / "t.py").write_text("print('ran on the alias', flush=True)\n")
    env = {**environ(tmp_path), "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    env["USER"] = env["LOGNAME"] = "someone-else"  # never this machine's login name
    args = ["launch", "--cloud", "ssh", "--hosts", "labbox", "--name", "alias"]
    args += ["--python", sys.executable, "--no-setup", "--workdir", str(work)]
    r = aios(env, *args, "--dry-run", "t.py")
    assert r.returncode == 0, r.stderr
    assert (
        "worker 0: ssh host labbox as your ~/.ssh/config has it (its User) (its Port)" in r.stdout
    )
    probe = next(ln for ln in r.stdout.splitlines() if ln.startswith("ssh ") and "hostname" in ln)
    assert " -p " not in probe and "@labbox" not in probe and " labbox " in probe
    r = aios(env, *args, "t.py")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ran on the alias" in r.stdout
    assert aios(env, "down", "alias").returncode == 0


def _host_pip_config(home: Path) -> str:
    """The host's own pip configuration (``~/.config/pip/pip.conf``): where its pip finds
    packages. These hosts reach no package index; this machine's local wheels and simple
    indexes stand for the one a user's host is configured with."""
    wheels, simple, more = (
        Path("/opt/wheels"),
        Path("/opt/pypi/simple"),
        Path("/opt/pypi-more/simple"),
    )
    if not any(wheels.glob("torch-2.13.0*.whl")) or not simple.is_dir():
        pytest.skip("needs torch 2.13.0 among this machine's local wheels (/opt/wheels)")
    conf = home / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    extra = f"file://{more}" if more.is_dir() else ""
    conf.write_text(
        f"[global]\nfind-links = {wheels}\nindex-url = file://{simple}\n"
        + (f"extra-index-url = {extra}\n" if extra else "")
    )
    return str(conf)


def _python3_without_torch(bindir: Path, where: Path) -> str:
    """The host's ``python3``: the system's interpreter with the packages a user's box has
    (this environment's, through a ``site-packages`` directory of links) except torch and aios,
    as a machine whose owner installed Python libraries but never torch. These hosts reach no
    package index, so aios's own requirements come from there; torch comes from the host's pip
    configuration (:func:`_host_pip_config`)."""
    import sysconfig

    site = where / "site-packages"
    site.mkdir(parents=True)
    for p in Path(sysconfig.get_paths()["purelib"]).iterdir():
        n = p.name.lower()
        if n.startswith(("torch", "functorch", "aios", "_aios", "__editable__")) or n.endswith(
            ".pth"
        ):
            continue
        (site / p.name).symlink_to(p)
    bindir.mkdir(parents=True, exist_ok=True)
    tool = bindir / "python3"
    tool.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec /usr/bin/python3 "$@"\n')
    tool.chmod(0o755)
    return str(tool)


def test_cloud_ssh_quick_start_on_a_host_without_torch(tmp_path, sshd_cluster):
    """The quick start as a newcomer types it, from a clone: ``aios launch --cloud ssh --hosts
    root@HOST examples/gpt.py`` on a host whose python3 has no torch (nor aios's
    requirements). aios made ``.aios-venv`` itself, so it installs torch there (the CPU build,
    through the host's pip configuration), says so in one line with the time it took, and the
    example trains on the corpus it reads from examples/data (tracked, so it ships). Before:
    "torch is not installed for .aios-venv/bin/python; install it there", and with torch the
    example died of FileNotFoundError: code sync had left every folder named data behind."""
    cluster = sshd_cluster(1, netns=True)
    (h,) = cluster.hosts
    _host_pip_config(h.home)
    py = _python3_without_torch(h.confdir / "bin", tmp_path / "host-python")
    assert subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0
    assert (
        subprocess.run([py, "-c", "import pluggy, pydantic"], capture_output=True).returncode == 0
    )
    clone = tmp_path / "aios"
    (clone / "examples" / "data").mkdir(parents=True)
    shutil.copy(EXAMPLES / "gpt.py", clone / "examples" / "gpt.py")
    shutil.copy(EXAMPLES / "data" / "corpus.txt", clone / "examples" / "data" / "corpus.txt")
    (clone / "examples" / "data" / "scratch").mkdir()
    (clone / "examples" / "data" / "scratch" / "big.bin").write_bytes(b"0" * 4096)  # untracked
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run([*git, "add", "examples/gpt.py", "examples/data/corpus.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], check=True)
    env = environ(tmp_path)
    env["AIOS_PLUGINS"] = "aios-cloud"
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    for key, value in re.findall(r"(SSH_AUTH_SOCK|SSH_AGENT_PID)=([^;]+);", agent.stdout):
        env[key] = value
    try:
        subprocess.run(["ssh-add", "-q", str(cluster.client_key)], env=env, check=True)
        host = f"{cluster.user}@{h.ip}" + (f":{h.port}" if h.port != 22 else "")
        # --steps N after the script: the example's docstring prints it (1000 steps otherwise)
        cmd = ["launch", "--cloud", "ssh", "--hosts", host, "examples/gpt.py", "--steps", "6"]
        dry = subprocess.run(
            [sys.executable, "-m", "aios.cli.main", *cmd[:-3], "--dry-run", *cmd[-3:]],
            env=env, cwd=clone, text=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert (
            "# code sync left out 1 file in folders named data (examples/data/scratch/big.bin): "
            "datasets stay home unless git tracks them"
        ) in dry.stdout, dry.stdout
        assert "torch==2.13.0" in dry.stdout  # the setup the plan prints installs it
        r = subprocess.run(
            [sys.executable, "-m", "aios.cli.main", *cmd],
            env=env, cwd=clone, text=True, capture_output=True, timeout=900,
        )  # fmt: skip
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-5000:]
        installed = re.findall(
            r"\[aios\] \S+: python3 has no torch: installed torch==2\.13\.0 \(cpu\) into "
            r"\.aios-venv in (\d+)s",
            out,
        )
        assert len(installed) == 1, out[-5000:]
        assert "code sync left out 1 file in folders named data" in out
        assert DONE_RE.search(out) and "gpt: done 6 steps (6 this run)" in out, out[-5000:]
        assert "FileNotFoundError" not in out and "torch is not installed" not in out
        code = h.home / "aios" / job(env)["name"] / "code"
        assert (code / "examples" / "data" / "corpus.txt").is_file()
        assert not (code / "examples" / "data" / "scratch").exists()
        venv = code / ".aios-venv"
        assert list(venv.glob("lib/python3*/site-packages/torch/__init__.py")), "not in aios's venv"
        assert aios(env, "down", job(env)["name"]).returncode == 0
        assert not venv.exists()  # aios made it, `aios down` removes it
    finally:
        subprocess.run(["ssh-agent", "-k"], env=env, capture_output=True)


def test_cloud_ssh_down_keeps_a_venv_aios_did_not_make(tmp_path):
    """``aios down``'s cleanup removes ``.aios-venv`` only when aios's marker is in it."""
    from aios_cloud.sshhosts.shell import VENV_MARKER, cleanup_command

    home = tmp_path / "home"
    for name, marked in (("ours", True), ("theirs", False)):
        venv = home / "aios" / name / "code" / ".aios-venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("")
        if marked:
            (venv / VENV_MARKER).write_text("")
        r = subprocess.run(
            ["bash", "-c", cleanup_command(name, remove=True)],
            env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert venv.exists() is not marked, name


FT_LOOP = Path(__file__).resolve().parents[3] / "packages/core/tests/scripts/ft_loop.py"


def test_cloud_ssh_replica_groups_over_three_hosts_keep_training_when_one_is_lost(
    tmp_path, sshd_cluster
):
    """Issue 36 on hosts a user has: ``aios launch --cloud ssh`` on 3 sshd hosts (network
    namespaces) with ``--env AIOS_FT__REPLICA_GROUPS=3``: each host runs aios-run with one
    replica group (node 0's starts the lighthouse); the process of group 1 on the second host is
    SIGKILLed after step 5. The other two hosts never restart and commit steps with 2 groups;
    the second host's aios-run restarts its group, which heals from a live group on another
    host and commits with 3 again; the job succeeds with every sample trained once."""
    pytest.importorskip("torchft", reason="torchft is not installed (the extra aios-core[ft])")
    cluster = sshd_cluster(3, netns=True)
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(FT_LOOP, work / "ft_loop.py")
    out = tmp_path / "out"  # the hosts share this machine's filesystem: their logs land here
    out.mkdir()
    env = environ(tmp_path)
    base = ["--cloud", "ssh", "--hosts", hosts_arg(cluster), "--identity", str(cluster.client_key)]
    settings = [
        "AIOS_FT__REPLICA_GROUPS=3",
        "AIOS_FT__HEARTBEAT_TIMEOUT_MS=500",
        "AIOS_FT__TIMEOUT=30",
    ]
    run = [
        *("--name", "ft3", "--python", sys.executable, "--nprocs-per-host", "1"),
        *("--no-setup", "--no-bundle", "--workdir", str(work), "--poll", "0.5"),
        *(a for s in settings for a in ("--env", s)),
        *("--env", "OMP_NUM_THREADS=1", "--env", "AIOS_LOGGING__TENSORBOARD=false"),
        *("--env", f"FT_OUT={out}", "--env", "FT_KILL_STEP=5", "--env", "FT_KILL_MODE=between"),
    ]
    r = aios(env, "launch", *base, *run, "--dry-run", "ft_loop.py")
    assert r.returncode == 0, r.stderr
    assert "-m aios.cli.run --nnodes 3 --node-rank 2" in r.stdout, r.stdout[-3000:]
    assert "ft.replica_groups=3" in r.stdout and "torch.distributed.run" not in r.stdout
    r = aios(env, "launch", *base, *run, "ft_loop.py", timeout=600)
    said = r.stdout + r.stderr
    assert r.returncode == 0, said[-4000:]
    assert "aios: replica group 1 lost at step" in said and "restarting replica group 1" in said
    assert "replica group 1 healed from a live group" in said, said[-4000:]
    assert "restarting replica group 0" not in said and "restarting replica group 2" not in said
    logs = {
        p.name: [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(out.glob("g*-r*.jsonl"))
    }
    runs = {g: [v for k, v in logs.items() if k.startswith(f"g{g}-")] for g in range(3)}
    assert [len(runs[g]) for g in range(3)] == [1, 2, 1], sorted(logs)
    first, again = sorted(runs[1], key=lambda v: v[0]["restarted"] if v else True)
    assert again[0]["restarted"]
    for g in (0, 2):  # the live hosts' groups: committed with 2 groups, then with 3 again
        committed = [e for e in runs[g][0] if e["ok"]]
        assert any(e["p"] == 2 for e in committed) and committed[-1]["p"] == 3
    by_step = {e["step"]: e["params"] for e in runs[0][0] if e["ok"]}
    healed = [e for e in again if e["ok"]]
    assert healed and all(by_step[e["step"]] == e["params"] for e in healed)
    # every sample once: each committed step's shares of the groups in its quorum
    seen: list[int] = []
    share: dict[int, list[dict]] = {}
    for run_ in (runs[0][0], runs[2][0], first, again):
        for e in run_:
            if e["ok"] and not (run_ is again and e is again[0]):
                share.setdefault(e["step"], []).append(e)
    last = max(share)
    tail: set[int] = set()
    for step, entries in sorted(share.items()):
        assert len(entries) == entries[0]["p"], (step, entries)
        for e in entries:
            (tail.update if step == last else seen.extend)(e["idx"])
    assert len(seen) == len(set(seen)) and set(seen) | tail == set(range(64))
    assert job(env)["jobs"][0]["state"] == "SUCCEEDED"
    assert aios(env, "down", "ft3").returncode == 0
