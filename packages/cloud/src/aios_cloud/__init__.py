"""Cloud layer shared by every cloud plugin (aios-cloud-gcp, aios-cloud-aws, third-party).

Modules:

* :mod:`aios_cloud.provider`: the :class:`CloudProvider` interface and its data types.
* :mod:`aios_cloud.store`: SQLite cluster/job/event records under ``$AIOS_HOME`` (WAL,
  ``BEGIN IMMEDIATE``), safe under concurrent ``aios`` commands.
* :mod:`aios_cloud.ssh`: parallel SSH with ``(worker N, ip)`` prefixes, exit-255 retries with
  backoff, per-cluster pinned host keys.
* :mod:`aios_cloud.codesync`: the code tarball (``.gitignore`` honoured, untracked data left home);
  :mod:`aios_cloud.bundle`: aios itself shipped next to it.
* :mod:`aios_cloud.failover`: create with zone failover on stockout/quota, cleanup of failed
  attempts.
* :mod:`aios_cloud.request` (the launch request, checked once), :mod:`aios_cloud.launch` (the
  launch's stages), :mod:`aios_cloud.records`, :mod:`aios_cloud.head`, :mod:`aios_cloud.jobs`,
  :mod:`aios_cloud.watching` (managed-spot recovery), :mod:`aios_cloud.lifecycle`,
  :mod:`aios_cloud.signals`. ``python -m aios_cloud.watch`` is the detached watcher.
* :mod:`aios_cloud.cost`: estimates and rankings; :mod:`aios_cloud.transfer`: ``aios sync``.

Importing this package is cheap: no cloud SDK, no torch; the names below load
:mod:`aios_cloud.provider` on first use (``aios --help`` imports only :mod:`aios_cloud.plugin`).
"""

from __future__ import annotations

from typing import Any

from aios_cloud.__about__ import __version__

__all__ = [
    "__version__",
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        from aios_cloud import provider  # deferred: lazy re-export (module __getattr__)

        return getattr(provider, name)
    raise AttributeError(f"module 'aios_cloud' has no attribute {name!r}")
