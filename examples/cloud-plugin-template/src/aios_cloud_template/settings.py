"""The ``pool`` config section (``AIOS_POOL__HOSTS='["root@10.0.0.5:22", ...]'``, YAML ``pool:``)."""

from __future__ import annotations

from aios.config.settings import Section
from pydantic import Field


class PoolSettings(Section):
    hosts: list[str] = Field(
        default_factory=list, description="the pool's machines, USER@HOST[:PORT] each"
    )
    leases: str | None = Field(
        None, description="the lease file (default: $AIOS_HOME/pool-leases.json)"
    )
    identity: str | None = Field(
        None, description="the pool's admin key (a path) that adds a cluster's key to a machine"
    )
    devices: int = Field(1, ge=1, description="processes per machine (its CPU cores to use)")
