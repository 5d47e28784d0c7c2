"""The exact environment `aios launch --cloud aws` gives the training processes on the hosts must
resolve as an aios config there: on the hosts every AIOS_* name outside the reserved ones
(AIOS_RUN_*, AIOS_INTERNAL_*, AIOS_TEST_*, a few control names) is parsed as a config key, and a key
of a plugin the host's aios lacks is an error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from aios.config.schema import CONTROL_ENV, CONTROL_PREFIXES, resolve
from aios_cloud.jobs import JobSpec, host_commands, job_env, render_run_sh
from aios_cloud.provider.data import ClusterHost, ClusterInfo
from aios_cloud.provider.states import READY
from aios_cloud.store import ClusterRecord
from aios_cloud_aws.provider import AwsProvider
from aios_cloud_aws.settings import AwsSettings


def _host_envs(backend: str, accelerator: str, spot: bool) -> list[dict[str, str]]:
    """What each host's processes get: job env (provider env, --env, checkpoint dir), the backend
    plan's env, and run.sh's own exports, assembled by the same functions start_job uses."""
    hosts = [
        ClusterHost(i, f"10.0.0.{i + 1}", f"172.31.0.{i + 1}", ssh_user="ubuntu") for i in range(2)
    ]
    info = ClusterInfo(
        "gpt",
        "aws",
        "us-east-1a",
        accelerator,
        READY,
        spot=spot,
        hosts=hosts,
        raw={"region": "us-east-1"},
    )
    rec = ClusterRecord(
        name="gpt",
        cloud="aws",
        zone="us-east-1a",
        accelerator=accelerator,
        spot=spot,
        state=READY,
        hosts=[{"worker_id": h.worker_id, "ip": h.ip, "internal_ip": h.internal_ip} for h in hosts],
        ssh_user="ubuntu",
    )
    provider = AwsProvider(settings=AwsSettings())
    spec = JobSpec(
        script="train.py",
        backend=backend,
        python=provider.python(accelerator),
        env={"WANDB_PROJECT": "gpt"},
        checkpoint_dir="s3://ckpt/run1",
    )
    config = resolve(environ={}, check_backend=False)
    base = job_env(spec, provider.remote_env(info), environ={})
    out = []
    for plan in host_commands(rec, spec, config).values():
        run_sh = render_run_sh(rec, 1, plan, bundle=spec.bundle)
        exported = dict(re.findall(r'^export (AIOS_\w+)="?([^"\n]*)"?$', run_sh, re.M))
        out.append({**base, **plan.env, **exported})
    return out


@pytest.mark.parametrize(
    "backend,accelerator", [("cuda", "p5.48xlarge"), ("neuron", "trn1.32xlarge")]
)
def test_aws_host_env_resolves_as_config_on_the_hosts(backend, accelerator, monkeypatch):
    envs = _host_envs(backend, accelerator, spot=True)
    assert len(envs) == 2
    for env in envs:
        config_names = sorted(
            k
            for k in env
            if k.startswith("AIOS_") and k not in CONTROL_ENV and not k.startswith(CONTROL_PREFIXES)
        )
        # the only config key the cloud layer sets is the one it means to: checkpoint.dir
        assert config_names == ["AIOS_CHECKPOINT__DIR"], config_names
        cfg = resolve(environ=env, check_backend=False)  # a host with this aios and its plugins
        assert cfg.checkpoint.dir == "s3://ckpt/run1"
        assert env["AIOS_RUN_SPOT_WATCH"] == "1" and env["AIOS_RUN_STATUS_DIR"] == "$D/status"
    # a host whose image has aios-core and the backend only (`--no-bundle`): still resolves
    code = (
        "import json, sys; from aios.config.schema import resolve; "
        "c = resolve(environ=json.load(sys.stdin), check_backend=False); print(c.checkpoint.dir)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(envs[1]),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_PLUGINS": f"aios-backend-{backend}"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "s3://ckpt/run1", r.stderr


def test_aws_spot_hosts_turn_the_spot_notice_watcher_on(monkeypatch):
    """aws.spot_watch=auto on a spot host watches the notice even where on_ec2() cannot tell
    (here: not EC2); on on-demand hosts nothing is set, and an explicit false still wins."""
    from aios.plugins.registry import get_registry, reset_registry

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")
    reset_registry()

    def watchers(env: dict[str, str], overrides: list[str] = ()) -> list[str]:
        for k in ("AIOS_RUN_SPOT_WATCH",):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        cfg = resolve(overrides=list(overrides), environ=env, check_backend=False)
        results = get_registry().call_all("aios_preemption_watchers", config=cfg)
        return [
            w.name for plugin, ws, exc in results if plugin == "aios-cloud-aws" for w in (ws or [])
        ]

    assert watchers(_host_envs("cuda", "p5.48xlarge", spot=True)[0]) == ["aws-spot"]
    on_demand = _host_envs("cuda", "p5.48xlarge", spot=False)[0]
    assert "AIOS_RUN_SPOT_WATCH" not in on_demand
    assert watchers(_host_envs("cuda", "p5.48xlarge", spot=True)[0], ["aws.spot_watch=false"]) == []
