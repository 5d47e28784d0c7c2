"""A minimal cloud over real sshd hosts, for tests of what aios does with a cluster's jobs (the
watcher, ``aios status``, ``aios report CLUSTER``): the cluster is the given
:class:`aios_cloud.testing.sshd.SshdCluster`, creating and deleting it records the call, and its
one accelerator type (``box``) has the catalog price given (None: no price)."""

from __future__ import annotations

import builtins
from typing import Any

from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import (
    CatalogEntry,
    CloudCommand,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
)
from aios_cloud.provider.states import HEALTHY, READY


class LoopbackCloud(CloudProvider):
    """A 'cloud' whose cluster is the given sshd hosts; records what it is asked in ``calls``."""

    name = "loop"
    cli = "loop"

    def __init__(self, cluster: Any, hourly: float | None = None) -> None:
        self.c = cluster
        self.hourly = hourly
        self.exists = True
        self.calls: list[str] = []

    def catalog(self) -> list[CatalogEntry]:
        return [
            CatalogEntry(
                "loop",
                "box",
                1,
                "cpu",
                0.0,
                on_demand_hourly=self.hourly,
                spot_hourly=self.hourly,
                zones=("z1",),
                backend="cpu",
            )
        ]

    def info(self, name: str) -> ClusterInfo:
        hosts = [
            ClusterHost(h.worker_id, h.ip, h.internal_ip or h.ip, ssh_user=self.c.user, port=h.port)
            for h in self.c.hosts
        ]
        return ClusterInfo(name, "loop", "z1", "box", READY, health=HEALTHY, hosts=hosts)

    def create(self, request: ClusterRequest) -> ClusterInfo:
        self.calls.append("create")
        self.exists = True
        return self.info(request.name)

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        self.calls.append("describe")
        return self.info(name) if self.exists else None

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        return []

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        self.calls.append("start")
        return self.info(name)

    def stop(self, name: str, zone: str | None) -> None:
        self.calls.append("stop")

    def delete(self, name: str, zone: str | None) -> None:
        self.calls.append("delete")
        self.exists = False

    def render_create(self, request: ClusterRequest) -> builtins.list[CloudCommand]:
        return []

    def render(self, action: str, name: str, zone: str | None) -> builtins.list[CloudCommand]:
        return []
