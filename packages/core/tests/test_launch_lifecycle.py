"""``aios-run`` as a process supervisor: workers never outlive it (SIGKILL of its pid or its
process group), the rank blamed for a failure is the one that failed first, an explicit port is
free again right after a run (TIME_WAIT is not "in use"), a node that starts before node 0 waits
for it, and ``--max-restarts`` recovers from a worker death with one line per restart."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from aios.testing import launch, zygote


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return launch.run_env(tmp, **extra)


def _script(tmp: Path, body: str, name: str = "train.py") -> Path:
    p = tmp / name
    p.write_text(textwrap.dedent(body))
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp: Path, args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """aios-run in the background, output merged into one text pipe."""
    return launch.launch(args, cwd=tmp, env=env, **kw)


def _run_aios(
    tmp: Path, args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """aios-run to the end, stdout and stderr captured apart."""
    return launch.aios_run(args, cwd=tmp, env=env, timeout=timeout)


def _alive(pid: int) -> bool:
    """Running (a zombie, killed but not reaped by whoever adopted it, is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"launcher ended before {what}:\n{proc.stdout.read() if proc.stdout else ''}"
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


SLEEPER = """
    import os, time
    d = os.environ["PID_DIR"]
    with open(os.path.join(d, "w%s.tmp" % os.environ.get("RANK", "0")), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(d, "w%s.tmp" % os.environ.get("RANK", "0")),
               os.path.join(d, "w%s" % os.environ.get("RANK", "0")))
    while True:
        time.sleep(0.05)
        with open(os.path.join(d, "tick%s" % os.environ.get("RANK", "0")), "w") as f:  # "writing checkpoints"
            f.write(str(time.time()))
"""


def _pids(d: Path, n: int) -> list[int]:
    return [int((d / f"w{r}").read_text()) for r in range(n)]


# ------------------------------------------------------------------------------ item 6


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the workers")
@pytest.mark.parametrize(("nprocs", "how"), [(2, "pid"), (2, "pgid"), (1, "pid")])
def test_workers_die_with_sigkilled_launcher(tmp_path: Path, nprocs: int, how: str) -> None:
    script = _script(tmp_path, SLEEPER)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = _launch(
        tmp_path,
        ["--nprocs", str(nprocs), "--master-port", str(_free_port()), str(script)],
        _env(tmp_path, PID_DIR=str(pid_dir)),
        start_new_session=True,
    )
    try:
        _wait_for(
            lambda: all((pid_dir / f"w{r}").exists() for r in range(nprocs)),
            120,
            "the workers to start",
            proc,
        )
        workers = _pids(pid_dir, nprocs)
        assert all(_alive(p) for p in workers)
        if how == "pid":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _wait_for(
            lambda: not any(_alive(p) for p in workers),
            10,
            f"workers {workers} to die with their launcher",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        for f in pid_dir.glob("w?"):
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_worker_watchdog_follows_a_launcher_that_is_not_its_parent(tmp_path: Path) -> None:
    """The portable fallback (what ``aios.init()`` starts in every worker): a process started by
    something other than ``aios-run`` itself still dies with it."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from aios.launcher.worker import watch_launcher; import time\n"
            "assert watch_launcher(interval=0.1)\nprint('watching', flush=True)\ntime.sleep(120)",
        ],
        env={**os.environ, "AIOS_RUN_LAUNCHER_PID": str(launcher.pid)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert worker.poll() is None
        launcher.kill()  # not reaped yet: a zombie launcher counts as dead
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (launcher, worker):
            if p.poll() is None:
                p.kill()
            p.wait()


# ------------------------------------------------------------------------------ item 7

# rank 1 raises; rank 0 is not stopped by the agent but exits on its own right AFTER rank 1
# (the way a gloo peer fails with "connection closed"), and would also exit non-zero when the
# agent's SIGTERM arrives (the way a worker with a preemption handler does). Within one monitor
# interval both failures look alike to torch (same exit code, same whole-second timestamp).
FAILS_AFTER_RANK1 = """
    import os, sys, time, signal
    rank = os.environ["RANK"]
    mark = os.path.join(os.environ["MARK_DIR"], "rank1-" + os.environ["TORCHELASTIC_RESTART_COUNT"])
    if rank == "1":
        time.sleep(0.1)
        with open(mark + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(mark + ".tmp", mark)
        raise RuntimeError("rank 1 fails")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    while not os.path.exists(mark):
        time.sleep(0.002)
    pid = int(open(mark).read())
    def gone(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            return True
    while not gone(pid):
        time.sleep(0.001)
    sys.exit(1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the script reads /proc")
def test_first_failing_rank_is_named_20_times(tmp_path: Path) -> None:
    script = _script(tmp_path, FAILS_AFTER_RANK1)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = _env(tmp_path, MARK_DIR=str(marks))
    # 20 attempts in one launcher (19 restarts), each failure reported on its own line
    r = _run_aios(
        tmp_path,
        [
            "--nprocs",
            "2",
            "--max-restarts",
            "19",
            "--master-port",
            str(_free_port()),
            str(script),
        ],
        env,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    restarts = [ln for ln in r.stderr.splitlines() if ln.startswith("aios-run: restart ")]
    assert restarts == [
        f"aios-run: restart {n}/19: rank 1 exited with code 1; restarting all workers"
        for n in range(1, 20)
    ], r.stderr
    assert (
        f"aios-run: error: {script} exited with code 1 on rank 1 (other ranks stopped)" in r.stderr
    )
    # and without restarts (the static rendezvous path)
    (tmp_path / "marks2").mkdir()
    r = _run_aios(
        tmp_path,
        ["--nprocs", "2", "--master-port", str(_free_port()), str(script)],
        {**env, "MARK_DIR": str(tmp_path / "marks2")},
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        f"aios-run: error: {script} exited with code 1 on rank 1 (other ranks stopped)" in r.stderr
    )


# ------------------------------------------------------------------------------ item 8


def test_port_in_time_wait_is_free_listening_is_not() -> None:
    from aios.launcher.ports import port_free as _port_free

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the c10d TCPStore server does
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    assert not _port_free("127.0.0.1", port)
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end of the connection goes to TIME_WAIT
    time.sleep(0.05)
    cli.close()
    srv.close()
    time.sleep(0.05)
    with socket.socket() as probe:  # a plain bind (what the check did before) still fails
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
    assert _port_free("127.0.0.1", port)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the workers")
def test_kill_then_relaunch_on_one_explicit_port_10_times(tmp_path: Path) -> None:
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    for cycle in range(10):
        pid_dir = tmp_path / f"pids{cycle}"
        pid_dir.mkdir()
        proc = _launch(
            tmp_path,
            ["--nprocs", "2", "--master-port", str(port), str(script)],
            _env(tmp_path, PID_DIR=str(pid_dir)),
        )
        try:
            _wait_for(
                lambda d=pid_dir: (d / "w0").exists() and (d / "w1").exists(),
                120,
                f"cycle {cycle} to start",
                proc,
            )
        finally:
            proc.kill()
            proc.wait(timeout=30)
        workers = _pids(pid_dir, 2)
        _wait_for(
            lambda w=workers: not any(_alive(p) for p in w), 10, f"cycle {cycle}'s workers to die"
        )


def test_second_node_started_first_waits_for_node_0(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "node", os.environ["GROUP_RANK"])
    """,
    )
    port = str(_free_port())
    common = ["--nnodes", "2", "--nprocs", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    node1 = _launch(tmp_path, [*common, "--node-rank", "1", str(script)], _env(tmp_path))
    try:
        time.sleep(5)  # node 1 is up and waiting (under load it may still be importing: also fine)
        assert node1.poll() is None, node1.stdout.read() if node1.stdout else ""
        node0 = _run_aios(
            tmp_path, [*common, "--node-rank", "0", str(script)], _env(tmp_path), timeout=240
        )
        out1, _ = node1.communicate(timeout=240)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert node0.returncode == 0, node0.stdout + node0.stderr
    assert node1.returncode == 0, out1
    # the c10d rendezvous (as under torchrun) gives group ranks in its own order: one node each
    lines = sorted(ln for ln in (node0.stdout + out1).splitlines() if ln.startswith("[rank"))
    assert lines == ["[rank0]:rank 0 of 2 node 0", "[rank1]:rank 1 of 2 node 1"], (
        node0.stdout + out1
    )


# ------------------------------------------------------------------------------ item 9


def test_max_restarts_after_worker_death_gets_a_fresh_rendezvous(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # rank 1 dies after the group formed; on the restart it joins late, so a rank 0 that read
    # rank 1's address from the previous attempt would try to connect to a dead process
    script = _script(
        tmp_path,
        """
        import datetime, os, time
        import torch
        import torch.distributed as dist
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        rank = int(os.environ["RANK"])
        if attempt > 0 and rank == 1:
            time.sleep(2)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"attempt {attempt} rank {rank} sum {t.item()}", flush=True)
        if attempt < 2 and rank == 1:
            os._exit(9)
        dist.barrier()
        dist.destroy_process_group()
    """,
    )
    r = _run_aios(
        tmp_path,
        [
            "--nprocs",
            "2",
            "--max-restarts",
            "3",
            "--master-port",
            str(_free_port()),
            str(script),
        ],
        _env(tmp_path),
        timeout=500,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[rank{rank}]:attempt 2 rank {rank} sum 2.0" in r.stdout, r.stdout + r.stderr
    restarts = [ln for ln in r.stderr.splitlines() if ln.startswith("aios-run: restart ")]
    assert restarts == [
        f"aios-run: restart {n}/3: rank 1 exited with code 9; restarting all workers"
        for n in (1, 2)
    ], r.stderr


def test_restart_line_names_a_signal(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, signal, sys
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(0)
    """,
    )
    r = _run_aios(
        tmp_path,
        [
            "--nprocs",
            "2",
            "--max-restarts",
            "1",
            "--master-port",
            str(_free_port()),
            str(script),
        ],
        _env(tmp_path),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(
        r"^aios-run: restart 1/1: rank 0 was killed by SIGKILL; restarting all workers$",
        r.stderr,
        re.M,
    ), r.stderr


def test_aios_init_watches_the_launcher(tmp_path: Path) -> None:
    """``aios.init()`` in a worker arms the watchdog (a worker several processes below
    ``aios-run``, e.g. started by a backend's own launcher, is not covered by its parent death
    signal)."""
    pytest.importorskip("torch")
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import aios, time\nrt = aios.init()\nprint('started', flush=True)\ntime.sleep(300)",
        ],
        env=_env(tmp_path, AIOS_RUN_LAUNCHER_PID=str(launcher.pid)),
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "started"
        assert worker.poll() is None
        launcher.kill()
        launcher.wait()
        assert worker.wait(timeout=15) == -signal.SIGKILL
    finally:
        for p in (launcher, worker):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_restart_plan_uses_a_fresh_rendezvous_per_attempt(tmp_path: Path) -> None:
    import json

    script = _script(tmp_path, "print('hi')\n")
    r = _run_aios(
        tmp_path,
        ["--nprocs", "2", "--max-restarts", "2", "--dry-run", "--json", str(script)],
        _env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    host = json.loads(r.stdout)["hosts"][0]
    cmd = host["command"]
    assert (
        cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
        and cmd[cmd.index("--rdzv-conf") + 1] == "is_host=1"
    )
    assert host["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    r = _run_aios(
        tmp_path,
        [
            "--nprocs",
            "2",
            "--max-restarts",
            "2",
            "launch.rdzv_backend=static",
            "--dry-run",
            str(script),
        ],
        _env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "note: launch.rdzv_backend=static keeps one store for every attempt" in r.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the workers")
def test_status_folder_of_a_sigkilled_launcher_is_removed_by_the_next_launch(
    tmp_path: Path,
) -> None:
    """A SIGKILLed aios-run cannot remove its status folder; the next aios-run on the host does,
    and only its own folders whose owner file names a launcher that is gone: a folder without
    that file, one of a live launcher, one from another pid namespace or user, and a link stay;
    a pid reused by another process does not keep a folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = _env(tmp_path, PID_DIR=str(pid_dir), TMPDIR=str(tmp), **zygote.OFF)  # its own pid
    proc = _launch(
        tmp_path,
        ["--nprocs", "1", "--master-port", str(_free_port()), str(_script(tmp_path, SLEEPER))],
        env,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: (pid_dir / "w0").exists(), 120, "the worker to start", proc)
        (killed,) = tmp.glob("aios-run-status-*")
        assert (killed / "launcher").read_text().split()[0] == str(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed.is_dir()  # nothing could remove it
    me = os.getpid()
    with open(f"/proc/{me}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    ns = os.readlink("/proc/self/ns/pid")
    foreign = tmp / "aios-run-status-foreign"
    foreign.mkdir()
    (foreign / "keep").write_text("not aios-run's")
    live = tmp / "aios-run-status-live"
    live.mkdir()
    (live / "launcher").write_text(f"{me} {start} {ns}\n")
    reused = tmp / "aios-run-status-reused"
    reused.mkdir()
    (reused / "launcher").write_text(f"{me} {int(start) - 1} {ns}\n")
    other_ns = tmp / "aios-run-status-other-container"
    other_ns.mkdir()
    (other_ns / "launcher").write_text("999999 1 pid:[1]\n")
    dead = f"999999 1 {ns}\n"  # a launcher that is gone, in this namespace
    target = tmp_path / "not-a-status-folder"
    target.mkdir()
    (target / "launcher").write_text(dead)
    (tmp / "aios-run-status-link").symlink_to(target)
    kept = ["foreign", "link", "live", "other-container"]
    if os.getuid() == 0:  # a folder of another user is never judged
        other_user = tmp / "aios-run-status-other-user"
        other_user.mkdir()
        (other_user / "launcher").write_text(dead)
        os.chown(other_user, 65534, 65534)
        kept.append("other-user")
    quick = _script(tmp_path, "print('done')\n", name="quick.py")
    r = _run_aios(tmp_path, ["--master-port", str(_free_port()), str(quick)], env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    left = sorted(p.name for p in tmp.glob("aios-run-status-*"))
    assert left == [f"aios-run-status-{k}" for k in kept]
    assert (foreign / "keep").read_text() == "not aios-run's"
    assert (target / "launcher").read_text() == dead


def test_a_default_port_taken_between_the_check_and_the_bind_is_replaced(tmp_path: Path) -> None:
    """Two runs started together both find the default port free; the second one's store then
    fails to bind it (EADDRINUSE, seen in CI). When the port is aios's own choice, aios-run
    answers with another free port (a note says so); a port the user chose stays an error."""
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    code = textwrap.dedent(
        f"""
        import socket
        from aios.launcher import agent, ports
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        targs = ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                 str(port), {str(script)!r}]
        kind, detail = agent.run_elastic_inprocess(targs, {{}}, 5.0, agent.AgentWatch(), True)
        print("ours:", kind)
        env = {{"MASTER_PORT": str(port)}}
        moved = ports.with_port(targs, env, 1234)
        print("moved:", moved[moved.index("--master-port") + 1], env["MASTER_PORT"])
        print("rdzv:", ports.with_port(["--rdzv-endpoint", f"h:{{port}}"], {{}}, 99))
        try:
            agent.run_elastic_inprocess(targs, {{}}, 5.0, agent.AgentWatch(), False)
        except Exception as exc:
            print("explicit:", type(exc).__name__, "EADDRINUSE" in str(exc))
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ours: port-taken" in p.stdout, p.stdout + p.stderr
    assert "moved: 1234 1234" in p.stdout
    assert "rdzv: ['--rdzv-endpoint', 'h:99']" in p.stdout
    assert "explicit: DistNetworkError True" in p.stdout, p.stdout + p.stderr
