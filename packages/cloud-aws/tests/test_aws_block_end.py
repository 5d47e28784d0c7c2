"""A managed run on a Capacity Block reaches the block's end (issue 27's acceptance): EC2 begins
to terminate a block's instances 30 minutes before its end, with no notice on the hosts
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html); the EC2
stand-in does the same on its clock.

What runs for real: the launch into the block through boto3, moto and the EC2 stand-in (its
dates read, the instances tagged with its end), the environment every host's ranks get
(``remote_env``: ``AIOS_RUN_DEADLINE`` = end - 30 min - ``aws.capacity_block_margin``), the
user's script under ``aios-run`` with 2 ranks (gloo) and that environment: aios's own deadline
watcher announces the end, both ranks stop at the same step boundary and commit the emergency
checkpoint, and exit 75; then the stand-in's clock reaches end - 30 min: it terminates the
instances, and aios sees capacity that ended (``PREEMPTED``, what the managed watcher recovers
from); the run resumes from that checkpoint (as the recovery does, on the capacity it finds:
here one process, a smaller shape) and trains every sample exactly once.

What it does not run: the ranks on the instances themselves (moto's instances run nothing:
they run here, with the hosts' environment) and the watcher's loop between the two runs
(test_aws_capacity.py runs that loop end to end after a spot reclaim). Time: the block is short
in test time, not in wall time: its reclaim is 10 minutes away on the stand-in's injected clock,
and the emergency checkpoint is estimated to need 15 minutes (``checkpoint.grace_seconds``
900), so the run is already within its notice lead when it starts; nothing waits on the wall
clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.states import PREEMPTED, READY
from aios_cloud_aws.testing.inventory import leftovers

pytestmark = pytest.mark.slow  # two training runs (about 50 s on a loaded 2-core machine)

SCRIPT = Path(__file__).resolve().parents[2] / "cloud" / "tests" / "scripts" / "capacity_samples.py"
SAMPLES = 32
PY = sys.executable
GLOBAL_BATCH = 8  # 2 ranks x micro-batch 2 x 2 accumulation: 4 steps of 32 samples
RECLAIM_S = 1800


def _run(
    tmp: Path, ckpt: Path, out: Path, env_extra: dict[str, str], nprocs: int = 2
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "AWS_"))}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "AIOS_GLOBAL_BATCH": str(GLOBAL_BATCH),
            "AIOS_MICRO_BATCH": "2",
            "OMP_NUM_THREADS": "1",
            "SAMPLES": str(SAMPLES),
            **env_extra,
        }
    )
    env["AIOS_CHECKPOINT__DIR"] = str(ckpt)
    # the hosts' ranks under aios-run; one plain process where that is all a run needs
    cmd = [*AIOS_RUN, "--nprocs", str(nprocs), "--backend", "cpu"] if nprocs > 1 else [PY]
    return subprocess.run(
        [*cmd, str(SCRIPT), str(out)],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_run_on_a_capacity_block_commits_its_checkpoint_before_the_reclaim(
    aws, make_provider, pubkey, tmp_path
):
    from aios.checkpoint import MARKER
    from aios.launcher.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV
    from aios.resilience.notices import EXIT_PREEMPTED

    t0 = float(int(time.time()))
    now = [t0]
    aws.proxy.clock = lambda: now[0]
    # a short block: started an hour ago, EC2 starts terminating its instances in 10 minutes
    end = t0 + RECLAIM_S + 600
    aws.proxy.capacity_reservations["cr-0short"] = {
        **{"zone": "us-east-1b", "instance_type": "p5.48xlarge", "type": "capacity-block"},
        **{"count": 1, "start": t0 - 3600, "end": end},
    }
    margin = 300.0
    p = make_provider(capacity_block_margin=margin)
    p.clock = aws.proxy.clock
    req = p.validate(
        ClusterRequest(
            name="blk",
            accelerator="p5.48xlarge",
            zone="us-east-1b",
            ssh_public_key=pubkey,
            extra={"reservation": "block:cr-0short"},
        )
    )
    info = p.create(req)
    assert info.state == READY
    env = p.remote_env(info)  # what every host's ranks get
    deadline = float(env[DEADLINE_ENV])
    assert deadline == end - RECLAIM_S - margin and env[DEADLINE_SOURCE_ENV] == "capacity-block"

    ckpt, out = tmp_path / "ckpt", tmp_path / "samples.json"
    host_env = {
        DEADLINE_ENV: env[DEADLINE_ENV],
        DEADLINE_SOURCE_ENV: env[DEADLINE_SOURCE_ENV],
        "AIOS_CHECKPOINT__GRACE_SECONDS": "900",
    }
    r = _run(tmp_path, ckpt, out, host_env)
    log = r.stdout + r.stderr
    assert r.returncode == EXIT_PREEMPTED, log[-3000:]
    assert "capacity-block" in log, log[-3000:]
    done = sorted(c for c in ckpt.glob("ckpt-*") if (c / MARKER).exists())
    assert done, log[-3000:]
    committed = (done[-1] / MARKER).stat().st_mtime
    step = int(done[-1].name.removeprefix("ckpt-").split("-", 1)[0])
    assert 1 <= step < SAMPLES // GLOBAL_BATCH, log[-3000:]  # stopped early, at a boundary
    assert not out.exists()  # the run did not reach its end
    # the checkpoint was committed before the ranks' deadline, itself before the reclaim
    assert committed < deadline < end - RECLAIM_S

    # the stand-in's clock reaches end - 30 min: EC2 terminates the block's instances
    ids = sorted(h.instance_id for h in info.hosts)
    now[0] = end - RECLAIM_S
    assert sorted(aws.proxy.reap()) == ids
    gone = p.describe("blk", "us-east-1b")
    assert gone is not None and gone.state == PREEMPTED  # capacity that ended: recovered from

    # the run moves on (the recovery's relaunch, on the capacity it finds: here one process,
    # a smaller shape, which aios resumes onto): nothing lost
    r = _run(tmp_path, ckpt, out, {}, nprocs=1)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert f"resumed from {done[-1]}" in log, log[-3000:]
    result = json.loads(out.read_text())
    assert sorted(result["ids"]) == list(range(SAMPLES)), result  # every sample exactly once
    assert result["steps"] == SAMPLES // GLOBAL_BATCH
    assert result["worlds"][str(step)] == 2 and result["world"] == 1
    p.delete("blk", None)
    assert leftovers(aws.ec2, "blk", aws.proxy) == {}
