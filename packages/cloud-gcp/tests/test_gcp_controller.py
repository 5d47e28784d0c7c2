"""A managed spot run whose controller survives the launching machine: the recovery loop runs on
a third sshd host (the controller), the launching process is killed, the slice is preempted, and
the controller recreates it and sees the job through. Real aios CLI, real sshd hosts in network
namespaces, the local Cloud TPU service (reachable from the hosts), gcp-storage-emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aios_cloud.testing.sshd import SshdCluster, netns_available, sshd_unavailable_reason
from aios_cloud_gcp.testing import FakeTpuService

pytestmark = pytest.mark.slow


@pytest.fixture
def three_hosts(tmp_path: Path):
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    if not netns_available():
        pytest.skip(
            "needs network namespaces (root + iproute2): the controller is a host of its own"
        )
    with SshdCluster(3, tmp_path / "sshd") as cluster:
        yield cluster


def test_managed_spot_run_survives_the_launching_process(
    tmp_path, three_hosts, gcp_env, aios_cli, wait_for
):
    c = three_hosts
    workers, controller = c.hosts[:2], c.hosts[2]
    pytest.importorskip(
        "gcp_storage_emulator",
        reason="needs gcp-storage-emulator: pip install gcp-storage-emulator",
    )
    c.popen_service([sys.executable, "-m", "aios_cloud_gcp.testing.gcs", "9023", c.service_ip])
    c.wait_port(9023)
    gcs = f"http://{c.service_ip}:9023"
    import gcsfs

    gcsfs.GCSFileSystem(endpoint_url=gcs, token="anon", skip_instance_cache=True).mkdir("mj-ckpt")
    work = tmp_path / "proj"
    work.mkdir()
    # the first attempt marks the bucket and runs long (it is preempted); the second finishes
    (work / "job.py").write_text(
        "import os, time, gcsfs\n"
        "fs = gcsfs.GCSFileSystem(endpoint_url=os.environ['STORAGE_EMULATOR_HOST'], "
        "token='anon', skip_instance_cache=True)\n"
        "first = not fs.exists('mj-ckpt/attempt')\n"
        "if first and os.environ.get('RANK', '0') == '0':\n"
        "    fs.pipe('mj-ckpt/attempt', b'1')\n"
        "print('working', 'first' if first else 'again', flush=True)\n"
        "time.sleep(600 if first else 1)\n"
        "print('finished', flush=True)\n"
    )
    with FakeTpuService(
        machines=workers, authorized_keys=c.authorized_keys, project="aios-test", host="0.0.0.0"
    ) as svc:
        host_url = f"http://{c.subnet}.1:{svc.server.server_address[1]}"
        env = gcp_env(
            tmp_path,
            svc,
            AIOS_GCP__AGENT_ENDPOINT=host_url,
            STORAGE_EMULATOR_HOST=gcs,
            GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
        )
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aios.cli.main",
                "launch",
                "--cloud",
                "gcp",
                "-a",
                "v4-16",
                "--name",
                "mj",
                "--spot",
                "--max-restarts",
                "2",
                "--checkpoint-dir",
                "gs://mj-ckpt/run",
                "--backend",
                "cpu",
                "--python",
                sys.executable,
                "--no-setup",
                "--workdir",
                str(work),
                "--poll",
                "0.5",
                "--controller",
                f"{c.user}@{controller.ip}",
                "--controller-python",
                sys.executable,
                "--env",
                f"STORAGE_EMULATOR_HOST={gcs}",
                "--env",
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false",
                "job.py",
            ],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            log = workers[0].home / "aios" / "mj" / "jobs" / "1" / "worker.log"
            wait_for(lambda: log.exists() and "working" in log.read_text(), 180, "the job to start")
            wait_for(
                lambda: p.poll() is not None, 180, "the launch to hand the job to the controller"
            )
        finally:
            # the launching side dies (and its whole process group): only the controller is left
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _out, err = p.communicate(timeout=60)
        assert "is watched by a controller on" in err, err[-3000:]
        # no watcher of this machine manages the job
        st = json.loads(aios_cli(env, "status", "--json").stdout)[0]
        assert st["controller"]["target"] == f"{c.user}@{controller.ip}"
        svc.preempt("mj")

        def done() -> dict | None:
            r = aios_cli(env, "status", "mj", "--refresh", "--json")
            rows = json.loads(r.stdout) if r.returncode == 0 else []
            job = rows[0]["jobs"][-1] if rows and rows[0]["jobs"] else None
            return rows[0] if job and job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

        row = wait_for(done, 300, "the controller to see the job through", interval=2)
        ctl_log = (controller.home / "aios-controller" / "mj" / "controller.log").read_text()
        job = row["jobs"][-1]
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 1, ctl_log[-3000:]
        # the controller read the checkpoint bucket through the job's storage settings (--env);
        # without them its reads went to storage.googleapis.com and each stalled in retries
        assert "Traceback" not in ctl_log and "storage.googleapis.com" not in ctl_log, ctl_log[
            -3000:
        ]
        assert any(
            e["kind"] == "recovered" and "recreated" in e["message"] for e in row["recoveries"]
        ), row["recoveries"]
        # the recreation was the controller's doing, from its own host
        creators = {ip for m, path, ip in svc.callers if m == "POST" and path.endswith("/nodes")}
        assert controller.ip in creators
        text = (workers[0].home / "aios" / "mj" / "jobs" / "1" / "worker.log").read_text()
        assert "working again" in text and "finished" in text, text
        r = aios_cli(env, "status", "mj")
        assert "managed by a controller on" in r.stdout
        assert aios_cli(env, "down", "mj").returncode == 0 and svc.nodes == {}


def test_down_stops_a_running_controller_first(tmp_path, three_hosts, gcp_env, aios_cli, wait_for):
    """`aios down` of a cluster whose controller still runs stops the controller first: it would
    otherwise recreate the cluster it sees disappear (and bill for it)."""
    c = three_hosts
    workers, controller = c.hosts[:2], c.hosts[2]
    work = tmp_path / "proj"
    work.mkdir()
    (work / "job.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(600)\n")
    with FakeTpuService(
        machines=workers, authorized_keys=c.authorized_keys, project="aios-test", host="0.0.0.0"
    ) as svc:
        env = gcp_env(
            tmp_path,
            svc,
            AIOS_GCP__AGENT_ENDPOINT=f"http://{c.subnet}.1:{svc.server.server_address[1]}",
        )
        r = aios_cli(
            env,
            "launch",
            "--cloud",
            "gcp",
            "-a",
            "v4-16",
            "--name",
            "dn",
            "--down",
            "--backend",
            "cpu",
            "--python",
            sys.executable,
            "--no-setup",
            "--workdir",
            str(work),
            "--poll",
            "0.5",
            "--controller",
            f"{c.user}@{controller.ip}",
            "--controller-python",
            sys.executable,
            "job.py",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        pid = int((controller.home / "aios-controller" / "dn" / "controller.pid").read_text())
        d = aios_cli(env, "down", "dn")
        assert (
            d.returncode == 0
            and f"stopped the controller of dn on {c.user}@{controller.ip}" in d.stderr
        ), d.stderr
        assert svc.nodes == {}
        import time

        time.sleep(3)  # a live controller would have started recreating by now
        assert svc.nodes == {} and svc.count("POST", "/nodes") == 1
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
