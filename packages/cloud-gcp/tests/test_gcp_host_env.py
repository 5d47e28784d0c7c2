"""The exact environment `aios launch --cloud gcp` gives the processes on the TPU VM workers must
resolve as an aios config there (every AIOS_* name outside the reserved ones is a config key),
and the compilation cache path must be the host's home, not a literal '~'."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from aios.config.schema import CONTROL_ENV, CONTROL_PREFIXES, resolve
from aios_cloud.jobs import JobSpec, env_file, host_commands, job_env, render_run_sh
from aios_cloud.provider.data import ClusterHost, ClusterInfo
from aios_cloud.provider.states import READY
from aios_cloud.store import ClusterRecord
from aios_cloud_gcp.provider import GcpProvider
from aios_cloud_gcp.settings import GcpSettings


class _Cfg:
    def section(self, name: str):
        return GcpSettings(project="aios-test") if name == "gcp" else None


def test_gcp_host_env_resolves_as_config_on_the_workers(tmp_path):
    hosts = [
        ClusterHost(i, f"10.0.0.{i + 1}", f"10.128.0.{i + 1}", ssh_user="aios") for i in range(2)
    ]
    info = ClusterInfo("tpu", "gcp", "us-central2-b", "v4-16", READY, spot=True, hosts=hosts)
    rec = ClusterRecord(
        name="tpu",
        cloud="gcp",
        zone="us-central2-b",
        accelerator="v4-16",
        spot=True,
        state=READY,
        hosts=[{"worker_id": h.worker_id, "ip": h.ip, "internal_ip": h.internal_ip} for h in hosts],
        ssh_user="aios",
    )
    provider = GcpProvider(_Cfg())
    spec = JobSpec(
        script="train.py",
        backend="xla",
        python=provider.python("v4-16"),
        checkpoint_dir="gs://ckpt/run1",
    )
    config = resolve(environ={}, check_backend=False)
    base = job_env(spec, provider.remote_env(info), environ={})
    plans = host_commands(rec, spec, config)
    assert len(plans) == 2
    for plan in plans.values():
        run_sh = render_run_sh(rec, 1, plan, bundle=spec.bundle)
        exported = dict(re.findall(r'^export (AIOS_\w+)="?([^"\n]*)"?$', run_sh, re.M))
        env = {**base, **plan.env, **exported}
        names = sorted(
            k
            for k in env
            if k.startswith("AIOS_") and k not in CONTROL_ENV and not k.startswith(CONTROL_PREFIXES)
        )
        assert names == ["AIOS_CHECKPOINT__DIR"], names
        assert resolve(environ=env, check_backend=False).checkpoint.dir == "gs://ckpt/run1"
        # a worker image with aios-core and the xla backend only (`--no-bundle`)
        code = (
            "import json, sys; from aios.config.schema import resolve; "
            "print(resolve(environ=json.load(sys.stdin), check_backend=False).checkpoint.dir)"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(env),
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "AIOS_PLUGINS": "aios-backend-xla"},
        )
        assert r.returncode == 0 and r.stdout.strip() == "gs://ckpt/run1", r.stderr
        # the env file start_job writes: the compile cache lands in that worker's home
        home = tmp_path / f"worker{plan.host.worker_id}"
        src = env_file({**base, **plan.env}) + "printenv XLA_PERSISTENT_CACHE_PATH\n"
        r = subprocess.run(
            ["bash", "-c", src],
            capture_output=True,
            text=True,
            env={"HOME": str(home), "PATH": os.environ["PATH"]},
        )
        assert r.stdout.strip() == f"{home}/.cache/aios/xla-compile", r.stderr
