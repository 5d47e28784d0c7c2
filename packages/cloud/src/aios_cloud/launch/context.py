"""The launch's state as it passes through the stages (:class:`Launch`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.records import Log
from aios_cloud.request import JobSpec, LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import ClusterRecord, Store

Echo = Callable[[str], None]


@dataclass
class Launch:
    """A launch in progress: what its stages share."""

    request: LaunchRequest
    provider: CloudProvider
    cloud: str
    config: Any
    store: Store | None
    existing: ClusterRecord | None
    cluster: ClusterRequest
    spec: JobSpec
    echo: Echo
    log: Log
    printer: LinePrinter
    key: str | None = None
    record: ClusterRecord | None = None
    created: bool = False
    job_id: int | None = None
    starting: bool = False
    #: ``-a TYPE1,TYPE2,...``: every candidate's validated cluster request, in the order tried
    #: (the first is :attr:`cluster`); one entry for a single type
    clusters: list[ClusterRequest] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.cluster.name

    def require_store(self) -> Store:
        assert self.store is not None, "a dry run has no store"
        return self.store

    def require_record(self) -> ClusterRecord:
        assert self.record is not None, "not provisioned yet"
        return self.record

    def require_job(self) -> int:
        assert self.job_id is not None, "no job yet"
        return self.job_id
