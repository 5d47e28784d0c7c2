"""The interruption model: notices with deadlines (SIGTERM with the platform's grace, a known
end from the launcher, a notice file), the save cost, the interval of checkpoint.max_lost and
whether an emergency save fits. Pure: clocks are injected."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from aios.checkpoint.policy import SaveCost, choose_interval, parse_duration, parse_fraction
from aios.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV, GRACE_CAP_ENV
from aios.preemption import (
    DeadlineWatcher,
    FileWatcher,
    PreemptionMonitor,
    effective_grace,
    read_notice_file,
)
from aios.types import Notice


def test_sigterm_notice_carries_the_grace_capped_by_the_platform():
    grace, why = effective_grace(25.0, [], env={GRACE_CAP_ENV: "15"})
    assert grace == 15.0 and GRACE_CAP_ENV in why
    assert effective_grace(25.0, [None, 20.0, 40.0], env={}) == (20.0, "the platform allows 20s")
    assert effective_grace(10.0, [30.0], env={GRACE_CAP_ENV: "junk"}) == (10.0, None)

    now = [1000.0]
    mon = PreemptionMonitor(grace=grace, clock=lambda: now[0])
    mon._handler(signal.SIGTERM, None)
    assert mon.notice == Notice("sigterm", "signal SIGTERM", 1015.0)
    now[0] = 1004.0
    assert mon.time_left() == pytest.approx(11.0)
    mon.notify(Notice("aws-spot", "later", 1.0))  # the first notice wins
    assert mon.notice.source == "sigterm"


def test_a_known_end_from_the_launcher_is_announced_when_the_time_left_falls_to_the_lead():
    env = {DEADLINE_ENV: "5000", DEADLINE_SOURCE_ENV: "capacity-block"}
    lead = [60.0]
    w = DeadlineWatcher.from_env(lambda: lead[0], env=env)
    assert w is not None and w.source == "capacity-block" and w.deadline == 5000.0
    assert not w.due(now=4939.0)
    assert w.due(now=4940.0)
    lead[0] = 200.0  # a save measured slower: announced earlier
    assert w.due(now=4800.0)
    n = w.notice()
    assert n.source == "capacity-block" and n.deadline == 5000.0 and "ends at" in n.reason
    assert DeadlineWatcher.from_env(lambda: 1.0, env={}) is None
    assert DeadlineWatcher.from_env(lambda: 1.0, env={DEADLINE_ENV: "-3"}) is None


def test_the_deadline_watcher_thread_notifies_once_through_a_monitor():
    now = [0.0]
    w = DeadlineWatcher(100.0, "queued-resource", lambda: 10.0, clock=lambda: now[0], interval=0.01)
    mon = PreemptionMonitor(clock=lambda: now[0])
    got = threading.Event()
    seen: list = []

    def notify(n):
        seen.append(n)
        mon.notify(n)
        got.set()

    w.start(notify)
    assert not got.wait(0.1)  # far from the deadline: nothing
    now[0] = 95.0
    assert got.wait(10)
    w.stop()
    assert len(seen) == 1 and mon.notice.source == "queued-resource"
    assert mon.time_left() == pytest.approx(5.0)


def test_a_notice_file_may_carry_source_and_deadline(tmp_path):
    p = tmp_path / "notice"
    p.write_text(json.dumps({"source": "tpu-maintenance", "reason": "maint", "deadline": 77.5}))
    assert read_notice_file(str(p)) == Notice("tpu-maintenance", "maint", 77.5)
    p.write_text("")
    assert read_notice_file(str(p)) == Notice("file", f"notice file {p}", None)
    q = tmp_path / "n2"
    fw = FileWatcher(str(q), interval=0.01)
    got = threading.Event()
    out: list = []
    fw.start(lambda n: (out.append(n), got.set()))
    q.write_text(json.dumps({"deadline": 5}))
    assert got.wait(10)
    fw.stop()
    assert out[0].deadline == 5.0 and out[0].source == "file"
    assert os.path.exists(q)  # aios never deletes what it did not write


def test_durations_and_fractions():
    assert parse_duration("30m") == 1800.0
    assert parse_duration("10s") == 10.0
    assert parse_duration(90) == 90.0
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("off") is None and parse_duration(0) is None
    with pytest.raises(ValueError, match="no duration"):
        parse_duration("ten minutes")
    assert parse_fraction("3%") == pytest.approx(0.03)
    assert parse_fraction(0.05) == 0.05
    with pytest.raises(ValueError):
        parse_fraction(2)


def test_save_cost_takes_a_slower_save_in_full_and_decays_over_faster_ones():
    c = SaveCost()
    assert c.estimate("full") is None
    c.add("full", 2.0, 2.0)
    c.add("full", 4.0, 4.0)
    assert c.estimate("full") == (4.0, 4.0)
    c.add("full", 2.0, 2.0)
    assert c.estimate("full") == (3.0, 3.0)
    c.add("dcp+async", 0.1, 5.0)
    assert c.estimate("dcp+async") == (0.1, 5.0)


@pytest.mark.parametrize(
    "max_lost,overhead,blocking,total,step",
    [
        (10, 0.03, 0.2, 0.2, 0.5),
        (600, 0.03, 2, 30, 1),
        (10, 0.01, 1, 1, 0.1),
        (1800, 0.03, 5, 5, 2),
    ],
)
def test_the_interval_bounds_the_loss_and_says_when_overhead_must_give(
    max_lost, overhead, blocking, total, step
):
    iv = choose_interval(max_lost, overhead, blocking, total, step)
    assert iv.seconds + total + step <= max_lost + 1e-9  # the bound holds
    assert iv.lost_bound <= max_lost + 1e-9
    assert iv.overhead == pytest.approx(blocking / iv.seconds)
    assert iv.conflict == (blocking / overhead > iv.seconds)


def test_before_any_save_is_measured_the_first_comes_at_half_the_bound():
    iv = choose_interval(10.0, 0.03, None, None, 1.0)
    assert iv.seconds == 4.0 and not iv.conflict
