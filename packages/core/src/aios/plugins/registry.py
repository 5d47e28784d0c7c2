"""The plugin registry: entry points in the ``aios`` group, loaded lazily, once, each isolated.

Environment switches:

* ``AIOS_PLUGINS=a,b``: load only these plugins (entry-point names = distribution names) and
  the plugins they depend on (``AIOS_PLUGINS=aios-cloud-gcp`` loads aios-cloud, which brings the
  cloud commands). ``aios-core`` (the built-in CPU backend) is always loaded unless disabled
  explicitly.
* ``AIOS_DISABLE_PLUGINS=a,b``: never load these.
* ``AIOS_STRICT_PLUGINS=1``: a plugin that fails to load, or a name claimed twice, raises
  :class:`aios.errors.PluginError` instead of being reported (for CI).
* ``AIOS_PLUGIN_TIMEOUT=SECONDS`` (default 10; ``0`` disables): the time limit for a plugin's
  import, each of its registration hooks, probes and CLI-side hooks (``aios_doctor_checks``,
  which may import a device runtime: 10 times that).

Isolation: every plugin import and every hook call runs per plugin, so one plugin's failure is
reported by name and the other plugins still answer (the built-in ``cpu`` backend keeps
working). A plugin that raises (``SystemExit`` included) is reported and ignored; output it
prints to stdout/stderr while aios calls it is captured (``--json`` output stays clean) and shown
as one warning line on stderr naming the plugin; a plugin that does not answer within the time
limit is reported ("plugin X timed out after 10s in Y"), ignored for the rest of the process,
and skipped by the processes this one starts (``AIOS_INTERNAL_SKIP_PLUGINS``), so ``aios-run``
and its workers pay the timeout once. Imports, registration hooks, probes and
a backend's ``discover``/``launch_plan``, ``aios_doctor_checks`` and ``aios_env_info`` run in a
daemon thread under the time limit; the per-process runtime hook (``aios_preemption_watchers``)
runs in the calling thread (it may set
per-thread device state) with the same isolation but no time limit. A hook that raises an
:class:`aios.errors.AiosError` is giving a user-facing answer: that error propagates unchanged.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from aios.errors import AiosError, BackendUnavailable, ConfigError, PluginError
from aios.plugins import hookspecs, install_hints
from aios.plugins.guarded import (
    TIMEOUT_ENV,
    Outcome,
    guarded,
    one_line,
    plugin_timeout,
    split_env,
    truthy,
    warn,
)
from aios.plugins.loading import (
    config_key,
    core_commands,
    declared_probe,
    is_target,
    with_plugin,
    with_plugin_dependencies,
)
from aios.plugins.reserved import CONFIG_KEYS
from aios.strategies.precision import default_precision
from aios.types import (
    AcceleratorSpec,
    Availability,
    BackendSpec,
    CheckpointFormatSpec,
    CloudSpec,
    CommandSpec,
    DeviceReport,
    LaunchPlan,
    LaunchRequest,
    LoggerSpec,
    StorageSpec,
    StrategySpec,
)

if TYPE_CHECKING:  # pragma: no cover
    from aios.environments.base import ClusterEnvironment

GROUP = "aios"
BUILTIN = "aios-core"
# plugins a parent process found hanging: its child processes skip them instead of waiting again
SKIP_ENV = "AIOS_INTERNAL_SKIP_PLUGINS"
# per-process runtime hooks: called in the calling thread (no time limit), still isolated
INLINE_HOOKS = frozenset({"aios_preemption_watchers"})
# hooks allowed to import a device runtime (deep doctor checks import torch_xla, NVML, ...) or to
# reach a remote host (a cluster's run records copied for ``aios report CLUSTER``): their limit is
# this multiple of AIOS_PLUGIN_TIMEOUT
SLOW_HOOKS = {"aios_doctor_checks": 10, "aios_report_target": 10}
_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")


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


class Registry:
    """Loaded plugins and what they registered. Build with :func:`get_registry`."""

    def __init__(
        self,
        entry_points: Iterable[Any] | None = None,
        strict: bool | None = None,
        timeout: float | None | bool = True,
        commands_only: bool = False,
    ) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.strict = truthy("AIOS_STRICT_PLUGINS") if strict is None else strict
        self.timeout: float | None = plugin_timeout() if timeout is True else (timeout or None)
        self.plugins: dict[str, PluginInfo] = {}
        self.errors: list[LoadError] = []
        self.warnings: list[str] = []
        self.backends: dict[str, BackendSpec] = {}
        self.clouds: dict[str, CloudSpec] = {}
        self.commands: dict[str, CommandSpec] = {}
        self.storage: dict[str, StorageSpec] = {}
        self.loggers: dict[str, LoggerSpec] = {}
        self.checkpoint_formats: dict[str, CheckpointFormatSpec] = {}
        self.config_sections: dict[str, tuple[str, type]] = {}
        self.strategies: dict[str, list[StrategySpec]] = {}
        self.accelerators: dict[str, AcceleratorSpec] = {}
        self.cluster_envs: dict[str, ClusterEnvironment] = {}
        self.conflicted: dict[str, list[str]] = {}
        self.rejected: dict[str, tuple[str, str]] = {}  # "kind:key" -> (plugin, why)
        self.dead: set[str] = set()  # plugins that timed out: ignored from then on
        self._probes: dict[tuple[str, str], Availability] = {}
        self._load(entry_points)
        if commands_only:  # `aios --help`: the plugins' commands, nothing else (no pydantic)
            self._collect_commands()
        else:
            self._collect()

    # ------------------------------------------------------------------ isolation
    def _error(self, plugin: str, message: str, tb: str = "") -> None:
        self.errors.append(LoadError(plugin, message, tb))
        if self.strict:
            raise PluginError(
                f'plugin "{plugin}": {message}', "fix or uninstall it, or unset AIOS_STRICT_PLUGINS"
            )

    def _run(self, plugin: str, what: str, fn: Callable[[], Any], inline: bool = False) -> Outcome:
        """Call into ``plugin`` isolated: output captured, exceptions caught, time-limited."""
        limit = self.timeout * SLOW_HOOKS.get(what, 1) if self.timeout else None
        out = guarded(fn, limit, inline=inline)
        if out.output.strip():
            msg = (
                f'plugin "{plugin}" printed output during {what} (captured): {one_line(out.output)}'
            )
            self.warnings.append(msg)
            warn(msg)
        if out.timed_out:
            self.dead.add(plugin)
            skipped = split_env(SKIP_ENV) | {plugin}
            os.environ[SKIP_ENV] = ",".join(sorted(skipped))  # child processes skip it
            self._error(
                plugin,
                f"timed out after {limit:g}s in {what}; ignored "
                f"(raise {TIMEOUT_ENV} or disable it with AIOS_DISABLE_PLUGINS={plugin})",
            )
        return out

    # ------------------------------------------------------------------ loading
    def _load(self, entry_points: Iterable[Any] | None) -> None:
        if entry_points is None:
            from importlib.metadata import entry_points as _eps

            entry_points = _eps(group=GROUP)
        allow = split_env("AIOS_PLUGINS")
        if allow:
            entry_points = list(entry_points)
            allow = with_plugin_dependencies(allow, entry_points)
        deny = split_env("AIOS_DISABLE_PLUGINS")
        hung = split_env(SKIP_ENV)
        seen: set[str] = set()
        for ep in sorted(entry_points, key=lambda e: (e.name != BUILTIN, e.name)):
            name = ep.name
            if name in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(name)
            if name in deny or (allow and name not in allow and name != BUILTIN):
                continue
            if name in hung:
                self.dead.add(name)
                self._error(
                    name, f"skipped: it timed out in the parent aios process (limit {TIMEOUT_ENV})"
                )
                continue
            version = getattr(getattr(ep, "dist", None), "version", None) or "?"
            out = self._run(name, "import", ep.load)
            if out.timed_out:
                continue
            if out.exc is not None:
                exc = out.exc
                self._error(name, f"Error importing plugin: {type(exc).__name__}: {exc}", out.tb)
                continue
            module = out.value
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
            self.plugins[name] = PluginInfo(
                name, version, getattr(module, "__name__", str(module)), hooks
            )

    # ------------------------------------------------------------------ registration hooks
    def _impls(self, hook_name: str) -> list[Any]:
        """A hook's implementations in pluggy's call order, without plugins that timed out."""
        caller = getattr(self.pm.hook, hook_name)
        return [i for i in reversed(caller.get_hookimpls()) if i.plugin_name not in self.dead]

    def _each_impl(self, hook_name: str, call: Callable[[Callable[..., Any], str], None]) -> None:
        # iterate in load order so the first registrant of a name is stable
        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            plugin = impl.plugin_name
            if plugin in self.dead:
                continue
            out = self._run(plugin, hook_name, functools.partial(call, impl.function, plugin))
            if out.exc is not None and not out.timed_out:
                if isinstance(out.exc, PluginError) and self.strict:
                    raise out.exc
                self._error(
                    plugin, f"{hook_name} failed: {type(out.exc).__name__}: {out.exc}", out.tb
                )

    def _claim(self, kind: str, table: dict[str, Any], key: str, value: Any, plugin: str) -> None:
        if plugin in self.dead:
            return
        if key in self.conflicted.get(f"{kind}:{key}", []):
            return
        if key in table:
            other = table[key].plugin if hasattr(table[key], "plugin") else table[key][0]
            if other == BUILTIN:  # a built-in name is never displaced by a third-party plugin
                self._error(
                    plugin,
                    f'{kind} \'{key}\' is built into aios ("{BUILTIN}"); "{plugin}" cannot replace it',
                )
                return
            del table[key]
            self.conflicted[f"{kind}:{key}"] = [other, plugin]
            self._error(
                plugin,
                f'{kind} \'{key}\' is registered by both "{other}" and "{plugin}"',
            )
            return
        table[key] = value

    def _reject(self, kind: str, key: Any, plugin: str, why: str) -> None:
        self.rejected[f"{kind}:{key}"] = (plugin, why)
        self._error(plugin, f"{kind} {key!r} rejected: {why}")

    def _collect(self) -> None:
        self._collect_commands()
        self._collect_specs()

    def _collect_commands(self) -> None:
        def call(fn: Callable[..., Any], plugin: str) -> None:
            def register(spec: Any) -> None:
                name = getattr(spec, "name", None)
                key = name if isinstance(name, str) else ""
                if not isinstance(spec, CommandSpec):
                    why = f"expected a CommandSpec, got {type(spec).__name__}"
                elif not _NAME.match(key):
                    why = "the name must be lowercase letters, digits, '-', '_' or '.'"
                elif not is_target(spec.target):
                    why = f"its target {spec.target!r} is not 'module:attribute'"
                else:
                    why = ""
                if why:
                    self._reject("command", name, plugin, why)
                    return
                if key in core_commands():
                    self._error(
                        plugin,
                        f"command '{key}' is built into aios; \"{plugin}\" cannot replace it",
                    )
                    return
                self._claim("command", self.commands, key, with_plugin(spec, plugin), plugin)

            fn(register=register)

        self._each_impl("aios_register_commands", call)

    def _collect_specs(self) -> None:
        types = {
            "backend": BackendSpec,
            "cloud": CloudSpec,
            "storage scheme": StorageSpec,
            "logger": LoggerSpec,
            "checkpoint format": CheckpointFormatSpec,
            "accelerator": AcceleratorSpec,
        }

        def reg(
            kind: str, table: dict[str, Any], attr: str
        ) -> Callable[[Callable[..., Any], str], None]:
            def call(fn: Callable[..., Any], plugin: str) -> None:
                def register(spec: Any) -> None:
                    key = getattr(spec, attr, None)
                    if not isinstance(spec, types[kind]):
                        self._reject(
                            kind,
                            key,
                            plugin,
                            f"expected a {types[kind].__name__}, got {type(spec).__name__}",
                        )
                        return
                    if not isinstance(key, str) or not _NAME.match(key) or key == "auto":
                        self._reject(
                            kind,
                            key,
                            plugin,
                            "the name must be lowercase letters, digits, '-', '_' or '.', and not 'auto'",
                        )
                        return
                    if kind == "backend" and not callable(getattr(spec, "probe", None)):
                        self._reject(kind, key, plugin, "its probe is not callable")
                        return
                    spec = with_plugin(spec, plugin)
                    if kind == "backend":
                        spec = declared_probe(spec, plugin)
                    self._claim(kind, table, key, spec, plugin)

                fn(register=register)

            return call

        self._each_impl("aios_register_backends", reg("backend", self.backends, "name"))
        self._each_impl("aios_register_clouds", reg("cloud", self.clouds, "name"))
        self._each_impl("aios_register_storage", reg("storage scheme", self.storage, "scheme"))
        self._each_impl("aios_register_loggers", reg("logger", self.loggers, "name"))
        self._each_impl(
            "aios_register_checkpoint_formats",
            reg("checkpoint format", self.checkpoint_formats, "name"),
        )

        def sections(fn: Callable[..., Any], plugin: str) -> None:
            for key, model in (fn() or {}).items():
                if key in CONFIG_KEYS:
                    self._error(
                        plugin,
                        f"config section '{key}' belongs to aios core; \"{plugin}\" cannot replace it",
                    )
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
                spec = with_plugin(spec, plugin)
                targets = [f"backend {b}" for b in spec.backends] + [
                    f"accelerator {a}" for a in spec.accelerators
                ]
                for other in self.strategies.get(spec.name, []):
                    mine = {f"backend {b}" for b in other.backends} | {
                        f"accelerator {a}" for a in other.accelerators
                    }
                    clash = [t for t in targets if t in mine]
                    if clash:
                        self._error(
                            plugin,
                            f"strategy '{spec.name}' for {clash[0]} is registered by both "
                            f'"{other.plugin}" and "{plugin}"; keeping "{other.plugin}"\'s',
                        )
                        return
                self.strategies.setdefault(spec.name, []).append(spec)

            fn(register=register)

        self._each_impl("aios_register_strategies", strategies)

    # ------------------------------------------------------------------ queries
    def _failed_note(self) -> str:
        failed = [e for e in self.errors if e.plugin not in self.plugins or e.plugin in self.dead]
        if not failed:
            return ""
        shown = "; ".join(f'"{e.plugin}": {one_line(e.error, 120)}' for e in failed[:3])
        more = f" (+{len(failed) - 3} more)" if len(failed) > 3 else ""
        return f"; plugins that failed to load: {shown}{more}"

    def backend(self, name: str) -> BackendSpec:
        """The spec for ``name``; a clear error when unknown, rejected or claimed twice."""
        if name in self.backends:
            spec = self.backends[name]
            if spec.plugin in self.dead:
                raise PluginError(
                    f"backend '{name}': its plugin \"{spec.plugin}\" timed out and is ignored",
                    f"raise {TIMEOUT_ENV}, or fix or disable the plugin (AIOS_DISABLE_PLUGINS={spec.plugin})",
                )
            return spec
        if f"backend:{name}" in self.conflicted:
            a, b = self.conflicted[f"backend:{name}"]
            raise PluginError(
                f'backend \'{name}\' is registered by both "{a}" and "{b}"',
                f"uninstall one, or disable it with AIOS_DISABLE_PLUGINS={b}",
            )
        if f"backend:{name}" in self.rejected:
            plugin, why = self.rejected[f"backend:{name}"]
            raise PluginError(
                f"backend '{name}' from plugin \"{plugin}\" was rejected: {why}",
                "fix the plugin or report it to its authors",
            )
        hint = KNOWN_BACKENDS.get(name)
        known = ", ".join(["auto", *sorted(self.backends)])
        if hint:
            raise BackendUnavailable(
                f"backend '{name}' is not installed{self._failed_note()}", f"run: {hint}"
            )
        raise BackendUnavailable(
            f"unknown backend '{name}' (installed: {known}){self._failed_note()}",
            "pick one of those or install the plugin that provides it",
        )

    def probe(self, name: str, config: Any = None) -> Availability:
        """Ask the backend's probe (isolated, time-limited, answered once per config); probes
        that take a ``config`` argument get the resolved config (e.g. ``xla.allow_cpu``)."""
        spec = self.backend(name)
        key = (name, config_key(config))
        if key in self._probes:
            return self._probes[key]
        out = self._run(
            spec.plugin or name, f"the '{name}' probe", lambda: spec.probe(config=config)
        )
        if out.timed_out:
            avail = Availability(
                False,
                f'probe timed out after {self.timeout:g}s (plugin "{spec.plugin}" is ignored)',
            )
        elif out.exc is not None:
            avail = Availability(False, f"probe failed: {type(out.exc).__name__}: {out.exc}")
        elif not isinstance(out.value, Availability):
            avail = Availability(
                False,
                f'probe of plugin "{spec.plugin}" returned {type(out.value).__name__}, not Availability',
            )
        else:
            avail = out.value
        self._probes[key] = avail
        return avail

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
            if spec.plugin in self.dead:
                continue
            if self.probe(spec.name, config):
                return spec
        raise BackendUnavailable(
            f"no backend is available{self._failed_note()}",
            f"the cpu backend is built into aios-core; run `aios doctor` (install: {INSTALL_CORE})",
        )

    def cloud(self, name: str) -> CloudSpec:
        if name in self.clouds and self.clouds[name].plugin not in self.dead:
            return self.clouds[name]
        if f"cloud:{name}" in self.conflicted:
            a, b = self.conflicted[f"cloud:{name}"]
            raise PluginError(
                f'cloud \'{name}\' is registered by both "{a}" and "{b}"',
                f"uninstall one, or disable it with AIOS_DISABLE_PLUGINS={b}",
            )
        hint = KNOWN_CLOUDS.get(name)
        if hint:
            raise PluginError(
                f"cloud '{name}' is not installed{self._failed_note()}", f"run: {hint}"
            )
        known = ", ".join(sorted(self.clouds)) or "none installed"
        raise PluginError(
            f"unknown cloud '{name}' (installed: {known}){self._failed_note()}",
            f"install the plugin that provides it, e.g. {KNOWN_CLOUDS['gcp']}",
        )

    # ------------------------------------------------------------------ strategies / accelerators
    def accelerator(self, name: str, config: Any = None) -> Any:
        """A new :class:`aios.devices.accelerator.Accelerator` for ``name``."""
        if name not in self.accelerators:
            known = ", ".join(sorted(self.accelerators)) or "none"
            raise PluginError(
                f"accelerator '{name}' is not registered (registered: {known})",
                "install the plugin that provides it",
            )
        return self.accelerators[name].factory(config)

    def strategies_for(self, backend: BackendSpec) -> list[str]:
        """Names of the registered strategies that run on ``backend``."""
        return sorted(
            n
            for n, specs in self.strategies.items()
            if any(s.supports(backend.name, backend.accelerator) for s in specs)
        )

    def strategy_spec(self, name: str, backend: BackendSpec) -> StrategySpec:
        """The :class:`StrategySpec` for ``strategy=name`` on ``backend`` (``auto``: the backend's
        default). An unknown name, or one the backend cannot run, is a
        one-line :class:`ConfigError`; never a silent substitute."""
        supported = self.strategies_for(backend)
        if name == "auto":
            if not supported:
                raise PluginError(
                    f"backend '{backend.name}' provides no training strategy",
                    f"reinstall the plugin that registers it ({backend.plugin or 'unknown'})",
                )
            name = (
                backend.default_strategy if backend.default_strategy in supported else supported[0]
            )
        if name not in self.strategies:
            known = ", ".join(["auto", *sorted(self.strategies)])
            raise ConfigError(f"invalid value {name!r} for 'strategy'", f"choose one of: {known}")
        specs = [s for s in self.strategies[name] if s.supports(backend.name, backend.accelerator)]
        if not specs:
            where = f"{backend.name} backend" + (
                f" ({backend.accelerator} accelerator)" if backend.accelerator else ""
            )
            on = ", ".join(["auto", *supported]) if supported else "none registered"
            raise ConfigError(
                f"strategy '{name}' is not available on the {where}",
                f"strategies on {backend.name}: {on}",
            )

        # a spec naming the backend beats one naming the accelerator, which beats "*"
        def rank(s: StrategySpec) -> int:
            return (
                0
                if backend.name in s.backends
                else (1 if backend.accelerator in s.accelerators else 2)
            )

        return sorted(specs, key=rank)[0]

    def make_strategy(self, config: Any, backend: BackendSpec) -> tuple[Any, StrategySpec, Any]:
        """``(strategy, spec, accelerator)`` for ``config.strategy`` on ``backend``."""
        accel = self.accelerator(backend.accelerator, config) if backend.accelerator else None
        spec = self.strategy_spec(getattr(config, "strategy", "auto"), backend)
        return spec.factory(config, accel, backend.name), spec, accel

    def make_precision(
        self,
        config: Any,
        backend: BackendSpec,
        spec: StrategySpec | None,
        accel: Any,
        device_type: str,
    ) -> Any:
        """The precision policy: the strategy's, else the backend's, else the core default over
        the accelerator (its autocast dtype passed explicitly)."""
        precision = config.precision
        for fn in (spec.precision if spec else None, backend.precision):
            if fn is not None:
                out = fn(precision, config, accel)
                if out is not None:
                    return out
        return default_precision(precision, device_type, accelerator=accel)

    def discover_devices(self, backend: str, config: Any | None) -> DeviceReport | None:
        """What ``backend`` finds on this machine (``aios devices``, the launch plan, the run
        record): its :attr:`BackendSpec.discover`, called isolated (a plugin that raises or
        times out is an error naming it; an :class:`AiosError` is its answer). ``None`` for an
        unknown backend or one that declares no discovery. Used at setup only."""
        spec = self.backends.get(backend)
        fn = spec.discover if spec is not None else None
        if spec is None or fn is None:
            return None
        value: DeviceReport | None = self._component(
            spec.plugin, "BackendSpec.discover", lambda: fn(config)
        )
        return value

    def launch_plan(self, backend: str, config: Any, request: LaunchRequest) -> LaunchPlan | None:
        """How ``request.script`` starts on ``backend``: its :attr:`BackendSpec.launch_plan`,
        called isolated, with the environment the configured strategy adds
        (:attr:`StrategySpec.launch_env`) on every host. ``None`` for an unknown backend or one
        that declares no plan."""
        spec = self.backends.get(backend)
        fn = spec.launch_plan if spec is not None else None
        if spec is None or fn is None:
            return None
        value: LaunchPlan | None = self._component(
            spec.plugin, "BackendSpec.launch_plan", lambda: fn(config, request)
        )
        if value is None:
            return None
        sspec = self.strategy_spec(getattr(config, "strategy", "auto"), spec)
        if sspec is not None and sspec.launch_env is not None:
            extra = sspec.launch_env(config, spec.name)
            for hp in value.hosts:
                hp.env.update(extra)
            if extra:
                value.notes.append(
                    f"strategy {sspec.name} ({sspec.plugin}): "
                    + " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
                )
        return value

    def _component(self, plugin: str, hook_name: str, fn: Callable[[], Any]) -> Any:
        """One plugin's component, called isolated; its failure is an error naming it."""
        out = self._run(plugin, hook_name, fn, inline=hook_name in INLINE_HOOKS)
        if out.timed_out:
            raise PluginError(
                f'plugin "{plugin}" timed out after {self.timeout:g}s in {hook_name}',
                f"fix or disable the plugin (AIOS_DISABLE_PLUGINS={plugin}), or raise AIOS_PLUGIN_TIMEOUT",
            )
        if out.exc is not None:
            if isinstance(out.exc, AiosError):
                raise out.exc
            self._error(plugin, f"{hook_name} failed: {type(out.exc).__name__}: {out.exc}", out.tb)
            raise PluginError(
                one_line(
                    f'plugin "{plugin}" failed in {hook_name}: {type(out.exc).__name__}: {out.exc}',
                    400,
                ),
                f"fix or disable the plugin (AIOS_DISABLE_PLUGINS={plugin}), or report it to its authors",
            ) from out.exc
        return out.value

    def call_all(
        self, hook_name: str, **kwargs: Any
    ) -> list[tuple[str, Any, BaseException | None]]:
        """Call a collecting hook plugin by plugin; one plugin's exception never hides others."""
        out: list[tuple[str, Any, BaseException | None]] = []

        def record(plugin: str, res: Outcome) -> None:
            if res.timed_out:
                limit = (self.timeout or 0) * SLOW_HOOKS.get(hook_name, 1)
                out.append(
                    (plugin, None, PluginError(f"timed out after {limit:g}s in {hook_name}"))
                )
            elif res.exc is not None:
                out.append((plugin, None, res.exc))
            else:
                out.append((plugin, res.value, None))

        if hook_name == "aios_doctor_checks":
            asked = kwargs.get("backend")
            for spec in self.backends.values():
                doctor = spec.doctor
                if doctor is not None and asked in (None, spec.name):
                    record(
                        spec.plugin,
                        self._run(
                            spec.plugin,
                            hook_name,
                            functools.partial(doctor, kwargs.get("config"), asked == spec.name),
                        ),
                    )
        for impl in self._impls(hook_name):
            accepted = {k: v for k, v in kwargs.items() if k in impl.argnames}
            record(
                impl.plugin_name,
                self._run(
                    impl.plugin_name,
                    hook_name,
                    functools.partial(impl.function, **accepted),
                    inline=hook_name in INLINE_HOOKS,
                ),
            )
        return out


# Install lines for first-party backends and clouds that are absent: data, one place
# (aios.plugins.install_hints); re-exported under their 0.2 names.
INSTALL_CORE = install_hints.CORE
KNOWN_BACKENDS = install_hints.BACKENDS
KNOWN_CLOUDS = install_hints.CLOUDS


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
    main = sys.modules.get("aios.cli.main")
    if main is not None:
        main._plugin_registry = None  # type: ignore[attr-defined]
