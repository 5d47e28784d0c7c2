"""The aios cloud commands with --cloud gcp: dry runs, bad input, zone failover, catalog and cost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


def _project(tmp_path: Path) -> Path:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hello from', __import__('socket').gethostname())\n")
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(b"x" * 100)
    return work


def test_torchtpu_launch_installs_the_torch_tpu_set_not_torch_xla(
    tmp_path, bare_tpu, gcp_env, aios_cli
):
    """--backend tpu (TorchTPU): host setup installs aios.plugins.versions' torch_tpu set; torch_xla
    (which pins another torch) is never installed."""
    from aios.plugins.versions import STACKS

    work = _project(tmp_path)
    env = gcp_env(tmp_path, bare_tpu)
    args = ["launch", "--cloud", "gcp", "-a", "v5litepod-8", "--name", "tt", "--zone"]
    args += ["us-central1-a", "--workdir", str(work), "--dry-run"]
    r = aios_cli(env, *args, "--backend", "tpu", "train.py")
    assert r.returncode == 0, r.stderr
    pins = STACKS["torch_tpu"][0].install.removeprefix("pip install ")
    assert "torch==2.13.0" in pins and "torch_tpu==" in pins
    # into a Python 3.12 venv: the image's python3 is 3.10, torch_tpu has cp311/cp312 wheels only
    assert f"~/.aios/torch-tpu-venv/bin/python -m pip install --quiet {pins}" in r.stdout
    assert f"python3 -m pip install --quiet {pins}" not in r.stdout
    # the printed per-worker line expands ~ on the host, as run.sh does (never '~/...')
    assert "TORCH_TPU_TIER2_COMPILATION_CACHE=~/" in r.stdout and "'~/" not in r.stdout
    assert "torch_xla" not in r.stdout
    # the default backend of a TPU (xla) still gets the torch_xla set
    x = aios_cli(env, *args, "train.py")
    assert x.returncode == 0, x.stderr
    assert "torch_xla[tpu]~=2.9.0" in x.stdout and "torch_tpu" not in x.stdout
    assert bare_tpu.calls == []


def test_gcp_dry_run_prints_gcloud_and_per_worker_commands_and_touches_nothing(
    tmp_path, bare_tpu, gcp_env, aios_cli
):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, bare_tpu, WANDB_API_KEY="sekrit-value-123")
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "dry",
        "--spot",
        "--zone",
        "us-central2-b",
        "--max-restarts",
        "3",
        "--checkpoint-dir",
        "gs://b/ckpt",
        "--env",
        "WANDB_API_KEY",
        "--env",
        "LOG=1",
        "--workdir",
        str(work),
        "--dry-run",
        "train.py",
        "--",
        "--lr",
        "0.1",
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert (
        "gcloud compute tpus tpu-vm create dry --project=aios-test --zone=us-central2-b "
        "--accelerator-type=v4-16 --version=tpu-ubuntu2204-base --spot" in out
    )
    assert "us-central2-c" in out  # where it fails over to
    # setup: the pinned torch / torch_xla[tpu] set from the libtpu index
    assert "torch_xla[tpu]~=2.9.0" in out and "libtpu-releases" in out
    # per worker: the backend-xla launch plan for 2 hosts (PJRT on TPU), env included
    assert "(worker 0, <worker-0-ip>)" in out and "(worker 1, <worker-1-ip>)" in out
    assert "PJRT_DEVICE=TPU" in out and "AIOS_CHECKPOINT__DIR=gs://b/ckpt" in out and "LOG=1" in out
    assert "train.py --lr 0.1" in out
    assert "sekrit-value-123" not in out + r.stderr
    assert "1 files" in out  # data/ is never synced
    # nothing touched: no API call, no state written
    assert bare_tpu.calls == []
    assert not (Path(env["AIOS_HOME"]) / "state.db").exists()
    q = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v5litepod-8",
        "--queued",
        "--valid-until",
        "+6h",
        "--name",
        "q",
        "--workdir",
        str(work),
        "--dry-run",
        "train.py",
    )
    assert (
        q.returncode == 0
        and "gcloud compute tpus queued-resources create q --node-id=q" in q.stdout
    )
    # "+6h" made absolute once (every zone of the failover queues against the same deadline)
    assert "--valid-until-time=20" in q.stdout and bare_tpu.calls == []


@pytest.mark.parametrize(
    "args,expect",
    [
        (["-a", "v9-8"], "unknown accelerator 'v9-8'"),
        (["-a", "v4-16", "--zone", "us-west4-a"], "zone 'us-west4-a' does not offer v4-16"),
        (
            ["-a", "v4-16", "--ssh-key", "/nonexistent/id_ed25519"],
            "SSH key /nonexistent/id_ed25519 does not exist",
        ),
        (["-a", "v4-16", "--max-restarts", "2"], "--max-restarts needs --checkpoint-dir"),
        (["-a", "v4-16", "--env", "WANDB_API_KEY=abc"], "puts a secret on the command line"),
        (["-a", "v4-16", "--valid-until", "+1h"], "only apply to queued resources"),
        (["-a", "v4-16", "--name", "Bad_Name"], "cluster name 'Bad_Name' is invalid"),
    ],
)
def test_gcp_bad_input_is_one_line_exit_2_and_creates_nothing(
    tmp_path, bare_tpu, gcp_env, aios_cli, args, expect
):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, bare_tpu)
    r = aios_cli(env, "launch", "--cloud", "gcp", *args, "--workdir", str(work), "train.py")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert bare_tpu.nodes == {} and not any(m == "POST" for m, _ in bare_tpu.calls)


def test_gcp_missing_project_and_credentials(tmp_path, bare_tpu, gcp_env, aios_cli):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, bare_tpu)
    del env["AIOS_GCP__PROJECT"]
    env["PATH"] = str(Path(sys.executable).parent) + ":/usr/bin:/bin"  # no gcloud here
    r = aios_cli(env, "launch", "--cloud", "gcp", "-a", "v4-16", "--workdir", str(work), "train.py")
    assert (
        r.returncode == 2
        and "no GCP project is set" in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )
    env = gcp_env(
        tmp_path,
        bare_tpu,
        AIOS_GCP__CREDENTIALS="auto",
        GOOGLE_APPLICATION_CREDENTIALS="/nonexistent.json",
        NO_GCE_CHECK="True",
    )
    env["PATH"] = str(Path(sys.executable).parent) + ":/usr/bin:/bin"
    r = aios_cli(env, "launch", "--cloud", "gcp", "-a", "v4-16", "--workdir", str(work), "train.py")
    assert r.returncode == 2 and "no Google Cloud credentials found" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert bare_tpu.calls == [] and bare_tpu.nodes == {}


def test_gcp_launch_fails_over_to_the_next_zone(tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, fake_tpu)
    fake_tpu.inject_stockout("us-central2-b")
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "fo",
        "--backend",
        "cpu",
        "--python",
        sys.executable,
        "--no-setup",
        "--workdir",
        str(work),
        "--poll",
        "0.3",
        "train.py",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "us-central2-b: stockout" in r.stderr and "trying us-central2-c" in r.stderr
    assert [n.zone for n in fake_tpu.nodes.values()] == ["us-central2-c"]
    st = json.loads(aios_cli(env, "status", "--json").stdout)[0]
    assert st["zone"] == "us-central2-c"
    assert any(
        e["kind"] == "failover" and "us-central2-b: stockout" in e["message"]
        for e in st["recoveries"]
    )
    fake_tpu.set_health("fo", "UNHEALTHY_TENSORFLOW")
    st = json.loads(aios_cli(env, "status", "fo", "--refresh", "--json").stdout)[0]
    assert st["state"] == "READY/UNHEALTHY_TENSORFLOW"
    fake_tpu.set_health("fo", "HEALTHY")
    # dry runs of the lifecycle commands print gcloud and change nothing
    d = aios_cli(env, "down", "fo", "--dry-run")
    assert (
        "gcloud compute tpus tpu-vm delete fo --project=aios-test --zone=us-central2-c --quiet"
        in d.stdout
    )
    s = aios_cli(env, "stop", "fo", "--dry-run")
    assert "gcloud compute tpus tpu-vm stop fo" in s.stdout
    e = aios_cli(env, "exec", "fo", "--dry-run", "nproc")
    assert e.stdout.count("ssh -i ") == 2 and "HostKeyAlias=aios-fo-w1" in e.stdout
    ssh = aios_cli(env, "ssh", "fo", "-w", "1", "hostname")
    assert ssh.returncode == 0 and ssh.stdout.strip().endswith("-w1"), ssh.stdout + ssh.stderr
    assert "BatchMode=yes" in aios_cli(env, "ssh", "fo", "--dry-run").stdout
    assert fake_tpu.node("fo").body["state"] == "READY"
    assert aios_cli(env, "down", "fo").returncode == 0 and fake_tpu.nodes == {}


def test_gcp_failed_launch_leaves_no_resource(tmp_path, sshd_hosts, fake_tpu, gcp_env, aios_cli):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, fake_tpu)
    # every zone stocked out: exit 2, one line naming the zones, the failed nodes deleted
    fake_tpu.inject_stockout("us-central2-b")
    fake_tpu.inject_stockout("us-central2-c")
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "nope",
        "--workdir",
        str(work),
        "train.py",
    )
    assert r.returncode == 2, r.stderr
    assert (
        "could not create v4-16 in any zone: tried us-central2-b (stockout), us-central2-c (stockout)"
        in r.stderr.splitlines()[-1]
    )
    assert fake_tpu.nodes == {} and fake_tpu.count("DELETE", "/nodes/nope") >= 2
    assert json.loads(aios_cli(env, "status", "--json").stdout) == []
    # created, then setup fails on the hosts: the cluster is deleted again
    (work / "setup.sh").write_text("echo broken >&2; exit 7\n")
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--name",
        "nope",
        "--python",
        sys.executable,
        "--backend",
        "cpu",
        "--setup-script",
        str(work / "setup.sh"),
        "--workdir",
        str(work),
        "train.py",
    )
    assert r.returncode == 2, r.stderr
    assert "setup failed on 2 of 2 hosts" in r.stderr and "deleting nope" in r.stderr
    assert fake_tpu.nodes == {} and json.loads(aios_cli(env, "status", "--json").stdout) == []


def test_gcp_catalog_and_cost(tmp_path, bare_tpu, gcp_env, aios_cli):
    env = gcp_env(tmp_path, bare_tpu)
    r = aios_cli(env, "catalog", "--cloud", "gcp", "--json")
    assert r.returncode == 0
    cat = {e["accelerator"]: e for e in json.loads(r.stdout)}
    v5e = cat["v5litepod-8"]
    assert v5e["devices"] == 8 and v5e["hosts"] == 1 and v5e["runtime"] == "v2-alpha-tpuv5-lite"
    assert v5e["spot_hourly"] < v5e["on_demand_hourly"] and v5e["peak_tflops"] == pytest.approx(
        8 * 197.0
    )
    assert cat["v4-16"]["hosts"] == 2 and cat["v6e-4"]["runtime"] == "v2-alpha-tpuv6e"
    r = aios_cli(env, "cost", "--cloud", "gcp", "-a", "v4-16", "--hours", "10", "--json")
    est = json.loads(r.stdout)[0]
    assert est["on_demand_usd"] == pytest.approx(10 * cat["v4-16"]["on_demand_hourly"])
    r = aios_cli(
        env,
        "cost",
        "--cloud",
        "gcp",
        "--params",
        "1.3B",
        "--tokens",
        "26B",
        "--spot",
        "--json",
        "--top",
        "50",
    )
    rank = json.loads(r.stdout)
    assert rank["flops"] == pytest.approx(6 * 1.3e9 * 26e9)
    spot = [x["spot_usd"] for x in rank["ranking"]]
    priced = [x for x in spot if x is not None]  # unpriced types (tpu7x) sort last
    assert spot[: len(priced)] == sorted(priced) and len(priced) > 5
    first = rank["ranking"][0]
    peak = cat[first["accelerator"]]["peak_tflops"]
    assert first["hours"] == pytest.approx(6 * 1.3e9 * 26e9 / (peak * 1e12 * 0.4) / 3600, rel=1e-3)
    assert aios_cli(env, "cost", "--params", "lots", "--tokens", "1B").returncode == 2
    assert bare_tpu.calls == []
