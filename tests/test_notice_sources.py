"""Every interruption notice source, end to end on its stand-in (issue 29, first acceptance
item): a real 2-rank ``aios-run`` training (gloo, ``checkpoint.dir`` set) hears the notice the
way the platform gives it; the stand-in kills the host (SIGKILL to the process group of every
process it runs, :class:`aios_cloud.testing.host.Host`) at the deadline the platform fixes; the
checkpoint is committed before that kill; the relaunch on the same shape resumes from it and
continues bit for bit as an uninterrupted run (one baseline for the module).

Sources: EC2 spot ``instance-action`` (IMDSv2 stand-in), a Capacity Block's end (the env
``aios launch`` gives the hosts; no notice on the hosts), GCE preemption and Cloud TPU upcoming
maintenance (metadata server stand-in, the TPU VM seen through a PCI tree with a v5e chip), a GKE
Spot node's pod termination (the pod spec aios renders, the kubelet's SIGTERM and 15 s cap) and
Slurm's ``--signal`` lead (a real Slurm, the sbatch script aios renders). Pod deletion outside
Spot nodes is the same SIGTERM path with the pod's own grace (``test_k8s_manifests`` checks that
the grace the manifest asks for is aios's).

Deadlines are the platforms' own rules, applied to the time the notice carries: EC2 acts at the
``instance-action``'s ``time`` (two minutes ahead on EC2; 20 s here); Compute Engine stops a
preempted VM 30 s after ``instance/preempted`` (the notice carries no time: the real 30 s);
Cloud TPU interrupts the slice at the announced window's start; EC2 reclaims a Capacity Block's
instances from its end minus 30 minutes (the block's end is set 30 minutes, the margin and 60 s
ahead); the kubelet SIGKILLs a pod when its grace runs out, at most 15 s on a GKE Spot node;
Slurm ends the job at its time limit. A run that behaves ends before any deadline, and the host
then has nothing left to kill: no test waits for a deadline it beat.

The step at which a run stops does not depend on the machine's speed: the script holds one step
after its start until its rank has heard the notice (``rt.should_stop``), so every rank stops at
the next boundary. Sources known at launch (a Capacity Block's end, TPU maintenance announced
ahead) stop the run at its first step boundary.

Cost: a launch is three interpreters importing torch (``aios-run`` and two ranks), about 14 s of
CPU. The sources therefore share one relay of checkpoints (:class:`Relay`): each source's run
is the relaunch that resumes the previous source's emergency checkpoint, checked after every
step against the baseline's parameters, and the module's last relaunch resumes the last one to
the baseline's end, bitwise. Eight launches in all instead of thirteen; any subset or order of
the parameters works (each run resumes whatever checkpoint is newest).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from aios_cloud.testing.host import Host  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "notice_train.py"
TOTAL = 12  # optimizer steps of the whole run (the relay's sources take 10)
#: the env a test process may carry that would make the ranks think they run on a cloud
PLATFORM_ENV = (
    "AIOS_",
    "GCE_METADATA_HOST",
    "AWS_EC2_METADATA",
    "SLURM_",
    "KUBERNETES_",
    "TPU_",
    "PJRT_",
    "MASTER_",
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PLATFORM_ENV)}
    env.update(
        AIOS_HOME=str(work / "aios-home"),
        AIOS_LOGGING__RUN_DIR=str(work / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        OMP_NUM_THREADS="1",
        TOTAL_STEPS=str(TOTAL),
        # the test machine is not a TPU VM unless a source says so (an empty PCI tree)
        AIOS_TEST_SYSFS_PCI=str(work / "no-pci"),
    )
    (work / "no-pci").mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


def _aios_run(ckpt: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aios.cli.run",
        "--nprocs",
        "2",
        "--master-port",
        str(_port()),
        f"checkpoint.dir={ckpt}",
        str(SCRIPT),
        str(out),
    ]


def _committed(ckpt: Path) -> list[int]:
    """The steps of the checkpoints committed in ``ckpt`` (a manifest is written last)."""
    return sorted(
        int(m.parent.name.split("-")[1]) for m in ckpt.glob("ckpt-*/aios-checkpoint.json")
    )


def _params(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def _wait_progress(
    progress: Path, running: Callable[[], bool], at: int, timeout: float = 240
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not running():
            raise AssertionError(f"the run ended before step {at}")
        try:
            if int(progress.read_text() or 0) >= at:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"the run did not reach step {at}")


def _preemption(runs: Path) -> dict[str, Any]:
    """The preemption event of the interrupted run's record."""
    events = [
        ev
        for diag in runs.glob("*/diagnostics.json")
        for ev in json.loads(diag.read_text()).get("preemptions", [])
    ]
    assert len(events) == 1, events
    return events[0]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run (same command, same checkpoint settings): its final parameters and
    the digest of its parameters after every step."""
    work = tmp_path_factory.mktemp("baseline")
    out = work / "final.pt"
    env = _env(work, DIGEST_FILE=str(work / "digests"))
    with Host(_aios_run(work / "ckpt", out), env=env, cwd=work) as host:
        rc = host.wait(300)
    assert rc == 0, host.output
    digests = _digests(work / "digests")
    assert sorted(digests) == list(range(1, TOTAL + 1))
    return {"params": _params(out), "digests": digests}


def _digests(path: Path) -> dict[int, str]:
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {int(step): digest for step, digest in pairs}


def _continues_bitwise(digests: Path, baseline: dict[str, Any], start: int, stop: int) -> None:
    """The run's parameters after every step from ``start`` (where it resumed) to ``stop`` are
    the uninterrupted run's, bit for bit."""
    got = _digests(digests)
    assert sorted(got) == list(range(start + 1, stop + 1)), (start, stop, sorted(got))
    for step in sorted(got):
        assert got[step] == baseline["digests"][step], (
            f"after resuming at step {start}, the parameters after step {step} differ from the "
            "uninterrupted run's"
        )


@dataclass
class Relay:
    """One checkpoint directory that every source's run resumes from and stops in: each run is
    both the relaunch that resumes the previous source's emergency checkpoint (checked step by
    step against the baseline) and the run the next notice stops. The module's last relaunch
    resumes the last checkpoint and ends at the baseline's final parameters (teardown)."""

    work: Path
    #: which source's run wrote each checkpoint
    sources: dict[int, str] = field(default_factory=dict)

    @property
    def ckpt(self) -> Path:
        return self.work / "ckpt"

    @property
    def step(self) -> int:
        """The newest committed checkpoint's step, where the next run resumes (0: none yet)."""
        return (_committed(self.ckpt) or [0])[-1]

    @property
    def source(self) -> str:
        return self.sources.get(self.step, "?")

    @property
    def out(self) -> Path:
        return self.work / "final.pt"


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory, baseline: dict[str, Any]) -> Any:
    r = Relay(tmp_path_factory.mktemp("relay"))
    yield r
    step, source = r.step, r.source
    if not step:
        return
    # the relaunch after the last notice: resumes its checkpoint, ends where the baseline ends
    work = r.work / "last"
    env = _env(work, DIGEST_FILE=str(work / "digests"))
    with Host(_aios_run(r.ckpt, r.out), env=env, cwd=work) as host:
        rc = host.wait(300)
    assert rc == 0, host.output
    assert f"resumed from {r.ckpt / f'ckpt-{step:09d}'} at step {step}" in host.output
    _continues_bitwise(work / "digests", baseline, step, TOTAL)
    got = _params(r.out)
    assert got.keys() == baseline["params"].keys()
    for k in got:
        assert torch.equal(got[k], baseline["params"][k]), (
            f"{k} differs after resuming {source}'s checkpoint at step {step}"
        )


# ---------------------------------------------------------------------------------------------
# the sources: each sets up its stand-in, gives the ranks their platform's environment and
# delivers the notice the way the platform does


@dataclass
class Source:
    name: str
    #: the notice's ``source`` in the run record
    source: str
    #: before the launch: the stand-ins, and the env the platform gives the ranks
    prepare: Callable[[Source, Path], dict[str, str]]
    #: after the launch: deliver the notice (at the held step, or at once for a notice known at
    #: launch); returns the deadline at which the host is killed
    deliver: Callable[[Source, Host, Callable[[], Any]], float]
    at_launch: bool = False
    #: how long before the kill the run plans to have committed (aws.capacity_block_margin)
    margin: float = 0.0
    #: where the run runs: a host of ours (:class:`Host`), or a job of a real Slurm
    kind: str = "host"
    state: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)


def _aws_spot_prepare(src: Source, work: Path) -> dict[str, str]:
    from aios_cloud.provider.data import ClusterInfo
    from aios_cloud_aws.provider import AwsProvider
    from aios_cloud_aws.settings import AwsSettings
    from aios_cloud_aws.testing.imds import ImdsServer

    imds = ImdsServer().start()
    src.closers.append(imds.stop)
    src.state["imds"] = imds
    info = ClusterInfo("c", "aws", "us-east-1a", "p5.48xlarge", spot=True)
    # what aios launch gives a spot cluster's hosts, and the hosts' IMDS
    env = AwsProvider(settings=AwsSettings()).remote_env(info)
    return {
        **env,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
        "AIOS_AWS__IMDS_POLL_SECONDS": "0.2",
    }


def _aws_spot_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    return src.state["imds"].interrupt(host, seconds=20, inspect=inspect)


BLOCK_MARGIN_S = 5.0  # aws.capacity_block_margin, scaled down from 300 s
BLOCK_LEFT_S = 60.0  # the run's deadline, from its launch


def _capacity_block_prepare(src: Source, work: Path) -> dict[str, str]:
    from aios_cloud.provider.data import ClusterInfo
    from aios_cloud_aws.ec2params import TAG_BLOCK, TAG_BLOCK_END
    from aios_cloud_aws.instances import _block_raw
    from aios_cloud_aws.provider import AwsProvider
    from aios_cloud_aws.settings import AwsSettings

    # a block ending 30 minutes (EC2's reclaim lead) + the margin + BLOCK_LEFT_S from now
    end = int(time.time() + 1800 + BLOCK_MARGIN_S + BLOCK_LEFT_S)
    tags = {TAG_BLOCK: "cr-0aios00000000000", TAG_BLOCK_END: _iso(end)}
    info = ClusterInfo("c", "aws", "us-east-1a", "p5.48xlarge", raw=_block_raw(tags))
    provider = AwsProvider(settings=AwsSettings(capacity_block_margin=BLOCK_MARGIN_S))
    env = provider.remote_env(info)
    src.state["reclaim"] = float(end - 1800)
    # the lead before a save is measured is the configured grace: it covers the time left, so
    # the ranks announce the end as soon as they start
    return {**env, "AIOS_CHECKPOINT__GRACE_SECONDS": str(BLOCK_LEFT_S + 60)}


def _capacity_block_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    # no notice on the hosts (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html):
    # EC2 terminates the instances from the block's end minus 30 minutes
    host.reclaim_at(src.state["reclaim"], inspect)
    return float(src.state["reclaim"])


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _gce_prepare(src: Source, work: Path) -> dict[str, str]:
    from aios_cloud_gcp.testing import FakeMetadataServer

    md = FakeMetadataServer()
    src.closers.append(md.close)
    src.state["md"] = md
    return {"GCE_METADATA_HOST": md.host}


def _gce_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    return float(src.state["md"].preempt([host], inspect))


TPU_WINDOW_S = 90.0  # maintenance announced this far ahead of its window


def _tpu_prepare(src: Source, work: Path) -> dict[str, str]:
    from aios_cloud_gcp.testing import FakeMetadataServer

    env = _gce_prepare(src, work)
    # a TPU VM host: a v5e chip on the PCI bus (vendor 0x1ae0, device 0x0063)
    dev = work / "pci" / "0000:00:05.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1ae0\n")
    (dev / "device").write_text("0x0063\n")
    md: FakeMetadataServer = src.state["md"]
    start = time.time() + TPU_WINDOW_S
    src.state["start"] = start
    md.announce(start, start + 3600)  # announced before the run starts
    # the CPU backend on the TPU VM (this test checks the notice, not torch_xla)
    # a notice further ahead than the emergency checkpoint needs is held until it is (the
    # monitor's lead: the grace until a save was measured); a grace just under the window
    # makes it due at once, so this run need not train on for a minute first (the holding
    # itself: core's test_notices)
    return {
        **env,
        "AIOS_TEST_SYSFS_PCI": str(work / "pci"),
        "AIOS_BACKEND": "cpu",
        "AIOS_CHECKPOINT__GRACE_SECONDS": str(TPU_WINDOW_S - 10),
    }


def _tpu_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    # the slice is interrupted at the window's start (whole seconds on the wire)
    deadline = float(int(src.state["start"]))
    host.reclaim_at(deadline, inspect)
    return deadline


def _gke_pod() -> dict[str, Any]:
    """The pod spec ``aios launch --cloud k8s --spot`` asks GKE for, with aios's grace."""
    from aios.config.schema import resolve
    from aios_cloud_k8s import manifests as M

    grace = resolve(environ={}, check_backend=False).checkpoint.grace_seconds
    req = M.JobRequest(
        name="notice",
        namespace="default",
        image="python:3.12",
        command=["python", "-m", "aios.cli.run", "train.py"],
        place=M.placement("cpu", 1),
        api="jobset",
        grace_seconds=grace,
        spot=True,
    )
    js = M.jobset(req)
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _gke_prepare(src: Source, work: Path) -> dict[str, str]:
    from aios.launcher.contract import GRACE_CAP_ENV

    pod = _gke_pod()
    src.state["pod"] = pod
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # the grace the manifest asks of the kubelet is the one the ranks plan for: GKE's 15 s
    assert pod["terminationGracePeriodSeconds"] == int(env[GRACE_CAP_ENV]) == 15, pod
    return {GRACE_CAP_ENV: str(env[GRACE_CAP_ENV])}


def _gke_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    from aios_cloud_k8s.testing import terminate_pod

    # a GKE Spot node's shutdown: the kubelet ends the pod (SIGTERM to its main process)
    labels = {"cloud.google.com/gke-spot": "true"}
    return terminate_pod(host, src.state["pod"], labels, inspect)


def _slurm_deliver(src: Source, host: Host, inspect: Callable[[], Any]) -> float:
    raise AssertionError("a Slurm job is no Host of ours")  # pragma: no cover


def _slurm_prepare(src: Source, work: Path) -> dict[str, str]:
    return {}


SOURCES = [
    Source("aws-spot", "aws-spot", _aws_spot_prepare, _aws_spot_deliver),
    Source(
        "capacity-block",
        "capacity-block",
        _capacity_block_prepare,
        _capacity_block_deliver,
        at_launch=True,
        margin=BLOCK_MARGIN_S,
    ),
    Source("gce-preemption", "gce-preemption", _gce_prepare, _gce_deliver),
    Source("tpu-maintenance", "tpu-maintenance", _tpu_prepare, _tpu_deliver, at_launch=True),
    Source("gke-spot", "sigterm", _gke_prepare, _gke_deliver),
    Source("slurm-signal", "sigterm", _slurm_prepare, _slurm_deliver, kind="slurm"),
]


@dataclass
class Outcome:
    rc: int
    text: str
    #: when the platform kills the host (Slurm: the job's time limit)
    deadline: float
    #: the range the run's own deadline (the notice's, in its record) must fall in
    planned: tuple[float, float]
    #: when the run's last process ended; whether the platform's kill found any running
    ended: float
    killed: bool
    #: the steps of the checkpoints committed when the deadline came (or the run had ended)
    at_deadline: list[int]


def _on_host(src: Source, env: dict[str, str], r: Relay, hold: int, progress: Path) -> Outcome:
    with Host(_aios_run(r.ckpt, r.out), env=env, cwd=r.work) as host:
        try:
            if not src.at_launch:
                _wait_progress(progress, lambda: bool(host.running()), hold)
            deadline = src.deliver(src, host, lambda: _committed(r.ckpt))
            rc = host.wait(300)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{host.output[-4000:]}") from None
    planned = deadline - src.margin
    assert host.ended_at is not None
    return Outcome(
        rc,
        host.output,
        deadline,
        (planned - 1.0, planned + 1.0),
        host.ended_at,
        host.killed_at is not None,
        host.at_deadline,
    )


SLURM_LEAD_S = 20  # sbatch --signal=B:TERM@20 (aios's slurm.signal_grace), under aios's 25 s grace


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from aios_cloud_slurm.testing import SlurmCluster, slurm_unavailable_reason

    reason = slurm_unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no real Slurm: {reason} (.ci/run installs slurm-wlm munge)")
        pytest.skip(f"REAL SLURM TESTS SKIPPED: {reason}")
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=1) as cluster:
        yield cluster


def _sbatch(slurm: Any, r: Relay, name: str, env: dict[str, str]) -> tuple[str, Path]:
    """Submit the script ``aios launch --cloud slurm`` renders, running aios-run on one node."""
    import subprocess

    from aios_cloud_slurm.script import SbatchJob, render

    job_dir = r.work / f"job-{name}"
    job_dir.mkdir()
    script = render(
        SbatchJob(
            name=name,
            job_dir=str(job_dir),
            code_dir=str(r.work),
            command=_aios_run(r.ckpt, r.out),
            nodes=1,
            cpus_per_task=2,
            time="00:02:00",
            signal_grace=SLURM_LEAD_S,
        )
    )
    (job_dir / "run.sbatch").write_text(script)
    r = subprocess.run(
        ["sbatch", "--parsable", str(job_dir / "run.sbatch")],
        env=slurm.env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    return job, job_dir


def _slurm_job(slurm: Any, job: str) -> dict[str, str]:
    import subprocess

    r = subprocess.run(
        ["scontrol", "-o", "show", "job", job],
        env=slurm.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)


def _slurm_wait(job_dir: Path, timeout: float = 300) -> tuple[int, str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        exits = list(job_dir.glob("exit.*"))
        if exits:
            out = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
            return int(exits[0].read_text().strip()), out
        time.sleep(0.1)
    out = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
    raise AssertionError(f"the Slurm job did not end:\n{out[-4000:]}")


def _on_slurm(slurm: Any, env: dict[str, str], r: Relay, hold: int, progress: Path) -> Outcome:
    """A job of the sbatch script aios renders (``--time``, ``--signal=B:TERM@lead``) on a real
    Slurm. Slurm sends that SIGTERM to the batch shell ``lead`` seconds before the time limit
    (https://slurm.schedmd.com/sbatch.html#OPT_signal), the shell forwards it to the tasks, and
    Slurm ends the job at the limit. The test sends the same signal the same way (``scancel
    --signal=TERM --batch``, as slurmctld does) once the run holds, rather than waiting for
    Slurm's timer, which fires only at slurmctld's periodic check (30 s apart): the run's
    deadline (the signal's lead) then comes before the job's end, which stays Slurm's own
    kill."""
    import subprocess
    from datetime import datetime

    job, job_dir = _sbatch(slurm, r, progress.parent.name, env)
    _wait_progress(progress, lambda: not list(job_dir.glob("exit.*")), hold)
    info = _slurm_job(slurm, job)
    limit = datetime.fromisoformat(info["EndTime"]).timestamp()  # the job's end, local time
    sent = time.time()
    subprocess.run(
        ["scancel", "--signal=TERM", "--batch", job], env=slurm.env(), check=True, timeout=30
    )
    rc, text = _slurm_wait(job_dir)
    ended = time.time()
    assert "SIGTERM: forwarding it to the tasks" in text, text
    lead = (sent + SLURM_LEAD_S - 1.0, min(sent + SLURM_LEAD_S + 5.0, limit))
    return Outcome(rc, text, limit, lead, ended, ended >= limit, _committed(r.ckpt))


@pytest.mark.parametrize("src", SOURCES, ids=lambda s: s.name)
def test_a_notice_stops_the_run_with_a_checkpoint_before_the_host_dies_and_it_resumes_bitwise(
    src: Source,
    baseline: dict[str, Any],
    relay: Relay,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    start = relay.step
    hold = start + 1  # the run holds one step after it resumed, until its notice arrives
    progress, digests = tmp_path / "progress", tmp_path / "digests"
    extra = dict(
        HOLD_AT=str(hold),
        PROGRESS_FILE=str(progress),
        DIGEST_FILE=str(digests),
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
    )
    try:
        env = _env(relay.work, **src.prepare(src, tmp_path))
        env.update(extra)
        if src.kind == "slurm":
            o = _on_slurm(request.getfixturevalue("slurm"), env, relay, hold, progress)
        else:
            o = _on_host(src, env, relay, hold, progress)
    finally:
        for close in src.closers:
            close()
        relay.sources.update({s: src.name for s in _committed(relay.ckpt) if s > start})
    # it stopped for the notice with its emergency checkpoint, before the platform's kill
    assert not o.killed, f"the platform killed the run at its deadline\n{o.text}"
    assert o.rc == 75, o.text
    assert o.ended < o.deadline
    # it resumed the previous source's checkpoint and went on as the uninterrupted run did
    if start:
        assert f"resumed from {relay.ckpt / f'ckpt-{start:09d}'} at step {start}" in o.text
    stopped = start + 1 if src.at_launch else hold + 1
    _continues_bitwise(digests, baseline, start, stopped)
    committed = _committed(relay.ckpt)
    assert committed and committed[-1] == stopped, (committed, o.text)
    assert stopped in o.at_deadline, o.at_deadline
    assert not relay.out.exists()
    ev = _preemption(tmp_path / "runs")
    assert ev["source"] == src.source, ev
    assert ev["checkpoint"] == str(relay.ckpt / f"ckpt-{stopped:09d}"), ev
    # the deadline the run planned for is the platform's (to the second; a Capacity Block's
    # margin before its reclaim; the signal's lead on Slurm)
    assert o.planned[0] <= ev["deadline"] <= o.planned[1], (ev, o.planned)
