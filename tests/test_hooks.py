"""One behavioural test per hook, through the registry with every first-party plugin loaded
(tests/test_contract_hooks.py checks that each hook has its `test_hook_<name>` here)."""

from __future__ import annotations

import pytest
from aios.config.schema import resolve
from aios.errors import AiosError
from aios.plugins.registry import get_registry, reset_registry
from aios.types import LaunchRequest


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch, tmp_path):
    for var in ("AIOS_PLUGINS", "AIOS_DISABLE_PLUGINS", "AIOS_STRICT_PLUGINS", "PJRT_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "home"))
    reset_registry()
    yield
    reset_registry()


def _cfg(*overrides, **flags):
    return resolve(overrides=list(overrides), flags=flags, environ={})


def _impl_plugins(hook: str) -> set[str]:
    return {impl.plugin_name for impl in getattr(get_registry().pm.hook, hook).get_hookimpls()}


def test_hook_aios_register_backends():
    reg = get_registry()
    assert {
        "aios-core",
        "aios-backend-cuda",
        "aios-backend-xla",
        "aios-backend-neuron",
    } <= _impl_plugins("aios_register_backends")
    owners = {name: spec.plugin for name, spec in reg.backends.items()}
    assert owners["cpu"] == "aios-core" and owners["xla"] == "aios-backend-xla"
    assert owners["cuda"] == "aios-backend-cuda" and owners["neuron"] == "aios-backend-neuron"
    # accelerators outrank the CPU for --backend auto, and none of them is available here
    assert (
        reg.backends["xla"].priority > reg.backends["cuda"].priority > reg.backends["cpu"].priority
    )
    assert reg.select("auto").name == "cpu"
    for name in ("cuda", "xla", "neuron"):
        assert not reg.probe(name)
        with pytest.raises(AiosError):
            reg.select(name)


def test_hook_aios_register_clouds():
    reg = get_registry()
    owners = {c: s.plugin for c, s in reg.clouds.items()}
    assert owners["gcp"] == "aios-cloud-gcp" and owners["aws"] == "aios-cloud-aws"
    for spec in reg.clouds.values():
        assert callable(spec.factory)


def test_hook_aios_register_commands(aios_cli):
    import click

    reg = get_registry()
    cloud = {"launch", "status", "exec", "logs", "ssh", "sync", "stop", "start", "down"}
    cloud |= {"cancel", "autostop", "catalog", "cost"}
    assert {n for n, s in reg.commands.items() if s.plugin == "aios-cloud"} == cloud
    assert _impl_plugins("aios_register_commands") == {"aios-cloud"}
    for name, spec in reg.commands.items():
        module, _, attr = spec.target.partition(":")
        cmd = getattr(__import__(module, fromlist=[attr]), attr)
        assert isinstance(cmd, click.Command) and cmd.name == name, spec
        assert spec.help
    # the command runs through `aios`, exactly as the plugin's click command
    res = aios_cli("status", "--json")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(("[", "{"))


def test_hook_aios_register_storage():
    reg = get_registry()
    assert reg.storage["gs"].plugin == "aios-cloud-gcp" and reg.storage["gs"].protocol == "gs"
    assert reg.storage["s3"].plugin == "aios-cloud-aws" and reg.storage["s3"].protocol == "s3"
    assert reg.storage["file"].plugin == "aios-core"


def test_hook_aios_register_loggers(tmp_path):
    reg = get_registry()
    assert {"tensorboard", "wandb"} <= set(reg.loggers)
    cfg = _cfg("logging.wandb=false")
    assert reg.loggers["wandb"].enabled(cfg) is False
    tb = reg.loggers["tensorboard"]
    assert tb.enabled(cfg) is True  # tensorboard is installed in this environment
    logger = tb.factory(cfg, str(tmp_path))
    logger.log({"loss": 1.5}, step=3)
    logger.close()
    assert list(tmp_path.rglob("events.out.tfevents.*")), "TensorBoard logger wrote no event file"


def test_hook_aios_config_sections():
    reg = get_registry()
    owners = {k: v[0] for k, v in reg.config_sections.items()}
    assert owners.get("xla") == "aios-backend-xla"
    assert owners.get("cuda") == "aios-backend-cuda"
    assert owners.get("neuron") == "aios-backend-neuron"
    cfg = _cfg()
    for section in owners:
        assert cfg.section(section) is not None, section


def test_backend_discover_devices():
    reg = get_registry()
    cpu = reg.discover_devices("cpu", None)
    assert cpu.available and cpu.count == 1 and cpu.devices[0].memory_bytes > 0
    for name in ("cuda", "xla", "neuron"):
        rep = reg.discover_devices(name, None)
        assert rep is not None and rep.backend == name
        assert rep.available is False and rep.reason  # no accelerator on this machine: says why
    assert reg.discover_devices("no-such-backend", None) is None


def test_strategies_and_precisions_come_through_the_registered_specs():
    """The built-in strategies and precision policies come through the descriptors
    (``aios_register_strategies``, ``BackendSpec.precision``): no 0.1 component hook remains."""
    from aios.config.schema import ConfigError
    from aios.plugins import hookspecs
    from aios.strategies.ddp import DDPStrategy
    from aios.strategies.precision import MixedPrecision

    assert not hasattr(hookspecs, "aios_make_strategy")
    assert not hasattr(hookspecs, "aios_make_precision")
    reg = get_registry()
    strat, spec, accel = reg.make_strategy(_cfg(), reg.backends["cpu"])
    assert type(strat) is DDPStrategy and spec.plugin == "aios-core" and accel.name == "cpu"
    with pytest.raises(AiosError, match="invalid value 'bogus' for 'strategy'"):
        reg.make_strategy(_cfg().model_copy(update={"strategy": "bogus"}), reg.backends["cpu"])
    # the Neuron backend's policy (carried by its spec) refuses fp16 with a one-line error
    with pytest.raises(ConfigError, match="fp16"):
        reg.make_precision(_cfg(precision="fp16-mixed"), reg.backends["neuron"], None, None, "xla")
    # nobody overrides the CPU policy: the core default over the cpu accelerator
    p = reg.make_precision(
        _cfg(precision="bf16-mixed"), reg.backends["cpu"], None, reg.accelerator("cpu"), "cpu"
    )
    assert isinstance(p, MixedPrecision) and p.device_type == "cpu" and p.dtype_name == "bfloat16"


def test_hook_aios_register_strategies():
    reg = get_registry()
    assert {
        "aios-core",
        "aios-backend-cuda",
        "aios-backend-xla",
        "aios-backend-neuron",
    } <= _impl_plugins("aios_register_strategies")
    assert reg.strategies_for(reg.backends["cpu"]) == ["ddp", "deepspeed", "fsdp", "hsdp", "tp"]
    assert reg.strategies_for(reg.backends["xla"]) == ["ddp", "spmd"]
    assert reg.strategies_for(reg.backends["neuron"]) == [
        "ddp",
        "fsdp",
        "hsdp",
        "nxd",
        "tp",
    ]  # fsdp/tp/hsdp: TorchNeuron only
    assert set(reg.strategies_for(reg.backends["tpu"])) >= {"ddp", "fsdp", "hsdp", "tp"}
    assert reg.strategy_spec("deepspeed", reg.backends["cpu"]).plugin == "aios-backend-cuda"
    assert (
        reg.strategy_spec("ddp", reg.backends["cuda"]).plugin == "aios-backend-cuda"
    )  # backend-specific wins
    assert (
        reg.strategy_spec("fsdp", reg.backends["cuda"]).plugin == "aios-core"
    )  # native, any accelerator
    from aios.config.schema import ConfigError

    for name in ("spmd", "nxd"):  # never a silent DDP
        with pytest.raises(ConfigError) as e:
            reg.strategy_spec(name, reg.backends["cpu"])
        assert (
            e.value.one_line()
            == f"strategy '{name}' is not available on the cpu backend (cpu accelerator); "
            "strategies on cpu: auto, ddp, deepspeed, fsdp, hsdp, tp"
        )
    with pytest.raises(
        ConfigError,
        match="invalid value 'single' for 'strategy'.*choose one of: auto, ddp, deepspeed, fsdp, hsdp, nxd, spmd, tp",
    ):
        _cfg("strategy=single")
    with pytest.raises(ConfigError, match="strategy 'fsdp' is not available on the xla backend"):
        reg.strategy_spec("fsdp", reg.backends["xla"])


def test_hook_aios_register_accelerators():
    reg = get_registry()
    assert {"aios-core", "aios-backend-cuda"} <= _impl_plugins("aios_register_accelerators")
    cpu, cuda = reg.accelerator("cpu"), reg.accelerator("cuda", _cfg())
    assert (cpu.device_type, cpu.dist_backend, cpu.is_available()) == ("cpu", "gloo", True)
    assert (cuda.device_type, cuda.dist_backend, cuda.collectives_on_device) == (
        "cuda",
        "nccl",
        True,
    )
    assert reg.backends["cpu"].accelerator == "cpu" and reg.backends["cuda"].accelerator == "cuda"
    assert reg.backends["xla"].accelerator is None  # torch_xla is not a native device


def test_hook_aios_register_cluster_environments():
    from aios.environments.base import detect

    reg = get_registry()
    assert set(reg.cluster_envs) >= {"local", "torchelastic"}
    local = detect({}, reg)
    assert (local.name, local.nnodes, local.node_rank, local.world_size) == ("local", 1, 0, 1)
    env = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
    }
    te = detect(env, reg)
    assert (
        te.name,
        te.rank,
        te.local_rank,
        te.node_rank,
        te.nnodes,
        te.master_addr,
        te.master_port,
    ) == ("torchelastic", 5, 1, 1, 2, "10.0.0.1", 29400)


def test_builtin_names_are_never_displaced():
    from aios.devices.accelerator import Accelerator
    from aios.plugins.registry import Registry
    from aios.types import AcceleratorSpec

    class Intruder:
        from aios.plugins.hookspecs import hookimpl

        @hookimpl
        def aios_register_accelerators(self, register):
            register(AcceleratorSpec("cpu", lambda config: Accelerator(config)))

        @hookimpl
        def aios_config_sections(self):
            from aios.config.settings import FsdpSettings

            return {"checkpoint": FsdpSettings}

    class Ep:
        def __init__(self, name, obj):
            self.name, self.obj, self.dist = name, obj, None

        def load(self):
            return self.obj

    import aios.plugins.builtin

    reg = Registry(
        [Ep("aios-core", aios.plugins.builtin), Ep("intruder", Intruder())], strict=False
    )
    assert reg.accelerators["cpu"].plugin == "aios-core"
    msgs = [e.error for e in reg.errors if e.plugin == "intruder"]
    assert any(
        'accelerator \'cpu\' is built into aios ("aios-core"); "intruder" cannot replace it' in m
        for m in msgs
    )
    assert any("config section 'checkpoint' belongs to aios core" in m for m in msgs)
    assert "checkpoint" not in reg.config_sections


def test_backend_launch_plan():
    reg = get_registry()
    plan = reg.launch_plan("cpu", _cfg(nprocs=2), LaunchRequest("train.py", ["--x", "1"]))
    (host,) = plan.hosts
    assert plan.launcher == "elastic" and plan.world_size == 2
    assert host.command[1:3] == ["-m", "torch.distributed.run"]
    assert host.command[-3:] == ["train.py", "--x", "1"]
    assert [r["RANK"] for r in host.ranks] == ["0", "1"]
    single = reg.launch_plan("cpu", _cfg(), LaunchRequest("train.py"))
    assert single.launcher == "direct" and single.hosts[0].command[1:] == ["train.py"]


def test_hook_aios_doctor_checks():
    reg = get_registry()
    results = reg.call_all("aios_doctor_checks", backend=None, config=None)
    by_plugin = {plugin: checks for plugin, checks, exc in results if exc is None}
    assert not [(p, e) for p, _, e in results if e is not None]
    assert {"aios-core", "aios-backend-xla", "aios-backend-cuda", "aios-backend-neuron"} <= set(
        by_plugin
    )
    assert any(c.status == "pass" and c.name == "torch installed" for c in by_plugin["aios-core"])
    # a backend-scoped call only returns that backend's checks
    only_cpu = [
        c
        for _, checks, _ in reg.call_all("aios_doctor_checks", backend="cpu", config=None)
        for c in (checks or [])
    ]
    assert only_cpu and all(c.backend in (None, "cpu") for c in only_cpu)


def test_hook_aios_preemption_watchers():
    reg = get_registry()
    results = reg.call_all("aios_preemption_watchers", config=_cfg())
    assert not [(p, e) for p, _, e in results if e is not None]
    assert {"aios-cloud-aws", "aios-cloud-gcp"} <= _impl_plugins("aios_preemption_watchers")
    # off a cloud VM no watcher is started (nothing to poll)
    watchers = [w for _, ws, _ in results for w in (ws or [])]
    assert watchers == []


def test_hook_aios_env_info():
    reg = get_registry()
    info = {}
    for plugin, result, exc in reg.call_all("aios_env_info"):
        assert exc is None, plugin
        info.update(result or {})
    assert info["torch"].startswith("2.") and "python" in info
