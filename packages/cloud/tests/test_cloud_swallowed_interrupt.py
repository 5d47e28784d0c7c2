"""A Ctrl-C whose KeyboardInterrupt Python swallows is not lost: the signal handler's raise can
land in a weakref callback or ``__del__`` run by the garbage collector, where Python prints
"Exception ignored" and goes on (seen: a foreground ``aios launch`` kept watching to the job's end
instead of detaching with exit 130). The watch loop's sleep raises it again."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import signal
from aios_cloud import signals

signals.install_signal_handlers()


class Collected:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while the collector runs this


Collected()  # the KeyboardInterrupt is raised inside __del__: Python ignores it
print("went on", flush=True)
try:
    signals.interruptible_sleep(0.01)
except KeyboardInterrupt:
    print("interrupted", flush=True)
signals.interruptible_sleep(0.01)  # handled once: nothing pending any more
print("pending cleared", flush=True)
"""


def test_a_ctrl_c_swallowed_in_a_finalizer_interrupts_the_next_sleep() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Exception ignored" in r.stderr  # Python did swallow it
    assert r.stdout.split() == ["went", "on", "interrupted", "pending", "cleared"], r.stdout
