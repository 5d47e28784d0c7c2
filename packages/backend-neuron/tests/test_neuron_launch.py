"""Launch plans, checked field by field, and every bad input as one clear error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aios.errors import AiosError, BackendUnavailable, ConfigError, LaunchError
from aios.types import Host, LaunchRequest
from aios_backend_neuron.launch import build_plan, plan_for_instances

NODES = [Host("54.0.0.1", "172.31.10.1", 0), Host("54.0.0.2", "172.31.10.2", 1)]


def _launcher_head(python: str, nnodes: int, nproc: int) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.5",
    ]


def test_trn1_32xlarge_two_nodes_field_by_field():
    plan = plan_for_instances(
        "trn1.32xlarge",
        NODES,
        "train.py",
        ["--steps", "100"],
        overrides=[
            "neuron.model_type=transformer",
            "neuron.compile_cache=s3://ckpt-bucket/neuron-cache",
            "precision=bf16-mixed",
        ],
    )
    assert plan.backend == "neuron" and plan.launcher == "elastic"
    assert plan.world_size == 64 and len(plan.hosts) == 2
    expected_env = {
        "AIOS_RUN_BACKEND": "neuron",
        "PJRT_DEVICE": "NEURON",
        "NEURON_CC_FLAGS": "--target trn1 --model-type transformer",
        "NEURON_COMPILE_CACHE_URL": "s3://ckpt-bucket/neuron-cache",
        "NEURON_RT_ROOT_COMM_ID": "172.31.10.1:46820",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
    }
    for i, hp in enumerate(plan.hosts):
        assert hp.host == NODES[i]
        assert hp.nprocs == 32
        assert hp.env == expected_env
        assert hp.command == [
            *_launcher_head("python3", 2, 32),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "172.31.10.1:29500",
            "--rdzv-id",
            "aios",
            "--tee",
            "3",
            "train.py",
            "--steps",
            "100",
        ]
        assert len(hp.ranks) == 32
        assert hp.ranks[0] == {
            "RANK": str(32 * i),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "64",
            "LOCAL_WORLD_SIZE": "32",
            "GROUP_RANK": str(i),
            "MASTER_ADDR": "172.31.10.1",
            "MASTER_PORT": "29500",
        }
        assert hp.ranks[31]["RANK"] == str(32 * i + 31)
    assert "NEURON_LOGICAL_NC_CONFIG" not in plan.hosts[0].env  # Trn1 has no logical-core config
    assert (
        "XLA_USE_BF16" not in plan.hosts[0].env
    )  # bf16 comes from autocast, never the removed switch
    notes = "\n".join(plan.notes)
    assert "parallelism: 64 workers = dp 64 x tp 1 x pp 1" in notes
    assert (
        "trn1.32xlarge (from request): 16 Neuron device(s), 2 logical cores each (LNC=1, 32 physical)"
        in notes
    )
    assert "node-local" not in notes  # the cache is shared on S3
    shell = plan.hosts[1].shell()
    assert shell.startswith("AIOS_RUN_BACKEND=neuron FI_EFA_FORK_SAFE=1 ")


def test_trn2_48xlarge_single_node_field_by_field(config, no_neuron_ls):
    cfg = config(
        "neuron.instance_type=trn2.48xlarge", "neuron.model_type=transformer", "precision=bf16-true"
    )
    plan = build_plan(cfg, LaunchRequest("train.py", ["--lr", "3e-4"]), python="/usr/bin/python3")
    assert plan.world_size == 64 and plan.launcher == "elastic"
    (hp,) = plan.hosts
    assert hp.host == Host("localhost") and hp.nprocs == 64
    # Trn2 defaults to TorchNeuron (native device neuron): no PJRT_DEVICE
    assert hp.env == {
        "AIOS_RUN_BACKEND": "neuron",
        "NEURON_CC_FLAGS": "--target trn2 --model-type transformer",
        "NEURON_COMPILE_CACHE_URL": "/var/tmp/neuron-compile-cache",
        "NEURON_LOGICAL_NC_CONFIG": "2",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1",  # bf16 weights round stochastically by default
        # this host's CPUs (its affinity) shared among the 64 ranks, unless the user set it
        **(
            {}
            if "OMP_NUM_THREADS" in os.environ
            else {"OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // 64))}
        ),
    }
    # planned off-instance from neuron.instance_type: the guard runs it only where devices exist
    assert hp.command == [
        "/usr/bin/python3",
        "-m",
        "aios_backend_neuron.guard",
        "trn2.48xlarge",
        "--",
        *_launcher_head("/usr/bin/python3", 1, 64),
        "--node-rank",
        "0",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "--tee",
        "3",
        "train.py",
        "--lr",
        "3e-4",
    ]
    assert (
        "trn2.48xlarge (from neuron.instance_type): 16 Neuron device(s), 4 logical cores each (LNC=2, 128 physical)"
        in "\n".join(plan.notes)
    )


def test_trn2_logical_core_config_1_gives_128_workers(config):
    plan = build_plan(
        config("neuron.instance_type=trn2.48xlarge", "neuron.logical_nc_config=1"),
        LaunchRequest("t.py"),
    )
    assert plan.world_size == 128 and plan.hosts[0].env["NEURON_LOGICAL_NC_CONFIG"] == "1"


def test_trn2_two_nodes_with_tp_and_precompile(config):
    # NxD TP/PP and neuron_parallel_compile are the (legacy) XLA runtime's: named explicitly on Trn2
    cfg = config(
        "neuron.runtime=xla",
        "neuron.tp_degree=8",
        "neuron.pp_degree=4",
        "neuron.precompile=true",
        "neuron.precompile_retries=1",
        "neuron.stochastic_rounding=false",
        "neuron.env={NEURON_RT_LOG_LEVEL: INFO}",
    )
    plan = build_plan(
        cfg, LaunchRequest("train.py", hosts=NODES, accelerator="trn2.48xlarge"), python="python3"
    )
    assert plan.world_size == 128
    hp = plan.hosts[0]
    assert hp.command[0] == "neuron_parallel_compile"
    assert hp.command[1:4] == ["python3", "-m", "torch.distributed.run"]
    assert hp.env["NEURON_PARALLEL_COMPILE_MAX_RETRIES"] == "1"
    assert hp.env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0"
    assert hp.env["NEURON_RT_LOG_LEVEL"] == "INFO"
    assert (
        hp.env["FI_PROVIDER"] == "efa" and hp.env["NEURON_RT_ROOT_COMM_ID"] == "172.31.10.1:46820"
    )
    notes = "\n".join(plan.notes)
    assert "dp 4 x tp 8 x pp 4" in notes
    assert "precompile: neuron_parallel_compile" in notes
    assert "compile cache is node-local" in notes


def test_trn1_2xlarge_multi_node_warns_no_efa(config):
    plan = build_plan(config(), LaunchRequest("t.py", hosts=NODES, accelerator="trn1.2xlarge"))
    assert plan.world_size == 4
    assert "FI_PROVIDER" not in plan.hosts[0].env
    assert any("has no EFA" in n for n in plan.notes)


def test_visible_cores_restrict_the_plan(config):
    plan = build_plan(
        config("neuron.instance_type=trn1.32xlarge", "neuron.visible_cores='0-3,8'"),
        LaunchRequest("t.py"),
    )
    assert plan.world_size == 5 and plan.hosts[0].env["NEURON_RT_VISIBLE_CORES"] == "0-3,8"


def test_plan_from_local_neuron_ls(fake_neuron_ls, config, monkeypatch):
    fake_neuron_ls("trn1.2xlarge")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1")
    plan = build_plan(config(), LaunchRequest("t.py"), python="py")
    assert plan.world_size == 1 and plan.launcher == "direct"
    assert plan.hosts[0].command == ["py", "t.py"]
    assert plan.hosts[0].env["NEURON_RT_VISIBLE_CORES"] == "1"
    assert plan.hosts[0].env["NEURON_CC_FLAGS"] == "--target trn1"


def test_script_findings_become_notes(tmp_path, config):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport flash_attn\n"
        "opt = torch.optim.AdamW([], fused=True)\n"
        "x = torch.zeros(2).half()\n"
        "g = torch.Generator(device='xla')\n"
        "m = torch.compile(lambda x: x)\n"
    )
    plan = build_plan(config("neuron.instance_type=trn1.2xlarge"), LaunchRequest(str(script)))
    notes = [n for n in plan.notes if n.startswith(f"script {script}")]
    assert [n.split(": ", 1)[0].rsplit(" ", 2)[-2:] for n in notes] == [
        ["line", "2"],
        ["line", "3"],
        ["line", "4"],
        ["line", "5"],
        ["line", "6"],
    ]
    assert "imports flash_attn" in notes[0] and "fused=True" in notes[1] and "fp16" in notes[2]


# ------------------------------------------------------------------------------ bad input


def _err(exc_info) -> str:
    return str(exc_info.value)


def test_fp16_is_a_clear_error(config):
    with pytest.raises(ConfigError) as e:
        build_plan(
            config("neuron.instance_type=trn1.32xlarge", "precision=fp16-mixed"),
            LaunchRequest("t.py"),
        )
    assert _err(e) == (
        "precision fp16-mixed is not supported on Trainium (backend neuron); use precision=bf16-mixed "
        "(autocast) or precision=bf16-true (bf16 weights with stochastic rounding)"
    )


def test_xla_use_bf16_is_a_clear_error(config, monkeypatch):
    monkeypatch.setenv("XLA_USE_BF16", "1")
    with pytest.raises(ConfigError, match="XLA_USE_BF16 is set; it was removed from torch-neuronx"):
        build_plan(config("neuron.instance_type=trn1.32xlarge"), LaunchRequest("t.py"))


@pytest.mark.parametrize("tp", [3, 64])
def test_tp_not_dividing_the_cores(config, tp):
    with pytest.raises(ConfigError) as e:
        build_plan(
            config("neuron.instance_type=trn1.32xlarge", f"neuron.tp_degree={tp}"),
            LaunchRequest("t.py"),
        )
    assert _err(e) == (
        f"neuron.tp_degree={tp} does not divide the 32 NeuronCores per node; use a tp_degree that "
        "divides 32 (e.g. 1, 2, 4, 8, 16, 32)"
    )


def test_tp_times_pp_not_dividing_the_workers(config):
    with pytest.raises(
        ConfigError, match=r"tp_degree=8 x neuron.pp_degree=3 = 24 does not divide the 32 workers"
    ):
        build_plan(
            config(
                "neuron.instance_type=trn1.32xlarge", "neuron.tp_degree=8", "neuron.pp_degree=3"
            ),
            LaunchRequest("t.py"),
        )


def test_unknown_instance_type(config):
    with pytest.raises(
        ConfigError, match="unknown Trainium instance type 'trn9.large'; known: trn1.2xlarge"
    ):
        build_plan(config(), LaunchRequest("t.py", accelerator="trn9.large"))
    with pytest.raises(ConfigError, match="invalid value 'p5.48xlarge' for 'neuron.instance_type'"):
        config("neuron.instance_type=p5.48xlarge")


def test_lnc2_on_trn1(config):
    with pytest.raises(
        ConfigError, match=r"logical_nc_config=2 is not available on trn1.32xlarge \(supported: 1\)"
    ):
        build_plan(
            config("neuron.instance_type=trn1.32xlarge", "neuron.logical_nc_config=2"),
            LaunchRequest("t.py"),
        )


def test_native_runtime_on_trn1(config):
    with pytest.raises(
        ConfigError, match="native TorchNeuron runtime supports Trn2 and Trn3, not trn1.32xlarge"
    ):
        build_plan(
            config("neuron.instance_type=trn1.32xlarge", "neuron.runtime=native"),
            LaunchRequest("t.py"),
        )


def test_precompile_on_native(config):
    with pytest.raises(
        ConfigError, match="neuron_parallel_compile, which extracts torch_xla graphs"
    ):
        build_plan(
            config(
                "neuron.instance_type=trn2.48xlarge",
                "neuron.runtime=native",
                "neuron.precompile=true",
            ),
            LaunchRequest("t.py"),
        )


def test_visible_cores_out_of_range(config):
    with pytest.raises(
        ConfigError,
        match="neuron.visible_cores names NeuronCores 2-3, but this instance has logical cores 0-1",
    ):
        build_plan(
            config("neuron.instance_type=trn1.2xlarge", "neuron.visible_cores='0-3'"),
            LaunchRequest("t.py"),
        )


def test_too_many_processes(config):
    with pytest.raises(
        LaunchError, match="--nprocs 4 asks for more processes than the 2 devices found"
    ):
        build_plan(config("neuron.instance_type=trn1.2xlarge", "nprocs=4"), LaunchRequest("t.py"))


def test_no_devices_and_no_instance_type(no_neuron_ls, config):
    with pytest.raises(BackendUnavailable) as e:
        build_plan(config(), LaunchRequest("t.py"))
    assert "found no Neuron devices here" in _err(
        e
    ) and "neuron.instance_type=trn1.32xlarge" in _err(e)


def test_local_placeholders_refused(fake_neuron_ls, neuron_site, config):
    fake_neuron_ls("trn1.2xlarge")
    neuron_site("placeholders")
    with pytest.raises(BackendUnavailable, match="from PyPI are placeholders"):
        build_plan(config(), LaunchRequest("t.py"))


def test_on_instance_discovery_wins_over_configured_type(fake_neuron_ls, config):
    fake_neuron_ls("trn1.2xlarge")
    plan = build_plan(config("neuron.instance_type=trn1.32xlarge"), LaunchRequest("t.py"))
    assert plan.world_size == 2
    assert (
        "neuron.instance_type=trn1.32xlarge ignored: this machine is a trn1.2xlarge" in plan.notes
    )


def test_no_hosts():
    with pytest.raises(ConfigError, match="at least one host"):
        plan_for_instances("trn1.32xlarge", [], "t.py")


# ------------------------------------------------------------------------------ through aios-run


def _aios_run() -> str | None:
    exe = Path(sys.executable).with_name("aios-run")
    return str(exe) if exe.exists() else shutil.which("aios-run")


def test_aios_run_dry_run_off_instance(tmp_path, no_neuron_ls):
    """``aios-run --backend neuron --dry-run`` on a machine without Trainium, the instance type
    from the config: prints the whole plan, imports no torch."""
    if _aios_run() is None:
        pytest.skip("aios-run is not installed (aios-core's launcher)")
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "AIOS_"))}
    args = [
        "--backend",
        "neuron",
        "--dry-run",
        "neuron.instance_type=trn1.32xlarge",
        "neuron.model_type=transformer",
        "nnodes=2",
        "master_addr=10.1.2.3",
        str(script),
    ]
    code = (
        f"import sys\nfrom aios.cli.run import main\nsys.argv=['aios-run']+{args!r}\n"
        "try:\n    main()\nfinally:\n    print('HEAVY', sorted(m for m in "
        "('torch','torch_xla','torch_neuronx') if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr
    text = out.stdout
    for piece in (
        "devices:    32 x NeuronCore-v2",
        "launcher:   elastic, world size 64",
        "torch.distributed.run",
        "--nproc-per-node 32",
        "--nnodes 2",
        "--rdzv-backend c10d",
        "--rdzv-endpoint 10.1.2.3:29500",
        "PJRT_DEVICE=NEURON",
        "NEURON_CC_FLAGS='--target trn1 --model-type transformer'",
        "FI_PROVIDER=efa",
        "FI_EFA_USE_DEVICE_RDMA=1",
        "FI_EFA_FORK_SAFE=1",
        "NEURON_RT_ROOT_COMM_ID=10.1.2.3:46820",
        "NEURON_COMPILE_CACHE_URL=/var/tmp/neuron-compile-cache",
    ):
        assert piece in text, f"{piece!r} missing from:\n{text}"


def test_aios_run_fp16_is_one_line_exit_2(tmp_path, no_neuron_ls):
    exe = _aios_run()
    if exe is None:
        pytest.skip("aios-run is not installed (aios-core's launcher)")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = subprocess.run(
        [
            exe,
            "--backend",
            "neuron",
            "--dry-run",
            "--precision",
            "fp16-mixed",
            "neuron.instance_type=trn1.32xlarge",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp16-mixed is not supported on Trainium" in lines[0]
    assert "Traceback" not in out.stderr


def test_plan_is_json_serialisable():
    plan = plan_for_instances("trn2.48xlarge", NODES, "t.py")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["world_size"] == 128 and d["hosts"][1]["host"]["internal_address"] == "172.31.10.2"


def test_errors_are_aios_errors():
    assert issubclass(ConfigError, AiosError) and issubclass(BackendUnavailable, AiosError)


def test_xla_cpu_stand_in_runs_one_process(fake_neuron_ls, config, monkeypatch):
    fake_neuron_ls("trn1.32xlarge")
    monkeypatch.setenv("AIOS_TEST_NEURON_ON_XLA_CPU", "1")
    from aios_backend_neuron import packages

    packages.forget()
    plan = build_plan(config(), LaunchRequest("t.py"), python="py")
    assert (
        plan.world_size == 1
        and plan.hosts[0].env["PJRT_DEVICE"] == "CPU"
        and plan.hosts[0].command == ["py", "t.py"]
    )
    assert any("XLA:CPU stands in for NeuronCores" in n for n in plan.notes)
    with pytest.raises(LaunchError, match="stand-in .* runs one process"):
        build_plan(config("nprocs=2"), LaunchRequest("t.py"))


def test_guard_refuses_without_devices_and_execs_with_them(tmp_path, no_neuron_ls, fake_neuron_ls):
    cmd = [
        sys.executable,
        "-m",
        "aios_backend_neuron.guard",
        "trn1.32xlarge",
        "--",
        sys.executable,
        "-c",
        "print('RAN')",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "RAN" not in out.stdout
    assert out.stderr.strip().startswith(
        "aios-run: error: this plan is for a trn1.32xlarge but this machine has no Neuron devices"
    )
    assert len(out.stderr.strip().splitlines()) == 1
    fake_neuron_ls("trn1.32xlarge")  # now neuron-ls lists devices
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 0 and out.stdout.strip() == "RAN", out.stderr


def test_running_an_off_instance_plan_here_is_refused(tmp_path, no_neuron_ls):
    exe = _aios_run()
    if exe is None:
        pytest.skip("aios-run is not installed (aios-core's launcher)")
    script = tmp_path / "train.py"
    script.write_text("print('RAN')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "AIOS_"))}
    out = subprocess.run(
        [exe, "--backend", "neuron", "neuron.instance_type=trn1.2xlarge", "nprocs=1", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "RAN" not in out.stdout
    assert "this plan is for a trn1.2xlarge but this machine has no Neuron devices" in out.stderr
    assert "Traceback" not in out.stderr
