"""End to end: the real aios CLI and google-cloud-tpu client against the local Cloud TPU service,
whose v4-16 nodes are two real sshd hosts in their own network namespaces; the example
(examples/gpt.py) runs on both hosts on CPU (gloo), with c10d rendezvous between the hosts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aios_cloud.store import JOB_FINAL, JOB_RUNNING, Store

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TINY = [
    "--data",
    "corpus.txt",
    "--n-layer",
    "1",
    "--n-embd",
    "32",
    "--n-head",
    "2",
    "--batch-size",
    "8",
    "--block-size",
    "32",
    "--warmup",
    "5",
    "--eval-batches",
    "2",
]
VAL_RE = re.compile(r"val loss (\d+\.\d+)")


def make_project(tmp_path: Path) -> Path:
    if not (EXAMPLES / "gpt.py").is_file():
        pytest.skip("examples/gpt.py is not in this checkout")
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(EXAMPLES / "gpt.py", work / "gpt.py")
    shutil.copy(EXAMPLES / "data" / "corpus.txt", work / "corpus.txt")
    (work / ".gitignore").write_text("*.log\nscratch/\n")
    (work / "notes.log").write_text("ignored by .gitignore")
    (work / "scratch").mkdir()
    (work / "scratch" / "x.txt").write_text("ignored by .gitignore")
    (work / "data").mkdir()
    (work / "data" / "shard.bin").write_bytes(b"0" * 4096)  # data never syncs
    (work / "setup.sh").write_text("echo setup-ran-on-$(hostname) >> $HOME/setup.log\n")
    return work


def launch_args(work: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        name,
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--setup-script",
        str(work / "setup.sh"),
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        *extra,
        "gpt.py",
        "--",
        *TINY,
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
    ]


def status(aios_cli, env) -> list[dict]:
    r = aios_cli(env, "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def job_state(env, job_id: int = 1) -> str | None:
    """The job's state as the watcher records it: a look without a CLI process (a wait loop's)."""
    store = Store(Path(env["AIOS_HOME"]) / "state.db")
    try:
        job = store.get_job(job_id)
        return job.state if job else None
    finally:
        store.close()


def test_gcp_launch_on_two_host_slice_stop_refused_then_down(
    tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli
):
    work = make_project(tmp_path)
    env = gcp_env(tmp_path, fake_tpu)
    # the slice's hosts share this machine's cores (nproc counts all of them on each): one
    # thread per rank; two spinning OpenMP threads per rank on a loaded machine slow each step
    r = aios_cli(env, *launch_args(work, "slice", 10, "--env", "OMP_NUM_THREADS=1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    h0, h1 = sshd_hosts.hosts
    # every line is prefixed with its worker; both hosts ran (rank 0 prints the summary)
    assert f"(worker 0, {h0.ip}) " in r.stdout and f"(worker 1, {h1.ip}) " in r.stdout
    assert re.search(rf"\(worker 0, {re.escape(h0.ip)}\) .*gpt: done 10 steps", r.stdout)
    assert "2 x cpu" in r.stdout  # world size 2: one process per host, over the hosts' own network
    # code sync honoured .gitignore and never shipped data/
    for h in (h0, h1):
        code = h.home / "aios" / "slice" / "code"
        assert sorted(p.name for p in code.iterdir() if p.name not in ("checkpoints", "runs")) == [
            ".aios-site",
            ".gitignore",
            "corpus.txt",
            "gpt.py",
            "setup.sh",
        ]
        # aios itself travels with the code: core and the plugins the job needs, with entry points
        site = sorted(p.name for p in (code / ".aios-site").iterdir())
        assert "aios" in site and "aios_cloud_gcp" in site and "aios_cloud_aws" not in site
        assert "aios_backend_xla" not in site  # this job runs the cpu backend
        assert (
            code / ".aios-site" / "aios_core-0.1.0.dist-info" / "entry_points.txt"
        ).read_text().count("aios-core = aios.plugins.builtin") == 1
        assert (h.home / "setup.log").read_text().count("setup-ran-on-") == 1
    # the node was created through the API with aios's labels and key, on the v4 runtime
    node = fake_tpu.node("slice").body
    assert (
        node["runtimeVersion"] == "tpu-ubuntu2204-base"
        and node["labels"]["aios-cluster"] == "slice"
    )
    assert node["metadata"]["ssh-keys"].startswith("root:ssh-ed25519 ")
    st = status(aios_cli, env)
    assert st[0]["jobs"][0]["state"] == "SUCCEEDED" and st[0]["jobs"][0]["exit_codes"] == [0, 0]

    # exec on every host in parallel, prefixed
    r = aios_cli(env, "exec", "slice", "hostname -I")
    assert r.returncode == 0, r.stderr
    assert f"(worker 0, {h0.ip}) {h0.ip}" in r.stdout and f"(worker 1, {h1.ip}) {h1.ip}" in r.stdout
    r = aios_cli(env, "exec", "slice", "-w", "1", "exit 3")
    assert r.returncode == 3

    # a multi-host slice cannot be stopped, only deleted (the TPU API stops single-host nodes
    # only): one line, exit 2, the slice untouched (stop/start of a single-host node, with the
    # re-pinned host keys, is in test_gcp_agent.py)
    r = aios_cli(env, "stop", "slice")
    assert r.returncode == 2 and "multi-host slice" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "aios down slice" in r.stderr
    assert fake_tpu.node("slice").body["state"] == "READY" and h0.running
    assert fake_tpu.count("POST", ":stop") == 0
    # sync local -> every host, host 0 -> local
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    assert aios_cli(env, "sync", str(tmp_path / "cfg.yaml"), "slice:conf/").returncode == 0
    assert (h1.home / "aios" / "slice" / "code" / "conf" / "cfg.yaml").read_text() == "a: 1\n"
    r = aios_cli(env, "sync", "slice:conf", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back" / "conf" / "cfg.yaml").read_text() == "a: 1\n"

    # launching again on the existing cluster reuses it; setup already succeeded there, so it
    # is not re-run
    (work / "again.py").write_text("print('again', flush=True)\n")
    r = aios_cli(
        env,
        "launch",
        "--name",
        "slice",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--setup-script",
        str(work / "setup.sh"),
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        "again.py",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "reusing cluster slice" in r.stderr and r.stdout.count("[aios] setup already done") == 2
    assert (h0.home / "setup.log").read_text().count("setup-ran-on-") == 1
    assert (
        fake_tpu.count("POST", "/nodes") - fake_tpu.count("POST", ":st") == 1
    )  # one create in all

    r = aios_cli(env, "down", "slice")
    assert r.returncode == 0, r.stderr
    assert fake_tpu.nodes == {} and status(aios_cli, env) == []


def test_gcp_unmanaged_spot_preemption_fails_the_job_with_a_hint(
    tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli, wait_for
):
    work = make_project(tmp_path)
    (work / "sleepy.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(300)\n")
    env = gcp_env(tmp_path, fake_tpu)
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "bare",
        "--spot",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        "--detach",
        "sleepy.py",
    )
    assert r.returncode == 0, r.stderr
    log = sshd_hosts.hosts[1].home / "aios" / "bare" / "jobs" / "1" / "worker.log"
    wait_for(
        lambda: log.exists() and "working" in log.read_text(), 60, "the job's output while it runs"
    )
    follow = subprocess.Popen(
        [sys.executable, "-m", "aios.cli.main", "logs", "bare", "-f"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout), daemon=True)
    reader.start()
    h0, h1 = sshd_hosts.hosts
    wait_for(
        lambda: all(
            any(
                ln.startswith(f"(worker {h.worker_id}, {h.ip}) ") and "working" in ln for ln in seen
            )
            for h in (h0, h1)
        ),
        60,
        "`aios logs -f` to show both workers",
    )
    assert status(aios_cli, env)[0]["jobs"][0]["state"] == "RUNNING"
    fake_tpu.preempt("bare")
    wait_for(lambda: job_state(env) not in (None, JOB_RUNNING), 120, "the job to end")
    job = status(aios_cli, env)[0]["jobs"][0]
    assert job["state"] == "FAILED" and job["restarts"] == 0
    assert follow.wait(timeout=60) == 0  # `aios logs -f` returns when the job ends
    st = status(aios_cli, env)[0]
    assert [e["kind"] for e in st["recoveries"]] == ["preempted"]
    assert "preempted" in aios_cli(env, "status").stdout
    watcher = (Path(env["AIOS_HOME"]) / "clusters" / "bare" / "watcher-1.log").read_text()
    assert "relaunch with --spot --max-restarts N" in watcher
    assert fake_tpu.count("POST", "/nodes") - fake_tpu.count("POST", ":st") == 1  # not recreated
    assert aios_cli(env, "down", "bare").returncode == 0 and fake_tpu.nodes == {}


def _final_val_loss(text: str) -> float:
    found = VAL_RE.findall(text)
    assert found, text[-3000:]
    return float(found[-1])


def test_gcp_managed_spot_recovers_from_preemption_with_the_same_loss(
    tmp_path, sshd_hosts, fake_tpu, gcs, gcs_fs, gcp_env, aios_cli, wait_for
):
    steps = 200  # long enough that the preemption lands mid-run on an idle machine
    work = make_project(tmp_path)
    # the uninterrupted reference: the same script, 2 processes, locally
    ref_env = {k: v for k, v in gcp_env(tmp_path, fake_tpu).items()}
    ref = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "cpu",
            "--nprocs",
            "2",
            f"checkpoint.dir={tmp_path / 'ref-ckpt'}",
            "gpt.py",
            *TINY,
            "--steps",
            str(steps),
            "--eval-every",
            str(steps),
        ],
        cwd=work,
        env=ref_env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    reference = _final_val_loss(ref.stdout + ref.stderr)

    gcs_fs.mkdir("aios-ckpt")
    env = gcp_env(tmp_path, fake_tpu)
    r = aios_cli(
        env,
        *launch_args(
            work,
            "spot",
            steps,
            "--spot",
            "--max-restarts",
            "2",
            "--checkpoint-dir",
            "gs://aios-ckpt/gpt",
            "--env",
            f"STORAGE_EMULATOR_HOST={gcs}",
            "--env",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false",
            "--env",
            "AIOS_CHECKPOINT__EVERY=5",
            # the reference ran 2 processes on one 2-core machine (1 thread
            # each); the same thread count keeps the float sums identical
            "--env",
            "OMP_NUM_THREADS=1",
            # never fires here (30 min); the recreated head host must get the agent again
            "--autostop",
            "30",
            "--autodown",
            "--detach",
        ),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert fake_tpu.node("spot").body["schedulingConfig"]["spot"] is True

    def committed_steps() -> list[int]:
        gcs_fs.invalidate_cache()
        try:
            markers = gcs_fs.glob("aios-ckpt/gpt/ckpt-*/aios-checkpoint.json")
        except FileNotFoundError:
            return []
        return sorted(int(re.search(r"ckpt-(\d+)", m).group(1)) for m in markers)

    wait_for(lambda: [s for s in committed_steps() if s >= 10], 240, "a checkpoint at step >= 10")
    at_preemption = max(committed_steps())
    assert at_preemption < steps
    fake_tpu.preempt("spot")

    wait_for(lambda: job_state(env) in JOB_FINAL, 420, "the managed job to finish")
    st = status(aios_cli, env)[0]
    job = st["jobs"][-1]
    watcher_log = Path(env["AIOS_HOME"]) / "clusters" / "spot" / "watcher-1.log"
    assert job["state"] == "SUCCEEDED", (
        watcher_log.read_text()[-4000:] if watcher_log.exists() else st
    )
    assert job["restarts"] == 1
    kinds = [e["kind"] for e in st["recoveries"]]
    assert "preempted" in kinds and "recovered" in kinds
    assert any("recovery 1/2" in e["message"] for e in st["recoveries"])
    r = aios_cli(env, "status")
    assert "recovered: recovery 1/2: recreated" in r.stdout
    # the autostop agent was installed again on the recreated cluster's head host
    head_ip = st["hosts"][0].split(":", 1)[1]
    head = next(h for h in sshd_hosts.hosts if h.ip == head_ip)
    agent = json.loads((head.home / "aios" / "spot" / "agent.json").read_text())
    assert agent["action"] == "down" and agent["idle_seconds"] == 1800
    assert "# aios-agent spot" in head.cron_table()
    # the recovered run resumed from the bucket (not from step 0) and ended where the
    # uninterrupted run did
    logs = aios_cli(env, "logs", "spot")
    assert logs.returncode == 0
    m = re.search(r"gpt: done (\d+) steps \((\d+) this run\)", logs.stdout)
    assert m and int(m.group(1)) == steps and int(m.group(2)) < steps - 5, logs.stdout[-2000:]
    assert _final_val_loss(logs.stdout) == pytest.approx(reference, abs=1e-4)
    assert aios_cli(env, "down", "spot").returncode == 0
    assert fake_tpu.nodes == {}


@pytest.mark.parametrize(
    "sticky,acc",
    [(False, "v4-8"), (True, "v4-8"), (False, "v4-16")],
    ids=["stop-start-heals", "recreate", "multi-host-recreated"],
)
def test_gcp_unhealthy_node_is_repaired(
    tmp_path, sshd_hosts, fake_tpu, gcs, gcs_fs, gcp_env, aios_cli, wait_for, sticky, acc
):
    work = make_project(tmp_path)
    (work / "sleepy.py").write_text(
        "import time\nprint('working', flush=True)\ntime.sleep(6)\nprint('finished', flush=True)\n"
    )
    env = gcp_env(tmp_path, fake_tpu)
    base = [
        "launch",
        "--cloud",
        "gcp",
        "-a",
        acc,
        "--name",
        "sick",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        "--max-restarts",
        "1",
        "--detach",
    ]
    # the checkpoint bucket must exist: one line, exit 2, nothing created
    r = aios_cli(env, *base, "--checkpoint-dir", "gs://no-such-bucket/x", "sleepy.py")
    assert r.returncode == 2 and "bucket gs://no-such-bucket not found" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and fake_tpu.nodes == {}
    gcs_fs.mkdir("sick-ckpt")
    r = aios_cli(env, *base, "--checkpoint-dir", "gs://sick-ckpt/x", "sleepy.py")
    assert r.returncode == 0, r.stderr
    log = sshd_hosts.hosts[0].home / "aios" / "sick" / "jobs" / "1" / "worker.log"
    wait_for(lambda: log.exists() and "working" in log.read_text(), 60, "the job to start")
    fake_tpu.set_health("sick", "UNHEALTHY_TENSORFLOW", sticky=sticky)

    wait_for(lambda: job_state(env) in JOB_FINAL, 180, "the job to finish")
    st = status(aios_cli, env)[0]
    job = st["jobs"][-1]
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 1, st
    recovered = [e["message"] for e in st["recoveries"] if e["kind"] == "recovered"]
    assert any("UNHEALTHY_TENSORFLOW" in m for m in recovered), st["recoveries"]
    creates = fake_tpu.count("POST", "/nodes") - fake_tpu.count("POST", ":st")
    if acc == "v4-16":  # a multi-host slice cannot be stopped: recreated at once
        assert fake_tpu.count("POST", ":stop") == 0
        assert creates == 2 and any("recreated" in m for m in recovered)
        assert aios_cli(env, "down", "sick").returncode == 0 and fake_tpu.nodes == {}
        return
    assert fake_tpu.count("POST", ":stop") == 1 and fake_tpu.count("POST", ":start") == 1
    if sticky:  # stop/start did not heal it: deleted and recreated
        assert creates == 2 and any("recreated" in m for m in recovered)
    else:
        assert creates == 1 and any("stop/start" in m for m in recovered)
    assert aios_cli(env, "down", "sick").returncode == 0 and fake_tpu.nodes == {}


def test_gcp_sync_between_a_bucket_and_the_slice_runs_on_the_hosts(
    tmp_path, sshd_hosts, fake_tpu, gcs, gcs_fs, gcp_env, aios_cli
):
    work = tmp_path / "proj"
    work.mkdir()
    (work / "hello.py").write_text("print('hello', flush=True)\n")
    env = gcp_env(tmp_path, fake_tpu)
    # a first job ships aios and the code to the hosts
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "bk",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        "hello.py",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    gcs_fs.mkdir("aios-data")
    gcs_fs.pipe({"aios-data/set/a.txt": b"alpha", "aios-data/set/sub/b.txt": b"beta" * 1000})
    emu = [
        "--env",
        f"STORAGE_EMULATOR_HOST={gcs}",
        "--env",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false",
    ]
    # dry run: the per-worker command, nothing copied, no env value on the command line
    r = aios_cli(env, "sync", "gs://aios-data/set", "bk:data", *emu, "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("(worker ")]
    assert len(lines) == 2 and all(
        "-m aios_cloud.transfer gs://aios-data/set data" in ln for ln in lines
    )
    assert gcs not in r.stdout
    assert not (sshd_hosts.hosts[0].home / "aios" / "bk" / "code" / "data").exists()
    # bucket -> every host (copied by the hosts themselves)
    r = aios_cli(env, "sync", "gs://aios-data/set", "bk:data", *emu)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for h in sshd_hosts.hosts:
        d = h.home / "aios" / "bk" / "code" / "data"
        assert (d / "a.txt").read_bytes() == b"alpha" and (
            d / "sub" / "b.txt"
        ).read_bytes() == b"beta" * 1000
    # one host -> bucket
    r = aios_cli(
        env, "exec", "bk", "-w", "1", "mkdir -p out && echo from-worker-1 > out/result.txt"
    )
    assert r.returncode == 0, r.stderr
    r = aios_cli(env, "sync", "bk:out", "gs://aios-data/results", "-w", "1", *emu)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    gcs_fs.invalidate_cache()
    assert gcs_fs.cat("aios-data/results/result.txt") == b"from-worker-1\n"
    # a missing object: one line, exit 2
    r = aios_cli(env, "sync", "gs://aios-data/nothing-here", "bk:x", *emu)
    assert (
        r.returncode == 2
        and "nothing-here does not exist" in r.stderr
        and r.stderr.count("\n") == 1
    ), r.stderr
    assert aios_cli(env, "down", "bk").returncode == 0
