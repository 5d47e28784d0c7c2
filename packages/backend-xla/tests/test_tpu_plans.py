"""TorchTPU (backend ``tpu``): launch plans for single-host, multi-host and multislice slices,
runtime choice (``xla.runtime``), bad input, the per-host launcher's environment, the ``tpu-vm``
cluster environment. Pure Python: nothing here imports torch, torch_tpu or libtpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aios.config.schema import resolve
from aios.errors import AiosError, BackendUnavailable, ConfigError, LaunchError
from aios.types import Host, LaunchRequest
from aios_backend_xla import tpu as T
from aios_backend_xla.cluster_tpu import TpuVmEnvironment
from aios_backend_xla.discovery import TpuFacts
from aios_backend_xla.tpu_launcher import host_env, rank_envs

NO_TPU = TpuFacts()


@pytest.fixture
def cfg(clean_env):
    def make(*overrides, **flags):
        return resolve(
            overrides=["backend=tpu", *overrides], flags=flags, environ={}, check_backend=False
        )

    return make


def req(*hosts: Host) -> LaunchRequest:
    return LaunchRequest(script="train.py", args=["--lr", "1e-3"], hosts=list(hosts) or [Host()])


# (accelerator type, hosts, chips per host, TORCH_TPU_TOPOLOGY): v5e/v6e single host 1/4/8 chips,
# multi-host 4 chips per host; v4/v5p 4 chips per host (TorchTPU's own topology tables).
CASES = [
    ("v5litepod-4", 1, 4, "2,2,1"),
    ("v5litepod-8", 1, 8, "2,4,1"),
    ("v5litepod-16", 4, 4, "2,2,1"),
    ("v5p-8", 1, 4, "2,2,1"),
    ("v5p-16", 2, 4, "2,2,1"),
    ("v5p-32", 4, 4, "2,2,1"),
    ("v6e-1", 1, 1, "1,1,1"),
    ("v6e-4", 1, 4, "2,2,1"),
    ("v6e-8", 1, 8, "2,4,1"),
    ("v6e-16", 4, 4, "2,2,1"),
    ("v4-8", 1, 4, "2,2,1"),
    ("v4-16", 2, 4, "2,2,1"),
]


@pytest.mark.parametrize("acc,nhosts,per_host,topology", CASES)
def test_plan_env_per_slice(cfg, acc, nhosts, per_host, topology):
    plan = T.tpu_launch_plan(cfg(f"xla.accelerator={acc}"), req(), NO_TPU, python="python3")
    assert plan.backend == "tpu" and plan.launcher == "torch_tpu"
    assert plan.world_size == nhosts * per_host and len(plan.hosts) == nhosts
    names = [h.host.address for h in plan.hosts]
    for i, hp in enumerate(plan.hosts):
        env = hp.env
        assert hp.nprocs == per_host
        assert env["AIOS_RUN_BACKEND"] == "tpu" and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"
        assert env["TORCH_TPU_TOPOLOGY"] == topology
        assert hp.command[:5] == [
            "python3",
            "-m",
            "aios_backend_xla.tpu_launcher",
            "--nprocs",
            str(per_host),
        ]
        assert hp.command[5:] == ["train.py", "--lr", "1e-3"]
        assert [r["RANK"] for r in hp.ranks] == [str(i * per_host + j) for j in range(per_host)]
        if nhosts == 1:
            assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
                f"localhost:{8070 + j}" for j in range(per_host)
            )
            assert "NODE_RANK" not in env and "TPU_WORKER_HOSTNAMES" not in env
        else:
            assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
                f"{h}:{8070 + j}" for h in names for j in range(per_host)
            )
            assert (
                env["NNODES"] == str(nhosts)
                and env["NODE_RANK"] == str(i)
                and env["TPU_WORKER_ID"] == str(i)
            )
            assert env["MASTER_ADDR"] == names[0] and env["MASTER_PORT"] == "29500"
            assert env["TPU_WORKER_HOSTNAMES"] == ",".join(names)
    # the same slice-builder list on every host
    assert len({h.env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] for h in plan.hosts}) == 1


def test_given_hosts_use_internal_addresses(cfg):
    hosts = [Host("34.1.1.1", "10.0.0.1"), Host("34.1.1.2", "10.0.0.2")]
    plan = T.tpu_launch_plan(cfg("xla.accelerator=v5p-16"), req(*hosts), NO_TPU, python="py")
    assert plan.hosts[1].env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")[4] == "10.0.0.2:8070"
    assert plan.hosts[1].env["MASTER_ADDR"] == "10.0.0.1"


def test_base_port_and_caches(cfg):
    plan = T.tpu_launch_plan(
        cfg(
            "xla.accelerator=v6e-4", "xla.tpu_base_port=9000", "xla.tpu_compile_cache_dir=/data/tt"
        ),
        req(),
        NO_TPU,
    )
    env = plan.hosts[0].env
    assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].startswith("localhost:9000,localhost:9001")
    assert env["TORCH_TPU_TIER2_COMPILATION_CACHE"] == "/data/tt/tier2"
    assert env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == "/data/tt/tier3"
    off = (
        T.tpu_launch_plan(cfg("xla.accelerator=v6e-4", "xla.tpu_compile_cache_dir="), req(), NO_TPU)
        .hosts[0]
        .env
    )
    assert "TORCH_TPU_TIER2_COMPILATION_CACHE" not in off


def test_default_cache_is_persistent_under_home_and_stays_unexpanded_for_remote_hosts(cfg):
    plan = T.tpu_launch_plan(cfg("xla.accelerator=v6e-16"), req(), NO_TPU)
    assert (
        plan.hosts[0].env["TORCH_TPU_TIER2_COMPILATION_CACHE"]
        == "~/.cache/aios/torch-tpu-compile/tier2"
    )
    local = T.tpu_launch_plan(cfg("xla.accelerator=v6e-4"), req(), NO_TPU)
    assert local.hosts[0].env["TORCH_TPU_TIER2_COMPILATION_CACHE"] == os.path.expanduser(
        "~/.cache/aios/torch-tpu-compile/tier2"
    )


def test_multislice_megascale_env(cfg):
    plan = T.tpu_launch_plan(
        cfg("xla.accelerator=v5p-16", "xla.num_slices=2"), req(), NO_TPU, python="py"
    )
    assert len(plan.hosts) == 4 and plan.world_size == 16
    names = [h.host.address for h in plan.hosts]
    assert names == [
        "tpu-slice0-worker-0",
        "tpu-slice0-worker-1",
        "tpu-slice1-worker-0",
        "tpu-slice1-worker-1",
    ]
    coord = {h.env["MEGASCALE_COORDINATOR_ADDRESS"] for h in plan.hosts}
    assert coord == {"tpu-slice0-worker-0:8080"}
    assert [h.env["MEGASCALE_SLICE_ID"] for h in plan.hosts] == ["0", "0", "1", "1"]
    assert {h.env["MEGASCALE_NUM_SLICES"] for h in plan.hosts} == {"2"}
    assert [h.env["NODE_RANK"] for h in plan.hosts] == ["0", "1", "2", "3"]
    # each slice builds its own ICI slice
    assert (
        plan.hosts[2].env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].startswith("tpu-slice1-worker-0:8070")
    )
    assert plan.hosts[3].ranks[-1]["RANK"] == "15"


def test_bad_nprocs_and_host_counts(cfg):
    with pytest.raises(LaunchError, match="one process per chip"):
        T.tpu_launch_plan(cfg("xla.accelerator=v6e-16", nprocs=2), req(), NO_TPU)
    with pytest.raises(LaunchError, match="no topology for 3 chips"):
        T.tpu_launch_plan(cfg("xla.accelerator=v6e-8", nprocs=3), req(), NO_TPU)
    assert (
        T.tpu_launch_plan(cfg("xla.accelerator=v6e-8", nprocs=4), req(), NO_TPU)
        .hosts[0]
        .env["TORCH_TPU_TOPOLOGY"]
        == "2,2,1"
    )
    with pytest.raises(LaunchError, match="have 4 hosts but 3 were given"):
        T.tpu_launch_plan(
            cfg("xla.accelerator=v5p-16", "xla.num_slices=2"),
            req(Host("a"), Host("b"), Host("c")),
            NO_TPU,
        )
    with pytest.raises(ConfigError, match="does not drive TPU v3"):
        T.tpu_launch_plan(cfg("xla.accelerator=v3-8"), req(), NO_TPU)


def test_runtime_setting_contradicting_the_backend_is_one_line(cfg):
    with pytest.raises(ConfigError) as ei:
        T.tpu_launch_plan(cfg("xla.accelerator=v6e-4", "xla.runtime=torch_xla"), req(), NO_TPU)
    assert ei.value.one_line() == (
        "--backend tpu runs TorchTPU, but xla.runtime=torch_xla is set; "
        "use --backend xla for torch_xla, or set xla.runtime=auto (or torch_tpu)"
    )
    with pytest.raises(ConfigError, match="use --backend tpu for TorchTPU"):
        T.check_backend_runtime("xla", cfg("xla.runtime=torch_tpu"))


def test_no_tpu_and_nothing_planned_is_unavailable(cfg):
    with pytest.raises(BackendUnavailable, match="backend 'tpu': no TPU was found"):
        T.tpu_launch_plan(cfg(), req(), NO_TPU)


# ------------------------------------------------------------------------------ preflight (metadata only)

GOOD = {"torch_tpu": "0.2.0", "torch": "2.13.0", "libtpu": "0.0.52", "numpy": "2.1.0"}


def test_preflight_passes_a_good_set():
    assert T.preflight(host="w0", versions=GOOD).name == "TorchTPU 0.2"


def test_preflight_torch_outside_range_names_host_installed_and_expected():
    with pytest.raises(AiosError) as ei:
        T.preflight(host="tpu-w1", versions={**GOOD, "torch": "2.16.0"})
    assert ei.value.one_line().startswith(
        "tpu-w1: torch 2.16.0 is installed, TorchTPU 0.2 needs torch>=2.11,<=2.15"
    )


def test_preflight_libtpu_missing_is_detected_before_any_import():
    with pytest.raises(BackendUnavailable) as ei:
        T.preflight(host="h", versions={**GOOD, "libtpu": None})
    assert ei.value.one_line() == (
        "libtpu is not installed: importing torch_tpu would exit the process; "
        "pip install 'libtpu>=0.0.50' (torch_tpu's dependency)"
    )


def test_preflight_runtime_torch_tpu_without_the_package(cfg):
    with pytest.raises(
        BackendUnavailable,
        match="xla.runtime=torch_tpu is set but torch_tpu is not installed; pip install torch==2.13.0 torch_tpu==0.2.0",
    ):
        T.preflight(versions={**GOOD, "torch_tpu": None}, config=cfg("xla.runtime=torch_tpu"))


# ------------------------------------------------------------------------------ launcher env


def test_launcher_completes_gke_pod_env_from_job_completion_index():
    environ = {
        "TPU_WORKER_HOSTNAMES": "p0.svc,p1.svc,p2.svc,p3.svc",
        "JOB_COMPLETION_INDEX": "2",
        "TORCH_TPU_TOPOLOGY": "2,2,1",
        "TPU_SKIP_MDS_QUERY": "1",
    }
    env = host_env(environ, 4, "p2")
    assert env["NODE_RANK"] == "2" and env["AIOS_RUN_NODE_RANK"] == "2" and env["NNODES"] == "4"
    assert env["MASTER_ADDR"] == "p0.svc" and env["MASTER_PORT"] == "29500"
    assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")[8:10] == [
        "p2.svc:8070",
        "p2.svc:8071",
    ]
    assert "TORCH_TPU_TOPOLOGY" not in env  # already set: never overwritten
    ranks = rank_envs({**environ, **env}, 4)
    assert [r["RANK"] for r in ranks] == ["8", "9", "10", "11"] and ranks[0]["WORLD_SIZE"] == "16"


def test_launcher_sets_skip_mds_off_gce_and_autoload_on(monkeypatch):
    monkeypatch.setenv("AIOS_TEST_DMI_PRODUCT", "/nonexistent")
    env = host_env({}, 4, "dev-box")
    assert env["TPU_SKIP_MDS_QUERY"] == "1" and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"
    assert (
        "TORCH_TPU_SLICEBUILDER_ADDRESSES" not in env
    )  # single host: the plan's own values are used
    assert "TPU_SKIP_MDS_QUERY" not in host_env({"TPU_SKIP_MDS_QUERY": "0"}, 4, "x")


def test_launcher_gke_without_hostnames_is_an_error():
    with pytest.raises(LaunchError, match="TPU_WORKER_HOSTNAMES is not"):
        host_env({"JOB_COMPLETION_INDEX": "0"}, 4, "p0")


@pytest.mark.skipif(
    T.torch_tpu_installed(), reason="checks the error path where torch_tpu is absent"
)
def test_launcher_without_torch_tpu_is_exit_2_one_line_and_starts_nothing(tmp_path):
    script = tmp_path / "train.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = subprocess.run(
        [sys.executable, "-m", "aios_backend_xla.tpu_launcher", "--nprocs", "1", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "aios-backend-xla tpu launcher: error: torch_tpu (TorchTPU) is not installed; "
        "pip install torch==2.13.0 torch_tpu==0.2.0 (from the public registry; it brings "
        "libtpu>=0.0.50); or use torch_xla with --backend xla"
    ]
    assert not marker.exists()


# ------------------------------------------------------------------------------ cluster env


def test_tpu_vm_cluster_environment():
    ce = TpuVmEnvironment()
    assert not ce.detect({"TPU_WORKER_HOSTNAMES": "only-me"})  # single-host TPU VM: local
    env = {"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3", "TPU_WORKER_ID": "3", "MASTER_PORT": "1234"}
    assert ce.detect(env)
    info = ce.info(env)
    assert (
        info.name,
        info.nnodes,
        info.node_rank,
        info.master_addr,
        info.master_port,
        info.hosts,
    ) == ("tpu-vm", 4, 3, "w0", 1234, ("w0", "w1", "w2", "w3"))
    assert ce.info({"TPU_WORKER_HOSTNAMES": "a,b", "JOB_COMPLETION_INDEX": "1"}).node_rank == 1
    with pytest.raises(ConfigError, match="which one this is"):
        ce.info({"TPU_WORKER_HOSTNAMES": "a,b"})
    with pytest.raises(ConfigError, match="outside the 2 hosts"):
        ce.info({"TPU_WORKER_HOSTNAMES": "a,b", "TPU_WORKER_ID": "2"})


def test_cluster_detect_picks_tpu_vm_through_the_registry():
    from aios.environments.base import detect
    from aios.plugins.registry import get_registry

    info = detect({"TPU_WORKER_HOSTNAMES": "w0,w1", "TPU_WORKER_ID": "1"}, registry=get_registry())
    assert info.name == "tpu-vm" and info.node_rank == 1
    # torchelastic (a launcher already started the ranks) outranks it
    assert (
        detect(
            {"TPU_WORKER_HOSTNAMES": "w0,w1", "TPU_WORKER_ID": "1", "RANK": "0", "WORLD_SIZE": "8"},
            registry=get_registry(),
        ).name
        == "torchelastic"
    )


# ------------------------------------------------------------------------------ aios-run --dry-run (CLI)


def _aios_run(args, env_extra=None, timeout=120):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "TPU_", "PJRT_", "GCE_"))
    }
    env.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", **(env_extra or {}))
    code = (
        f"import sys\nfrom aios.cli.run import main\nsys.argv=['aios-run']+{args!r}\n"
        "try:\n    main()\nfinally:\n    print('HEAVY', sorted(m for m in "
        "('torch','torch_tpu','libtpu','torch_xla') if m in sys.modules), file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_dry_run_v6e_16_json_without_importing_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    out = _aios_run(
        ["--backend", "tpu", "--dry-run", "--json", "xla.accelerator=v6e-16", str(script)]
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr
    plan = json.loads(out.stdout)
    assert (
        plan["backend"] == "tpu"
        and plan["world_size"] == 16
        and [h["nprocs"] for h in plan["hosts"]] == [4] * 4
    )
    assert plan["hosts"][3]["env"]["NODE_RANK"] == "3"
    assert "TORCH_TPU_SLICEBUILDER_ADDRESSES=" in plan["hosts"][0]["shell"]


def test_dry_run_contradicting_runtime_is_exit_2_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    out = _aios_run(
        [
            "--backend",
            "tpu",
            "--dry-run",
            "xla.accelerator=v6e-4",
            "xla.runtime=torch_xla",
            str(script),
        ]
    )
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith("HEAVY")]
    assert len(lines) == 1 and "xla.runtime=torch_xla" in lines[0] and "--backend xla" in lines[0]


def test_torch_xla_and_cpu_workers_never_autoload_torch_tpu(clean_env):
    from aios.launcher.plan import elastic_plan
    from aios_backend_xla.launch import xla_launch_plan

    c = resolve(overrides=["xla.accelerator=v6e-16"], flags={}, environ={}, check_backend=False)
    for hp in xla_launch_plan(c, req(), NO_TPU, python="py", environ={}).hosts:
        assert hp.env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    cpu = elastic_plan(
        "cpu", resolve(overrides=[], flags={}, environ={}, check_backend=False), req(), 2
    )
    assert cpu.hosts[0].env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    tpu = T.tpu_launch_plan(
        resolve(
            overrides=["backend=tpu", "xla.accelerator=v6e-4"],
            flags={},
            environ={},
            check_backend=False,
        ),
        req(),
        NO_TPU,
    )
    assert tpu.hosts[0].env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"


def test_each_chip_process_gets_its_share_of_the_cpus_this_process_may_use(cfg, monkeypatch):
    """OMP_NUM_THREADS from this process's affinity shared among the host's processes; a
    user-set value wins; remote hosts count their own CPUs (none of ours in their plan)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    plan = T.tpu_launch_plan(cfg("xla.accelerator=v6e-4"), req(), NO_TPU)
    assert plan.hosts[0].env["OMP_NUM_THREADS"] == str(max(1, len(before) // 4))
    try:
        os.sched_setaffinity(0, {min(before)})
        plan = T.tpu_launch_plan(cfg("xla.accelerator=v6e-4", nprocs=1), req(), NO_TPU)
    finally:
        os.sched_setaffinity(0, before)
    assert plan.hosts[0].env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (
        "OMP_NUM_THREADS"
        not in T.tpu_launch_plan(cfg("xla.accelerator=v6e-4"), req(), NO_TPU).hosts[0].env
    )
    monkeypatch.delenv("OMP_NUM_THREADS")
    hosts = [Host(f"10.0.0.{i + 1}", worker_id=i) for i in range(4)]
    plan = T.tpu_launch_plan(cfg("xla.accelerator=v6e-16"), req(*hosts), NO_TPU)
    assert all("OMP_NUM_THREADS" not in hp.env for hp in plan.hosts)
