"""Cloud layer shared by every cloud plugin (aios-cloud-gcp, aios-cloud-aws, third-party).

Modules:

* :mod:`aios.cloud.provider`: the :class:`CloudProvider` interface and its data types.
* :mod:`aios.cloud.store`: SQLite cluster/job/event records under ``$AIOS_HOME`` (WAL,
  ``BEGIN IMMEDIATE``), safe under concurrent ``aios`` commands.
* :mod:`aios.cloud.ssh`: parallel SSH with ``(worker N, ip)`` prefixes, exit-255 retries with
  backoff, per-cluster pinned host keys.
* :mod:`aios.cloud.codesync`: the code tarball (``.gitignore`` honoured, data never shipped);
  :mod:`aios.cloud.bundle`: aios itself shipped next to it.
* :mod:`aios.cloud.failover`: create with zone failover on stockout/quota, cleanup of failed
  attempts.
* :mod:`aios.cloud.ops`: provision, sync, setup, job start from the backend's launch plan, the
  watcher with managed-spot recovery, stop/start/down. ``python -m aios.cloud.watch`` is the
  detached watcher.
* :mod:`aios.cloud.cost`: estimates and rankings; :mod:`aios.cloud.transfer`: ``aios sync``.

Importing this package is cheap: no cloud SDK, no torch.
"""

from aios.cloud.provider import (
    CapacityError,
    CatalogEntry,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterNotFound,
    ClusterRequest,
    CredentialsError,
    QuotaError,
)

__all__ = [
    "CapacityError",
    "CatalogEntry",
    "CloudCommand",
    "CloudError",
    "CloudProvider",
    "ClusterHost",
    "ClusterInfo",
    "ClusterNotFound",
    "ClusterRequest",
    "CredentialsError",
    "QuotaError",
]
