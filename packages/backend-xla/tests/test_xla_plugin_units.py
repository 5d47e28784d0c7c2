"""Pure-Python parts: the compile guard's accounting, precision and strategy selection, probe,
config section, doctor. Run without torch_xla."""

from __future__ import annotations

import warnings

import pytest
from aios.config.schema import resolve
from aios.errors import BackendUnavailable, ConfigError
from aios_backend_xla import components
from aios_backend_xla.compile_guard import CompileGuard, RecompileError, RecompileWarning, shapes_of
from aios_backend_xla.discovery import TpuFacts
from aios_backend_xla.doctor import checks


class FakeTensor:
    def __init__(self, *shape):
        self.shape = shape
        self.dtype = "f32"


class Counter:
    def __init__(self):
        self.n = 0

    def __call__(self):
        return self.n


def test_shapes_of_nested_batches():
    got = shapes_of({"x": FakeTensor(8, 16), "y": [FakeTensor(8), 3]}, "batch")
    assert got == {"batch['x']": (8, 16), "batch['y'][0]": (8,)}


def test_guard_counts_per_step_and_allows_warmup():
    c = Counter()
    g = CompileGuard(warmup_steps=2, read_compiles=c)
    for step, new in ((1, 1), (2, 1), (3, 0), (4, 0)):
        g.observe((FakeTensor(8, 16),))
        c.n += new
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert g.step_end(step) == new
    assert g.summary()["compiles_by_step"] == {"1": 1, "2": 1}
    assert g.recompiles == 0 and g.compiles == 2


def test_guard_warns_with_step_and_changed_shapes():
    c = Counter()
    g = CompileGuard(warmup_steps=1, read_compiles=c)
    g.observe((FakeTensor(8, 16),), "forward")
    c.n += 1
    g.step_end(1)
    g.observe((FakeTensor(5, 16),), "forward")
    c.n += 1
    with pytest.warns(RecompileWarning, match=r"at step 2 .*forward\[0\] \(8, 16\) -> \(5, 16\)"):
        g.step_end(2)
    assert g.events[0]["step"] == 2


def test_guard_late_graphs_without_shape_change_are_allowed_then_flagged():
    c = Counter()
    g = CompileGuard(warmup_steps=1, read_compiles=c, late_graphs=2)
    g.observe((FakeTensor(8, 16),))
    c.n += 1
    g.step_end(1)
    for step in (2, 3):  # e.g. a logging .item() graph, a checkpoint graph
        g.observe((FakeTensor(8, 16),))
        c.n += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            g.step_end(step)
    g.observe((FakeTensor(8, 16),))
    c.n += 1
    with pytest.warns(RecompileWarning, match="at step 4 .*input shapes unchanged"):
        g.step_end(4)
    assert g.summary()["late_graphs_after_warmup"] == 3 and g.recompiles == 1


def test_guard_first_evaluation_is_a_new_graph_but_eval_shape_changes_are_recompiles():
    c = Counter()
    g = CompileGuard(warmup_steps=1, read_compiles=c, late_graphs=0)
    g.observe((FakeTensor(8, 16),))
    c.n += 1
    g.step_end(1)
    g.observe((FakeTensor(8, 16),))
    g.observe((FakeTensor(4, 16),), mode="eval, no_grad")
    c.n += 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.step_end(2)
    assert g.new_graphs == 1 and g.recompiles == 0
    g.observe((FakeTensor(8, 16),))
    g.observe((FakeTensor(3, 16),), mode="eval, no_grad")
    c.n += 1
    with pytest.warns(RecompileWarning, match=r"\(4, 16\) -> \(3, 16\) \(eval, no_grad\)"):
        g.step_end(3)
    # back to shapes seen before: cached graphs, nothing compiles, nothing is flagged
    g.observe((FakeTensor(8, 16),))
    g.observe((FakeTensor(4, 16),), mode="eval, no_grad")
    assert g.step_end(4) == 0 and g.recompiles == 1


def test_guard_limit_raises_one_line_error():
    c = Counter()
    g = CompileGuard(warmup_steps=0, max_recompiles=1, read_compiles=c)
    g.observe((FakeTensor(8, 16),))
    g.step_end(0)
    g.observe((FakeTensor(7, 16),))
    c.n += 1
    with pytest.warns(RecompileWarning):
        g.step_end(1)
    g.observe((FakeTensor(6, 16),))
    c.n += 1
    with pytest.raises(
        RecompileError, match="2 XLA recompiles after warm-up exceed xla.max_recompiles=1 .*step 2"
    ) as ei:
        g.step_end(2)
    assert "\n" not in ei.value.one_line()


@pytest.fixture
def cfg(clean_env):
    return lambda *o: resolve(overrides=list(o), environ={}, check_backend=False)


def test_config_section_defaults_and_validation(cfg):
    c = cfg()
    assert c.xla.allow_cpu is False and c.xla.drop_last is True and c.xla.warmup_steps == 2
    assert cfg("xla.accelerator=v5e-8").xla.accelerator == "v5litepod-8"
    with pytest.raises(ConfigError, match="unknown config key 'xla.nope'"):
        cfg("xla.nope=1")
    with pytest.raises(ConfigError, match="xla.max_recompiles"):
        cfg("xla.max_recompiles=-1")


def test_env_var_opt_in_is_the_config_key(clean_env):
    c = resolve(environ={"AIOS_XLA__ALLOW_CPU": "1"}, check_backend=False)
    assert c.xla.allow_cpu is True


def test_precision_policies(clean_env):
    from aios_backend_xla.precision import xla_precision

    assert xla_precision("fp32").device_type == "xla"
    bf = xla_precision("bf16-mixed")
    assert bf.device_type == "xla" and bf.name == "bf16-mixed" and bf.dtype_name == "bfloat16"
    assert xla_precision("bf16-true").name == "bf16-true"
    with pytest.raises(ConfigError, match="fp16-mixed' is not supported"):
        xla_precision("fp16-mixed")
    clean_env.setenv("XLA_USE_BF16", "1")
    with pytest.raises(ConfigError, match="XLA_USE_BF16=1 is set.*deprecated"):
        xla_precision("bf16-mixed")


def test_deepspeed_strategy_is_refused(cfg):
    from aios.plugins.registry import get_registry

    reg = get_registry()
    for name in ("deepspeed", "fsdp", "nxd"):
        with pytest.raises(
            ConfigError,
            match=f"strategy '{name}' is not available on the xla backend; strategies on xla: auto, ddp, spmd",
        ):
            reg.strategy_spec(name, reg.backends["xla"])
    assert reg.strategy_spec("auto", reg.backends["xla"]).plugin == "aios-backend-xla"


def test_pjrt_device_decision(cfg, fake_sysfs):
    c = cfg()
    assert components.pjrt_device_for(c, {"PJRT_DEVICE": "TPU"}) == "TPU"
    with pytest.raises(BackendUnavailable, match="no TPU was found"):
        components.pjrt_device_for(c, {})
    with pytest.raises(BackendUnavailable):
        components.pjrt_device_for(c, {"PJRT_DEVICE": "CPU"})  # CPU only with the opt-in
    assert components.pjrt_device_for(cfg("xla.allow_cpu=true"), {"PJRT_DEVICE": "CPU"}) == "CPU"
    assert components.pjrt_device_for(c, {"AIOS_XLA__ALLOW_CPU": "1"}) == "CPU"
    with pytest.raises(ConfigError, match="PJRT_DEVICE=CUDA"):
        components.pjrt_device_for(c, {"PJRT_DEVICE": "CUDA"})
    root = fake_sysfs([("0x1ae0", "0x005e")] * 4)
    assert (
        components.pjrt_device_for(cfg("xla.allow_cpu=true"), {"AIOS_TEST_SYSFS_PCI": str(root)})
        == "TPU"
    )
    with pytest.raises(ConfigError, match="PJRT_DEVICE=CPU is set on a machine with a TPU"):
        components.pjrt_device_for(c, {"AIOS_TEST_SYSFS_PCI": str(root), "PJRT_DEVICE": "CPU"})


def test_probe(cfg, monkeypatch):
    monkeypatch.setattr(components, "_torch_xla_installed", lambda: True)
    a = components.probe()
    assert not a and "no TPU was found" in a.reason
    assert components.probe(cfg("xla.allow_cpu=true"))
    assert (
        not components.probe()
    )  # nothing is remembered from an earlier resolve: only the config given counts
    monkeypatch.setenv(
        "AIOS_XLA__ALLOW_CPU", "1"
    )  # no config (aios devices): the env opt-in still counts
    assert components.probe()
    monkeypatch.delenv("AIOS_XLA__ALLOW_CPU")
    p = components.probe(cfg("xla.accelerator=v4-16"))
    assert p and "planning for v4-16" in p.reason
    assert not components.probe()
    monkeypatch.setattr(components, "_torch_xla_installed", lambda: False)
    assert components.probe(cfg("xla.allow_cpu=true")).reason == "torch_xla is not installed"


def test_registry_require_names_the_opt_in(cfg, monkeypatch):
    from aios.plugins.registry import get_registry

    monkeypatch.setattr(components, "_torch_xla_installed", lambda: True)
    with pytest.raises(BackendUnavailable) as ei:
        get_registry().require("xla")
    assert (
        "no TPU was found" in ei.value.one_line() and "AIOS_XLA__ALLOW_CPU=1" in ei.value.one_line()
    )
    # the registry passes the resolved config to the probe: the opt-in in the config is enough
    assert get_registry().require("xla", config=cfg("xla.allow_cpu=true")).name == "xla"
    with pytest.raises(BackendUnavailable):
        get_registry().require("xla", config=cfg())
    assert get_registry().backends["xla"].priority == 200


def _by_name(cs):
    return {c.name: c for c in cs}


def test_doctor_on_a_tpu_vm_without_pjrt_and_libtpu(clean_env, monkeypatch):
    import aios_backend_xla.doctor as doc

    monkeypatch.setattr(
        doc, "_ver", lambda d: {"torch": "2.9.0+cu128", "torch_xla": "2.9.0"}.get(d)
    )
    monkeypatch.setattr(
        doc.importlib.util, "find_spec", lambda n: None if n == "libtpu" else object()
    )
    facts = TpuFacts(pci_chips=4, accelerator_type="v4-8", sources=["sysfs", "metadata"])
    cs = _by_name(checks(None, environ={}, facts=facts))
    assert cs["torch/torch_xla versions"].status == "pass"
    assert cs["PJRT_DEVICE"].status == "warn"
    assert cs["libtpu"].status == "fail" and "libtpu-releases" in cs["libtpu"].fix
    cs = _by_name(checks(None, environ={"PJRT_DEVICE": "CPU", "XLA_USE_BF16": "1"}, facts=facts))
    assert cs["PJRT_DEVICE"].status == "fail" and cs["XLA_USE_BF16"].status == "fail"


def test_doctor_version_mismatch_and_no_tpu(clean_env, monkeypatch):
    import aios_backend_xla.doctor as doc

    monkeypatch.setattr(doc, "_ver", lambda d: {"torch": "2.13.0+cpu", "torch_xla": "2.9.0"}.get(d))
    monkeypatch.setattr(doc.importlib.util, "find_spec", lambda n: object())
    cs = _by_name(checks(None, environ={}, facts=TpuFacts()))
    assert (
        cs["torch/torch_xla versions"].status == "fail"
        and "torch 2.13.0+cpu does not match torch_xla 2.9.0"
        in cs["torch/torch_xla versions"].message
    )
    assert cs["TPU attached"].status == "warn" and "AIOS_XLA__ALLOW_CPU=1" in cs["TPU attached"].fix
    cs = _by_name(checks(None, deep=False, environ={"PJRT_DEVICE": "TPU"}, facts=TpuFacts()))
    assert cs["PJRT_DEVICE"].status == "fail"


def test_doctor_without_torch_xla(clean_env, monkeypatch):
    import aios_backend_xla.doctor as doc

    monkeypatch.setattr(doc, "_ver", lambda d: None)
    cs = checks(None, environ={}, facts=TpuFacts())
    assert [c.status for c in cs] == [
        "fail"
    ] and "pip install -e './packages/core[xla]' ./packages/backend-xla" in cs[0].fix
