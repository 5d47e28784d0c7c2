"""A single child process of ``aios-run`` (the ``direct`` plan and a backend's own launcher):
signals forwarded, its stderr relayed as it comes (a pseudo-terminal when ours is one) and its end
kept for the portability hint. No torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress as _suppress
from typing import Any

from aios.launcher.outcome import HINT_TAIL
from aios.launcher.worker import child_preexec


def relay_stderr(fd: int, tail: bytearray) -> None:
    """Copy a worker's stderr (``fd``: a pipe, or a pseudo-terminal) to ours as it comes (raw
    chunks, no line buffering), keeping its last :data:`HINT_TAIL` bytes in ``tail`` for the
    portability hint. Closes ``fd`` at the end of the output."""
    out = getattr(sys.stderr, "buffer", None)
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:  # pragma: no cover - retried by os.read since PEP 475
                continue
            except OSError:  # EIO: the pseudo-terminal's last writer is gone
                break
            if not chunk:
                break
            tail += chunk
            del tail[:-HINT_TAIL]
            try:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:  # pragma: no cover - a replaced sys.stderr without a buffer
                    sys.stderr.write(chunk.decode(errors="replace"))
                    sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone: keep draining
                out = None
    finally:
        with _suppress(OSError):
            os.close(fd)


def stderr_channel() -> tuple[int, int]:
    """``(read end, the worker's stderr)``: a pseudo-terminal when our stderr is a terminal (the
    script still sees one: colours, progress bars and their width stay as without aios), else a
    pipe."""
    try:
        isatty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        isatty = False
    if isatty and sys.platform != "win32":
        import fcntl
        import pty
        import termios

        master, slave = pty.openpty()
        with _suppress(OSError):
            size = fcntl.ioctl(sys.stderr.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        return master, slave
    return os.pipe()


#: ``spawn(cmd, env, stderr)``: the process started some other way (forked warm,
#: :mod:`aios.launcher.warm`), or None to start it with ``subprocess.Popen``
Spawn = Callable[[list[str], dict[str, str], int | None], Any]


def run_subprocess(
    cmd: list[str],
    env: dict[str, str],
    tail: bytearray | None = None,
    spawn: Spawn | None = None,
) -> int:
    """Run ``cmd`` forwarding SIGINT/SIGTERM/SIGHUP; return its exit status (negative = signal).
    With ``tail``, its stderr is relayed through this process and the end of it kept there.
    ``spawn``: tried first (see :data:`Spawn`)."""
    import threading

    read_end, child_err = stderr_channel() if tail is not None else (-1, None)
    try:
        proc = spawn(cmd, env, child_err) if spawn is not None else None
        if proc is None:
            proc = subprocess.Popen(
                cmd, env=env, preexec_fn=child_preexec(os.getpid()), stderr=child_err
            )
    except BaseException:
        if child_err is not None:
            os.close(read_end)
        raise
    finally:
        if child_err is not None:
            os.close(child_err)  # the worker holds it now
    relay = None
    if tail is not None:
        relay = threading.Thread(
            target=relay_stderr, args=(read_end, tail), name="aios-stderr", daemon=True
        )
        relay.start()
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handled by forward()
                continue
        if relay is not None:  # the rest of its output; a process it left behind may hold the
            relay.join(5.0)  # pipe open: not waited for beyond that
        return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)
