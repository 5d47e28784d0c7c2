"""The reclaimed-host stand-in (:class:`aios_cloud.testing.host.Host`): at its deadline every
process it runs dies, those that left its process group included, as on a terminated VM; a host
whose processes all ended first is not waited for."""

from __future__ import annotations

import os
import sys
import time

import pytest
from aios_cloud.testing.host import Host

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a main process, a child in its group and a grandchild in a session of its own (as aios-run's
# ranks are), each printing its pid
# (one write(2) per line: the three share the pipe, and print's two writes could interleave)
TREE = (
    "import os, subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import os, time; "
    'os.write(1, b"%d\\\\n" % os.getpid()); time.sleep(60)\'])\n'
    "own = subprocess.Popen([sys.executable, '-c', 'import os, time; "
    'os.write(1, b"%d\\\\n" % os.getpid()); time.sleep(60)\'], start_new_session=True)\n'
    "os.write(1, b'%d\\n' % os.getpid())\n"
    "time.sleep(60)\n"
)


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def test_the_host_dies_whole_at_its_deadline_and_the_inspection_sees_it_then(tmp_path):
    seen: list[float] = []
    with Host([sys.executable, "-c", TREE], env=dict(os.environ)) as host:
        end = time.monotonic() + 60
        while len(host.output.split()) < 3 and time.monotonic() < end:
            time.sleep(0.02)
        pids = [int(p) for p in host.output.split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        deadline = time.time() + 0.5
        host.reclaim_at(deadline, inspect=lambda: seen.append(time.time()) or "state")
        rc = host.wait(60)
    assert rc == -9
    assert host.killed_at is not None and host.killed_at >= deadline
    assert sorted(host.killed) == sorted(pids)
    assert not any(_alive(p) for p in pids)
    assert host.at_deadline == "state" and seen[0] >= host.killed_at


def test_a_host_that_ended_before_its_deadline_is_not_waited_for():
    with Host([sys.executable, "-c", "pass"], env=dict(os.environ)) as host:
        host.reclaim_at(time.time() + 3600, inspect=lambda: "ended")
        rc = host.wait(60)
    assert rc == 0 and host.killed_at is None and host.at_deadline == "ended"
    assert host.ended_at is not None and host.ended_at < host.deadline
