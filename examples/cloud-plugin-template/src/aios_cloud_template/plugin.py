"""The plugin's entry point: imports nothing heavy (``aios --help`` and ``aios plugins`` load
it); the provider and its SDK load only when a cloud command runs."""

from __future__ import annotations

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec


def _factory(config: Any = None) -> Any:
    from aios_cloud_template.provider import PoolProvider

    return PoolProvider(config)


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="pool",
            factory=_factory,
            description="a pool of SSH machines aios leases hosts from (template cloud)",
            install_hint="pip install ./examples/cloud-plugin-template",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_cloud_template.settings import PoolSettings

    return {"pool": PoolSettings}
