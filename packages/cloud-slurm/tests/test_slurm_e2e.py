"""End to end on a REAL Slurm (controller + two slurmd nodes on this machine): the example
(examples/gpt.py) on 2 nodes over gloo through ``srun aios-run`` and ``aios launch --cloud
slurm``, bad input, and a preempted run that requeues, resumes and ends at the uninterrupted
run's loss."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
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


def _val_loss(text: str) -> float:
    found = VAL_RE.findall(text)
    assert found, text[-3000:]
    return float(found[-1])


def _reference(project: Path, env: dict[str, str], steps: int, ckpt: Path) -> float:
    """The same script, 2 processes on one machine, uninterrupted."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "cpu",
            "--nprocs",
            "2",
            f"checkpoint.dir={ckpt}",
            "gpt.py",
            *TINY,
            "--steps",
            str(steps),
            "--eval-every",
            str(steps),
        ],
        cwd=project,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return _val_loss(r.stdout + r.stderr)


def test_srun_aios_run_on_two_nodes_one_task_each(slurm, project, aios_env, wait_for):
    env = aios_env()
    r = subprocess.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--time=10",
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "cpu",
            "gpt.py",
            *TINY,
            "--steps",
            "8",
            "--eval-every",
            "8",
        ],
        cwd=project,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    # one process per node, world size 2 over gloo: the Slurm step gave node rank, nodes, master
    assert re.search(r"gpt: .* 2 x cpu \(cpu", out), out[-3000:]
    assert "gpt: done 8 steps" in out
    # srun has returned; Slurm lists the job as COMPLETING until its epilog has run
    wait_for(lambda: slurm.squeue().strip() == "", 120, "the job to leave the queue")


def test_srun_with_two_tasks_per_node_runs_each_rank_directly(slurm, project, aios_env, run_aios):
    env = aios_env()
    r = subprocess.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--time=10",
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "cpu",
            "gpt.py",
            *TINY,
            "--steps",
            "4",
            "--eval-every",
            "4",
        ],
        cwd=project,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"gpt: .* 4 x cpu \(cpu", out), out[-3000:]  # 4 Slurm tasks = 4 ranks
    assert out.count("gpt: done 4 steps") == 1  # printed by rank 0 only


def test_aios_run_in_the_batch_script_of_a_two_node_allocation_says_use_srun(
    slurm, project, aios_env, run_aios, tmp_path
):
    env = aios_env()
    script = tmp_path / "batch.sh"
    script.write_text(
        f"#!/bin/bash\ncd {project}\n{sys.executable} -m aios.cli.run --backend cpu gpt.py --steps 1\necho rc=$?\n"
    )
    r = subprocess.run(
        ["sbatch", "--wait", "--nodes=2", f"--output={tmp_path / 'b.out'}", str(script)],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    out = (tmp_path / "b.out").read_text()
    assert "rc=2" in out and "start it on every node: srun" in out, out
    assert r.returncode == 0


def test_launch_cloud_slurm_two_nodes_then_status_logs_down(slurm, project, aios_env, run_aios):
    env = aios_env()
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "slurm",
        "-a",
        "debug",
        "--nodes",
        "2",
        "--name",
        "gpt2n",
        "--workdir",
        str(project),
        "--poll",
        "0.5",
        "gpt.py",
        "--",
        *TINY,
        "--steps",
        "8",
        "--eval-every",
        "8",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"gpt: .* 2 x cpu \(cpu", out) and "gpt: done 8 steps" in out, out[-3000:]
    assert re.search(r"submitted Slurm job \d+ \(gpt2n, partition debug, 2 node\(s\)\)", r.stderr)
    code = Path(env["AIOS_SLURM__REMOTE_DIR"]) / "gpt2n" / "code"
    assert (code / "gpt.py").is_file() and not (code / "data").exists()  # untracked data stays home
    st = json.loads(run_aios(env, "status", "--json").stdout)
    assert st[0]["name"] == "gpt2n" and st[0]["cloud"] == "slurm"
    assert st[0]["jobs"][-1]["state"] == "SUCCEEDED" and st[0]["jobs"][-1]["exit_codes"] == [0]
    logs = run_aios(env, "logs", "gpt2n")
    assert logs.returncode == 0 and "gpt: done 8 steps" in logs.stdout
    refreshed = run_aios(env, "status", "--refresh", "--json")
    assert json.loads(refreshed.stdout)[0]["state"] == "COMPLETED", (
        refreshed.stdout + refreshed.stderr
    )
    assert run_aios(env, "down", "gpt2n").returncode == 0
    assert json.loads(run_aios(env, "status", "--json").stdout) == []
    assert (code / "gpt.py").is_file()  # down never deletes the user's files on the cluster


def test_dry_run_prints_the_sbatch_script_without_secrets(slurm, project, aios_env, run_aios):
    env = aios_env(
        HF_TOKEN="s3cr3t-value",
        AIOS_SLURM__ACCOUNT="proj1",
        AIOS_SLURM__TIME="01:00:00",
        AIOS_SLURM__CPUS_PER_TASK="2",
    )
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "slurm",
        "-a",
        "debug",
        "--nodes",
        "2",
        "--name",
        "dry",
        "--workdir",
        str(project),
        "--max-restarts",
        "2",
        "--env",
        "HF_TOKEN",
        "--env",
        "LOG_LEVEL=debug",
        "--dry-run",
        "gpt.py",
        "--",
        "--steps",
        "3",
    )
    assert r.returncode == 0, r.stderr
    s = r.stdout
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=debug",
        "#SBATCH --account=proj1",
        "#SBATCH --time=01:00:00",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@120",
        "export LOG_LEVEL=debug",
        "scontrol requeue",
    ):
        assert line in s, (line, s)
    assert "s3cr3t-value" not in s and "HF_TOKEN <forwarded from your environment>" in s
    # the untracked data folder stays home, and the plan says so in one line
    assert (
        "# code sync left out 1 file in folders named data (data/shard.bin): datasets stay home "
        "unless git tracks them"
    ) in s, s
    assert re.search(
        r'srun --kill-on-bad-exit=0 --wait=120 --nodes=2 --ntasks-per-node=1 --cpus-per-task="\$cpus" \S+ -m '
        r"aios.cli.run --backend cpu gpt.py --steps 3",
        s,
    )
    assert slurm.squeue().strip() == "" and not Path(env["AIOS_HOME"], "state.db").exists()


def test_catalog_cost_and_cancel(slurm, project, aios_env, run_aios, wait_for):
    env = aios_env()
    r = run_aios(env, "catalog", "--cloud", "slurm", "--json")
    assert r.returncode == 0, r.stderr
    part, gpu = sorted(json.loads(r.stdout), key=lambda e: e["accelerator"])
    assert (
        part["accelerator"] == "debug"
        and part["hosts"] == 2
        and part["devices"] == 4
        and part["extra"]["default"] is True
        and part["backend"] == "cpu"
    )
    # the gpu partition: two nodes, gres gpu:2 each
    assert (gpu["accelerator"], gpu["hosts"], gpu["devices"], gpu["backend"]) == (
        "gpu",
        2,
        4,
        "cuda",
    ), gpu
    r = run_aios(env, "cost", "--cloud", "slurm", "-a", "debug", "--hours", "2")
    assert (
        r.returncode == 0 and "on-demand n/a (your cluster), spot n/a (your cluster)" in r.stdout
    ), r.stdout + r.stderr
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "slurm",
        "-a",
        "debug",
        "--nodes",
        "1",
        "--name",
        "long",
        "--workdir",
        str(project),
        "--detach",
        "gpt.py",
        "--",
        *TINY,
        "--steps",
        "100000",
    )
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "RUNNING" in slurm.squeue(), 120, "the job to run")
    r = run_aios(env, "cancel", "long")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: slurm.squeue().strip() == "", 120, "the job to leave the queue")
    st = json.loads(run_aios(env, "status", "--json").stdout)
    assert st[0]["jobs"][-1]["state"] == "CANCELLED"
    assert run_aios(env, "down", "long").returncode == 0


def test_launch_through_a_login_node_over_ssh(slurm, project, aios_env, run_aios, tmp_path):
    from aios_cloud.testing.sshd import SshdCluster, sshd_unavailable_reason

    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SshdCluster(
        1, tmp_path / "sshd", netns=False
    ) as login:  # on loopback: it reaches this slurmctld
        h = login.hosts[0]
        env = aios_env(
            AIOS_SLURM__LOGIN=f"{login.user}@{h.ip}",
            AIOS_SLURM__SSH_PORT=str(h.port),
            AIOS_SLURM__SSH_KEY=str(login.client_key),
            AIOS_SLURM__SSH_OPTIONS='["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]',
            AIOS_SLURM__LOGIN_ENV=json.dumps({"SLURM_CONF": str(slurm.conf)}),
        )
        r = run_aios(
            env,
            "launch",
            "--cloud",
            "slurm",
            "-a",
            "debug",
            "--nodes",
            "2",
            "--name",
            "viassh",
            "--workdir",
            str(project),
            "--poll",
            "0.5",
            "gpt.py",
            "--",
            *TINY,
            "--steps",
            "4",
            "--eval-every",
            "4",
        )
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert f"on {login.user}@{h.ip}" in r.stderr and "gpt: done 4 steps" in out
        assert run_aios(env, "down", "viassh").returncode == 0
        bad = aios_env(
            AIOS_SLURM__LOGIN=f"{login.user}@{h.ip}",
            AIOS_SLURM__SSH_PORT="1",
            AIOS_SLURM__SSH_KEY=str(login.client_key),
        )
        line = _no_trace(
            run_aios(
                bad,
                "launch",
                "--cloud",
                "slurm",
                "-a",
                "debug",
                "--workdir",
                str(project),
                "gpt.py",
            )
        )
        assert "cannot reach the Slurm login node" in line


def _no_trace(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert (
        len(errors) == 1 and errors[0].startswith("aios: error: ") and "Traceback" not in r.stderr
    ), r.stderr
    assert r.stderr.rstrip().endswith(
        errors[0]
    )  # the error is the last word, progress lines before it
    return errors[0]


def test_bad_input_is_one_line_exit_2_and_nothing_queued(
    slurm, project, aios_env, run_aios, tmp_path
):
    env = aios_env()
    base = ["launch", "--cloud", "slurm", "--workdir", str(project), "--name", "bad"]
    line = _no_trace(run_aios(env, *base, "-a", "nosuch", "gpt.py"))
    assert "unknown Slurm partition 'nosuch'" in line and "debug" in line
    line = _no_trace(
        run_aios(env, *base, "-a", "debug", "--nodes", "5", "gpt.py")
    )  # the cluster has 2 nodes
    assert "--nodes 5 is more than partition debug has (2)" in line
    line = _no_trace(
        run_aios(aios_env(AIOS_SLURM__TIME="nonsense"), *base, "-a", "debug", "gpt.py")
    )
    assert "sbatch rejected the job" in line and "time" in line.lower()
    # accepted by sbatch but never runnable (more CPUs per task than a node has): cancelled, reported
    line = _no_trace(
        run_aios(aios_env(AIOS_SLURM__CPUS_PER_TASK="64"), *base, "-a", "debug", "gpt.py")
    )
    assert "sbatch rejected the job" in line or "will never start" in line, line
    line = _no_trace(run_aios(env, *base, "-a", "debug", "--spot", "gpt.py"))
    assert "--spot is not supported by --cloud slurm (spot capacity); drop --spot" in line
    nobin = tmp_path / "bin"
    nobin.mkdir()
    (nobin / "bash").symlink_to("/bin/bash")
    line = _no_trace(run_aios({**env, "PATH": str(nobin)}, *base, "-a", "debug", "gpt.py"))
    assert "no Slurm on PATH" in line
    assert slurm.squeue().strip() == ""
    assert json.loads(run_aios(env, "status", "--json").stdout) == []


def test_preempted_job_requeues_resumes_and_ends_at_the_uninterrupted_loss(
    slurm, project, aios_env, run_aios, wait_for, tmp_path
):
    steps = 120
    env = aios_env()
    reference = _reference(project, env, steps, tmp_path / "ref-ckpt")
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "slurm",
        "-a",
        "debug",
        "--nodes",
        "2",
        "--name",
        "pre",
        "--workdir",
        str(project),
        "--max-restarts",
        "2",
        "--env",
        "AIOS_CHECKPOINT__EVERY=5",
        "--env",
        "OMP_NUM_THREADS=1",
        "--detach",
        "gpt.py",
        "--",
        *TINY,
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", r.stderr).group(1)
    ckpt = Path(env["AIOS_SLURM__REMOTE_DIR"]) / "pre" / "checkpoints"

    def committed() -> list[int]:
        return sorted(
            int(re.search(r"ckpt-(\d+)", str(m)).group(1))
            for m in ckpt.glob("ckpt-*/aios-checkpoint.json")
        )

    wait_for(lambda: [s for s in committed() if s >= 10], 400, "a checkpoint at step >= 10")
    assert max(committed()) < steps
    # what `#SBATCH --signal=B:TERM@grace` delivers before the time limit: SIGTERM to the batch shell
    subprocess.run(["scancel", "--signal=TERM", "--batch", job_id], env=env, check=True, timeout=30)
    logs = run_aios(env, "logs", "pre", "-f", timeout=900)
    assert logs.returncode == 0, logs.stderr
    text = logs.stdout
    assert "preempted after an emergency checkpoint: requeueing (restart 1/2)" in text, text[-4000:]
    m = re.search(r"gpt: done (\d+) steps \((\d+) this run\)", text)
    assert m and int(m.group(1)) == steps and int(m.group(2)) < steps - 5, text[-3000:]
    assert _val_loss(text) == pytest.approx(reference, abs=1e-4)
    st = json.loads(run_aios(env, "status", "--json").stdout)[0]
    assert st["jobs"][-1]["state"] == "SUCCEEDED" and st["jobs"][-1]["restarts"] == 1, st
    assert [e["kind"] for e in st["recoveries"]] == ["preempted", "recovered"]
    assert run_aios(env, "down", "pre").returncode == 0


def test_the_ranks_get_the_jobs_end_and_the_signal_lead_as_their_deadline(
    slurm, tmp_path, wait_for
):
    """The job's end (its --time) is every rank's known deadline, and --signal's lead is the
    grace after SIGTERM (https://slurm.schedmd.com/sbatch.html#OPT_signal): a real sbatch of the
    script aios renders, each task printing what it was given."""
    import time as _time

    from aios_cloud_slurm.script import SbatchJob, render

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    probe = (
        'echo "deadline=$AIOS_RUN_DEADLINE src=$AIOS_RUN_DEADLINE_SOURCE cap=$AIOS_RUN_GRACE_CAP"'
    )
    script = render(
        SbatchJob(
            name="dl",
            job_dir=str(job_dir),
            code_dir=str(tmp_path),
            command=["sh", "-c", probe],
            nodes=1,
            time="00:10:00",
            signal_grace=90,
        )
    )
    (job_dir / "run.sbatch").write_text(script)
    before = _time.time()
    r = subprocess.run(
        ["sbatch", "--parsable", str(job_dir / "run.sbatch")],
        env=slurm.env(),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = job_dir / f"slurm-{r.stdout.strip().split(';')[0]}.out"
    wait_for(lambda: out.exists() and "deadline=" in out.read_text(), 120, "the job's output")
    line = next(ln for ln in out.read_text().splitlines() if ln.startswith("deadline="))
    fields = dict(kv.split("=", 1) for kv in line.split())
    assert fields["src"] == "slurm-time-limit" and fields["cap"] == "90"
    # the deadline is the job's start plus its 10-minute limit
    assert before + 600 - 5 <= float(fields["deadline"]) <= _time.time() + 600 + 5
    wait_for(lambda: slurm.squeue().strip() == "", 120, "the job to leave the queue")
