"""The 0.1 plugin forms are gone (aios-core 0.3): a plugin that still implements the removed
``aios_make_strategy`` hook is named as invalid in one line, the legacy ``DDPStrategy``
constructor is a plain TypeError, and a strategy's ``data_rank`` written as a method is not
silently turned into a property."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PLUGIN_DIR = Path(__file__).parent / "scripts" / "legacy_plugin"


def test_a_plugin_implementing_the_removed_strategy_hook_is_named_invalid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aios.plugins.registry import Registry

    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    reg = Registry(
        entry_points=[
            EntryPoint(name="aios-core", value="aios.plugins.builtin", group="aios"),
            EntryPoint(name="legacy-backend", value="legacy_backend_plugin", group="aios"),
        ],
        strict=False,
    )
    assert "legacy" not in reg.backends
    (err,) = [e for e in reg.errors if e.plugin == "legacy-backend"]
    assert "unknown hooks: aios_make_strategy" in err.error


def test_ddp_strategy_takes_only_the_accelerator_form() -> None:
    from aios.config.schema import resolve
    from aios.devices.accelerator import CpuAccelerator
    from aios.strategies.ddp import DDPStrategy

    cfg = resolve(None, [], {}, environ={})
    with pytest.raises(TypeError):
        DDPStrategy(cfg, device_type="cuda", dist_backend="nccl")  # type: ignore[call-arg]
    s = DDPStrategy(cfg, accelerator=CpuAccelerator(cfg))
    assert (s.device_type, s.dist_backend) == ("cpu", "gloo")


def test_a_data_rank_method_stays_a_method() -> None:
    from aios.strategies.ddp import DDPStrategy

    class Old(DDPStrategy):
        def data_rank(self) -> int:  # type: ignore[override]
            return 0

    assert not isinstance(Old.__dict__["data_rank"], property)
