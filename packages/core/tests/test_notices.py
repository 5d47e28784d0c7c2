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
from aios.launcher.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV, GRACE_CAP_ENV
from aios.resilience.notices import (
    DeadlineWatcher,
    FileWatcher,
    PreemptionMonitor,
    effective_grace,
    read_notice_file,
)
from aios.testing.zygote import python
from aios.types import Notice


def test_sigterm_notice_carries_the_grace_capped_by_the_platform():
    grace, why = effective_grace(25.0, env={GRACE_CAP_ENV: "15"})
    assert grace == 15.0 and GRACE_CAP_ENV in why
    assert effective_grace(25.0, env={}) == (25.0, None)
    assert effective_grace(10.0, env={GRACE_CAP_ENV: "junk"}) == (10.0, None)

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


def test_a_notice_far_ahead_of_its_deadline_is_held_until_the_checkpoint_needs_it():
    """A Cloud TPU maintenance window announced hours ahead does not stop the run at the next
    step (a relaunch on the same VM would see it again and stop again): the notice is held
    and becomes due when the time left falls to what the emergency checkpoint needs; said
    once. A notice already within that time is due at once."""
    now = [1000.0]
    said: list = []
    mon = PreemptionMonitor(
        clock=lambda: now[0], lead=lambda: 40.0, on_defer=lambda n, ahead: said.append(ahead)
    )
    mon.defer_interval = 0.01
    window = Notice("tpu-maintenance", "maintenance window at 2:00", deadline=5000.0)
    mon.notify(window)
    mon.notify(window)  # a watcher that polls again: held once, said once
    assert not mon.requested and mon.deferred == [window]
    assert said == [pytest.approx(3960.0)]
    now[0] = 4900.0
    assert not mon.requested
    now[0] = 4961.0
    for _ in range(1000):
        if mon.requested:
            break
        threading.Event().wait(0.01)
    assert mon.requested and mon.notice == window
    assert mon.time_left() == pytest.approx(39.0)
    mon.uninstall()
    # within the lead already, or a short notice (a spot reclaim's 2 minutes with a save of a
    # few seconds measured): due at once, nothing held
    for deadline in (30.0, 120.0):
        soon = PreemptionMonitor(clock=lambda: 0.0, lead=lambda: 6.0)
        soon.notify(Notice("aws-spot", "instance-action terminate", deadline=deadline))
        assert soon.requested and soon.deferred == []
    # a signal is never held, whatever its grace (Slurm's --signal lead, a pod's grace)
    sig = PreemptionMonitor(grace=3600.0, clock=lambda: 0.0, lead=lambda: 6.0)
    sig._handler(signal.SIGTERM, None)
    assert sig.requested and sig.deferred == [] and sig.notice.source == "sigterm"


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


def _plugin(name: str, **hooks):
    import types

    from aios import hookimpl
    from aios.plugins.registry import get_registry

    mod = types.ModuleType(name)
    for hook, fn in hooks.items():
        setattr(mod, hook, hookimpl(fn))
    get_registry().pm.register(mod, name=name)
    return mod


def test_the_launchers_grace_cap_lowers_the_sigterm_grace_and_is_said_once(
    tmp_path, capsys, monkeypatch
):
    """``AIOS_RUN_GRACE_CAP`` (set by the Kubernetes manifest and the Slurm script) lowers the
    SIGTERM notice's grace, and aios says so once; a plugin answering the removed
    ``aios_grace_cap`` hook is rejected by name (no hook of that name)."""
    import aios
    from aios.launcher.contract import GRACE_CAP_ENV
    from aios.plugins.registry import get_registry

    monkeypatch.setenv("AIOS_LOGGING__RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
    monkeypatch.setenv(GRACE_CAP_ENV, "15")
    rt = aios.init(checkpoint={"grace_seconds": 25})
    try:
        assert rt.preemption.grace == 15.0
        rt.preemption._handler(signal.SIGTERM, None)
        assert rt.preemption.time_left() == pytest.approx(15.0, abs=5)
    finally:
        rt.preemption.reason = None
        rt.close()
    err = capsys.readouterr().err
    assert err.count("a SIGTERM's deadline is 15s") == 1
    assert "checkpoint.grace_seconds=25 is more than this platform gives" in err
    assert not hasattr(get_registry().pm.hook, "aios_grace_cap")


def test_hook_aios_report_target(tmp_path):
    """``aios report NAME``: a name that is no path is resolved by a plugin (a cloud's cluster)."""
    from aios.cli.main import cli
    from aios.plugins.registry import get_registry
    from click.testing import CliRunner

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "diagnostics.json").write_text(
        json.dumps(
            {
                "started": 100.0,
                "finished": 200.0,
                "status": "finished",
                "attempt": {
                    "launched": 100.0,
                    "first_step": 110.0,
                    "last_step": 190.0,
                    "start_step": 0,
                    "last_step_index": 81,
                },
                "checkpoints": [],
                "events": [],
            }
        )
    )
    mod = _plugin(
        "test-report-target",
        aios_report_target=lambda target: str(run) if target == "mycluster" else None,
    )
    try:
        r = CliRunner().invoke(cli, ["report", "mycluster", "--json"])
        bad = CliRunner().invoke(cli, ["report", "nosuchcluster"])
    finally:
        get_registry().pm.unregister(mod)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["wall_s"] == 100.0 and d["goodput"] == pytest.approx(0.8)
    assert d["badput"]["startup"] == 10.0 and d["badput"]["shutdown"] == 10.0
    assert (
        bad.exit_code == 2 and "no run record, checkpoint directory or known cluster" in bad.output
    )


# ------------------------------------------------------------------ the emergency save's decision


class _Handle:
    step = 3
    started = 0.0
    finished = None
    path = None

    def done(self):
        return False


def _manager(tmp_path, capsys=None):
    from aios.checkpoint.formats.base import CheckpointFormat
    from aios.checkpoint.manager import CheckpointManager
    from aios.config.schema import resolve
    from aios.runrecord.records import RunRecord
    from aios.types import CheckpointFormatSpec

    class FakeAsync(CheckpointFormat):
        """A format with a background save in flight (``pending``) that never ends by itself."""

        name = "fakeasync"

        def __init__(self):
            self.pending = None
            self.abandoned = None
            self.waited = False

        def wait(self):
            self.waited = True
            h, self.pending = self.pending, None
            return h

        def abandon(self):
            self.abandoned, self.pending = self.pending, None
            return self.abandoned

        def save(self, step, ctx, staging, store):
            return {"x.bin": store.write_file(staging, "x.bin", lambda f: f.write(b"x" * 10))}

    class Strategy:  # the members of aios.strategies.base.Strategy the manager reads
        rank, world_size, checkpoint_format = 0, 1, "fakeasync"
        data_rank, data_world = 0, 1

        def saves_on_this_rank(self):
            return True

    class Training:  # the members of aios.checkpoint.state.TrainingState the manager reads
        step = 7
        loaders: list = []

        def state_dict(self):
            return {}

        def rng_state(self):
            return {}

    cfg = resolve(overrides=[f"checkpoint.dir={tmp_path / 'ck'}"], check_backend=False)
    rec = RunRecord(str(tmp_path / "runs"), "r1", active=True)
    printed: list[str] = []
    m = CheckpointManager(
        cfg,
        Strategy(),
        Training(),
        rec,
        "cpu",
        print_fn=printed.append,
        formats={"fakeasync": CheckpointFormatSpec("fakeasync", FakeAsync)},
    )
    now = [1000.0]
    m.clock = lambda: now[0]
    return m, printed, now


@pytest.mark.parametrize("left,abandoned", [(10.0, True), (500.0, False)])
def test_a_background_save_in_flight_commits_in_time_or_is_abandoned(tmp_path, left, abandoned):
    m, printed, now = _manager(tmp_path)
    m.cost.add("fakeasync+async", 0.1, 100.0)  # a background save takes 100 s in all
    m.cost.add("fakeasync", 1.0, 1.0)  # a synchronous one 1 s
    m.format.pending = _Handle()
    m._pending_meta = {"step": 3, "key": "fakeasync+async", "clock_started": now[0] - 20}
    event = m.emergency_save("signal SIGTERM", 0, lambda: 0.5, lambda: left)
    assert (m.format.abandoned is not None) == abandoned
    assert m.format.waited == (not abandoned)
    assert m._abandoned == abandoned
    if abandoned:
        assert printed[0].startswith("aios: the background save of step 3 cannot commit before")
        # its commit callback now refuses, so the staging directory is aborted, never committed
        from aios.errors import CheckpointError

        with pytest.raises(CheckpointError, match="abandoned"):
            m._commit_unless_abandoned(None, None, {}, None)
    # the emergency save itself fits (1 s x 1.25 + 1 s) and is written either way
    assert event["checkpoint"] and event["checkpoint"].endswith("ckpt-000000007")
    assert event["skipped"] is None


def test_an_emergency_save_that_does_not_fit_keeps_the_last_checkpoint_in_one_line(tmp_path):
    m, printed, now = _manager(tmp_path)
    m.cost.add("fakeasync", 20.0, 20.0)
    m.committed_step = 4
    event = m.emergency_save("aws-spot", 0, lambda: 0.5, lambda: 10.0)
    assert event["checkpoint"] is None and event["kept_step"] == 4
    (line,) = printed
    assert line == (
        "aios: an emergency checkpoint needs about 25.0s and 10.0s are left before the "
        "deadline: keeping the last committed checkpoint (step 4); steps 4-7 will run again "
        "after the relaunch"
    )
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("ckpt-*"))


def test_a_launcher_s_known_end_stops_a_real_run_with_its_checkpoint(tmp_path):
    """AIOS_RUN_DEADLINE in the rank's environment: the run announces the end itself (its lead,
    the grace until a save was measured, exceeds the time left), checkpoints and exits 75,
    naming the source; the record keeps the deadline."""
    import subprocess
    import time
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "goodput_train.py"
    deadline = time.time() + 3600
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_CHECKPOINT__DIR=str(tmp_path / "ck"),
        AIOS_CHECKPOINT__GRACE_SECONDS="3700",
        AIOS_RUN_DEADLINE=repr(deadline),
        AIOS_RUN_DEADLINE_SOURCE="capacity-block",
        PROGRESS_FILE=str(tmp_path / "progress"),
        TOTAL_STEPS="100000",
        STEP_DELAY="0.01",
        OMP_NUM_THREADS="1",
    )
    r = subprocess.run(
        [*python(), str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    out = r.stdout + r.stderr
    assert r.returncode == 75, out
    assert "aios: preemption (capacity-block ends at " in out and "before its deadline" in out, out
    (diag,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/diagnostics.json")]
    (ev,) = diag["preemptions"]
    assert ev["source"] == "capacity-block" and ev["deadline"] == pytest.approx(deadline)
    assert ev["checkpoint"] and ev["time_left_s"] > 3000
