"""A third-party backend written against aios-core 0.1's plugin API (commit b364dcb), whose
``aios_make_strategy`` hook aios-core 0.3 removed: the registry names it invalid."""

from __future__ import annotations

from aios.plugins.hookspecs import hookimpl
from aios.strategies.ddp import DDPStrategy
from aios.types import Availability, BackendSpec


@hookimpl
def aios_register_backends(register):  # type: ignore[no-untyped-def]
    register(
        BackendSpec(
            name="legacy",
            priority=-1,
            probe=lambda: Availability(True),
            device_type="cpu",
            description="0.1-style backend (gloo on cpu)",
        )
    )


@hookimpl
def aios_make_strategy(backend, config):  # type: ignore[no-untyped-def]
    if backend != "legacy":
        return None
    return DDPStrategy(config)
