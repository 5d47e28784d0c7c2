"""``aios-run`` ends without the interpreter's teardown of torch (about a second of CPU per
launcher), and that end is the exit Python would have made: the same status, ``atexit`` handlers
run, buffered output written, and a normal exit where a non-daemon thread still runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from aios.testing.launch import aios_run


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_exit_now_keeps_the_status_the_atexit_handlers_and_buffered_output():
    out = _python(
        """
        import atexit, sys
        from aios.cli.run import exit_now
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("err buffered")
        exit_now(3)
        print("never")
        """
    )
    assert out.returncode == 3
    assert out.stdout.startswith("buffered, no newline") and "atexit ran" in out.stdout
    assert "never" not in out.stdout and out.stderr == "err buffered"


def test_exit_now_of_a_message_or_none_is_sys_exits():
    message = _python("from aios.cli.run import exit_now; exit_now('a one-line reason')")
    assert message.returncode == 1 and message.stderr.strip() == "a one-line reason"
    assert _python("from aios.cli.run import exit_now; exit_now(None)").returncode == 0


def test_a_running_non_daemon_thread_gets_the_normal_exit_that_waits_for_it():
    out = _python(
        """
        import threading, time
        from aios.cli.run import exit_now
        go = threading.Event()
        def work():
            go.wait()
            print("thread finished")
        t = threading.Thread(target=work)
        t.start()
        try:
            exit_now(4)
        except SystemExit as e:
            print("normal exit", e.code)
            go.set()
            raise
        """
    )
    assert out.returncode == 4
    assert out.stdout.splitlines() == ["normal exit 4", "thread finished"]


def test_aios_run_ends_with_its_ranks_status_and_its_last_lines(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys, torch\nprint('rank says', flush=True)\nsys.exit(3)\n",
    )
    out = aios_run(["--backend", "cpu", script], cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "rank says" in out.stdout
    assert out.stderr.strip(), "the launcher's closing line naming the failed rank is written"
