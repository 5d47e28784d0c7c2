"""End to end: ``aios launch --cloud aws`` provisions through moto, and the instances are real
sshd hosts in network namespaces (their private IPs are the addresses moto assigned in the
subnet the test created to match the namespaces' network). The example trains on CPU with
2 nodes x 1 process over gloo (torchrun c10d rendezvous at worker 0).

The spot test gives every host its own IMDSv2 stand-in on the namespace's 127.0.0.1 (like the
node-local 169.254.169.254) and S3 (moto) through a Unix-socket bridge; the spot notice makes
the workers write an emergency checkpoint to S3; the capacity is then reclaimed and the core's
managed recovery relaunches through this provider and resumes from S3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
from aios_cloud.store import JOB_FINAL, Store
from aios_cloud_aws.testing.inventory import leftovers

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PY = sys.executable
IMDS_PORT = 18169
S3_PORT = 18170


# sshd_hosts (two real sshd hosts in network namespaces: the instances) comes from the aios
# pytest plugin (aios.testing.plugin)


def _subnet_matching(aws, cluster) -> str:
    """A moto VPC/subnet equal to the namespaces' /24, with .4-.9 taken so the two launched
    instances get .10 and .11: the sshd hosts' addresses."""
    ec2 = aws.ec2
    vpc = ec2.create_vpc(CidrBlock="10.213.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(
        VpcId=vpc, CidrBlock=f"{cluster.subnet}.0/24", AvailabilityZone="us-east-1a"
    )["Subnet"]["SubnetId"]
    ec2.run_instances(
        ImageId=aws.gpu_ami, MinCount=6, MaxCount=6, InstanceType="t3.micro", SubnetId=sub
    )
    return sub


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    shutil.copy(EXAMPLES / "gpt.py", work / "gpt.py")
    return work


def _config(tmp: Path, subnet: str, extra: str = "") -> Path:
    cfg = tmp / "aios.yaml"
    cfg.write_text(
        "aws:\n"
        f"  subnet_ids: [{subnet}]\n"
        "  use_private_ip: true\n"
        "  ssh_user: root\n" + extra  # aios_requirements: the default (aios comes with the code)
    )
    return cfg


def _env(tmp: Path) -> dict[str, str]:
    env = os.environ.copy()
    env["AIOS_HOME"] = str(tmp / "home")
    env["COLUMNS"] = "200"
    return env


def _aios(tmp: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "aios.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp),
        cwd=tmp,
    )


def _gpt_args(steps: int) -> list[str]:
    return [
        "--data",
        str(EXAMPLES / "data" / "corpus.txt"),
        "--steps",
        str(steps),
        "--batch-size",
        "8",
        "--block-size",
        "32",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--eval-every",
        "1000",
        "--eval-batches",
        "1",
    ]


def test_launch_two_nodes_over_gloo_then_down(aws, sshd_hosts, tmp_path):
    subnet = _subnet_matching(aws, sshd_hosts)
    cfg = _config(tmp_path, subnet)
    work = _workdir(tmp_path)
    r = _aios(
        tmp_path,
        "launch",
        "--cloud",
        "aws",
        "-a",
        "trn1.2xlarge",
        "--nodes",
        "2",
        "--backend",
        "cpu",
        "--name",
        "e2e",
        "--ssh-key",
        str(sshd_hosts.client_key),
        "--python",
        PY,
        "--no-setup",
        "--workdir",
        str(work),
        "--config",
        str(cfg),
        "--env",
        "GLOO_SOCKET_IFNAME=eth0",
        "--env",
        "OMP_NUM_THREADS=1",  # the instances share this machine's cores: see the spot test
        "gpt.py",
        "--",
        *_gpt_args(12),
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    ips = [h.ip for h in sshd_hosts.hosts]
    assert (
        f"worker 0 {ips[0]}" in out and f"worker 1 {ips[1]}" in out
    )  # moto's private IPs = the sshd hosts
    assert f"(worker 0, {ips[0]})" in out and f"(worker 1, {ips[1]})" in out  # per-node prefixes
    assert "2 x cpu" in out and "done 12 steps" in out, out[
        -3000:
    ]  # one process on each of the 2 nodes
    (run,) = aws.proxy.called("RunInstances")
    assert run["MinCount"] == "2" and run["NetworkInterface.1.SubnetId"] == subnet
    st = _aios(tmp_path, "status", "e2e", "--json")
    assert st.returncode == 0 and '"accelerator": "trn1.2xlarge"' in st.stdout
    d = _aios(tmp_path, "down", "e2e")
    assert d.returncode == 0, d.stderr
    assert leftovers(aws.ec2, "e2e", aws.proxy) == {}


def _in_ns(host, argv: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen(
        ["ip", "netns", "exec", host.netns, *argv], stdout=f, stderr=f, start_new_session=True
    )


# long enough that the notice lands mid-run (one OpenMP thread a rank: ~30 steps/s): the test sends
# it as soon as rank 0's log shows step 10 (read on the host, not through a CLI per look) and the
# workers stop within one IMDS poll (0.5 s) and a step
STEPS = 600


def test_spot_notice_checkpoints_to_s3_and_managed_recovery_resumes(aws, sshd_hosts, tmp_path):
    from aios_cloud_aws.testing.bridge import UnixToTcp
    from aios_cloud_aws.testing.moto import reclaim_spot

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=aws.endpoint)
    s3.create_bucket(Bucket="ckpt")
    port = int(aws.endpoint.rsplit(":", 1)[1])
    sock = str(tmp_path / "moto.sock")
    bridge = UnixToTcp(sock, port).start()
    notice = tmp_path / "notice.json"
    procs: list[subprocess.Popen] = []
    try:

        def node_services(h):  # what every EC2 machine has locally: IMDS; plus the way to S3
            procs.append(
                _in_ns(
                    h,
                    [
                        PY,
                        "-m",
                        "aios_cloud_aws.testing.imds",
                        "--port",
                        str(IMDS_PORT),
                        "--notice-file",
                        str(notice),
                    ],
                    tmp_path / f"imds{h.worker_id}.log",
                )
            )
            procs.append(
                _in_ns(
                    h,
                    [
                        PY,
                        "-m",
                        "aios_cloud_aws.testing.bridge",
                        "--listen",
                        str(S3_PORT),
                        "--unix",
                        sock,
                    ],
                    tmp_path / f"bridge{h.worker_id}.log",
                )
            )

        for h in sshd_hosts.hosts:
            node_services(h)
        subnet = _subnet_matching(aws, sshd_hosts)
        cfg = _config(tmp_path, subnet, "  imds_poll_seconds: 0.5\n")
        work = _workdir(tmp_path)
        args = [
            "launch",
            "--cloud",
            "aws",
            "-a",
            "trn1.2xlarge",
            "--nodes",
            "2",
            "--backend",
            "cpu",
            "--spot",
            "--max-restarts",
            "1",
            "--checkpoint-dir",
            "s3://ckpt/gpt",
            "--name",
            "spot",
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
            "3",
            "--detach",
            "--env",
            "GLOO_SOCKET_IFNAME=eth0",
            # the two "instances" share this machine's cores (nproc counts all of them on each):
            # one thread per rank, as on a 1-core instance; two spinning OpenMP threads per rank
            # on a loaded machine made each step some 30 times slower
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
            "gpt.py",
            "--",
            *_gpt_args(STEPS),
        ]
        r = _aios(tmp_path, *args)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        # once training is under way (not after a fixed sleep: on an idle machine the run could
        # finish first), the spot notice arrives on every node
        import re

        worker_log = sshd_hosts.hosts[0].home / "aios" / "spot" / "jobs" / "1" / "worker.log"
        deadline = time.monotonic() + 180
        seen = 0
        while time.monotonic() < deadline and seen < 10:
            text = worker_log.read_text(errors="replace") if worker_log.exists() else ""
            seen = max([int(m) for m in re.findall(rf"gpt (\d+)/{STEPS}", text)] or [0])
            time.sleep(0.05)
        assert 10 <= seen < STEPS, f"training did not get under way (last step seen: {seen})"
        from aios_cloud_aws.testing.imds import notice_json

        notice.write_text(notice_json("terminate", 120))
        from aios.checkpoint import MARKER

        deadline = time.monotonic() + 120
        keys: list[str] = []
        while time.monotonic() < deadline and not any(k.endswith(MARKER) for k in keys):
            keys = [
                o["Key"]
                for o in s3.list_objects_v2(Bucket="ckpt", Prefix="gpt/").get("Contents", [])
            ]
            time.sleep(0.05)
        # the capacity goes away (AWS: at the notice's time): machines and their processes
        for h in sshd_hosts.hosts:
            h.stop()
        assert any(k.endswith(MARKER) for k in keys), (
            f"no complete emergency checkpoint on S3 after the spot notice: {keys}"
        )
        notice.unlink()
        ids = [
            i["InstanceId"]
            for r_ in aws.ec2.describe_instances(
                Filters=[{"Name": "tag:aios:cluster", "Values": ["spot"]}]
            )["Reservations"]
            for i in r_["Instances"]
        ]
        reclaim_spot(ids)
        # the managed watcher notices, deletes what is left and relaunches through the provider;
        # the new instances boot (with new host keys) at the addresses moto hands out again
        deadline = time.monotonic() + 180
        while len(aws.proxy.called("RunInstances")) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(aws.proxy.called("RunInstances")) == 2, _aios(
            tmp_path, "status", "spot", "--json"
        ).stdout
        for h in sshd_hosts.hosts:
            h.start(new_host_key=True)
            node_services(h)
        # the job's end as the watcher records it (read here, not through a CLI per look); then
        # what `aios status` says of it
        store = Store(tmp_path / "home" / "state.db")
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            job = store.get_job(1)
            if job is not None and job.state in JOB_FINAL:
                break
            time.sleep(0.5)
        store.close()
        state = _aios(tmp_path, "status", "spot", "--json").stdout
        assert '"state": "SUCCEEDED"' in state, (
            state + _aios(tmp_path, "logs", "spot").stdout[-3000:]
        )
        assert '"restarts": 1' in state and "recovered" in state
        logs = _aios(tmp_path, "logs", "spot").stdout
        done = re.findall(rf"done {STEPS} steps \((\d+) this run\)", logs)
        assert done and 0 < int(done[-1]) < STEPS, logs[
            -3000:
        ]  # resumed from the emergency checkpoint on S3
        assert (
            len(aws.proxy.called("RunInstances")) == 2
        )  # launched, then relaunched by the recovery
    finally:
        _aios(tmp_path, "down", "spot")
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        bridge.stop()
    assert leftovers(aws.ec2, "spot", aws.proxy) == {}
    # the forwarded credentials went to the hosts' mode-600 env files only: never into aios's
    # records, logs or the watcher log
    from aios_cloud_aws.testing.moto import FAKE_SECRET

    for f in (tmp_path / "home").rglob("*"):
        if f.is_file():
            assert FAKE_SECRET.encode() not in f.read_bytes(), f
