"""The plugin registry: entry points loaded lazily, once, each isolated; conflicts named."""

from __future__ import annotations

import json
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest
from aios.errors import BackendUnavailable, PluginError
from aios.plugins import registry as plugins_mod
from aios.plugins.registry import Registry
from aios.types import Lazy


def _module(site, name: str, source: str) -> EntryPoint:
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{name}.py").write_text(textwrap.dedent(source))
    return EntryPoint(name=name.replace("_", "-"), value=name, group="aios")


def _builtin() -> EntryPoint:
    return EntryPoint(name="aios-core", value="aios.plugins.builtin", group="aios")


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
    with pytest.raises(
        BackendUnavailable, match=r"pip install -e './packages/core\[xla\]' ./packages/backend-xla"
    ):
        reg.select("xla")
    with pytest.raises(BackendUnavailable, match="unknown backend 'nope'"):
        reg.select("nope")


def test_unknown_hook_is_rejected_with_the_plugin_name(syspath):
    p = _module(
        syspath,
        "plug_typo",
        """
        from aios import hookimpl

        @hookimpl
        def aios_register_backend(register):  # typo: missing s
            pass
    """,
    )
    reg = Registry(entry_points=[_builtin(), p], strict=False)
    assert "plug-typo" not in reg.plugins
    assert reg.errors[0].plugin == "plug-typo" and "aios_register_backend" in reg.errors[0].error


def test_registration_hook_raising_is_isolated(syspath):
    p = _module(
        syspath,
        "plug_raise",
        """
        from aios import hookimpl

        @hookimpl
        def aios_register_backends(register):
            raise ValueError('bad register')
    """,
    )
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


def test_installed_plugins_are_found_through_entry_points(
    site, run_aios, backend_plugin, write_dist
):
    write_dist(
        site, "aios-widget", "widget_plugin", backend_plugin("widget", 5, True), version="2.3"
    )
    write_dist(site, "aios-broken", "broken_plugin", "raise ImportError('missing dep')\n")
    res = run_aios("plugins", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    names = {p["name"]: p for p in data["plugins"]}
    assert names["aios-widget"]["version"] == "2.3"
    assert names["aios-widget"]["backends"] == ["widget"]
    assert names["aios-core"]["backends"] == ["cpu"]
    assert data["errors"] == [
        {"plugin": "aios-broken", "error": "Error importing plugin: ImportError: missing dep"}
    ]


def test_probe_receives_the_config_when_it_accepts_one(syspath):
    p = _module(
        syspath,
        "plug_optin",
        """
        from aios import hookimpl
        from aios.types import Availability, BackendSpec

        def probe(config=None):
            on = bool(config is not None and getattr(config, "opt_in", False))
            return Availability(on, "" if on else "no device; set opt_in")

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="optin", priority=1, probe=probe))
    """,
    )
    reg = Registry(entry_points=[_builtin(), p], strict=False)

    class Cfg:
        opt_in = True

    with pytest.raises(BackendUnavailable, match="no device; set opt_in"):
        reg.select("optin")
    assert reg.select("optin", config=Cfg()).name == "optin"


# ------------------------------------------------------------------ isolation (issue 14, item 11/12)


def test_plugin_calling_sys_exit_at_import_is_reported_not_fatal(syspath, backend_plugin):
    bad = _module(syspath, "plug_exit", "import sys\nsys.exit(3)\n")
    good = _module(syspath, "plug_fine", backend_plugin("widget", 5, True))
    reg = Registry(entry_points=[_builtin(), bad, good], strict=False)
    assert [e.plugin for e in reg.errors] == ["plug-exit"]
    assert "SystemExit" in reg.errors[0].error
    assert set(reg.backends) == {"cpu", "widget"}


def test_output_printed_at_import_is_captured_and_named(syspath, capsys):
    noisy = _module(
        syspath,
        "plug_noisy",
        """
        import sys
        print("hello from a noisy plugin")
        print("more noise", file=sys.stderr)
    """,
    )
    reg = Registry(entry_points=[_builtin(), noisy], strict=False)
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        'plugin "plug-noisy" printed output during import' in err
        and "hello from a noisy plugin" in err
    )
    assert "plug-noisy" in reg.plugins and reg.select("auto").name == "cpu"


def test_raising_backend_components_name_the_plugin_and_cpu_keeps_working(syspath, capsys):
    """A backend's discovery and launch plan are fields of its spec, called isolated: one that
    raises is an error naming its plugin and the field, and the other backends answer as before.
    A module that still implements the removed component hooks is refused as a plugin with
    unknown hooks (named, never fatal)."""
    bad = _module(
        syspath,
        "plug_specboom",
        """
        from aios import hookimpl
        from aios.types import Availability, BackendSpec

        def plan(config, request):
            raise RuntimeError("plan boom")

        def discover(config):
            raise RuntimeError("discover boom")

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="boom", priority=1, device_type="cpu",
                                 probe=lambda config=None: Availability(True), launch_plan=plan,
                                 discover=discover))
    """,
    )
    old = _module(
        syspath,
        "plug_oldhooks",
        """
        from aios import hookimpl

        @hookimpl
        def aios_launch_plan(backend, config, request):
            return None
    """,
    )
    reg = Registry(entry_points=[_builtin(), bad, old], strict=False)
    from aios.config.schema import resolve
    from aios.types import LaunchRequest

    cfg = resolve(environ={}, sections=reg.config_sections, check_backend=False)
    plan = reg.launch_plan("cpu", cfg, LaunchRequest(script="t.py"))
    assert plan is not None and plan.launcher
    rep = reg.discover_devices("cpu", None)
    assert rep is not None and rep.backend == "cpu"
    assert "plug-specboom" not in capsys.readouterr().err
    with pytest.raises(
        PluginError,
        match='plugin "plug-specboom" failed in BackendSpec.launch_plan: RuntimeError: plan boom',
    ):
        reg.launch_plan("boom", cfg, LaunchRequest(script="t.py"))
    with pytest.raises(PluginError, match="failed in BackendSpec.discover: RuntimeError"):
        reg.discover_devices("boom", None)
    assert reg.launch_plan("no-such-backend", cfg, LaunchRequest(script="t.py")) is None
    assert reg.discover_devices("no-such-backend", None) is None
    assert "plug-oldhooks" not in reg.plugins
    assert any(
        e.plugin == "plug-oldhooks" and "unknown hooks: aios_launch_plan" in e.error
        for e in reg.errors
    )


def test_hanging_import_and_probe_time_out_are_named_and_paid_once(
    syspath, monkeypatch, backend_plugin
):
    monkeypatch.setenv("AIOS_PLUGIN_TIMEOUT", "0.5")
    monkeypatch.delenv("AIOS_INTERNAL_SKIP_PLUGINS", raising=False)
    hang = _module(syspath, "plug_hang", "import time\ntime.sleep(30)\n")
    slow = _module(
        syspath,
        "plug_slowprobe",
        """
        import time
        from aios import hookimpl
        from aios.types import Availability, BackendSpec

        CALLS = []

        def probe():
            CALLS.append(1)
            time.sleep(30)
            return Availability(True)

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="slow", priority=900, probe=probe))
    """,
    )
    import time

    t0 = time.monotonic()
    reg = Registry(entry_points=[_builtin(), hang, slow], strict=False)
    assert reg.select("auto").name == "cpu"  # the slow probe is abandoned, cpu answers
    assert reg.select("auto").name == "cpu"
    assert time.monotonic() - t0 < 5
    errs = {e.plugin: e.error for e in reg.errors}
    assert "timed out after 0.5s in import" in errs["plug-hang"]
    assert "timed out after 0.5s in the 'slow' probe" in errs["plug-slowprobe"]
    assert sys.modules["plug_slowprobe"].CALLS == [1]  # asked once, then ignored
    # processes started from here (aios-run's workers) skip both instead of waiting again
    import os

    assert set(os.environ["AIOS_INTERNAL_SKIP_PLUGINS"].split(",")) == {
        "plug-hang",
        "plug-slowprobe",
    }
    child = Registry(entry_points=[_builtin(), hang, slow], strict=False)
    assert "plug-slowprobe" not in child.plugins and "skipped" in child.errors[0].error


def test_doubly_claimed_or_rejected_backend_is_named_by_aios_run(syspath, backend_plugin):
    a = _module(syspath, "plug_d1", backend_plugin("dup", 1, True))
    b = _module(syspath, "plug_d2", backend_plugin("dup", 2, True))
    rej = _module(
        syspath,
        "plug_rej",
        """
        from aios import hookimpl
        from aios.types import BackendSpec

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="Bad Name", priority=1, probe=lambda: None))
    """,
    )
    reg = Registry(entry_points=[_builtin(), a, b, rej], strict=False)
    from aios.config.schema import resolve

    with pytest.raises(PluginError, match='"plug-d1" and "plug-d2"'):
        resolve(overrides=["backend=dup"], environ={}, sections={}, registry=reg)
    with pytest.raises(PluginError, match='"plug-rej" was rejected'):
        reg.select("Bad Name")


def test_unknown_backend_names_plugins_that_failed_to_load(syspath):
    broken = _module(syspath, "plug_gone", "raise ImportError('needs libwidget')\n")
    reg = Registry(entry_points=[_builtin(), broken], strict=False)
    with pytest.raises(
        BackendUnavailable, match='unknown backend .widget.*"plug-gone": .*needs libwidget'
    ):
        reg.select("widget")


def test_cli_json_stays_clean_with_noisy_exiting_and_raising_plugins(
    site, run_aios, backend_plugin, write_dist
):
    write_dist(
        site,
        "aios-noisy",
        "noisy_plugin",
        "print('NOISE at import')\n" + textwrap.dedent(backend_plugin("noisy", 1, True)),
    )
    write_dist(site, "aios-quitter", "quitter_plugin", "import sys\nsys.exit(4)\n")
    write_dist(
        site,
        "aios-planboom",
        "planboom_plugin",
        textwrap.dedent("""
        from aios import hookimpl
        from aios.types import Availability, BackendSpec

        def plan(config, request):
            raise RuntimeError("plan boom")

        @hookimpl
        def aios_register_backends(register):
            register(BackendSpec(name="planboom", priority=1,
                                 probe=lambda config=None: Availability(True),
                                 launch_plan=plan))
    """),
    )
    res = run_aios("plugins", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)  # nothing the plugins printed is in it
    assert (
        "NOISE" not in res.stdout
        and 'plugin "aios-noisy" printed output during import' in res.stderr
    )
    assert {e["plugin"] for e in data["errors"]} == {"aios-quitter"}
    (site.parent / "t.py").write_text("print('hi')\n")
    run = run_aios("run", "--dry-run", "--json", "--backend", "cpu", "t.py")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["backend"] == "cpu"
    assert "aios-planboom" not in run.stderr  # another backend's plan is never asked for cpu


def test_lazy_targets_load_on_first_call_and_a_broken_one_names_its_plugin(syspath):
    """A spec's callable given as ``Lazy("module:attribute")`` imports nothing when the plugin
    loads; the first call imports it, and a target that cannot load is one line naming the
    plugin that registered it."""
    p = _module(
        syspath,
        "plug_lazy",
        """
        from aios import hookimpl
        from aios.types import AcceleratorSpec, Lazy

        @hookimpl
        def aios_register_accelerators(register):
            register(AcceleratorSpec("widget", Lazy("plug_lazyimpl:make")))
            register(AcceleratorSpec("gadget", Lazy("plug_no_such_module:make")))
        """,
    )
    (syspath / "plug_lazyimpl.py").write_text("def make(config):\n    return ('made', config)\n")
    reg = Registry(entry_points=[_builtin(), p], strict=False)
    assert "plug_lazyimpl" not in sys.modules
    assert reg.accelerator("widget", "cfg") == ("made", "cfg")
    assert reg.accelerators["gadget"].factory == Lazy("plug_no_such_module:make", "plug-lazy")
    with pytest.raises(PluginError) as info:
        reg.accelerator("gadget")
    assert str(info.value).startswith(
        'plugin "plug-lazy" names plug_no_such_module:make, which cannot be loaded: '
        "ModuleNotFoundError: No module named 'plug_no_such_module'; reinstall plug-lazy"
    )
    assert "\n" not in str(info.value)
    # the built-in plugin's own strategies and formats are such targets
    assert reg.strategies["ddp"][0].factory == Lazy("aios.strategies.native:ddp", "aios-core")
