"""The plugin registry: entry points in the ``aios`` group, loaded lazily, once, each in its own
``try``/``except``.

Environment switches:

* ``AIOS_PLUGINS=a,b``: load only these plugins (entry-point names = distribution names).
  ``aios-core`` (the built-in CPU backend) is always loaded unless disabled explicitly.
* ``AIOS_DISABLE_PLUGINS=a,b``: never load these.
* ``AIOS_STRICT_PLUGINS=1``: a plugin that fails to load, or a name claimed twice, raises
  :class:`aios.errors.PluginError` instead of being reported (for CI).

A broken plugin is reported by name (``aios plugins`` shows the error) and the rest keep
working.
"""

from __future__ import annotations

import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from aios import hookspecs
from aios.errors import BackendUnavailable, ConfigError, PluginError
from aios.types import AcceleratorSpec, Availability, BackendSpec, CloudSpec, LoggerSpec, StorageSpec, StrategySpec

GROUP = "aios"
BUILTIN = "aios-core"


@dataclass
class PluginInfo:
    name: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)


@dataclass
class LoadError:
    plugin: str
    error: str
    traceback: str = ""


def _split_env(name: str) -> set[str]:
    return {p.strip() for p in os.environ.get(name, "").split(",") if p.strip()}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Registry:
    """Loaded plugins and what they registered. Build with :func:`get_registry`."""

    def __init__(self, entry_points: Iterable[Any] | None = None, strict: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.strict = _truthy("AIOS_STRICT_PLUGINS") if strict is None else strict
        self.plugins: dict[str, PluginInfo] = {}
        self.errors: list[LoadError] = []
        self.backends: dict[str, BackendSpec] = {}
        self.clouds: dict[str, CloudSpec] = {}
        self.storage: dict[str, StorageSpec] = {}
        self.loggers: dict[str, LoggerSpec] = {}
        self.config_sections: dict[str, tuple[str, type]] = {}
        self.strategies: dict[str, list[StrategySpec]] = {}
        self.accelerators: dict[str, AcceleratorSpec] = {}
        self.cluster_envs: dict[str, Any] = {}
        self.conflicted: dict[str, list[str]] = {}
        self._load(entry_points)
        self._collect()

    # ------------------------------------------------------------------ loading
    def _error(self, plugin: str, message: str, tb: str = "") -> None:
        self.errors.append(LoadError(plugin, message, tb))
        if self.strict:
            raise PluginError(f'plugin "{plugin}": {message}', "fix or uninstall it, or unset AIOS_STRICT_PLUGINS")

    def _load(self, entry_points: Iterable[Any] | None) -> None:
        if entry_points is None:
            from importlib.metadata import entry_points as _eps

            entry_points = _eps(group=GROUP)
        allow = _split_env("AIOS_PLUGINS")
        deny = _split_env("AIOS_DISABLE_PLUGINS")
        seen: set[str] = set()
        for ep in sorted(entry_points, key=lambda e: (e.name != BUILTIN, e.name)):
            name = ep.name
            if name in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(name)
            if name in deny or (allow and name not in allow and name != BUILTIN):
                continue
            version = getattr(getattr(ep, "dist", None), "version", None) or "?"
            try:
                module = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must never be fatal
                self._error(name, f"Error importing plugin: {type(exc).__name__}: {exc}", traceback.format_exc())
                continue
            try:
                self.pm.register(module, name=name)
                unknown = [
                    impl for impl in self.pm.get_hookcallers(module) or [] if impl.spec is None
                ]
                if unknown:
                    self.pm.unregister(module)
                    raise pluggy.PluginValidationError(
                        module, f"unknown hooks: {', '.join(h.name for h in unknown)}"
                    )
            except Exception as exc:  # noqa: BLE001
                self._error(name, f"invalid plugin: {exc}", traceback.format_exc())
                continue
            hooks = sorted(
                h.name for h in self.pm.get_hookcallers(module) or [] if h.name.startswith("aios_")
            )
            self.plugins[name] = PluginInfo(name, version, getattr(module, "__name__", str(module)), hooks)

    # ------------------------------------------------------------------ registration hooks
    def _each_impl(self, hook_name: str, call: Callable[[Callable[..., Any], str], None]) -> None:
        caller = getattr(self.pm.hook, hook_name)
        # pluggy calls LIFO; iterate in load order so the first registrant of a name is stable
        for impl in caller.get_hookimpls():
            try:
                call(impl.function, impl.plugin_name)
            except PluginError:
                raise
            except Exception as exc:  # noqa: BLE001
                self._error(impl.plugin_name, f"{hook_name} failed: {type(exc).__name__}: {exc}", traceback.format_exc())

    def _claim(self, kind: str, table: dict[str, Any], key: str, value: Any, plugin: str) -> None:
        if key in self.conflicted.get(f"{kind}:{key}", []):
            return
        if key in table:
            other = table[key].plugin if hasattr(table[key], "plugin") else table[key][0]
            if other == BUILTIN:  # a built-in name is never displaced by a third-party plugin
                self._error(plugin, f"{kind} '{key}' is built into aios (\"{BUILTIN}\"); \"{plugin}\" cannot replace it")
                return
            del table[key]
            self.conflicted[f"{kind}:{key}"] = [other, plugin]
            self._error(
                plugin,
                f"{kind} '{key}' is registered by both \"{other}\" and \"{plugin}\"",
            )
            return
        table[key] = value

    def _collect(self) -> None:
        def reg(kind: str, table: dict[str, Any], attr: str) -> Callable[[Callable[..., Any], str], None]:
            def call(fn: Callable[..., Any], plugin: str) -> None:
                def register(spec: Any) -> None:
                    spec = _with_plugin(spec, plugin)
                    self._claim(kind, table, getattr(spec, attr), spec, plugin)

                fn(register=register)

            return call

        self._each_impl("aios_register_backends", reg("backend", self.backends, "name"))
        self._each_impl("aios_register_clouds", reg("cloud", self.clouds, "name"))
        self._each_impl("aios_register_storage", reg("storage scheme", self.storage, "scheme"))
        self._each_impl("aios_register_loggers", reg("logger", self.loggers, "name"))

        def sections(fn: Callable[..., Any], plugin: str) -> None:
            from aios.config import AiosConfigBase

            for key, model in (fn() or {}).items():
                if key in AiosConfigBase.model_fields:
                    self._error(plugin, f"config section '{key}' belongs to aios core; \"{plugin}\" cannot replace it")
                    continue
                self._claim("config section", self.config_sections, key, (plugin, model), plugin)

        self._each_impl("aios_config_sections", sections)
        self._each_impl("aios_register_accelerators", reg("accelerator", self.accelerators, "name"))

        def envs(fn: Callable[..., Any], plugin: str) -> None:
            def register(env: Any) -> None:
                if not getattr(env, "plugin", ""):
                    try:
                        env.plugin = plugin
                    except AttributeError:  # pragma: no cover - a frozen object
                        pass
                self._claim("cluster environment", self.cluster_envs, env.name, env, plugin)

            fn(register=register)

        self._each_impl("aios_register_cluster_environments", envs)

        def strategies(fn: Callable[..., Any], plugin: str) -> None:
            def register(spec: StrategySpec) -> None:
                spec = _with_plugin(spec, plugin)
                targets = [f"backend {b}" for b in spec.backends] + [f"accelerator {a}" for a in spec.accelerators]
                for other in self.strategies.get(spec.name, []):
                    mine = {f"backend {b}" for b in other.backends} | {f"accelerator {a}" for a in other.accelerators}
                    clash = [t for t in targets if t in mine]
                    if clash:
                        self._error(
                            plugin,
                            f"strategy '{spec.name}' for {clash[0]} is registered by both \"{other.plugin}\" and \"{plugin}\"; keeping \"{other.plugin}\"'s",
                        )
                        return
                self.strategies.setdefault(spec.name, []).append(spec)

            fn(register=register)

        self._each_impl("aios_register_strategies", strategies)

    # ------------------------------------------------------------------ queries
    def backend(self, name: str) -> BackendSpec:
        """The spec for ``name``; a clear error when unknown or claimed twice."""
        if name in self.backends:
            return self.backends[name]
        if f"backend:{name}" in self.conflicted:
            a, b = self.conflicted[f"backend:{name}"]
            raise PluginError(
                f"backend '{name}' is registered by both \"{a}\" and \"{b}\"",
                f"uninstall one, or disable it with AIOS_DISABLE_PLUGINS={b}",
            )
        hint = KNOWN_BACKENDS.get(name)
        known = ", ".join(["auto", *sorted(self.backends)])
        if hint:
            raise BackendUnavailable(f"backend '{name}' is not installed", f"run: {hint}")
        raise BackendUnavailable(f"unknown backend '{name}' (installed: {known})", "pick one of those or install the plugin that provides it")

    def probe(self, name: str, config: Any = None) -> Availability:
        """Ask the backend's probe; probes that take a ``config`` argument get the resolved
        config (e.g. an explicit opt-in such as ``xla.allow_cpu``)."""
        spec = self.backend(name)
        try:
            if config is not None and _accepts_config(spec.probe):
                return spec.probe(config=config)
            return spec.probe()
        except Exception as exc:  # noqa: BLE001
            return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")

    def require(self, name: str, config: Any = None) -> BackendSpec:
        """The spec for an explicitly requested backend; unavailable is an error, never a fallback."""
        spec = self.backend(name)
        avail = self.probe(name, config)
        if not avail:
            fix = spec.install_hint or "see `aios doctor --backend " + name + "`"
            raise BackendUnavailable(f"backend '{name}' is not available here: {avail.reason}", fix)
        return spec

    def select(self, name: str, config: Any = None) -> BackendSpec:
        """Resolve ``auto`` to the highest-priority available backend, or require ``name``."""
        if name != "auto":
            return self.require(name, config)
        ranked = sorted(self.backends.values(), key=lambda s: (-s.priority, s.name))
        for spec in ranked:
            if self.probe(spec.name, config):
                return spec
        raise BackendUnavailable("no backend is available", "install aios-core (the cpu backend is built in)")

    def cloud(self, name: str) -> CloudSpec:
        if name in self.clouds:
            return self.clouds[name]
        hint = KNOWN_CLOUDS.get(name)
        if hint:
            raise PluginError(f"cloud '{name}' is not installed", f"run: {hint}")
        known = ", ".join(sorted(self.clouds)) or "none installed"
        raise PluginError(f"unknown cloud '{name}' (installed: {known})", "install the plugin that provides it, e.g. pip install 'aios-core[gcp]'")

    # ------------------------------------------------------------------ strategies / accelerators
    def accelerator(self, name: str, config: Any = None) -> Any:
        """A new :class:`aios.accelerator.Accelerator` for ``name``."""
        if name not in self.accelerators:
            known = ", ".join(sorted(self.accelerators)) or "none"
            raise PluginError(f"accelerator '{name}' is not registered (registered: {known})", "install the plugin that provides it")
        return self.accelerators[name].factory(config)

    def strategies_for(self, backend: BackendSpec) -> list[str]:
        """Names of the registered strategies that run on ``backend``."""
        return sorted(n for n, specs in self.strategies.items() if any(s.supports(backend.name, backend.accelerator) for s in specs))

    def strategy_spec(self, name: str, backend: BackendSpec) -> StrategySpec | None:
        """The :class:`StrategySpec` for ``strategy=name`` on ``backend`` (``auto``: the backend's
        default). ``None`` for a backend that registers no strategy (served by the 0.1
        ``aios_make_strategy`` hook). An unknown name, or one the backend cannot run, is a
        one-line :class:`ConfigError`; never a silent substitute."""
        supported = self.strategies_for(backend)
        if name == "auto":
            if not supported:
                return None
            name = backend.default_strategy if backend.default_strategy in supported else supported[0]
        if name not in self.strategies:
            known = ", ".join(["auto", *sorted(self.strategies)])
            raise ConfigError(f"invalid value {name!r} for 'strategy'", f"choose one of: {known}")
        specs = [s for s in self.strategies[name] if s.supports(backend.name, backend.accelerator)]
        if not specs:
            if not supported and _has_legacy(self, "aios_make_strategy", backend.plugin):
                return None
            where = f"{backend.name} backend" + (f" ({backend.accelerator} accelerator)" if backend.accelerator else "")
            on = ", ".join(["auto", *supported]) if supported else "none registered"
            raise ConfigError(f"strategy '{name}' is not available on the {where}", f"strategies on {backend.name}: {on}")

        # a spec naming the backend beats one naming the accelerator, which beats "*"
        def rank(s: StrategySpec) -> int:
            return 0 if backend.name in s.backends else (1 if backend.accelerator in s.accelerators else 2)

        return sorted(specs, key=rank)[0]

    def make_strategy(self, config: Any, backend: BackendSpec) -> tuple[Any, StrategySpec | None, Any]:
        """``(strategy, spec, accelerator)`` for ``config.strategy`` on ``backend``."""
        accel = self.accelerator(backend.accelerator, config) if backend.accelerator else None
        spec = self.strategy_spec(getattr(config, "strategy", "auto"), backend)
        if spec is None:
            strategy = getattr(self.pm.hook, "aios_make_strategy")(backend=backend.name, config=config)
            if strategy is None:
                raise PluginError(f"backend '{backend.name}' provides no training strategy", f"reinstall the plugin that registers it ({backend.plugin or 'unknown'})")
            return strategy, None, accel
        return spec.factory(config, accel, backend.name), spec, accel

    def make_precision(self, config: Any, backend: BackendSpec, spec: StrategySpec | None, accel: Any, device_type: str) -> Any:
        """The precision policy: the strategy's, else the backend's, else the 0.1 hook, else the
        core default over the accelerator (its autocast dtype passed explicitly)."""
        from aios.precision import default_precision

        precision = config.precision
        for fn in (spec.precision if spec else None, backend.precision):
            if fn is not None:
                out = fn(precision, config, accel)
                if out is not None:
                    return out
        out = getattr(self.pm.hook, "aios_make_precision")(backend=backend.name, precision=precision, config=config)
        if out is not None:
            return out
        return default_precision(precision, device_type, accelerator=accel)

    def call_first(self, hook_name: str, **kwargs: Any) -> Any:
        """Call a ``firstresult`` component hook. Used at setup only, never per step. A
        component the backend's spec carries (``BackendSpec.discover``, ``.launch_plan``) is
        used before any hook is asked."""
        name = kwargs.get("backend")
        spec = self.backends.get(name) if isinstance(name, str) else None
        if spec is not None:
            if hook_name == "aios_discover_devices" and spec.discover is not None:
                return spec.discover(kwargs.get("config"))
            if hook_name == "aios_launch_plan":
                config, request = kwargs["config"], kwargs["request"]
                sspec = self.strategy_spec(getattr(config, "strategy", "auto"), spec)
                plan = spec.launch_plan(config, request) if spec.launch_plan is not None else getattr(self.pm.hook, hook_name)(**kwargs)
                if plan is not None and sspec is not None and sspec.launch_env is not None:
                    extra = sspec.launch_env(config, spec.name)
                    for hp in plan.hosts:
                        hp.env.update(extra)
                    if extra:
                        plan.notes.append(f"strategy {sspec.name} ({sspec.plugin}): " + " ".join(f"{k}={v}" for k, v in sorted(extra.items())))
                return plan
        return getattr(self.pm.hook, hook_name)(**kwargs)

    def call_all(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any, BaseException | None]]:
        """Call a collecting hook plugin by plugin; one plugin's exception never hides others."""
        out: list[tuple[str, Any, BaseException | None]] = []
        if hook_name == "aios_doctor_checks":
            asked = kwargs.get("backend")
            for spec in self.backends.values():
                if spec.doctor is not None and asked in (None, spec.name):
                    try:
                        out.append((spec.plugin, spec.doctor(kwargs.get("config"), asked == spec.name), None))
                    except Exception as exc:  # noqa: BLE001
                        out.append((spec.plugin, None, exc))
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            try:
                accepted = {k: v for k, v in kwargs.items() if k in impl.argnames}
                out.append((impl.plugin_name, impl.function(**accepted), None))
            except Exception as exc:  # noqa: BLE001
                out.append((impl.plugin_name, None, exc))
        return out


# Backends and clouds aios knows the install line for, even when their plugin is absent.
KNOWN_BACKENDS = {
    "cuda": "pip install 'aios-core[cuda]'",
    "xla": "pip install 'aios-core[xla]'",
    "neuron": "pip install 'aios-core[neuron]' (plus torch-neuronx from the AWS Neuron index)",
}
KNOWN_CLOUDS = {"gcp": "pip install 'aios-core[gcp]'", "aws": "pip install 'aios-core[aws]'"}


def _accepts_config(fn: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "config" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _has_legacy(reg: Registry, hook_name: str, plugin: str) -> bool:
    return any(impl.plugin_name == plugin for impl in getattr(reg.pm.hook, hook_name).get_hookimpls())


def _with_plugin(spec: Any, plugin: str) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(spec) and hasattr(spec, "plugin") and not spec.plugin:
        return dataclasses.replace(spec, plugin=plugin)
    return spec


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use and then reused."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = Registry()
    return _registry


def reset_registry() -> None:
    """Forget the loaded registry (tests; after installing a plugin in-process)."""
    global _registry
    _registry = None
