"""What the registry applies to the plugins it loads and to what they register: the plugins an
``AIOS_PLUGINS`` list depends on, the plugin's name on its specs, the form of a command's
target, the key of a probe's cache, and the adapter for a 0.1 backend probe."""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from typing import Any

from aios.plugins.reserved import COMMANDS
from aios.types import Availability, Lazy


def config_key(config: Any) -> str:
    if config is None:
        return ""
    dump = getattr(config, "model_dump_json", None)
    if dump is not None:
        try:
            return str(dump())
        except Exception:  # noqa: BLE001
            pass
    return f"id:{id(config)}"


def declared_probe(spec: Any, plugin: str) -> Any:
    """The one adapter for a 0.1 backend probe declared without the ``config`` parameter: looked
    at once, when the backend registers (never at each probe); the plugin's author is told the
    new form with a :class:`DeprecationWarning` and the probe is wrapped to take ``config``."""
    try:
        params = inspect.signature(spec.probe).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read, call as declared
        return spec
    if "config" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return spec
    old = spec.probe
    warnings.warn(
        f"backend '{spec.name}' of plugin \"{plugin}\": probe() without a config parameter is "
        "deprecated since aios 0.2; declare probe(config=None) -> Availability (the old form is "
        "removed in 0.4 at the earliest)",
        DeprecationWarning,
        stacklevel=2,
    )

    def probe(config: Any = None) -> Availability:
        return old()

    return dataclasses.replace(spec, probe=probe)


def with_plugin_dependencies(allow: set[str], entry_points: list[Any]) -> set[str]:
    """``allow`` plus the plugins its plugins require (their distributions' dependencies that
    are plugins themselves), transitively."""
    by_name = {ep.name: ep for ep in entry_points}
    out, todo = set(allow), list(allow)
    while todo:
        dist = getattr(by_name.get(todo.pop()), "dist", None)
        for req in (getattr(dist, "requires", None) or []) if dist is not None else []:
            if "extra ==" in req:
                continue
            name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name in by_name and name not in out:
                out.add(name)
                todo.append(name)
    return out


def core_commands() -> set[str]:
    return set(COMMANDS)


def is_target(target: Any) -> bool:
    mod, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    return bool(sep and mod and attr)


def with_plugin(spec: Any, plugin: str) -> Any:
    """``spec`` naming the plugin that registered it, and so do its :class:`aios.types.Lazy`
    callables (a target that cannot be loaded names that plugin)."""
    if (
        dataclasses.is_dataclass(spec)
        and not isinstance(spec, type)
        and hasattr(spec, "plugin")
        and not spec.plugin
    ):
        named: dict[str, Lazy[object]] = {
            key: Lazy(value.target, plugin)
            for key, value in vars(spec).items()
            if isinstance(value, Lazy) and not value.plugin
        }
        return dataclasses.replace(spec, plugin=plugin, **named)
    return spec
