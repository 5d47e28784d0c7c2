"""One validated config schema.

Precedence, lowest to highest:

1. defaults in the settings models (:mod:`aios.config.settings`);
2. the YAML file (``--config FILE`` or ``AIOS_CONFIG=FILE``);
3. ``AIOS_*`` environment variables (``AIOS_BACKEND=xla``, nested with a double underscore:
   ``AIOS_CHECKPOINT__DIR=gs://b/ckpt``, ``AIOS_XLA__SPMD=true``);
4. ``key=value`` overrides on the command line (``precision=bf16-mixed checkpoint.every=50``);
5. explicit flags (``--backend``, ``--nprocs``, ``--precision`` ...).

Plugins contribute sections through :func:`aios.plugins.hookspecs.aios_config_sections`. Any error is
one line naming the key, the bad value and the valid choices.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError, create_model

from aios.config.errors import format_error
from aios.config.redact import SECRET_WORDS as SECRET_WORDS  # re-exported: the public names stay
from aios.config.redact import is_secret as is_secret
from aios.config.redact import redact as redact
from aios.config.redact import redact_argv as redact_argv
from aios.config.redact import redact_url as redact_url
from aios.config.settings import AiosConfigBase
from aios.errors import AiosError, ConfigError
from aios.launcher.contract import CONTROL_PREFIX
from aios.plugins import install_hints
from aios.plugins.registry import get_registry

if TYPE_CHECKING:  # pragma: no cover
    from aios.plugins.registry import Registry

# Variables with the AIOS_ prefix that are not config keys.
CONTROL_ENV = {
    "AIOS_CONFIG",
    "AIOS_HOME",
    "AIOS_PLUGINS",
    "AIOS_DISABLE_PLUGINS",
    "AIOS_STRICT_PLUGINS",
    "AIOS_DEBUG",
    "AIOS_NO_COLOR",
    "AIOS_PLUGIN_TIMEOUT",
    # aios-cloud's limits for remote steps (aios_cloud.head)
    "AIOS_REACH_TIMEOUT",
    "AIOS_COMMAND_TIMEOUT",
    "AIOS_SETUP_TIMEOUT",
}
# AIOS_CI_*: the project's own CI runner (scripts/ci.py: AIOS_CI_LANES, AIOS_CI_HATCH), which the
# tests it runs inherit
CONTROL_PREFIXES = (CONTROL_PREFIX, "AIOS_INTERNAL_", "AIOS_TEST_", "AIOS_CI_")


_MODEL_CACHE: dict[tuple, type[AiosConfigBase]] = {}


def _registry() -> Registry:
    """The process's plugin registry: the default where a caller gives none (the config layer
    sits above the registry; the registry never imports the config)."""
    return get_registry()


def build_model(
    sections: dict[str, tuple[str, type]] | None = None, registry: Registry | None = None
) -> type[AiosConfigBase]:
    """The config class with the sections of ``registry``'s plugins (the process's registry
    when none is given) added, or exactly ``sections`` when given."""
    if sections is None:
        sections = (registry if registry is not None else _registry()).config_sections
    key = tuple(sorted((k, id(v[1])) for k, v in sections.items()))
    if key not in _MODEL_CACHE:
        fields: dict[str, Any] = {name: (model, model()) for name, (_, model) in sections.items()}
        _MODEL_CACHE[key] = create_model("AiosConfig", __base__=AiosConfigBase, **fields)
    return _MODEL_CACHE[key]


# ------------------------------------------------------------------------------ parsing


_EXP_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


class _Loader(yaml.SafeLoader):
    """YAML without the YAML 1.1 surprises: no dates/timestamps (``2024-06-01`` stays a string),
    no sexagesimal numbers (``10:20:30`` stays a string, not 37230), no leading-zero octal
    (``010`` is not 8); ``1e-3`` is a float."""


_Loader.yaml_implicit_resolvers = {
    k: [
        (tag, rx)
        for tag, rx in v
        if tag
        not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


#: budgets of every YAML text aios parses (config files, ``key=value`` values, ``AIOS_*``):
#: a config is a few hundred nodes; these stop alias bombs, deep nesting and recursive aliases
#: in milliseconds instead of minutes of CPU and gigabytes of memory
YAML_MAX_BYTES = 1 << 20
YAML_MAX_DEPTH = 32
YAML_MAX_NODES = 100_000
#: digits of an integer (int() of a huge literal is slow and Python refuses > 4300 digits)
YAML_MAX_INT_DIGITS = 30


class YamlBudgetError(ValueError):
    """YAML text beyond a parsing budget (size, nesting, alias expansion, integer length)."""


def _check_budget(text: str) -> None:
    """Walk the YAML event stream (iterative: no recursion) and then the composed node graph,
    counting every node an alias expands to: refuse before anything is built."""
    if len(text) > YAML_MAX_BYTES:
        raise YamlBudgetError(f"is {len(text)} bytes (at most {YAML_MAX_BYTES})")
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > YAML_MAX_DEPTH:
                raise YamlBudgetError(f"nests deeper than {YAML_MAX_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    root = yaml.compose(text, Loader=_Loader)
    stack: list[tuple[Any, int]] = [(root, 0)] if root is not None else []
    count = 0
    while stack:
        node, level = stack.pop()
        count += 1
        if count > YAML_MAX_NODES:
            raise YamlBudgetError(f"expands (through aliases) to more than {YAML_MAX_NODES} values")
        if level > YAML_MAX_DEPTH:
            raise YamlBudgetError(f"nests deeper than {YAML_MAX_DEPTH} levels (a recursive alias?)")
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:int":
                digits = sum(c.isdigit() for c in node.value)
                if digits > YAML_MAX_INT_DIGITS:
                    raise YamlBudgetError(
                        f"holds an integer of {digits} digits (at most {YAML_MAX_INT_DIGITS})"
                    )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, level + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend(((k, level + 1), (v, level + 1)))


def _yaml_load(text: str) -> Any:
    _check_budget(text)
    return yaml.load(text, Loader=_Loader)


def _parse_scalar(text: str) -> Any:
    """``key=value`` values are YAML scalars: ``true``, ``3``, ``1e-3``, ``null``, ``[a, b]``."""
    try:
        value = _yaml_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    except YamlBudgetError as exc:
        raise ConfigError(
            f"the value ({len(text)} characters) {exc}",
            "give a plain value (number, string, list)",
        ) from None
    if isinstance(value, str) and _EXP_FLOAT.match(value):
        return float(value)
    return value


def _set_path(d: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    cur = d
    for part in path[:-1]:
        nxt = cur.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"{origin}: '{'.'.join(path)}' goes inside '{part}', which is not a section"
            )
        cur = nxt
    cur[path[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override '{item}' is not key=value", "write it as e.g. precision=bf16-mixed"
            )
        key, _, value = item.partition("=")
        try:
            parsed = _parse_scalar(value)
        except ConfigError as exc:
            raise ConfigError(f"override '{key.strip()}': {exc.message}", exc.fix) from None
        _set_path(out, key.strip().split("."), parsed, f"override {item!r}")
    return out


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ) if environ is None else environ
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith("AIOS_") or name in CONTROL_ENV or name.startswith(CONTROL_PREFIXES):
            continue
        path = [p.lower() for p in name[len("AIOS_") :].split("__") if p]
        if path:
            try:
                parsed = _parse_scalar(value)
            except ConfigError as exc:
                raise ConfigError(f"env {name}: {exc.message}", exc.fix) from None
            _set_path(out, path, parsed, f"env {name}")
    return out


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(f"config file '{p}' {what}", "pass an existing YAML file to --config")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file '{p}' is not UTF-8 text (bad byte at offset {exc.start})",
            "save it as UTF-8",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file '{p}' cannot be read: {exc.strerror or exc}",
            "check its permissions, or pass another file to --config",
        ) from None
    try:
        data = _yaml_load(text) or {}
    except YamlBudgetError as exc:
        raise ConfigError(f"config file '{p}' {exc}", "write a plain config file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(
            f"config file '{p}' is not valid YAML{where}", "fix the YAML syntax"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{p}' must hold a mapping of keys, not {type(data).__name__}",
            "write key: value lines",
        )
    return data


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve(
    config_file: str | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    sections: dict[str, tuple[str, type]] | None = None,
    check_backend: bool = True,
    registry: Registry | None = None,
) -> AiosConfigBase:
    """Build the validated config from every source in precedence order. Plugin sections,
    backend and strategy names are checked against ``registry`` (the process's registry when
    none is given)."""
    environ = dict(os.environ) if environ is None else environ
    model = build_model(sections, registry)
    origins: dict[str, str] = {}
    layers: list[tuple[str, dict[str, Any]]] = []
    config_file = config_file or environ.get("AIOS_CONFIG")
    if config_file:
        layers.append((f"config file {config_file}", load_yaml(config_file)))
    layers.append(("environment", env_overrides(environ)))
    layers.append(("override", parse_overrides(overrides or [])))
    layers.append(("flag", {k: v for k, v in (flags or {}).items() if v is not None}))
    merged: dict[str, Any] = {}
    for origin, layer in layers:
        for dotted in _flatten(layer):
            origins[dotted] = origin
        merged = deep_merge(merged, layer)
    try:
        cfg = model.model_validate(merged)
    except ValidationError as err:
        raise format_error(err, model, merged, origins) from None
    if check_backend and cfg.backend != "auto":
        reg = registry if registry is not None else _registry()
        if cfg.backend not in reg.backends and install_hints.hint("backend", cfg.backend) is None:
            where = origins.get("backend", "default")
            if (
                f"backend:{cfg.backend}" in reg.conflicted
                or f"backend:{cfg.backend}" in reg.rejected
            ):
                try:  # the registry names the plugins: claimed by two, or rejected
                    reg.backend(cfg.backend)
                except AiosError as exc:
                    exc.message = f"{exc.message} (backend from {where})"
                    raise
            known = ", ".join(["auto", *sorted(reg.backends)])
            note = reg._failed_note()
            raise ConfigError(
                f"invalid value {cfg.backend!r} for 'backend' (from {where}){note}",
                f"choose one of: {known}",
            )
    if check_backend and cfg.strategy != "auto":
        reg = registry if registry is not None else _registry()
        if cfg.strategy not in reg.strategies:
            known = ", ".join(["auto", *sorted(reg.strategies)])
            raise ConfigError(
                f"invalid value {cfg.strategy!r} for 'strategy' (from {origins.get('strategy', 'default')})",
                f"choose one of: {known}",
            )
    return cfg


def _flatten(d: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "."))
    return out


def to_json(cfg: AiosConfigBase) -> str:
    """Serialise for passing to worker processes (AIOS_RUN_CONFIG)."""
    return cfg.model_dump_json()


def from_json(text: str) -> AiosConfigBase:
    model = build_model()
    return model.model_validate_json(text)
