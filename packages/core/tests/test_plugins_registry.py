"""The plugin registry: entry points loaded lazily, once, each isolated; conflicts named."""

from __future__ import annotations

import json
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from aios import plugins as plugins_mod
from aios.errors import BackendUnavailable, PluginError
from aios.plugins import Registry


def _module(site, name: str, source: str) -> EntryPoint:
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{name}.py").write_text(textwrap.dedent(source))
    return EntryPoint(name=name.replace("_", "-"), value=name, group="aios")


def _builtin() -> EntryPoint:
    return EntryPoint(name="aios-core", value="aios.builtin", group="aios")


@pytest.fixture
def syspath(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    yield site
    for mod in [m for m in sys.modules if m.startswith("plug_")]:
        del sys.modules[mod]


def test_builtin_cpu_backend_registered_like_any_plugin():
    reg = Registry(entry_points=[_builtin()])
    assert "aios-core" in reg.plugins
    assert reg.backends["cpu"].plugin == "aios-core"
    assert "aios_register_backends" in reg.plugins["aios-core"].hooks
    assert reg.select("auto").name == "cpu"


def test_broken_plugin_is_reported_by_name_and_others_work(syspath, backend_plugin):
    broken = _module(syspath, "plug_broken", "raise RuntimeError('boom at import')\n")
    good = _module(syspath, "plug_good", backend_plugin("widget", 50, True))
    reg = Registry(entry_points=[_builtin(), broken, good], strict=False)
    assert [e.plugin for e in reg.errors] == ["plug-broken"]
    assert "boom at import" in reg.errors[0].error
    assert set(reg.backends) == {"cpu", "widget"}
    assert reg.select("auto").name == "widget"  # highest available priority wins


def test_strict_mode_turns_load_errors_into_failures(syspath):
    broken = _module(syspath, "plug_broken2", "import not_a_module_anywhere\n")
    with pytest.raises(PluginError, match='plugin "plug-broken2"'):
        Registry(entry_points=[_builtin(), broken], strict=True)


def test_two_plugins_claiming_one_backend_is_an_error_naming_both(syspath, backend_plugin):
    a = _module(syspath, "plug_a", backend_plugin("dup", 1, True))
    b = _module(syspath, "plug_b", backend_plugin("dup", 2, True))
    reg = Registry(entry_points=[_builtin(), a, b], strict=False)
    assert "dup" not in reg.backends
    with pytest.raises(PluginError) as info:
        reg.backend("dup")
    assert '"plug-a"' in str(info.value) and '"plug-b"' in str(info.value)
    assert any("dup" in e.error for e in reg.errors)


def test_unavailable_backend_is_an_error_never_a_fallback(syspath, backend_plugin):
    p = _module(syspath, "plug_off", backend_plugin("widget", 500, False))
    reg = Registry(entry_points=[_builtin(), p], strict=False)
    with pytest.raises(BackendUnavailable, match="no widget; pip install widget"):
        reg.select("widget")
    assert reg.select("auto").name == "cpu"  # auto skips the unavailable one


def test_known_but_missing_backend_names_the_install_line():
    reg = Registry(entry_points=[_builtin()])
    with pytest.raises(BackendUnavailable, match=r"aios-core\[xla\]"):
        reg.select("xla")
    with pytest.raises(BackendUnavailable, match="unknown backend 'nope'"):
        reg.select("nope")


def test_unknown_hook_is_rejected_with_the_plugin_name(syspath):
    p = _module(syspath, "plug_typo", """
        from aios import hookimpl

        @hookimpl
        def aios_register_backend(register):  # typo: missing s
            pass
    """)
    reg = Registry(entry_points=[_builtin(), p], strict=False)
    assert "plug-typo" not in reg.plugins
    assert reg.errors[0].plugin == "plug-typo" and "aios_register_backend" in reg.errors[0].error


def test_registration_hook_raising_is_isolated(syspath):
    p = _module(syspath, "plug_raise", """
        from aios import hookimpl

        @hookimpl
        def aios_register_backends(register):
            raise ValueError('bad register')
    """)
    reg = Registry(entry_points=[p, _builtin()], strict=False)
    assert "cpu" in reg.backends
    assert reg.errors[0].plugin == "plug-raise" and "bad register" in reg.errors[0].error


def test_allow_and_deny_lists(syspath, monkeypatch, backend_plugin):
    a = _module(syspath, "plug_x", backend_plugin("x", 1, True))
    b = _module(syspath, "plug_y", backend_plugin("y", 1, True))
    monkeypatch.setenv("AIOS_DISABLE_PLUGINS", "plug-x")
    assert set(Registry(entry_points=[_builtin(), a, b]).backends) == {"cpu", "y"}
    monkeypatch.delenv("AIOS_DISABLE_PLUGINS")
    monkeypatch.setenv("AIOS_PLUGINS", "plug-x")
    assert set(Registry(entry_points=[_builtin(), a, b]).backends) == {"cpu", "x"}


def test_registry_loads_lazily_and_once(monkeypatch):
    calls = []
    real = Registry.__init__

    def counting(self, *a, **k):
        calls.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(Registry, "__init__", counting)
    plugins_mod.reset_registry()
    try:
        assert calls == []
        r1 = plugins_mod.get_registry()
        r2 = plugins_mod.get_registry()
        assert r1 is r2 and calls == [1]
    finally:
        plugins_mod.reset_registry()


def test_installed_plugins_are_found_through_entry_points(site, run_aios, backend_plugin, write_dist):
    write_dist(site, "aios-widget", "widget_plugin", backend_plugin("widget", 5, True), version="2.3")
    write_dist(site, "aios-broken", "broken_plugin", "raise ImportError('missing dep')\n")
    res = run_aios("plugins", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    names = {p["name"]: p for p in data["plugins"]}
    assert names["aios-widget"]["version"] == "2.3"
    assert names["aios-widget"]["backends"] == ["widget"]
    assert names["aios-core"]["backends"] == ["cpu"]
    assert data["errors"] == [{"plugin": "aios-broken", "error": "Error importing plugin: ImportError: missing dep"}]


def test_probe_receives_the_config_when_it_accepts_one(syspath):
    p = _module(syspath, "plug_optin", """
        from aios import hookimpl
        from aios.types import Availability, BackendSpec

        def probe(config=None):
            on = bool(config is not None and getattr(config, "opt_in", False))
            return Availability(on, "" if on else "no device; set opt_in")

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="optin", priority=1, probe=probe))
    """)
    reg = Registry(entry_points=[_builtin(), p], strict=False)

    class Cfg:
        opt_in = True

    with pytest.raises(BackendUnavailable, match="no device; set opt_in"):
        reg.select("optin")
    assert reg.select("optin", config=Cfg()).name == "optin"
