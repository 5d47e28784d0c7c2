"""End to end (issue 26): a ``--cloud ssh`` managed run follows the hosts it has. On 3 real sshd
hosts (network namespaces), one host dies at a known step: the run continues on the 2 that
remain (``--min-hosts 2``), and when the host is back it grows to all 3 at the next checkpoint.
Every sample of the epoch is trained on exactly once over the three shapes, and ``aios status``
shows each shape with its hosts, processes and steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "capacity_samples.py"
SAMPLES = 96
GLOBAL_BATCH = 12  # 3 processes: grad_accum 2; 2 processes: 3
STEPS = SAMPLES // GLOBAL_BATCH


def aios(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def wait_for(cond, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def committed(ckpt: Path) -> list[int]:
    return sorted(
        int(m.group(1))
        for p in ckpt.glob("ckpt-*/aios-checkpoint.json")
        if (m := re.search(r"ckpt-(\d+)", str(p)))
    )


def test_ssh_managed_run_continues_on_the_hosts_left_and_grows_back(tmp_path, sshd_cluster):
    cluster = sshd_cluster(3, netns=True)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {"AIOS_HOME": str(tmp_path / "aios-home"), "AIOS_PLUGINS": "aios-cloud", "COLUMNS": "200"}
    )
    ckpt = tmp_path / "shared-ckpt"  # the hosts share this filesystem (as over NFS)
    pauses = {2: tmp_path / "pause-2", 5: tmp_path / "pause-5", 6: tmp_path / "pause-6"}
    for p in pauses.values():
        p.touch()
    out = tmp_path / "samples.json"
    hosts = ",".join(f"{cluster.user}@{h.ip}:{h.port}" for h in cluster.hosts)
    r = aios(
        env,
        "launch",
        "--cloud",
        "ssh",
        "--hosts",
        hosts,
        "--identity",
        str(cluster.client_key),
        "--name",
        "grow",
        "--python",
        sys.executable,
        "--nprocs-per-host",
        "1",
        "--workdir",
        str(work),
        "--poll",
        "0.5",
        "--max-restarts",
        "1",
        "--min-hosts",
        "2",
        "--host-wait",
        "2",
        "--checkpoint-dir",
        str(ckpt),
        "--detach",
        "--env",
        "OMP_NUM_THREADS=1",
        "--env",
        "AIOS_CHECKPOINT__EVERY=1",
        "--env",
        f"AIOS_GLOBAL_BATCH={GLOBAL_BATCH}",
        "--env",
        "AIOS_MICRO_BATCH=2",
        "--env",
        f"SAMPLES={SAMPLES}",
        "--env",
        "PAUSE=" + ",".join(f"{k}:{v}" for k, v in pauses.items()),
        "train.py",
        str(out),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    watcher = Path(env["AIOS_HOME"]) / "clusters" / "grow" / "watcher-1.log"

    def status() -> dict:
        s = aios(env, "status", "grow", "--json")
        assert s.returncode == 0, s.stderr
        return json.loads(s.stdout)[0]

    try:
        # the middle host dies once step 2 is checkpointed (the run waits there)
        wait_for(lambda: 2 in committed(ckpt), 180, "the checkpoint of step 2")
        cluster.hosts[1].stop()
        wait_for(
            lambda: len(status()["jobs"][0]["shapes"]) == 2, 180, "the run to go on on 2 hosts", 1
        )
        pauses[2].unlink()
        # on 2 hosts, paused after step 5; the host comes back (same host key: it rebooted)
        wait_for(lambda: 5 in committed(ckpt), 180, "the checkpoint of step 5")
        cluster.hosts[1].start(new_host_key=False)
        wait_for(lambda: "answer again" in watcher.read_text(), 120, "the watcher to see the host")
        pauses[5].unlink()  # step 6 is the next checkpoint: the run grows back there
        wait_for(
            lambda: len(status()["jobs"][0]["shapes"]) == 3,
            180,
            "the run to grow back to 3 hosts",
            1,
        )
        pauses[6].unlink()
        final = wait_for(
            lambda: (
                lambda j: j if j["state"] not in ("RUNNING", "RECOVERING", "SETTING_UP") else None
            )(status()["jobs"][0]),
            300,
            "the job to finish",
            1,
        )
        log = watcher.read_text()
        assert final["state"] == "SUCCEEDED", log[-4000:]
        assert final["restarts"] == 1  # growing back is planned: it used no restart
        assert "continuing on the 2 that did (--min-hosts 2)" in log, log[-4000:]
        assert "reached the checkpoint of step 6: stopping it to relaunch on every host" in log
        # every sample of the epoch exactly once, over the three shapes
        result = json.loads(out.read_text())
        assert sorted(result["ids"]) == list(range(SAMPLES)), result
        assert result["steps"] == STEPS and result["world"] == 3
        shapes = final["shapes"]
        assert [(s["hosts"], s["processes"]) for s in shapes] == [(3, 3), (2, 2), (3, 3)], shapes
        assert [(s["from_step"], s["to_step"]) for s in shapes][0] == (None, 2)
        assert shapes[1]["from_step"] == 2 and shapes[1]["to_step"] >= 6
        assert shapes[2]["from_step"] == shapes[1]["to_step"] and shapes[2]["to_step"] == STEPS
        assert all(s["cost_usd"] is None for s in shapes)  # your own hosts: no price
        # the steps of each shape were taken by its processes (the checkpoints carry the record)
        worlds = {int(k): v for k, v in result["worlds"].items()}
        to = shapes[1]["to_step"]
        assert worlds == {s: 3 if s <= 2 or s > to else 2 for s in range(1, STEPS + 1)}, worlds
        logs = aios(env, "logs", "grow").stdout  # the current shape's run says what changed
        assert re.search(r"resumed at step [6-8]: 2 -> 3 processes", logs), logs[-3000:]
        text = aios(env, "status", "grow").stdout
        assert "job 1 shape 2: auto x 2 hosts, 2 processes: steps 2->" in text, text
    finally:
        assert aios(env, "down", "grow").returncode == 0
