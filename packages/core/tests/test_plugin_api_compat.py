"""Plugin API stability: a backend plugin written against aios-core 0.1's documented API
(``DDPStrategy(config, device_type=..., dist_backend=...)`` from ``aios_make_strategy``) still
trains, with a DeprecationWarning naming the new form; the hook reference marks it."""

from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PLUGIN_DIR = Path(__file__).parent / "scripts" / "legacy_plugin"


@pytest.fixture
def legacy_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from aios.plugins import registry as plugins_mod

    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    monkeypatch.setenv("AIOS_LOGGING__RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
    plugins_mod.reset_registry()
    plugins_mod._registry = plugins_mod.Registry(
        entry_points=[
            EntryPoint(name="aios-core", value="aios.plugins.builtin", group="aios"),
            EntryPoint(name="legacy-backend", value="legacy_backend_plugin", group="aios"),
        ]
    )
    yield
    plugins_mod.reset_registry()


def test_plugin_written_against_the_previous_release_still_trains(legacy_registry) -> None:
    import aios

    with pytest.warns(DeprecationWarning, match=r"use DDPStrategy\(config, accelerator=\.\.\.\)"):
        rt = aios.init(backend="legacy")
    try:
        assert rt.strategy.device_type == "cpu" and rt.strategy.dist_backend == "gloo"
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = rt.setup(model, opt)
        before = model.weight.detach().clone()
        rt.backward(model(torch.ones(2, 4)).sum())
        rt.step(opt)
        assert not torch.equal(before, model.weight.detach())
    finally:
        rt.close()


def test_ddp_strategy_old_forms_warn_and_new_form_is_quiet() -> None:
    from aios.config.schema import resolve
    from aios.devices.accelerator import CpuAccelerator
    from aios.strategies.ddp import DDPStrategy

    cfg = resolve(None, [], {}, environ={})
    for make in (
        lambda: DDPStrategy(cfg, device_type="cuda", dist_backend="nccl"),
        lambda: DDPStrategy(cfg, "cuda", "nccl"),  # 0.1 positional
    ):
        with pytest.warns(DeprecationWarning, match="deprecated since aios-core 0.2"):
            s = make()
        assert (s.device_type, s.dist_backend, s.accelerator.device_type) == (
            "cuda",
            "nccl",
            "cuda",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = DDPStrategy(cfg, accelerator=CpuAccelerator(cfg))
    assert (s.device_type, s.dist_backend) == ("cpu", "gloo")


def test_hook_reference_marks_the_deprecation() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    hooks = readme[readme.index("HOOKS:START") : readme.index("HOOKS:END")]
    assert "deprecated:: 0.2" in hooks and "DDPStrategy(config, accelerator=...)" in hooks


def test_a_probe_without_config_is_adapted_once_at_registration_with_a_warning() -> None:
    """The 0.1 ``probe()`` form: one DeprecationWarning naming the new form when the backend
    registers; the registry then calls every probe the declared way, ``probe(config=...)``."""
    from aios.plugins.registry import Registry
    from aios.types import Availability, BackendSpec

    calls: list[str] = []

    from aios import hookimpl

    class Old:
        @hookimpl
        def aios_register_backends(self, register):
            def probe():
                calls.append("old")
                return Availability(True)

            register(BackendSpec(name="oldprobe", priority=1, probe=probe))

    class New:
        @hookimpl
        def aios_register_backends(self, register):
            def probe(config=None):
                calls.append(f"new:{config}")
                return Availability(True)

            register(BackendSpec(name="newprobe", priority=1, probe=probe))

    class Ep:
        def __init__(self, name, obj):
            self.name, self.obj, self.dist = name, obj, None

        def load(self):
            return self.obj

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        reg = Registry([Ep("old-plugin", Old()), Ep("new-plugin", New())], strict=False)
    dep = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(dep) == 1 and "backend 'oldprobe' of plugin \"old-plugin\"" in dep[0]
    assert "probe(config=None) -> Availability" in dep[0]
    assert reg.probe("oldprobe", config="cfg").available
    assert reg.probe("newprobe", config="cfg").available
    assert calls == ["old", "new:cfg"]
