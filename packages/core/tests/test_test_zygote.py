"""The test session's zygote (:mod:`aios.testing.zygote`): a command run through it behaves as
``python ARGS`` started fresh (streams, exit status, argv, path, working directory, signals,
death of the trampoline), and starts fresh where forking is not known to be safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aios.testing import zygote

pytest.importorskip("torch")

#: prints what a fresh interpreter would show, and whether torch came already imported
PROBE = (
    "import os, sys, json; print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
    "'cwd': os.getcwd(), 'warm': 'torch' in sys.modules, 'x': os.environ.get('X'), "
    "'main': __name__, 'file': globals().get('__file__')}))"
)


@pytest.fixture(scope="module")
def zyg() -> Iterator[str]:
    proc, path = zygote.start()
    try:
        yield path
    finally:
        zygote.stop(proc, path)


@pytest.fixture
def env(zyg: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, zygote.ENV: zyg, zygote.LOG_ENV: str(tmp_path / "fresh.log")}


def _run(args: list[str], env: dict[str, str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        zygote.python(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=120, **kw
    )


def _fresh_reasons(tmp_path: Path) -> list[str]:
    log = tmp_path / "fresh.log"
    return [json.loads(x)["fresh"] for x in log.read_text().splitlines()] if log.exists() else []


def test_c_script_and_module_see_what_a_fresh_python_shows(env, tmp_path):
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE + "\n")
    (tmp_path / "probe_mod.py").write_text(PROBE + "\n")
    env = {**env, "X": "from-the-test"}
    for args, path0, argv0, file in (
        (["-c", PROBE, "a", "b"], "", "-c", None),
        ([str(script), "a", "b"], str(script.parent), str(script), str(script)),
        (["-m", "probe_mod", "a", "b"], str(tmp_path), str(tmp_path / "probe_mod.py"), None),
    ):
        forked = _run(args, env, tmp_path)
        fresh = subprocess.run(
            [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
        got, want = json.loads(forked.stdout), json.loads(fresh.stdout)
        assert got.pop("warm") is True and want.pop("warm") is False  # forked, torch imported
        if args[0] == "-m":
            got.pop("file"), want.pop("file")  # runpy's __file__: the same module either way
        assert got == want
        assert (
            got["argv"] == [argv0, "a", "b"]
            and got["path0"] == path0
            and got["x"] == "from-the-test"
        )
        assert got["main"] == "__main__" and (args[0] == "-m" or got.get("file") == file)
    assert _fresh_reasons(tmp_path) == []


def test_exit_status_streams_and_uncaught_errors(env, tmp_path):
    r = _run(
        ["-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        env,
        tmp_path,
    )
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = _run(
        ["-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"], env, tmp_path, input="abc"
    )
    assert (r.returncode, r.stdout) == (0, "ABC")
    r = _run(["-c", "def f():\n    raise ValueError('boom')\nf()"], env, tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines()[:2] == [
        "Traceback (most recent call last):",
        '  File "<string>", line 3, in <module>',
    ]
    assert r.stderr.splitlines()[-1] == "ValueError: boom" and "zygote" not in r.stderr
    for sig in (signal.SIGKILL, signal.SIGSEGV):  # killed: the trampoline dies of the same
        r = _run(["-c", f"import os; os.kill(os.getpid(), {int(sig)})"], env, tmp_path)
        assert r.returncode == -sig, r.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\nraise ValueError('in a script')\n")
    r = _run([str(bad)], env, tmp_path)
    assert r.returncode == 1 and r.stderr.splitlines()[1] == f'  File "{bad}", line 2, in <module>'
    r = _run(["-c", "raise KeyboardInterrupt"], env, tmp_path)
    assert r.returncode == -signal.SIGINT and "KeyboardInterrupt" in r.stderr
    r = _run(["-c", "import atexit; atexit.register(print, 'atexit ran')"], env, tmp_path)
    assert (r.returncode, r.stdout) == (0, "atexit ran\n")
    assert _fresh_reasons(tmp_path) == []


@pytest.mark.parametrize("session", [True, False])
def test_signals_reach_the_process_and_it_ends_as_the_process_did(env, tmp_path, session):
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print(os.getpid(), os.getpgid(0) == os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen(
        zygote.python("-c", code),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=session,
    )
    pid, leader = p.stdout.readline().split()
    assert int(pid) != p.pid and leader == "True"  # a process group of its own
    p.send_signal(signal.SIGUSR1)
    assert p.stdout.readline() == "usr1\n"
    p.terminate()
    assert p.wait(timeout=60) == 7
    p = subprocess.Popen(
        zygote.python("-c", "import time; print('up', flush=True); time.sleep(60)"),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline() == "up\n"  # running its code (not still being set up)
    p.send_signal(signal.SIGINT)  # no handler: killed by it, as a fresh python is
    assert p.wait(timeout=60) == -signal.SIGINT


def test_a_killed_trampoline_takes_the_process_with_it(env, tmp_path):
    p = subprocess.Popen(
        zygote.python("-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pid = int(p.stdout.readline())
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=60) == -signal.SIGKILL
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"process {pid} outlived its SIGKILLed trampoline")


def test_starts_fresh_where_forking_is_not_known_to_be_safe(env, tmp_path):
    probe = "import sys; print('torch' in sys.modules)"
    assert _run(["-c", probe], env, tmp_path).stdout == "True\n"
    # an import-time variable differs, the launcher's warm start is off, an unknown form
    assert _run(["-c", probe], {**env, "PYTHONHASHSEED": "7"}, tmp_path).stdout == "False\n"
    assert _run(["-c", probe], {**env, "AIOS_RUN_WARM_START": "0"}, tmp_path).stdout == "False\n"
    assert _run(["-X", "utf8", "-c", probe], env, tmp_path).stdout == "False\n"
    # no zygote in this session: plain python
    assert _run(["-c", probe], {**env, zygote.ENV: "0"}, tmp_path).stdout == "False\n"
    reasons = _fresh_reasons(tmp_path)
    assert reasons == [
        "environment differs in PYTHONHASHSEED",
        "AIOS_RUN_WARM_START=0",
        "not python -c/-m/SCRIPT",
    ]
    # a zygote that went away: fresh, said so
    r = _run(["-c", probe], {**env, zygote.ENV: str(tmp_path / "gone")}, tmp_path)
    assert r.stdout == "False\n" and _fresh_reasons(tmp_path)[-1].startswith("zygote unreachable")


def test_the_zygote_dies_with_the_session_however_it_ends(tmp_path):
    """A test session killed outright (no pytest_unconfigure) leaves no zygote behind."""
    code = (
        "import time\nfrom aios.testing import zygote\n"
        "proc, path = zygote.start()\nprint(proc.pid, flush=True)\ntime.sleep(120)\n"
    )
    session = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(session.stdout.readline())
    os.kill(pid, 0)  # running
    session.kill()
    session.wait()
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return  # dead, its parent gone before reaping it
        time.sleep(0.02)
    pytest.fail(f"zygote {pid} outlived its killed session")
