"""Cloud ``demo``: declares what of ``aios launch`` it supports (setup and labels); aios refuses
every other option before anything runs. Its hosts come from nowhere: a dry run only."""

from __future__ import annotations

from typing import Any

from aios_cloud.features import LABELS, SETUP
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import CatalogEntry, CloudCommand
from aios_cloud.provider.errors import CloudError

NOTHING = CloudError("the demo cloud creates nothing", "use --dry-run")


class DemoCloud(CloudProvider):
    name = "demo"
    cli = "demo-cli"
    features = frozenset({SETUP, LABELS})

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def catalog(self) -> list[CatalogEntry]:
        return [CatalogEntry("demo", "cpu", 1, "CPU", 0.0, zones=("demo-1",))]

    def create(self, request: Any) -> Any:
        raise NOTHING

    def describe(self, name: str, zone: str | None) -> Any:
        return None

    def list(self, zone: str | None = None) -> Any:
        return []

    def start(self, name: str, zone: str | None) -> Any:
        raise NOTHING

    def stop(self, name: str, zone: str | None) -> None:
        raise NOTHING

    def delete(self, name: str, zone: str | None) -> None:
        return None

    def render_create(self, request: Any) -> list[CloudCommand]:
        labels = [f"--label={k}={v}" for k, v in sorted(request.labels.items())]
        return [CloudCommand(["demo-cli", "create", request.name, *labels])]

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        return [CloudCommand(["demo-cli", action, name])]
