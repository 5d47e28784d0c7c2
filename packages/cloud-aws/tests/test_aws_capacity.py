"""Runs that follow capacity on AWS (issue 26): ``-a TYPE1,TYPE2,...`` candidates across
accelerator families, checked once; the dry run prices each; a launch (and a managed recovery)
that finds no capacity for one type launches the next, with its own backend and setup; the run
record and ``aios status`` keep each shape with its steps, time and cost.

The end-to-end run launches through moto and the EC2 stand-in onto real sshd hosts in network
namespaces (as test_aws_e2e.py), checkpoints to S3 (moto) and, after a spot reclaim, the stand-in
answers ``InsufficientInstanceCapacity`` for the first type: the recovery launches the second and
the run resumes there with every sample trained on exactly once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import boto3
from aios_cloud.store import JOB_FINAL, Store
from aios_cloud_aws.testing.inventory import leftovers

PY = sys.executable
SCRIPT = Path(__file__).resolve().parents[2] / "cloud" / "tests" / "scripts" / "capacity_samples.py"
IMDS_PORT = 18169
S3_PORT = 18170


def _offline(monkeypatch, tmp_path) -> dict[str, str]:
    env = os.environ.copy()
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "AKIADRYRUN0000000000",
            "AWS_SECRET_ACCESS_KEY": "aiosCapacityDryRunSecret",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # any AWS call would fail
            "AWS_EC2_METADATA_DISABLED": "true",
            "AIOS_HOME": str(tmp_path / "home"),
        }
    )
    (tmp_path / "train.py").write_text("print('train')\n")
    return env


def _dry(env: dict[str, str], tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "aios.cli.main", "launch", "--cloud", "aws", "--dry-run", *args, "train.py"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prices_each_candidate_in_order_and_cheapest_first(monkeypatch, tmp_path):
    env = _offline(monkeypatch, tmp_path)
    args = ["-a", "p5.48xlarge,trn1.32xlarge", "--nodes", "2", "--spot", "--region", "us-east-1"]
    r = _dry(env, tmp_path, *args)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if re.match(r"#   \d\. ", ln)]
    # the catalog's spot prices x 2 nodes: p5 31.46/h, trn1.32xlarge 6.4505/h each
    assert lines == [
        "#   1. 2 x p5.48xlarge: $62.92/h, backend cuda (chosen: launched first)",
        "#   2. 2 x trn1.32xlarge: $12.90/h, backend neuron (if p5.48xlarge has no capacity)",
    ], r.stdout[:2000]
    assert "candidates, in the order given, spot prices" in r.stdout
    # the plan that follows is the first candidate's
    assert '"InstanceType":"p5.48xlarge"' in r.stdout and 'trn1.32xlarge"' not in r.stdout
    r = _dry(env, tmp_path, *args, "--cheapest")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if re.match(r"#   \d\. ", ln)]
    assert lines[0].startswith("#   1. 2 x trn1.32xlarge: $12.90/h, backend neuron (chosen")
    assert '"InstanceType":"trn1.32xlarge"' in r.stdout
    # one type: its price
    r = _dry(env, tmp_path, "-a", "trn1.2xlarge", "--region", "us-east-1")
    assert "# price: 1 x trn1.2xlarge, $1.34/h (on-demand)" in r.stdout, r.stdout[:1000]


def test_a_bad_candidate_is_one_line_before_anything(monkeypatch, tmp_path):
    env = _offline(monkeypatch, tmp_path)
    for bad, word in (
        # a name no EC2 type has (an unlisted but EC2-shaped name is planned with an unknown
        # price offline and checked against DescribeInstanceTypes at launch: issue 27)
        ("p5.48xlarge,v5litepod-8", "v5litepod-8"),
        ("p5.48xlarge,,trn1.32xlarge", "empty entry"),
        ("p5.48xlarge,p5.48xlarge", "more than once"),
    ):
        r = _dry(env, tmp_path, "-a", bad, "--region", "us-east-1")
        assert r.returncode == 2, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and word in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "# " not in r.stdout
    r = _dry(env, tmp_path, "-a", "p5.48xlarge", "--cheapest")
    assert r.returncode == 2 and "--cheapest" in r.stderr and len(r.stderr.splitlines()) == 1
    r = _dry(env, tmp_path, "-a", "p5.48xlarge", "--min-hosts", "2", "--max-restarts", "1")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr


def test_launch_falls_through_to_the_next_candidate_without_capacity(
    aws, tmp_path, monkeypatch, pubkey
):
    """The first candidate has no capacity in any zone: the launch creates the second, with its
    own backend and interpreter, and says so; nothing of the first is left."""
    from aios_cloud.launch.planning import plan
    from aios_cloud.launch.stages import provision
    from aios_cloud.lifecycle import down_cluster
    from aios_cloud.records import get_provider
    from aios_cloud.request import LaunchRequest
    from aios_cloud.ssh import LinePrinter
    from aios_cloud.store import Store

    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print('train')\n")
    aws.proxy.inject(
        "RunInstances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone "
        "you requested.",
        instance_types=["p4d.24xlarge"],
    )
    request = LaunchRequest.from_options(
        {
            "script": "train.py",
            "cloud": "aws",
            "accelerator": "p4d.24xlarge,trn1.2xlarge",
            "name": "fall",
            "region": "us-east-1",
            "workdir": str(tmp_path),
            "no_setup": True,
        }
    )
    from aios.config.schema import resolve

    config = resolve(check_backend=False)
    provider = get_provider("aws", config)
    store = Store()
    said: list[str] = []
    launch = plan(
        request, provider, "aws", config, store, None, said.append, said.append, LinePrinter()
    )
    assert [c.accelerator for c in launch.clusters] == ["p4d.24xlarge", "trn1.2xlarge"]
    launch.key = str(tmp_path / "id_ed25519")
    provision(launch)
    try:
        rec = launch.require_record()
        assert rec.accelerator == "trn1.2xlarge" and launch.cluster.accelerator == "trn1.2xlarge"
        assert launch.spec.backend == "neuron" and launch.spec.python == provider.python(
            "trn1.2xlarge", "neuron"
        )
        assert any(
            "no capacity for p4d.24xlarge" in m and "trying the next candidate, trn1.2xlarge" in m
            for m in said
        ), said
        types = [c["InstanceType"] for c in aws.proxy.called("RunInstances")]
        assert "p4d.24xlarge" in types and types[-1] == "trn1.2xlarge"
    finally:
        down_cluster(store, provider, store.get_cluster("fall"))
    assert leftovers(aws.ec2, "fall", aws.proxy) == {}


# ------------------------------------------------------------------------------ end to end


def _subnet_matching(aws, cluster) -> str:
    """A moto subnet equal to the namespaces' /24, .4-.9 taken: the launched instances get .10
    and .11, the sshd hosts' addresses (as test_aws_e2e.py)."""
    ec2 = aws.ec2
    vpc = ec2.create_vpc(CidrBlock="10.213.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(
        VpcId=vpc, CidrBlock=f"{cluster.subnet}.0/24", AvailabilityZone="us-east-1a"
    )["Subnet"]["SubnetId"]
    ec2.run_instances(
        ImageId=aws.gpu_ami, MinCount=6, MaxCount=6, InstanceType="t3.micro", SubnetId=sub
    )
    return sub


def _in_ns(host, argv: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen(
        ["ip", "netns", "exec", host.netns, *argv], stdout=f, stderr=f, start_new_session=True
    )


def _aios(tmp: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    env = os.environ.copy()
    env["AIOS_HOME"] = str(tmp / "home")
    env["COLUMNS"] = "200"
    return subprocess.run(
        [PY, "-m", "aios.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp,
    )


def _wait(cond, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


SAMPLES = 48
GLOBAL_BATCH = 8
STEPS = SAMPLES // GLOBAL_BATCH


def test_managed_spot_run_moves_to_the_next_candidate_and_resumes_exactly_once(
    aws, sshd_hosts, tmp_path
):
    from aios.checkpoint import MARKER
    from aios_cloud_aws.testing.bridge import UnixToTcp
    from aios_cloud_aws.testing.moto import reclaim_spot

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=aws.endpoint)
    s3.create_bucket(Bucket="ckpt")
    sock = str(tmp_path / "moto.sock")
    bridge = UnixToTcp(sock, int(aws.endpoint.rsplit(":", 1)[1])).start()
    procs: list[subprocess.Popen] = []

    def node_services(h):  # what every EC2 machine has: IMDS; and here the way to S3 (moto)
        procs.append(
            _in_ns(
                h,
                [PY, "-m", "aios_cloud_aws.testing.imds", "--port", str(IMDS_PORT)],
                tmp_path / f"imds{h.worker_id}.log",
            )
        )
        procs.append(
            _in_ns(
                h,
                [PY, "-m", "aios_cloud_aws.testing.bridge", "--listen", str(S3_PORT)]
                + ["--unix", sock],
                tmp_path / f"bridge{h.worker_id}.log",
            )
        )

    def ckpt_steps() -> list[int]:
        keys = [
            o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="run/").get("Contents", [])
        ]
        return sorted(
            int(k.split("/")[1].removeprefix("ckpt-"))
            for k in keys
            if k.endswith(MARKER) and k.split("/")[1].startswith("ckpt-")
        )

    try:
        for h in sshd_hosts.hosts:
            node_services(h)
        subnet = _subnet_matching(aws, sshd_hosts)
        cfg = tmp_path / "aios.yaml"
        cfg.write_text(
            f"aws:\n  subnet_ids: [{subnet}]\n  use_private_ip: true\n  ssh_user: root\n"
            '  efa: "off"\n  imds_poll_seconds: 0.5\n'
        )
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text(SCRIPT.read_text())
        pause = tmp_path / "pause"
        pause.touch()
        out = tmp_path / "samples.json"
        r = _aios(
            tmp_path,
            "launch",
            "--cloud",
            "aws",
            "-a",
            "p4d.24xlarge,trn1.2xlarge",
            "--nodes",
            "2",
            "--backend",
            "cpu",
            "--spot",
            "--max-restarts",
            "1",
            "--checkpoint-dir",
            "s3://ckpt/run",
            "--name",
            "follow",
            "--ssh-key",
            str(sshd_hosts.client_key),
            "--python",
            PY,
            "--no-setup",
            "--workdir",
            str(work),
            "--config",
            str(cfg),
            "--poll",
            "1",
            "--detach",
            "--env",
            "GLOO_SOCKET_IFNAME=eth0",
            "--env",
            "OMP_NUM_THREADS=1",
            "--env",
            f"AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:{IMDS_PORT}",
            "--env",
            f"AWS_ENDPOINT_URL=http://127.0.0.1:{S3_PORT}",
            "--env",
            "AWS_ACCESS_KEY_ID",
            "--env",
            "AWS_SECRET_ACCESS_KEY",
            "--env",
            "AIOS_CHECKPOINT__EVERY=1",
            "--env",
            f"AIOS_GLOBAL_BATCH={GLOBAL_BATCH}",
            "--env",
            "AIOS_MICRO_BATCH=2",
            "--env",
            f"SAMPLES={SAMPLES}",
            "--env",
            f"PAUSE=2:{pause}",
            "train.py",
            str(out),
        )
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert [c["InstanceType"] for c in aws.proxy.called("RunInstances")] == ["p4d.24xlarge"]
        # step 2 is on S3 (the run waits there); then the spot capacity of p4d.24xlarge ends:
        # the machines go, and EC2 has no more of that type
        _wait(lambda: 2 in ckpt_steps(), 240, "the checkpoint of step 2 on S3")
        for h in sshd_hosts.hosts:
            h.stop()
        pause.unlink()
        aws.proxy.inject(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "There is no Spot capacity available that matches your request.",
            instance_types=["p4d.24xlarge"],
        )
        ids = [
            i["InstanceId"]
            for r_ in aws.ec2.describe_instances(
                Filters=[{"Name": "tag:aios:cluster", "Values": ["follow"]}]
            )["Reservations"]
            for i in r_["Instances"]
        ]
        reclaim_spot(ids)
        _wait(
            lambda: aws.proxy.called("RunInstances")[-1]["InstanceType"] == "trn1.2xlarge",
            240,
            "the recovery to launch the next candidate",
        )
        for h in sshd_hosts.hosts:  # the new instances boot at the addresses moto hands out
            h.start(new_host_key=True)
            node_services(h)

        # the job's end as the watcher records it (read here, not through a CLI per look); then
        # what `aios status` says of it
        store = Store(tmp_path / "home" / "state.db")

        def ended() -> bool:
            job = store.get_job(1)
            return job is not None and job.state in JOB_FINAL

        _wait(ended, 420, "the job to finish")
        store.close()
        st = _aios(tmp_path, "status", "follow", "--json")
        assert st.returncode == 0, st.stderr
        job = json.loads(st.stdout)[0]["jobs"][0]
        logs = _aios(tmp_path, "logs", "follow").stdout
        assert job["state"] == "SUCCEEDED", logs[-3000:]
        assert job["restarts"] == 1
        result = json.loads(out.read_text())
        assert sorted(result["ids"]) == list(range(SAMPLES)), result  # every sample once
        assert result["steps"] == STEPS
        types = [c["InstanceType"] for c in aws.proxy.called("RunInstances")]
        assert types[0] == "p4d.24xlarge" and types[-1] == "trn1.2xlarge", types
        assert "aios: resumed from s3://ckpt/run/ckpt-000000002" in logs, logs[-3000:]
        shapes = job["shapes"]
        assert [s["accelerator"] for s in shapes] == ["p4d.24xlarge", "trn1.2xlarge"], shapes
        assert [s["hosts"] for s in shapes] == [2, 2] and [s["processes"] for s in shapes] == [2, 2]
        assert shapes[0]["to_step"] == 2 and shapes[1]["from_step"] == 2
        assert shapes[1]["to_step"] == STEPS
        # the catalog's spot prices x 2 hosts, and what each shape cost at them
        assert shapes[0]["hourly_usd"] == 2 * 9.47 and shapes[1]["hourly_usd"] == 2 * 0.4011
        for s in shapes:
            assert abs(s["cost_usd"] - s["hourly_usd"] * s["seconds"] / 3600) < 1e-3
        text = _aios(tmp_path, "status", "follow").stdout
        assert "job 1 shape 1: p4d.24xlarge x 2 hosts, 2 processes: steps 0->2 (2)" in text, text
        assert "job 1 shape 2: trn1.2xlarge x 2 hosts, 2 processes: steps 2->" in text, text
        assert "job 1 cost so far $" in text
        assert "recovered" in text and "no capacity for p4d.24xlarge" in text, text
    finally:
        _aios(tmp_path, "down", "follow")
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        bridge.stop()
    assert leftovers(aws.ec2, "follow", aws.proxy) == {}
