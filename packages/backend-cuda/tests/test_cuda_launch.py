"""Launch plans: one process per visible GPU, NCCL/EFA presets for P4d/P5, explicit env wins,
and `aios-run --backend cuda --dry-run` printing them without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.config.schema import resolve
from aios.errors import ConfigError, LaunchError
from aios.testing.launch import AIOS_RUN
from aios.types import Host, LaunchRequest
from aios_backend_cuda import launch
from aios_backend_cuda.launch import choose_preset, cuda_launch_plan, nccl_env


def _cfg(*overrides: str, **flags):
    return resolve(overrides=list(overrides), flags=flags, environ={}, check_backend=False)


def test_p5_instance_plan_for_cloud_hosts() -> None:
    cfg = _cfg()
    hosts = [Host("10.0.0.1", "10.0.0.1", 0), Host("10.0.0.2", "10.0.0.2", 1)]
    req = LaunchRequest(
        script="train.py", args=["--lr", "3e-4"], hosts=hosts, accelerator="p5.48xlarge"
    )
    plan = cuda_launch_plan(cfg, req, environ={})
    assert plan.world_size == 16 and plan.launcher == "elastic"
    assert [h.nprocs for h in plan.hosts] == [8, 8]
    env = plan.hosts[1].env
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NCCL_NET_GDR_LEVEL"] == "PHB" and "NCCL_IB_HCA" in env
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    cmd = plan.hosts[1].command
    assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
    assert cmd[cmd.index("--rdzv-endpoint") + 1].startswith("10.0.0.1:")
    assert any(
        "NCCL preset: p5 (instance type p5.48xlarge: EFA with RDMA read)" in n for n in plan.notes
    )
    assert any("8x H100" in n for n in plan.notes)


def test_p4d_preset_and_explicit_env_wins() -> None:
    cfg = _cfg("cuda.nccl_debug=INFO")
    req = LaunchRequest(script="t.py", hosts=[Host("a"), Host("b")], accelerator="p4d.24xlarge")
    plan = cuda_launch_plan(cfg, req, environ={"NCCL_SOCKET_IFNAME": "ens32"})
    env = plan.hosts[0].env
    assert (
        "NCCL_SOCKET_IFNAME" not in env
    )  # the user's exported value reaches the workers untouched
    assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa"
    assert any("kept from your environment: NCCL_SOCKET_IFNAME=ens32" in n for n in plan.notes)


def test_remote_plan_ignores_this_machines_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "wlan0")  # the laptop running `aios launch`
    plan = cuda_launch_plan(
        _cfg("cuda.nccl_socket_ifname=ens32"),
        LaunchRequest(script="t.py", hosts=[Host("a"), Host("b")], accelerator="p5.48xlarge"),
    )
    assert plan.hosts[0].env["NCCL_SOCKET_IFNAME"] == "ens32"


def test_preset_none_and_single_node_auto() -> None:
    env, notes = nccl_env(_cfg("cuda.nccl_preset=none"), "p5.48xlarge", 2, environ={})
    assert not any(k.startswith(("FI_", "NCCL_")) for k in env)
    assert choose_preset("auto", None, 1)[0] == "none"
    # a single p5/p4d is launched without EFA (aws.efa=auto): the EFA preset would break NCCL
    assert (
        choose_preset("auto", "p5.48xlarge", 1)[0] == "none"
        and choose_preset("auto", "p4d.24xlarge", 1)[0] == "none"
    )
    assert choose_preset("auto", "g5.12xlarge", 2)[0] in ("none", "efa", "ib")


def test_auto_detects_local_efa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rdmap16s27").mkdir()
    monkeypatch.setattr(launch, "INFINIBAND_SYSFS", str(tmp_path))
    name, why = choose_preset("auto", None, 2)
    assert name == "efa" and "EFA" in why
    (tmp_path / "rdmap16s27").rmdir()
    (tmp_path / "mlx5_0").mkdir()
    assert choose_preset("auto", None, 2)[0] == "ib"


def _fabric(instance_type: str) -> dict[str, str]:
    hosts = [Host("10.0.0.1", "10.0.0.1", 0), Host("10.0.0.2", "10.0.0.2", 1)]
    plan = cuda_launch_plan(
        _cfg(), LaunchRequest(script="t.py", hosts=hosts, accelerator=instance_type)
    )
    return {k: v for k, v in plan.hosts[0].env.items() if k.startswith(("FI_", "NCCL_"))}


@pytest.mark.parametrize("local", [None, "rdmap16s27", "mlx5_0"])
def test_g5_and_p5_plans_get_the_fabric_aws_documents_whatever_this_machine_has(
    local: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS: RDMA read on Nitro v4 and later; g5 is Nitro v3 (EFA without RDMA read), p5 is v5.
    libfabric aborts with FI_EFA_USE_DEVICE_RDMA=1 on a device without RDMA read. The plan is
    for the hosts of the instance type: the devices of the machine planning it (an EFA or
    InfiniBand laptop/login node here) change nothing."""
    sysfs = tmp_path / "infiniband"
    sysfs.mkdir()
    if local:
        (sysfs / local).mkdir()
    monkeypatch.setattr(launch, "INFINIBAND_SYSFS", str(sysfs))
    g5, p5 = _fabric("g5.48xlarge"), _fabric("p5.48xlarge")
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    assert "NCCL_NET_GDR_LEVEL" not in g5 and "NCCL_IB_HCA" not in g5
    assert p5["FI_PROVIDER"] == "efa" and p5["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert p5["NCCL_NET_GDR_LEVEL"] == "PHB"
    # a g5 size without EFA, and a type the EFA table does not list: no fabric at all
    assert _fabric("g5.2xlarge") == {}
    assert _fabric("g6.12xlarge") == {}


def test_the_efa_table_follows_the_nitro_generation() -> None:
    from aios.devices.efa import efa_family, efa_interfaces, fabric_env

    for itype in ("g4dn.metal", "g5.48xlarge", "p3dn.24xlarge"):
        assert efa_family(itype).nitro == 3 and not efa_family(itype).rdma_read, itype
        assert fabric_env(itype) == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}, itype
    for itype in ("p4d.24xlarge", "p5.48xlarge", "trn1.32xlarge", "trn2.48xlarge"):
        assert efa_family(itype).rdma_read, itype
        assert fabric_env(itype)["FI_EFA_USE_DEVICE_RDMA"] == "1", itype
    assert [efa_interfaces(t) for t in ("p5.48xlarge", "p4d.24xlarge", "g5.48xlarge")] == [
        32,
        4,
        1,
    ]
    assert efa_interfaces("g5.xlarge") == 0 and fabric_env("g5.xlarge") == {}
    assert choose_preset("auto", "g5.48xlarge", 2)[0] == "efa"
    assert choose_preset("auto", "trn1.32xlarge", 2)[0] == "efa-rdma"


def test_bad_preset_and_instance_are_errors() -> None:
    with pytest.raises(ConfigError):
        _cfg("cuda.nccl_preset=p9")
    with pytest.raises(LaunchError) as err:
        cuda_launch_plan(_cfg(), LaunchRequest(script="t.py", accelerator="p9.huge"), environ={})
    assert "p5.48xlarge" in err.value.fix


def test_local_plan_one_process_per_visible_gpu(
    recorded_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_host("p4d.24xlarge-8xa100.json")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    plan = cuda_launch_plan(_cfg(), LaunchRequest(script="t.py"), environ={})
    assert plan.world_size == 4 and plan.hosts[0].nprocs == 4
    assert plan.hosts[0].env["OMP_NUM_THREADS"]
    with pytest.raises(LaunchError):
        cuda_launch_plan(_cfg(nprocs=6), LaunchRequest(script="t.py"), environ={})


def test_rank_threads_come_from_the_cpus_this_process_may_use(
    recorded_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OMP_NUM_THREADS from this process's affinity (a Slurm task bound to its CPUs, a cpuset),
    not the machine's CPU count, shared among the ranks; a value the user set wins."""
    recorded_host("p4d.24xlarge-8xa100.json")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    plan = cuda_launch_plan(_cfg(), LaunchRequest(script="t.py"), environ={})
    assert plan.hosts[0].env["OMP_NUM_THREADS"] == str(len(before))  # one rank: all its CPUs
    try:
        os.sched_setaffinity(0, {min(before)})  # what a task bound to one CPU sees
        plan = cuda_launch_plan(_cfg(), LaunchRequest(script="t.py"), environ={})
    finally:
        os.sched_setaffinity(0, before)
    assert plan.hosts[0].env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own: no plan value overrides it
    plan = cuda_launch_plan(_cfg(), LaunchRequest(script="t.py"), environ={})
    assert "OMP_NUM_THREADS" not in plan.hosts[0].env
    # planned here for remote hosts: each host counts its own CPUs (the cloud's run.sh)
    monkeypatch.delenv("OMP_NUM_THREADS")
    hosts = [Host("10.0.0.1", worker_id=0), Host("10.0.0.2", worker_id=1)]
    plan = cuda_launch_plan(
        _cfg(), LaunchRequest(script="t.py", hosts=hosts), gpus_per_host=8, environ={}
    )
    assert all("OMP_NUM_THREADS" not in h.env for h in plan.hosts)


def test_no_gpu_here_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from aios_backend_cuda import nvml, probe

    monkeypatch.delenv("AIOS_TEST_NVML_RECORDING", raising=False)
    monkeypatch.setattr(
        nvml, "open_source", lambda: (_ for _ in ()).throw(nvml.NvmlUnavailable("no NVML"))
    )
    monkeypatch.setattr(probe, "PROC_NVIDIA_GPUS", str(tmp_path / "none"))
    with pytest.raises(LaunchError) as err:
        cuda_launch_plan(_cfg(), LaunchRequest(script="t.py"), environ={})
    assert "no visible NVIDIA GPU" in err.value.message


def _env(rec: Path | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "CUDA_VISIBLE", "NCCL_", "FI_"))
    }
    if rec is not None:
        env["AIOS_TEST_NVML_RECORDING"] = str(rec)
    env.update(extra)
    return env


def test_aios_run_dry_run_shows_plan_without_torch(recorded_host, tmp_path: Path) -> None:
    rec = recorded_host("p5.48xlarge-8xh100.json", torch_version="2.4.0+cu121")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code = (
        "import sys; from aios.cli.run import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n"
        "    assert 'torch' not in sys.modules, 'dry-run imported torch'\n    raise\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--backend",
            "cuda",
            "--dry-run",
            "--json",
            "--nnodes",
            "2",
            "--master-addr",
            "10.1.2.3",
            "cuda.nccl_preset=p5",
            str(script),
        ],
        env=_env(rec),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["backend"] == "cuda" and plan["world_size"] == 16
    host = plan["hosts"][0]
    assert host["nprocs"] == 8 and host["env"]["FI_PROVIDER"] == "efa"
    assert "NCCL_NET_GDR_LEVEL=PHB" in host["shell"]
    assert plan["devices"]["count"] == 8
    assert plan["devices"]["topology"]["links"][1][2] == "NV18"


def test_aios_run_cuda_unavailable_is_one_line_error(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = subprocess.run(
        [*AIOS_RUN, "--backend", "cuda", str(script)],
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    if out.returncode == 0:
        pytest.skip("this machine has a usable NVIDIA GPU")
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "backend 'cuda' is not available here" in lines[0]
    assert "Traceback" not in out.stderr and "hi" not in out.stdout
