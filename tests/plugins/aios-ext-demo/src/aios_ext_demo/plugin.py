"""The entry point: the three hooks, each handing aios one thing from its own module (nothing
heavy is imported here: the format, the watcher and the provider load when used)."""

from __future__ import annotations

from typing import Any

from aios import hookimpl
from aios.types import CheckpointFormatSpec, CloudSpec


def _format() -> Any:
    from aios_ext_demo.formats import PickleFormat

    return PickleFormat()


def _cloud(config: Any = None) -> Any:
    from aios_ext_demo.cloud import DemoCloud

    return DemoCloud(config)


@hookimpl
def aios_register_checkpoint_formats(register: Any) -> None:
    register(CheckpointFormatSpec("demo-pickle", _format))


@hookimpl
def aios_preemption_watchers(config: Any) -> list[Any] | None:
    from aios_ext_demo.notices import watchers

    return watchers()


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(CloudSpec("demo", _cloud, description="a demo cloud that declares its features"))
