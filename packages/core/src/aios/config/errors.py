"""A config that fails validation, in one line: the key (with where it was set), the value,
and the valid keys or choices (:func:`format_error`)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from aios.errors import ConfigError
from aios.plugins import install_hints


def _keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys of the section at ``loc``."""
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", {})
        if isinstance(part, int) or part not in fields:
            break
        cur = fields[part].annotation
    return list(getattr(cur, "model_fields", {}))


def _choices(model: type[BaseModel], loc: tuple) -> list[str]:
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return sorted(getattr(cur, "model_fields", {}) or [])
        cur = fields[part].annotation
    out: list[str] = []

    def walk(t: Any) -> None:
        if get_origin(t) is Literal:
            out.extend(str(a) for a in get_args(t))
        for a in get_args(t):
            if get_origin(a) is Literal or get_args(a):
                walk(a)

    walk(cur)
    return out


def format_error(
    err: ValidationError, model: type[BaseModel], merged: dict[str, Any], origins: dict[str, str]
) -> ConfigError:
    e = err.errors()[0]
    loc = _field_loc(model, tuple(e["loc"]))
    dotted = ".".join(str(p) for p in loc)
    value = e.get("input")
    if not loc:  # a model-level check (e.g. node_rank below nnodes): name the keys it involves
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        keys = [k for k in origins if k in msg.split()]
        src = "; ".join(f"{k} from {origins[k]}" for k in keys)
        return ConfigError(
            f"invalid config: {msg}" + (f" ({src})" if src else ""), "fix one of those values"
        )
    where = ""
    for i in range(len(loc), 0, -1):  # the most specific source that set this key (or its section)
        where = origins.get(".".join(str(p) for p in loc[:i]), "")
        if where:
            break
    where = f" (from {where})" if where else " (default)"
    if e["type"] == "extra_forbidden":
        known = ", ".join(_keys(model, loc[:-1]))
        hint = ""
        inst = (
            install_hints.hint("backend", str(loc[0])) or install_hints.hint("cloud", str(loc[0]))
            if len(loc) == 1
            else None
        )
        if inst:
            hint = f"; the '{loc[0]}' section needs its plugin: {inst}"
        return ConfigError(
            f"unknown config key '{dotted}'{where}", f"valid keys here: {known}{hint}"
        )
    choices = _choices(model, loc) if e["type"] in ("literal_error", "enum") else []
    shown = _show(value)
    if choices:
        return ConfigError(
            f"invalid value {shown} for '{dotted}'{where}", f"choose one of: {', '.join(choices)}"
        )
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    desc = _description(model, loc)
    fix = f"set '{dotted}' to a valid value" + (f" ({desc})" if desc else "")
    return ConfigError(f"invalid value {shown} for '{dotted}'{where}: {msg}", fix)


_TAG = re.compile(r"^(int|str|float|bool|none|list|dict|[a-z-]+\[.*\])$")


def _field_loc(model: type[BaseModel], loc: tuple) -> tuple:
    """``loc`` without pydantic's union-member tags (``int``, ``literal['auto']``): a part is
    kept when it is a field of the section at that point (``strategy``, ``int_key``), a list
    index, or a key that is not a tag."""
    out: list[Any] = []
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if fields is not None and isinstance(part, str):
            out.append(part)
            cur = _model_of(fields[part].annotation) if part in fields else None
            continue
        if isinstance(part, int) or not _TAG.match(str(part)):
            out.append(part)
    return tuple(out)


def _model_of(t: Any) -> Any:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for a in get_args(t):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _description(model: type[BaseModel], loc: tuple) -> str:
    cur: Any = model
    info = None
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return ""
        info = fields[part]
        cur = _model_of(info.annotation)
    return (info.description or "") if info is not None else ""


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)
