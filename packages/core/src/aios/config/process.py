"""The config of one training process: what ``aios-run`` hands its workers, and what a worker
(or a script under plain ``python``/``torchrun``) resolves at :func:`aios.init`.

Precedence: the script's ``defaults`` < what ``aios-run`` resolved (``AIOS_RUN_CONFIG``) or,
without aios-run, the ``AIOS_CONFIG`` file and ``AIOS_*`` env vars < ``overrides`` < ``flags``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import ValidationError

from aios.config.errors import format_error
from aios.config.schema import build_model, deep_merge, is_secret, parse_overrides, resolve
from aios.config.settings import AiosConfigBase
from aios.errors import ConfigError
from aios.launcher.contract import CONFIG_ENV


def _drop_secrets(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_secrets(v) for k, v in obj.items() if not is_secret(str(k))}
    return obj


def explicit_config_json(cfg: Any) -> str:
    """What ``aios-run`` passes to workers in ``AIOS_RUN_CONFIG``: the keys that were set
    (file, env, overrides, flags), without secret-looking keys."""
    return json.dumps(_drop_secrets(cfg.model_dump(mode="json", exclude_unset=True)))


def resolve_config(
    config: AiosConfigBase | dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> AiosConfigBase:
    """The config for this process. Precedence: ``defaults`` (from the script) < what
    ``aios-run`` resolved (``AIOS_RUN_CONFIG``) or, without aios-run, ``AIOS_CONFIG`` file and
    ``AIOS_*`` env vars < ``overrides`` < ``flags`` (keyword arguments of :func:`aios.init`)."""
    if isinstance(config, AiosConfigBase):
        return config
    model = build_model()
    if isinstance(config, dict):
        explicit: dict[str, Any] = config
    elif os.environ.get(CONFIG_ENV):
        try:
            explicit = json.loads(os.environ[CONFIG_ENV])
        except ValueError:
            raise ConfigError(
                f"{CONFIG_ENV} is not valid JSON", "launch through aios-run or unset it"
            ) from None
    else:
        explicit = resolve(check_backend=False).model_dump(mode="json", exclude_unset=True)
    merged = deep_merge(defaults or {}, explicit)
    merged = deep_merge(merged, parse_overrides(overrides or []))
    merged = deep_merge(merged, {k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return model.model_validate(merged)
    except ValidationError as err:  # one line naming the key: resolve()'s formatter
        raise format_error(err, model, merged, {}) from None
