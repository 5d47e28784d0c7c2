"""Launch plans: 1-host and multi-host slices, SPMD, XLA:CPU opt-in, errors, `aios-run --dry-run`.
Pure Python: runs without torch_xla (the plans never import torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aios.config.schema import resolve
from aios.errors import BackendUnavailable, LaunchError
from aios.types import Host, LaunchRequest
from aios_backend_xla.discovery import SysfsSource, TpuFacts, discover
from aios_backend_xla.launch import xla_launch_plan


@pytest.fixture
def cfg(clean_env):
    def make(*overrides, **flags):
        return resolve(overrides=list(overrides), flags=flags, environ={}, check_backend=False)

    return make


def req(*hosts: Host, acc: str | None = None) -> LaunchRequest:
    return LaunchRequest(
        script="train.py", args=["--lr", "1e-3"], hosts=list(hosts) or [Host()], accelerator=acc
    )


NO_TPU = TpuFacts()


@pytest.mark.parametrize(
    "acc,hosts,per_host",
    [
        ("v2-8", 1, 4),
        ("v3-8", 1, 4),
        ("v4-8", 1, 4),
        ("v4-16", 2, 4),
        ("v5litepod-8", 1, 8),
        ("v5litepod-16", 4, 4),
        ("v5p-8", 1, 4),
        ("v6e-4", 1, 4),
        ("v6e-8", 1, 8),
        ("v6e-16", 4, 4),
    ],
)
def test_tpu_plan_per_type(cfg, acc, hosts, per_host):
    plan = xla_launch_plan(
        cfg(f"xla.accelerator={acc}"), req(), NO_TPU, python="python3", environ={}
    )
    assert plan.backend == "xla" and plan.launcher == "xla"
    assert len(plan.hosts) == hosts and plan.world_size == hosts * per_host
    for i, hp in enumerate(plan.hosts):
        assert hp.nprocs == per_host
        assert hp.env["PJRT_DEVICE"] == "TPU"
        assert hp.command[:5] == [
            "python3",
            "-m",
            "aios_backend_xla.launcher",
            "--nprocs",
            str(per_host),
        ]
        assert hp.command[5:] == ["train.py", "--lr", "1e-3"]
        cache = hp.env["XLA_PERSISTENT_CACHE_PATH"]
        if hosts == 1:  # planned for this machine: expanded here, never a literal '~'
            assert cache == os.path.expanduser("~/.cache/aios/xla-compile") and os.path.isabs(cache)
        else:  # remote hosts: their own home, expanded there
            assert cache == "~/.cache/aios/xla-compile"
            assert "'~" not in hp.shell() and '"$HOME/.cache/aios/xla-compile"' in hp.shell()
        assert [r["RANK"] for r in hp.ranks] == [str(i * per_host + k) for k in range(per_host)]
        if hosts > 1:
            assert (
                hp.env["TPU_WORKER_ID"] == str(i)
                and hp.env["MASTER_ADDR"] == plan.hosts[0].host.address
            )
        else:
            assert "MASTER_ADDR" not in hp.env
    assert plan.notes[0].startswith(f"{acc}: TPU")


def test_multi_host_uses_given_hosts_in_order(cfg):
    hosts = [Host("34.1.1.1", "10.0.0.2", 0), Host("34.1.1.2", "10.0.0.3", 1)]
    plan = xla_launch_plan(
        cfg("master_port=8476"), req(*hosts, acc="v4-16"), NO_TPU, python="py", environ={}
    )
    assert [h.host.address for h in plan.hosts] == ["34.1.1.1", "34.1.1.2"]
    assert all(
        h.env["MASTER_ADDR"] == "10.0.0.2" and h.env["MASTER_PORT"] == "8476" for h in plan.hosts
    )
    assert [h.env["TPU_WORKER_ID"] for h in plan.hosts] == ["0", "1"]


def test_multi_host_uses_metadata_workers_on_the_tpu_vm(cfg):
    facts = TpuFacts(
        pci_chips=4,
        accelerator_type="v4-16",
        worker_id=1,
        worker_addresses=["10.0.0.2", "10.0.0.3"],
        sources=["sysfs", "metadata"],
    )
    plan = xla_launch_plan(cfg(), req(), facts, python="py", environ={})
    assert [h.host.address for h in plan.hosts] == ["10.0.0.2", "10.0.0.3"]
    assert plan.world_size == 8


def test_host_count_mismatch_is_an_error(cfg):
    with pytest.raises(LaunchError, match="v4-16 has 2 hosts but 3 were given"):
        xla_launch_plan(
            cfg(), req(Host("a"), Host("b"), Host("c"), acc="v4-16"), NO_TPU, environ={}
        )


def test_single_process_and_bad_nprocs(cfg):
    one = xla_launch_plan(
        cfg("xla.accelerator=v4-8", nprocs=1), req(), NO_TPU, python="py", environ={}
    )
    assert one.hosts[0].nprocs == 1 and one.hosts[0].command[3:5] == ["--nprocs", "1"]
    with pytest.raises(LaunchError, match="one process per chip"):
        xla_launch_plan(cfg("xla.accelerator=v4-8", nprocs=3), req(), NO_TPU, environ={})


def test_spmd_is_one_process_per_host_running_the_script(cfg):
    plan = xla_launch_plan(
        cfg("xla.accelerator=v4-16", "strategy=spmd"), req(), NO_TPU, python="py", environ={}
    )
    assert plan.launcher == "direct" and plan.world_size == 2
    assert all(
        h.nprocs == 1 and h.command == ["py", "train.py", "--lr", "1e-3"] for h in plan.hosts
    )


def test_compile_cache_can_be_disabled(cfg):
    plan = xla_launch_plan(
        cfg("xla.accelerator=v6e-4", "xla.compile_cache=false"), req(), NO_TPU, environ={}
    )
    assert "XLA_PERSISTENT_CACHE_PATH" not in plan.hosts[0].env


def test_module_scripts(cfg):
    r = LaunchRequest(script="pkg.train", args=[], module=True)
    plan = xla_launch_plan(cfg("xla.accelerator=v4-8"), r, NO_TPU, python="py", environ={})
    assert plan.hosts[0].command[-2:] == ["-m", "pkg.train"]


def test_no_tpu_without_opt_in_is_an_error_naming_the_opt_in(cfg):
    with pytest.raises(BackendUnavailable) as ei:
        xla_launch_plan(cfg(), req(), NO_TPU, environ={})
    msg = ei.value.one_line()
    assert (
        "no TPU was found" in msg and "xla.allow_cpu=true" in msg and "AIOS_XLA__ALLOW_CPU=1" in msg
    )


def test_xla_cpu_opt_in_is_one_process_with_pjrt_cpu(cfg):
    for c, env in ((cfg("xla.allow_cpu=true"), {}), (cfg(), {"AIOS_XLA__ALLOW_CPU": "1"})):
        plan = xla_launch_plan(c, req(), NO_TPU, python="py", environ=env)
        hp = plan.hosts[0]
        assert plan.launcher == "direct" and plan.world_size == 1 and hp.nprocs == 1
        assert hp.env["PJRT_DEVICE"] == "CPU" and hp.env["AIOS_XLA__ALLOW_CPU"] == "1"
        assert hp.command == ["py", "train.py", "--lr", "1e-3"]
    spmd = xla_launch_plan(
        cfg("xla.allow_cpu=true", "strategy=spmd", "xla.cpu_devices=4"), req(), NO_TPU, environ={}
    )
    assert spmd.hosts[0].env["CPU_NUM_DEVICES"] == "4"
    with pytest.raises(LaunchError, match="XLA:CPU runs one process"):
        xla_launch_plan(cfg("xla.allow_cpu=true", nprocs=2), req(), NO_TPU, environ={})


def test_tpu_present_plans_tpu_even_with_opt_in(cfg, fake_sysfs, metadata_server):
    root = fake_sysfs([("0x1ae0", "0x006f")] * 4)
    srv = metadata_server({"accelerator-type": "v6e-4"})
    facts = discover(sysfs=SysfsSource(root), environ={"GCE_METADATA_HOST": srv.host})
    plan = xla_launch_plan(cfg("xla.allow_cpu=true"), req(), facts, python="py", environ={})
    assert plan.hosts[0].env["PJRT_DEVICE"] == "TPU" and plan.world_size == 4


# ------------------------------------------------------------------------------ aios-run --dry-run


def _aios_run(args, env_extra=None, timeout=120):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "TPU_", "PJRT_", "GCE_"))
    }
    env.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", **(env_extra or {}))
    code = (
        f"import sys\nfrom aios.cli.run import main\nsys.argv=['aios-run']+{args!r}\n"
        "try:\n    main()\nfinally:\n    print('HEAVY', sorted(m for m in "
        "('torch','torch_xla') if m in sys.modules), file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_dry_run_v4_16_prints_two_hosts_of_four_without_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    out = _aios_run(
        [
            "--backend",
            "xla",
            "--dry-run",
            "--json",
            "xla.accelerator=v4-16",
            str(script),
            "--epochs",
            "1",
        ]
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr
    plan = json.loads(out.stdout)
    assert plan["backend"] == "xla" and plan["launcher"] == "xla" and plan["world_size"] == 8
    assert [h["nprocs"] for h in plan["hosts"]] == [4, 4]
    for i, h in enumerate(plan["hosts"]):
        assert h["env"]["PJRT_DEVICE"] == "TPU" and h["env"]["TPU_WORKER_ID"] == str(i)
        assert h["command"][-3:] == [str(script), "--epochs", "1"]
        assert "PJRT_DEVICE=TPU" in h["shell"]


def test_dry_run_text_names_hosts_and_commands(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    out = _aios_run(
        ["--backend", "xla", "--dry-run", str(script)], {"AIOS_XLA__ACCELERATOR": "v5litepod-16"}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("4 process(es)") == 4
    assert "aios_backend_xla.launcher --nprocs 4" in out.stdout


def test_run_without_tpu_is_exit_2_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('RAN')\n")
    out = _aios_run(["--backend", "xla", str(script)])
    assert out.returncode == 2
    assert "RAN" not in out.stdout
    err = [ln for ln in out.stderr.splitlines() if not ln.startswith("HEAVY")]
    assert len(err) == 1 and "Traceback" not in out.stderr
    assert "xla.allow_cpu=true" in err[0] and "AIOS_XLA__ALLOW_CPU=1" in err[0]
    assert ("no TPU was found" in err[0]) or ("torch_xla is not installed" in err[0])


def test_bad_accelerator_type_is_exit_2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    out = _aios_run(["--backend", "xla", "--dry-run", "xla.accelerator=v4-banana", str(script)])
    assert (
        out.returncode == 2
        and "invalid TPU accelerator type 'v4-banana'" in out.stderr
        and "Traceback" not in out.stderr
    )


def test_xla_compile_cache_path_expands_on_the_host_that_runs_it(cfg, tmp_path):
    """A quoted '~' never expands: the shell line of a remote plan must give the host's $HOME,
    and the launcher expands a '~' it is handed before torch_xla reads the variable."""
    from aios.types import HostPlan
    from aios_backend_xla.launcher import expand_cache_env

    plan = xla_launch_plan(
        cfg("xla.accelerator=v4-16"), req(), NO_TPU, python="python3", environ={}
    )
    env = plan.hosts[1].env
    probe = HostPlan(
        host=plan.hosts[1].host,
        nprocs=1,
        env=env,
        command=["printenv", "XLA_PERSISTENT_CACHE_PATH"],
    )
    home = tmp_path / "home of worker"
    r = subprocess.run(
        ["bash", "-c", probe.shell()],
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{home}/.cache/aios/xla-compile"
    environ = {"XLA_PERSISTENT_CACHE_PATH": "~/.cache/x", "HOME": str(home)}
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        assert expand_cache_env(environ) == f"{home}/.cache/x"
    finally:
        os.environ["HOME"] = old or ""
    assert environ["XLA_PERSISTENT_CACHE_PATH"] == f"{home}/.cache/x"


def test_each_process_gets_its_share_of_the_cpus_this_process_may_use(cfg, monkeypatch):
    """OMP_NUM_THREADS from this process's affinity (not the machine's count) shared among the
    host's processes; a user-set value wins; a plan for remote hosts carries none of ours."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # a job bound to one CPU
        plan = xla_launch_plan(cfg("xla.accelerator=v6e-8"), req(), NO_TPU, environ={})
    finally:
        os.sched_setaffinity(0, before)
    assert plan.hosts[0].nprocs == 8 and plan.hosts[0].env["OMP_NUM_THREADS"] == "1"
    plan = xla_launch_plan(cfg("xla.accelerator=v6e-8", nprocs=1), req(), NO_TPU, environ={})
    assert plan.hosts[0].env["OMP_NUM_THREADS"] == str(len(before))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    plan = xla_launch_plan(cfg("xla.accelerator=v6e-8"), req(), NO_TPU, environ={})
    assert "OMP_NUM_THREADS" not in plan.hosts[0].env
    monkeypatch.delenv("OMP_NUM_THREADS")
    remote = req(Host("10.0.0.1", worker_id=0), acc="v4-16")
    plan = xla_launch_plan(cfg(), remote, NO_TPU, environ={})
    assert all("OMP_NUM_THREADS" not in hp.env for hp in plan.hosts)
