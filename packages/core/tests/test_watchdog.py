"""The watchdog names a hang instead of enduring it: the timeout policy on an injected clock (a
first step that compiles for minutes, steps that slow down 5x: no alarm), the summary of real
faulthandler dumps, and end-to-end under aios-run on real gloo: rank-0-only evaluation under
FSDP, a rank in time.sleep, a deadlocked DataLoader worker and a rank blocked in C with the GIL
held are each named with file:line, aios-run exits 124 and leaves no process; a live run is
dumped on demand (``aios stacks`` and SIGUSR1) and keeps going."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from aios.config.schema import resolve
from aios.errors import ConfigError
from aios.resilience.stacks import summarize
from aios.resilience.watchdog import EXIT_HUNG, HangPolicy, policy_from
from aios.testing import zygote
from aios.testing.zygote import python

SCRIPT = Path(__file__).parent / "scripts" / "hang_train.py"
RUN = [*python("-c", "from aios.cli.run import main; main()")]


# ------------------------------------------------------------------------------ the policy


def _steps(pol: HangPolicy, clock: list[float], n: int, seconds: float, steps: list[int]) -> None:
    """``n`` steps of ``seconds`` each on ranks 0 and 1, polled after each; never expired."""
    for _ in range(n):
        clock[0] += seconds
        steps[0] += 1
        assert not pol.expired(clock[0] - 1e-3), (clock[0], pol.allowance())
        for rank in (0, 1):
            pol.observe(rank, steps[0], clock[0], clock[0])


def test_policy_first_step_compiles_for_minutes_and_steps_slow_down_5x() -> None:
    settings = resolve(overrides=["watchdog.min_timeout=1"], check_backend=False).watchdog
    pol = policy_from(settings)  # auto timeout: max(1 s, 10 x slowest recent step)
    clock, steps = [0.0], [0]
    pol.reset(clock[0])
    for t in range(0, 180, 5):  # the first step compiles for 3 minutes: polled, no alarm
        assert not pol.expired(float(t))
        for rank in (0, 1):
            assert not pol.observe(rank, 0, 0.0, float(t))
    assert pol.allowance() == 1800.0
    _steps(pol, [180.0], 1, 0.0, steps)  # the first step lands at t=180
    clock = [180.0]
    _steps(pol, clock, 50, 1.0, steps)  # steady state: 1 s steps
    assert pol.allowance() == pytest.approx(10.0)
    _steps(pol, clock, 40, 5.0, steps)  # 5x slower for a while (a slow phase, a busy disk)
    assert pol.allowance() == pytest.approx(50.0)
    _steps(pol, clock, 100, 1.0, steps)  # and back
    # a real hang: nothing moves; it fires once the allowance has passed, not before
    allowance = pol.allowance()
    assert not pol.expired(clock[0] + allowance - 0.5)
    assert pol.expired(clock[0] + allowance + 0.5)


def test_policy_fixed_timeout_restart_and_defaults() -> None:
    pol = HangPolicy(timeout=20.0, first_step=60.0, min_timeout=600.0, factor=10.0)
    pol.reset(0.0)
    assert pol.allowance() == 60.0 and not pol.expired(59.0) and pol.expired(61.0)
    pol.reset(100.0)  # workers restarted: the first-step allowance again
    pol.observe(0, 0, 0.0, 100.0)
    assert pol.observe(0, 1, 5.0, 140.0)  # the first step took 40 s: within its allowance
    assert pol.allowance() == 20.0
    assert not pol.expired(159.0) and pol.expired(161.0)
    assert not pol.observe(0, 1, 5.0, 150.0)  # no new step: no progress
    # the defaults: auto timeout floored at 10 minutes, 30 minutes for the first step
    d = policy_from(resolve(check_backend=False).watchdog)
    assert (d.timeout, d.min_timeout, d.factor, d.first_step) == (None, 600.0, 10.0, 1800.0)
    # first_step shorter than a fixed timeout: the timeout is the floor
    assert HangPolicy(30.0, 5.0, 1.0, 10.0).allowance() == 30.0


def _worker(status: Path, pid: int, steps: int, t: float, closing: bool = False) -> None:
    """What a rank's register_worker() and rt.step leave in the status folder."""
    import struct

    (status / "worker-0.json").write_text(json.dumps({"rank": 0, "pid": pid, "world_size": 1}))
    (status / "progress-0").write_bytes(struct.pack("4d", steps, t, 1.0 if closing else 0.0, 0))


def test_monitor_dumps_once_per_allowance_resets_on_restart_and_ignores_closing(
    tmp_path: Path,
) -> None:
    """The launcher's poll over real status files, on an injected clock (action=dump)."""
    from aios.resilience.watchdog import Watchdog

    settings = resolve(
        overrides=["watchdog.timeout=10", "watchdog.first_step=100", "watchdog.action=dump"],
        check_backend=False,
    ).watchdog
    status, record = tmp_path / "status", tmp_path / "record"
    status.mkdir()
    said: list[str] = []
    # the ranks use the CPU all along (a compile before the first step: no idle hang), on the
    # injected clock
    now = [0.0]
    dog = Watchdog(
        settings, str(status), str(record), said.append, clock=lambda: 0.0, cpu=lambda pid: now[0]
    )
    plain_check = dog.check

    def check(t: float) -> bool:
        now[0] = t
        return plain_check(t)

    dog.check = check  # type: ignore[method-assign]
    assert not dog.check(500.0)  # nothing registered: nothing to watch
    dog.policy.reset(0.0)
    _worker(status, os.getpid(), 0, 0.0)
    assert not dog.check(0.0) and not dog.check(99.0)  # compiling: the first-step allowance
    _worker(status, os.getpid(), 1, 1.0)
    assert not dog.check(100.0)
    _worker(status, os.getpid(), 2, 2.0)
    assert not dog.check(105.0) and not dog.check(114.0)
    assert dog.check(116.0)  # 11 s without progress after the first step: dumped
    assert "watchdog: hang: no rank made progress for 11s (watchdog.timeout=10)" in said[0]
    assert (record / "watchdog" / "hang-1.txt").is_file()
    assert not dog.check(120.0) and dog.check(127.0)  # dump only: again a full allowance later
    assert (record / "watchdog" / "hang-2.txt").is_file() and dog.hang is None
    # a restarted rank (a new pid): the first-step allowance again
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _worker(status, child.pid, 0, 0.0)
        assert not dog.check(130.0) and not dog.check(229.0) and dog.check(231.0)
        _worker(status, child.pid, 3, 9.0, closing=True)  # past its last step: not watched
        assert not dog.check(240.0) and not dog.check(900.0)
    finally:
        child.kill()
        child.wait()
    assert len(list((record / "watchdog").glob("hang-*.txt"))) == 3


@pytest.mark.parametrize(
    "override", ["watchdog.timeout=0", "watchdog.action=kill", "watchdog.timeout=soon"]
)
def test_bad_watchdog_settings_are_one_line_errors(override: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(overrides=[override], check_backend=False)
    assert "watchdog." in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------ the summary


def _dump(tmp: Path, body: str) -> str:
    """A real faulthandler dump of a process running ``body`` (the main thread signals itself)."""
    script = tmp / "where.py"
    script.write_text(textwrap.dedent(body))
    code = (
        "import faulthandler, os, signal, sys, threading; "
        "f = open(sys.argv[1], 'w'); "
        "faulthandler.register(signal.SIGUSR2, file=f, all_threads=True); "
        "print(threading.main_thread().ident); sys.stdout.flush(); "
        f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))"
    )
    out = tmp / "dump.txt"
    ident = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()[0]
    return ident + "\n" + out.read_text()


def test_summary_names_each_rank_and_the_ranks_missing_from_a_collective(tmp_path: Path) -> None:
    from aios.resilience.stacks import Dump
    from aios.resilience.workers import library_dirs

    # a fake torch.distributed collective at a path the summary recognises
    lib = tmp_path / "lib"
    c10d = lib / "torch" / "distributed" / "distributed_c10d.py"
    c10d.parent.mkdir(parents=True)
    (lib / "torch" / "__init__.py").write_text("")
    (c10d.parent / "__init__.py").write_text("")
    c10d.write_text(
        "import os, signal\ndef all_gather(x):\n    os.kill(os.getpid(), signal.SIGUSR2)\n"
    )
    body = f"""
        import os, signal, sys
        sys.path.insert(0, {str(lib)!r})
        from torch.distributed.distributed_c10d import all_gather

        def estimate_loss():
            {{}}

        estimate_loss()
    """
    waiting = _dump(tmp_path, body.format("all_gather(1)")).split("\n", 1)
    elsewhere = _dump(tmp_path, body.format("os.kill(os.getpid(), signal.SIGUSR2)")).split("\n", 1)
    libs = [*library_dirs(), str(lib) + os.sep]
    dumps = [
        Dump(
            r,
            11 + r,
            0,
            "h",
            7,
            "S (sleeping)",
            text,
            info={"main_thread": int(ident), "lib": libs, "world_size": 3},
        )
        for r, (ident, text) in enumerate((waiting, elsewhere))
    ]
    lines = summarize(dumps)
    # world size 3, two ranks here: a node of a multi-node run, named on each line
    head = "rank {} (node 0, h) [pid {}, step 7]: "
    assert lines[0] == head.format(0, 11) + "waiting in all_gather from where.py:7 in estimate_loss"
    assert lines[1] == head.format(1, 12) + "where.py:7 in estimate_loss"
    assert lines[2] == "rank 1 is not in the all_gather that rank 0 waits in"
    assert lines[3] == "rank 2: on other nodes (their aios-run reports them)"
    # a rank whose stack could not be read is still named, with its process state
    dumps[1].text = ""
    assert summarize(dumps)[1].startswith(head.format(1, 12) + "no stack within the wait")


# ------------------------------------------------------------------------------ end to end


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC_")
        )
    }
    env.update({"AIOS_LOGGING__RUN_DIR": str(tmp / "runs"), "AIOS_LOGGING__TENSORBOARD": "false"})
    env["OMP_NUM_THREADS"] = "1"
    return env


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _hang(
    tmp: Path, nprocs: int, modes: str, *overrides: str, env: dict[str, str] | None = None
) -> tuple[str, list[int], dict]:
    """Run the hanging script; returns aios-run's stderr, the pids of every rank and DataLoader
    worker it started, and the hang's record."""
    from aios.testing.strategy_contract import free_port

    p = subprocess.run(
        [
            *RUN,
            "--nprocs",
            str(nprocs),
            f"master_port={free_port()}",
            "watchdog.timeout=8",
            *overrides,
            str(SCRIPT),
            modes,
            str(tmp),
        ],
        capture_output=True,
        text=True,
        env={**_env(tmp), **(env or {})},
        cwd=tmp,
        timeout=300,
    )
    # no wall-clock bound here (a loaded 2-core CI machine): the allowance itself is tested on
    # an injected clock; exit 124 says the watchdog, not the timeout, ended the run
    assert p.returncode == EXIT_HUNG, p.stdout + p.stderr
    pids = [
        int(f.read_text())
        for f in tmp.iterdir()
        if f.name.startswith(("rank", "loader")) and not f.name.endswith(".tmp")
    ]
    assert len(pids) >= nprocs, (sorted(os.listdir(tmp)), p.stderr)
    left = [pid for pid in pids if alive(pid)]
    assert not left, f"processes left behind: {left}"
    record = sorted((tmp / "runs").glob("*/watchdog/hang-*.json"))[-1]
    assert (record.with_suffix(".txt")).is_file()
    assert "hung: no rank made progress for" in p.stderr and f"(exit {EXIT_HUNG})" in p.stderr
    return p.stderr, pids, json.loads(record.read_text())


def _line(err: str, rank: int) -> str:
    return next(ln for ln in err.splitlines() if ln.startswith(f"aios-run:   rank {rank} "))


def test_rank0_only_evaluation_under_fsdp_is_named_and_restarted_then_stopped(
    tmp_path: Path,
) -> None:
    """watchdog.action=restart under --max-restarts 1: the hang is dumped and the workers
    restarted; the second attempt hangs the same way and aios-run stops with 124."""
    err, pids, record = _hang(
        tmp_path, 2, "fsdp_eval", "strategy=fsdp", "watchdog.action=restart", "--max-restarts", "1"
    )
    assert len(pids) == 4, pids  # two attempts of two ranks, none left
    assert "aios-run: restart 1/1: hang: no rank made progress for" in err, err
    assert len(list((tmp_path / "runs").glob("*/watchdog/hang-*.txt"))) == 2
    r0, r1 = _line(err, 0), _line(err, 1)
    # both ranks wait in FSDP collectives, each named with the script's file:line
    assert "waiting in all_gather (FSDP unshard) from hang_train.py:" in r0 + r1, err
    for ln in (r0, r1):
        assert "waiting in " in ln and "(FSDP " in ln and " from hang_train.py:" in ln, err
    assert "ranks wait in different collectives" in err, err
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert all(
        "Current thread" in r["stacks"] or "Thread 0x" in r["stacks"] for r in record["ranks"]
    )


def test_rank0_only_evaluation_before_the_first_step_is_named_within_the_timeout(
    tmp_path: Path,
) -> None:
    """nanoGPT evaluates at iteration 0 on the master rank: under fsdp on 2 processes the
    forward waits for an all-gather rank 1 never joins, before any step. Every rank idle (no
    CPU use) for watchdog.timeout=20 is a hang, though watchdog.first_step (30 minutes) has
    not passed: exit 124 within two minutes, both ranks named with file:line."""
    err, pids, record = _hang(tmp_path, 2, "fsdp_eval0", "strategy=fsdp", "watchdog.timeout=20")
    assert "before the first step, every rank idle (no CPU use) (watchdog.timeout=20)" in err, err
    r0, r1 = _line(err, 0), _line(err, 1)
    for ln in (r0, r1):
        assert "waiting in " in ln and " from hang_train.py:" in ln, err
    assert record["idle_s"] >= 20
    assert [r["rank"] for r in record["ranks"]] == [0, 1]


def test_policy_every_rank_idle_before_the_first_step_is_a_hang_a_busy_one_is_not() -> None:
    """Injected CPU samples and clock: rank 0 compiles for 60 s (busy) while rank 1 waits (no
    CPU): no alarm with watchdog.timeout=20; then every rank idle for 20 s: a hang, long before
    watchdog.first_step."""
    pol = HangPolicy(timeout=20.0, first_step=1800.0, min_timeout=600.0, factor=10.0)
    pol.reset(0.0)
    cpu = {0: 0.0, 1: 0.0}
    for t in range(0, 61):
        cpu[0] += 0.3  # a compile on a loaded machine: 30% of a core
        cpu[1] += 0.001  # blocked in a collective
        for r in (0, 1):
            pol.observe_cpu(r, cpu[r], float(t))
            pol.observe(r, 0, 0.0, float(t))
        assert not pol.idle_expired(float(t)) and not pol.expired(float(t)), t
    for t in range(61, 81):  # every rank waits now (a rank-0-only evaluation)
        for r in (0, 1):
            pol.observe_cpu(r, cpu[r], float(t))
        assert not pol.idle_expired(float(t)), t
    pol.observe_cpu(0, cpu[0], 81.5)
    assert pol.idle_expired(81.5)
    # auto timeout: min_timeout is the idle allowance
    auto = HangPolicy(timeout=None, first_step=1800.0, min_timeout=30.0, factor=10.0)
    auto.reset(0.0)
    auto.observe_cpu(0, 1.0, 0.0)
    auto.observe_cpu(0, 1.0, 29.0)
    assert not auto.idle_expired(29.0) and auto.idle_expired(31.0)
    # after the first step the step-based policy alone decides
    auto.observe(0, 1, 1.0, 31.0)
    assert not auto.idle_expired(100.0)


def test_sleep_native_call_and_dataloader_deadlock_are_named(tmp_path: Path) -> None:
    err, pids, record = _hang(tmp_path, 3, "loader,sleep,native")
    src = SCRIPT.read_text().splitlines()
    calls = ("time.sleep(10_000)", "libc.sleep(1000)", "threading.Event().wait()")
    line = {n: i + 1 for i, text in enumerate(src) for n in calls if n in text}
    r0, r1, r2 = _line(err, 0), _line(err, 1), _line(err, 2)
    assert "waiting for a DataLoader worker from hang_train.py:" in r0, err
    assert f"hang_train.py:{line['threading.Event().wait()']} in __getitem__" in r0, err
    assert r1.endswith(f": hang_train.py:{line['time.sleep(10_000)']} in <module>"), err
    # the GIL is held by the C call: faulthandler still reads the stack
    assert f"hang_train.py:{line['libc.sleep(1000)']} in block_in_c" in r2, err
    assert len(pids) == 4  # 3 ranks + the DataLoader worker, all gone
    assert (
        record["ranks"][0]["children"]
        and "__getitem__" in record["ranks"][0]["children"][0]["stacks"]
    )


def test_nccl_flight_recorder_is_dumped_and_the_rank_behind_is_named(tmp_path: Path) -> None:
    """On a hang aios-run writes to each rank's flight recorder pipe (torch's
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE protocol; the ranks here stand in for ProcessGroupNCCL, which
    needs GPUs), reads the dumps, names the rank that never reached the collective the other waits
    in, and keeps the dumps in the run record under torch's names."""
    from aios.resilience.flightrec import load_dump

    err, _pids, _record = _hang(
        tmp_path, 2, "sleep", env={"FAKE_NCCL_FR": "7:scheduled,6:completed"}
    )
    assert (
        "NCCL flight recorder: rank 0 at collective #7 nccl:_allgather_base (scheduled); "
        "rank 1 at collective #6 nccl:_allgather_base (completed)" in err
    ), err
    assert (
        "NCCL flight recorder: rank 1 never reached collective #7 (nccl:_allgather_base) that "
        "rank 0 waits in" in err
    ), err
    (folder,) = (tmp_path / "runs").glob("*/watchdog/hang-1-nccl")
    assert f"NCCL flight recorder dumps: {folder}" in err, err
    got = {p.name: len(load_dump(p.read_bytes())["entries"]) for p in folder.iterdir()}
    assert got == {"nccl_trace_rank_0": 7, "nccl_trace_rank_1": 6}
    assert "deprecated" not in err, err  # torch's current names for the recorder settings


def test_flight_recorder_settings_and_dumps_are_handled_safely(tmp_path: Path) -> None:
    import pickle

    from aios.resilience import flightrec

    env = flightrec.worker_env(str(tmp_path), {})
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "nccl-fr-pipe-"),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl-fr-rank-"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    mine = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "100",  # the older names count too
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/t_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/p_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    }
    assert flightrec.worker_env(str(tmp_path), mine) == {}  # the user's settings win
    # a dump is data: a pickle that would build an object is refused
    with pytest.raises(pickle.UnpicklingError):
        flightrec.load_dump(pickle.dumps({"entries": [Path("/etc")]}))
    # a pipe nobody reads (the rank's process group is gone) is skipped at once, no error
    os.mkfifo(tmp_path / "nccl-fr-pipe-0.pipe")
    t0 = time.monotonic()
    assert flightrec.trigger_and_collect({0: env}, wait=5.0) == []
    assert time.monotonic() - t0 < 5.0
    # a rank that was asked and never answers is named, within the wait
    fd = os.open(tmp_path / "nccl-fr-pipe-0.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        (rec,) = flightrec.trigger_and_collect({0: env}, wait=0.5)
    finally:
        os.close(fd)
    assert rec.error == "no dump within 0.5s"
    assert flightrec.summarize([rec]) == ["NCCL flight recorder: rank 0: no dump within 0.5s"]


def test_a_dump_a_rank_wrote_on_a_collective_timeout_is_kept_in_the_run_record(
    tmp_path: Path,
) -> None:
    """TORCH_NCCL_DUMP_ON_TIMEOUT: the rank dumps its recorder by itself, into the launch's
    status folder (removed at exit): aios-run copies it into the run record and says where."""
    script = tmp_path / "timeout.py"
    script.write_text(
        "import os, pickle, sys, time\n"
        "assert os.environ['TORCH_NCCL_DUMP_ON_TIMEOUT'] == '1'\n"
        "with open(os.environ['TORCH_FR_DUMP_TEMP_FILE'] + os.environ['RANK'], 'wb') as f:\n"
        "    pickle.dump({'version': '2.10', 'entries': []}, f)\n"
        "other = os.environ['TORCH_FR_DUMP_TEMP_FILE'] + str(1 - int(os.environ['RANK']))\n"
        "for _ in range(600):  # both have dumped before either exits (no race with the stop)\n"
        "    if os.path.exists(other):\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "sys.exit('collective operation timeout: WorkNCCL(SeqNum=7, OpType=_ALLGATHER_BASE)')\n"
    )
    p = subprocess.run(
        [*RUN, "--nprocs", "2", str(script)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr
    (folder,) = (tmp_path / "runs").glob("*/nccl")
    assert sorted(x.name for x in folder.iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert f"NCCL flight recorder dumps (a collective timed out): {folder}" in p.stderr, p.stderr


def test_slow_first_step_is_no_alarm_and_a_live_run_is_dumped_on_demand(tmp_path: Path) -> None:
    """Rank 0's first step computes (a compile) for three times watchdog.timeout while rank 1
    waits in the step's collective (within watchdog.first_step): no alarm, a busy first step is
    no hang; ``aios stacks --pid`` and SIGUSR1 dump both ranks while the run goes on to a clean
    exit."""
    from aios.testing.strategy_contract import free_port

    env = {**_env(tmp_path), "SLOW_FIRST": "12", **zygote.OFF}  # aios stacks --pid of aios-run
    p = subprocess.Popen(
        [
            *RUN,
            "--nprocs",
            "2",
            f"master_port={free_port()}",
            "watchdog.timeout=4",
            "watchdog.first_step=120",
            str(SCRIPT),
            "live",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        end = time.monotonic() + 180
        while not list(tmp_path.glob("rank1-*")) or not list(tmp_path.glob("rank0-*")):
            assert p.poll() is None and time.monotonic() < end, p.communicate()
            time.sleep(0.2)
        cli = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; sys.argv[0] = 'aios'; from aios.cli.main import main; main()",
                "stacks",
                "--pid",
                str(p.pid),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        (run,) = json.loads(cli.stdout)
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        assert all("hang_train.py" in r["stacks"] for r in run["ranks"]), run
        assert len(run["summary"]) >= 2 and "rank 1 [pid" in run["summary"][1]
        os.kill(p.pid, signal.SIGUSR1)
        record = tmp_path / "runs"
        while not list(record.glob("*/watchdog/stacks-1.json")):
            assert p.poll() is None and time.monotonic() < end, p.communicate()
            time.sleep(0.2)
        assert p.poll() is None  # the run keeps going
        (tmp_path / "stop").write_text("")
        _, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "watchdog: on demand (SIGUSR1)" in err and "watchdog: hang" not in err, err
    dumped = json.loads(next(record.glob("*/watchdog/stacks-1.json")).read_text())
    assert [r["rank"] for r in dumped["ranks"]] == [0, 1]


def test_aios_stacks_names_what_it_cannot_find(run_aios) -> None:
    r = run_aios("stacks", "--pid", "999999999")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "process 999999999 is neither an aios-run nor a worker" in r.stderr
    assert "torch" not in r.stderr


def test_ranks_under_a_foreign_launcher_are_watched_by_a_sidecar(tmp_path: Path) -> None:
    """A cluster job of ``aios launch`` runs torchrun itself with a status folder: local rank 0
    starts the watchdog beside it, which names the hang, leaves its marker, stops the launcher
    and the ranks, and ends with the launcher."""
    from aios.resilience.watchdog import HUNG_MARKER
    from aios.testing.strategy_contract import free_port

    status = tmp_path / "status"
    status.mkdir()
    env = {**_env(tmp_path), "AIOS_RUN_STATUS_DIR": str(status), "AIOS_WATCHDOG__TIMEOUT": "8"}
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(SCRIPT), "ok,sleep", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "aios: watchdog: hang: no rank made progress for" in out, out
    assert "rank 1 is not in the backward (the gradient all_reduce) that rank 0 waits in" in out
    assert (status / HUNG_MARKER).is_file()
    pids = [int(f.read_text()) for f in tmp_path.glob("rank*-*") if not f.name.endswith(".tmp")]
    assert len(pids) == 2 and not [pid for pid in pids if alive(pid)]
    end = time.monotonic() + 30  # the sidecar ends with its launcher
    while any(str(status) in _cmdline(pid) for pid in _all_pids()):
        assert time.monotonic() < end, "the watchdog beside torchrun outlived it"
        time.sleep(0.2)


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
