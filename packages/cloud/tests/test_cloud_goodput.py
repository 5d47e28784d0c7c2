"""A job's goodput outside the hosts (issue 29, item 5), against real sshd hosts: ``aios status``
copies the run record a running job writes on worker 0 and shows its goodput and the cost per
productive hour; the watcher keeps a copy when the job ends, so ``aios report CLUSTER`` works
after the cluster is deleted; ``--max-cost`` checkpoints and stops the job before its projected
spend passes the limit (the projection on an injected clock)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.config.schema import resolve
from aios.errors import AiosError
from aios_cloud import shapes
from aios_cloud.jobs import JobSpec, cancel_job, start_job, sync_code
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.records import request_dict, save_hosts
from aios_cloud.request import LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import JOB_CANCELLED, JOB_SUCCEEDED, ClusterRecord, Store
from aios_cloud.testing.loopback import LoopbackCloud
from aios_cloud.watching import Watcher, WatchOptions
from click.testing import CliRunner

# what rank 0 writes (aios.runrecord.records): one attempt, launched at t0, first step done at t0 + 10,
# last step at t0 + 100: 90 s of productive steps in 100 s of wall time
RECORD = """\
import json, os, pathlib, sys, time
t0 = time.time() - 100
d = pathlib.Path("runs") / "20261127-000000-1"
d.mkdir(parents=True)
attempt = {"launched": t0, "first_step": t0 + 10, "last_step": t0 + 100, "start_step": 0,
           "last_step_index": 50}
diag = {"started": t0, "updated": t0 + 100, "status": "running", "steps": 50, "attempt": attempt}
if FINISH:
    diag.update(finished=t0 + 100, status="completed")
(d / "metrics.jsonl").write_text(
    "".join(json.dumps({"step": s, "time": t0 + 10 + 90 * s / 50, "loss": 1.0}) + "\\n"
            for s in range(1, 51)))
(d / "diagnostics.json").write_text(json.dumps(diag))
print("record written", flush=True)
home = pathlib.Path(os.environ["HOME"])
while not FINISH and not (home / "stop").exists():
    time.sleep(0.1)
"""

# a run killed at step 25 (t0 + 50) and resumed from its checkpoint of step 20 (t0 + 60): the
# second record names the first by its path on the host, as aios.runtime's resume event does
TWO_ATTEMPTS = """\
import json, os, pathlib, time
t0 = time.time() - 100
def record(name, diag):
    d = pathlib.Path("runs") / name
    d.mkdir(parents=True)
    (d / "diagnostics.json").write_text(json.dumps(diag))
    return os.path.abspath(d)
first = record("20261127-000000-job1-aaaa", {
    "started": t0, "updated": t0 + 50, "status": "running", "steps": 25,
    "attempt": {"launched": t0, "first_step": t0 + 10, "last_step": t0 + 50, "start_step": 0,
                "last_step_index": 25}})
record("20261127-000100-job1-bbbb", {
    "started": t0 + 60, "updated": t0 + 100, "finished": t0 + 100, "status": "completed",
    "steps": 50, "events": [{"kind": "resume", "step": 20, "record": first}],
    "attempt": {"launched": t0 + 60, "first_step": t0 + 70, "last_step": t0 + 100,
                "start_step": 20, "last_step_index": 50}})
"""

# what aios.runtime does on SIGTERM: the emergency checkpoint, then its status marker and exit 75
STOPPABLE = """\
import os, pathlib, signal, sys, time
def notice(signum, frame):
    with open(os.path.join(os.environ["AIOS_RUN_STATUS_DIR"], "rank0"), "w") as f:
        f.write("preempted /ckpt/ckpt-000000007")
    pathlib.Path(os.environ["HOME"], "got-sigterm").write_text("yes")
    sys.exit(75)
signal.signal(signal.SIGTERM, notice)
pathlib.Path(os.environ["HOME"], "ready").write_text("yes")
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def env(tmp_path, monkeypatch, sshd_cluster):
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "aios-home"))
    return sshd_cluster(1)  # the aios pytest plugin: skips (fails with CI=true) without sshd


def _launch(c, tmp_path, script: str, hourly: float | None, max_cost: float | None = None):
    """A cluster record of the sshd host, a job running ``script`` there, its first shape."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(script)
    store = Store()
    provider = LoopbackCloud(c, hourly=hourly)
    request = ClusterRequest(name="wc", accelerator="box", zone="z1", ssh_user=c.user)
    rec = ClusterRecord(
        name="wc",
        cloud="loop",
        zone="z1",
        accelerator="box",
        spot=False,
        state="READY",
        request=request_dict(request),
        ssh_user=c.user,
        ssh_key=str(c.client_key),
    )
    assert store.claim_cluster(rec)
    rec = save_hosts(store, rec, provider.info("wc"), provider)
    spec = JobSpec(
        script="job.py", backend="cpu", python=sys.executable, workdir=str(work), bundle=False
    )
    spec.max_cost = max_cost
    config = resolve(flags={"nprocs": 1}, environ={}, check_backend=False)
    job_id = store.add_job("wc", "job.py", backend="cpu", spec=spec.to_dict())
    printer = LinePrinter(io.StringIO())
    logs: list[str] = []
    sync_code(rec, spec, printer, logs.append)
    procs = start_job(rec, job_id, spec, config, {}, printer, logs.append)
    store.update_job(job_id, state="RUNNING")
    price = shapes.hourly_for_hosts(provider, "box", False, len(rec.hosts))
    shapes.begin(store, rec, job_id, procs, price, None, "launched")
    return store, provider, rec, job_id, config, printer, logs


def _wait_for(path: Path, what: str) -> None:
    for _ in range(300):
        if path.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} never appeared ({path})")


def test_status_shows_a_running_jobs_goodput_and_cost_per_productive_hour(env, tmp_path):
    from aios_cloud.cli.status import status

    store, provider, rec, job_id, *_ = _launch(env, tmp_path, "FINISH = False\n" + RECORD, 3.6)
    runs = env.hosts[0].home / "aios" / "wc" / "code" / "runs" / "20261127-000000-1"
    try:
        _wait_for(runs / "diagnostics.json", "the run record")
        r = CliRunner().invoke(status, ["--json"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        (job,) = json.loads(r.output)[0]["jobs"]
        g = job["goodput"]
        assert g["source"] == "hosts"
        assert g["wall_s"] == pytest.approx(100, abs=0.01)
        assert g["productive_s"] == pytest.approx(90, abs=0.01)
        assert g["goodput"] == pytest.approx(0.9, abs=1e-4)
        # the spend so far (the shape at the catalog's $3.60/h) per productive hour
        (shape,) = job["shapes"]
        assert shape["hourly_usd"] == 3.6
        assert g["cost_usd"] == pytest.approx(shape["cost_usd"], abs=1e-3)
        assert g["usd_per_productive_hour"] == pytest.approx(g["cost_usd"] / (90 / 3600), rel=0.01)
        r = CliRunner().invoke(status, [], env={"COLUMNS": "200"}, catch_exceptions=False)
        assert "goodput ┃" in r.output.splitlines()[2]  # the table's last column
        assert "90.0%" in r.output
        line = next(ln for ln in r.output.splitlines() if ln.startswith(f"wc: job {job_id} good"))
        assert line.startswith(f"wc: job {job_id} goodput 90.0%: 1.5m productive of 1.7m wall, $")
        assert line.endswith(" per productive hour")
    finally:
        (env.hosts[0].home / "stop").write_text("")
        cancel_job(rec, job_id, grace=2)
        store.close()


def test_the_watcher_keeps_the_record_so_report_works_after_down(env, tmp_path):
    """The job ends, the watcher copies its run record; the hosts and the cluster go away;
    ``aios report wc`` and ``aios status`` still have the account."""
    from aios.cli.report import report
    from aios_cloud.cli.status import status
    from aios_cloud.lifecycle import down_cluster

    store, provider, rec, job_id, config, printer, logs = _launch(env, tmp_path, TWO_ATTEMPTS, None)
    opts = WatchOptions(poll=0.2, describe_every=0.2, follow=False, ssh_timeout=30)
    code = Watcher(
        store, provider, job_id, config, printer=printer, log=logs.append, options=opts
    ).run()
    assert code == 0 and store.get_job(job_id).state == JOB_SUCCEEDED, logs
    # ended, copied: status reads the copy (no price in this catalog: no cost figure)
    # 40 s of steps in the first attempt; 30 s in the second, of which the 5 steps of 29 that
    # the first had run already are rework; 100 s of wall time
    productive = 40 + 30 * (1 - 5 / 29)
    r = CliRunner().invoke(status, ["--json"], catch_exceptions=False)
    g = json.loads(r.output)[0]["jobs"][0]["goodput"]
    assert g["source"] == "copy" and g["goodput"] == pytest.approx(productive / 100, abs=1e-4)
    assert g["cost_usd"] is None and g["usd_per_productive_hour"] is None
    down_cluster(store, provider, store.get_cluster("wc"))
    home = env.hosts[0].home
    env.close()
    shutil.rmtree(home / "aios")  # the hosts are gone, their files with them
    r = CliRunner().invoke(report, ["wc", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["attempts"] == 2 and got["wall_s"] == pytest.approx(100, abs=0.01)
    assert got["goodput"] == pytest.approx(productive / 100, abs=1e-4)
    assert got["badput"]["rework"] == pytest.approx(30 * 5 / 29, abs=0.01)
    assert got["badput"]["between_attempts"] == pytest.approx(10, abs=0.01)
    (lost,) = got["interruptions"]
    assert (lost["step"], lost["resumed_at"], lost["steps_lost"]) == (25, 20, 5)
    assert got["productive_s"] + sum(got["badput"].values()) == pytest.approx(100, abs=0.01)
    store.close()


def test_max_cost_checkpoints_and_stops_the_job_before_the_spend_passes_it(env, tmp_path):
    store, provider, rec, job_id, config, printer, logs = _launch(
        env, tmp_path, STOPPABLE, 2.0, max_cost=1.0
    )
    started = store.events("wc", kind=shapes.SHAPE)[0].time
    ready = env.hosts[0].home / "ready"
    clock = {"elapsed": 10.0}  # seconds since the job's shape began, as the watcher sees it
    spent_at_checks: list[float] = []

    def now() -> float:
        return started + clock["elapsed"]

    def sleep(seconds: float) -> None:
        # one check under the limit happened; the job's handler is in place: half an hour on
        _wait_for(ready, "the job's SIGTERM handler")
        spent_at_checks.append(clock["elapsed"])
        clock["elapsed"] = 1790.0
        time.sleep(min(seconds, 0.2))

    opts = WatchOptions(poll=0.2, describe_every=60, follow=False, ssh_timeout=30)
    code = Watcher(
        store,
        provider,
        job_id,
        config,
        printer=printer,
        log=logs.append,
        options=opts,
        sleep=sleep,
        now=now,
    ).run()
    # at 10 s ($0.006 + the next ~30 s) the job ran on; at 1790 s, $0.99 + the ~30 s a stop
    # takes at $2/h would pass $1: stopped, with its emergency checkpoint
    assert spent_at_checks and spent_at_checks[0] == 10.0
    assert code == 75, logs
    assert store.get_job(job_id).state == JOB_CANCELLED
    assert (env.hosts[0].home / "got-sigterm").read_text() == "yes"
    (event,) = store.events("wc", kind="cost-limit")
    assert "has spent $0.99 at $2.00/h" in event.message and "--max-cost $1.00" in event.message
    assert any(
        "stopped at the spending limit (--max-cost $1.00, $0.99 spent); checkpoint "
        "/ckpt/ckpt-000000007 written" in m
        for m in logs
    ), logs
    (shape,) = shapes.job_shapes(store, "wc", job_id)
    assert shape["ended"] is not None
    store.close()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("-5", "more than 0"),
        ("0", "more than 0"),
        ("nan", "more than 0"),
        ("ten", "is not an amount in US dollars"),
    ],
)
def test_max_cost_bad_values_are_one_line(tmp_path, value, words):
    (tmp_path / "t.py").write_text("")
    with pytest.raises(AiosError) as err:
        LaunchRequest.from_options({"script": "t.py", "workdir": str(tmp_path), "max_cost": value})
    assert words in err.value.message and err.value.fix == "pass e.g. --max-cost 50"


def test_max_cost_parses_dollars(tmp_path):
    (tmp_path / "t.py").write_text("")
    req = LaunchRequest.from_options(
        {"script": "t.py", "workdir": str(tmp_path), "max_cost": "$1,250.5"}
    )
    assert req.cost_limit == 1250.5


def test_max_cost_on_a_cloud_without_prices_is_refused_before_anything_is_created(tmp_path):
    (tmp_path / "t.py").write_text("")
    home = tmp_path / "home"
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "ssh", "--hosts", "a,b"]
        + ["--max-cost", "20", "--workdir", str(tmp_path), "t.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(home)},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "aios: error: --max-cost is not supported by --cloud ssh (hourly prices to bound the "
        "spend with); drop --max-cost"
    ]
    assert not (home / "clusters").exists()
    if (home / "state.db").exists():
        assert Store(home / "state.db").clusters() == []


def test_a_multi_host_slice_is_priced_once_per_slice():
    """A TPU slice of 2 hosts has one catalog price for the slice: a cluster of its 2 hosts
    costs that price, not twice it (the shapes and --max-cost use this)."""
    import dataclasses

    provider = LoopbackCloud(None, hourly=4.0)
    entry = dataclasses.replace(provider.catalog()[0], hosts=2)
    provider.catalog = lambda: [entry]  # type: ignore[method-assign]
    assert shapes.hourly_for_hosts(provider, "box", False, 2) == 4.0
    assert shapes.hourly_for_hosts(provider, "box", False, 4) == 8.0


def _plan(tmp_path, hourly: float | None, **options):
    """The launch planned for ``options`` (``dry_run`` True unless given) and, for a dry run,
    what it prints."""
    from aios_cloud.launch.dryrun import render
    from aios_cloud.launch.planning import plan

    (tmp_path / "t.py").write_text("")
    req = LaunchRequest.from_options(
        {"script": "t.py", "workdir": str(tmp_path), "accelerator": "box", "name": "wc"}
        | {"no_setup": True, "no_bundle": True, "dry_run": True, **options}
    )
    config = resolve(flags={"nprocs": 1}, environ={}, check_backend=False)
    out: list[str] = []
    launch = plan(
        req, LoopbackCloud(None, hourly), "loop", config, None, None, out.append, out.append,
        LinePrinter(io.StringIO()),
    )  # fmt: skip
    if req.dry_run:
        render(launch)
    return launch, out


def test_max_cost_dry_run_says_what_the_limit_will_do(tmp_path):
    launch, out = _plan(tmp_path, 2.5, max_cost="10", down_after=True)
    assert launch.spec.max_cost == 10.0  # the watcher reads it from the job's spec
    (line,) = [ln for ln in out if ln.startswith("# cost limit")]
    assert line == (
        "# cost limit: --max-cost $10.00: the watcher projects the job's spend (catalog price x "
        "time on each shape), about 4.0 h at $2.50/h; before it passes the limit the job is "
        "checkpointed (SIGTERM, the checkpoint.grace_seconds notice) and stopped and the "
        "cluster deleted (--down)"
    )
    _, out = _plan(tmp_path, 2.5)
    assert not [ln for ln in out if ln.startswith("# cost limit")]


def test_max_cost_on_a_type_without_a_price_is_one_line(tmp_path):
    with pytest.raises(AiosError) as err:
        _plan(tmp_path, None, max_cost="10")
    assert err.value.message == (
        "--max-cost needs the price of box, and the loop catalog lists no on-demand price for it"
    )
    assert (
        err.value.fix
        == "drop --max-cost, or pick a type with a price (`aios catalog --cloud loop`)"
    )


def test_max_cost_with_down_deletes_the_cluster_after_the_stop(env, tmp_path, monkeypatch):
    """The background watcher (``aios launch --detach --down``): at $1,000,000/h the first
    check is already over a $1 limit (no timing involved); the job is stopped with its
    checkpoint, then the cluster is deleted."""
    from aios_cloud import records, watch

    store, provider, rec, job_id, *_ = _launch(env, tmp_path, STOPPABLE, 1e6, max_cost=1.0)
    _wait_for(env.hosts[0].home / "ready", "the job's SIGTERM handler")
    monkeypatch.setattr(records, "get_provider", lambda cloud, config: provider)
    code = watch.main([str(job_id), "--cloud", "loop", "--poll", "0.2", "--down"])
    assert code == 75
    assert (env.hosts[0].home / "got-sigterm").read_text() == "yes"
    assert store.get_cluster("wc") is None and provider.calls[-1] == "delete"
    job = store.get_job(job_id)
    assert job is not None and job.state == JOB_CANCELLED
    (event,) = store.events("wc", kind="cost-limit")
    assert "--max-cost $1.00" in event.message
    store.close()


def test_each_start_of_a_job_writes_its_own_run_record(env, tmp_path):
    """torchrun's rendezvous id (``aios``, the same for every attempt) must not name the run
    record: each start of the job (a recovery is one) gets its own ``AIOS_RUN_ID`` and the
    launch time the record's start-up counts from."""
    store, provider, rec, job_id, config, printer, logs = _launch(env, tmp_path, "", None)
    envfile = env.hosts[0].home / "aios" / "wc" / "jobs" / str(job_id) / "env"

    def attempt_env() -> dict[str, str]:
        out = {}
        for line in envfile.read_text().splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            out[k] = v.strip("'")
        return out

    before = time.time()
    first = attempt_env()
    spec = JobSpec.from_dict(store.get_job(job_id).spec)
    start_job(rec, job_id, spec, config, {}, printer, logs.append)  # a relaunch
    second = attempt_env()
    assert first["AIOS_RUN_ID"] != second["AIOS_RUN_ID"]
    assert f"-job{job_id}-" in second["AIOS_RUN_ID"]
    assert before <= float(second["AIOS_RUN_LAUNCH_TIME"]) <= time.time()
    store.close()


def test_report_on_a_cluster_without_a_run_record_says_so(tmp_path, monkeypatch):
    """``aios report NAME`` for a cluster this machine knows whose job wrote no run record: one
    line saying that (not "no known cluster"), exit 2; a name it does not know is left to the
    other resolvers."""
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "aios-home"))
    store = Store()
    store.claim_cluster(ClusterRecord("quiet", "loop", "z1", "box", False, "READY"))
    store.add_job("quiet", "job.py")
    store.close()
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "report", "quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(tmp_path / "aios-home")},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "aios: error: no run record of cluster quiet's jobs was copied here; a job writes one "
        "once its script calls aios.init (see `aios logs quiet`)"
    ]
    from aios_cloud.runs import report_target

    assert report_target("unknown") is None
    assert not (tmp_path / "aios-home" / "clusters" / "unknown").exists()


@pytest.mark.parametrize(("fee", "refused"), [(None, True), (240.0, False)])
def test_max_cost_on_reserved_capacity_needs_its_fee(tmp_path, monkeypatch, fee, refused):
    """Capacity billed as an upfront fee is projected at its fee per hour, read at launch: a
    cloud that does not tell the fee is refused in one line (the catalog's hourly price is not
    what is billed)."""
    from aios_cloud.provider.data import ReservedPrice

    def reservation_prices(self, request, hours=None, live=True):
        return [ReservedPrice("block cr-1", fee=fee if live else None, hours=24.0)]

    monkeypatch.setattr(LoopbackCloud, "reservation_prices", reservation_prices)
    options = {"max_cost": "10", "reservation": "block:cr-1", "dry_run": False}
    if refused:
        with pytest.raises(AiosError) as err:
            _plan(tmp_path, 2.5, **options)
        assert err.value.message == (
            "--max-cost needs what block cr-1 costs per hour, and loop does not tell its fee"
        )
    else:
        launch, _ = _plan(tmp_path, 2.5, **options)
        assert launch.spec.max_cost == 10.0


def test_the_watcher_copies_a_running_jobs_record_every_few_minutes(env, tmp_path):
    """A host can vanish with no incident the watcher acts on first: the running job's record
    is copied every ``copy_every`` seconds (on the watcher's clock), not only at its end."""
    from aios_cloud import runs

    store, provider, rec, job_id, config, printer, logs = _launch(
        env, tmp_path, "FINISH = False\n" + RECORD, None
    )
    written = env.hosts[0].home / "aios" / "wc" / "code" / "runs" / "20261127-000000-1"
    _wait_for(written / "diagnostics.json", "the run record")
    clock = {"t": 1000.0}
    copied_while_running: list[bool] = []

    def sleep(seconds: float) -> None:
        copied_while_running.append(runs.newest_record("wc", job_id) is not None)
        if len(copied_while_running) == 1:
            clock["t"] += 301.0  # the next check is due for a copy
        else:
            (env.hosts[0].home / "stop").write_text("")  # now the job may end
        time.sleep(min(seconds, 0.2))

    opts = WatchOptions(poll=0.2, describe_every=60, follow=False, copy_every=300)
    code = Watcher(
        store,
        provider,
        job_id,
        config,
        printer=printer,
        log=logs.append,
        options=opts,
        sleep=sleep,
        now=lambda: clock["t"],
    ).run()
    assert code == 0, logs
    # nothing copied in the first 300 s; copied at the check after them, while the job ran
    assert copied_while_running[:2] == [False, True], copied_while_running
    store.close()
