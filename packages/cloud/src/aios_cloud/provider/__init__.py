"""The cloud provider interface every aios cloud implements.

``aios-cloud-gcp`` (Cloud TPU VMs and pod slices) and ``aios-cloud-aws`` (EC2 GPU and Trainium
instances) both implement :class:`CloudProvider`; third-party clouds do the same and register a
:class:`aios.types.CloudSpec` whose ``factory(config)`` returns the provider. The cloud commands
(``aios launch|status|exec|logs|ssh|sync|stop|start|down|catalog|cost``) live in core and only talk
to this interface, the SQLite store (:mod:`aios_cloud.store`) and the SSH runner
(:mod:`aios_cloud.ssh`).

Rules for implementers:

* Importing the module that defines the provider must not import the cloud SDK; import it inside
  methods (``aios --help`` and ``--dry-run`` never pay for it).
* Every method that would touch the cloud has a ``render_*`` twin returning the equivalent CLI
  commands (``gcloud compute tpus tpu-vm create ...``, ``aws ec2 run-instances ...``); ``--dry-run``
  prints those and calls nothing else.
* Bad input (unknown accelerator, a zone that does not offer it, missing project, no credentials)
  raises :class:`aios.errors.AiosError` subclasses with a one-line message and fix.
* A ``create`` that fails must leave nothing behind: delete what it started (the core also calls
  :meth:`CloudProvider.delete` after a failed create; it must be idempotent).
* Capacity errors are classified by :meth:`CloudProvider.classify_error` so the core's zone failover
  (:func:`aios_cloud.failover.create_with_failover`) can move to the next zone.
* No secret (keys, tokens) is ever stored in the :class:`ClusterRecord` or printed.

The modules: :mod:`~aios_cloud.provider.base` (:class:`Provider`, :class:`CloudProvider`,
:class:`LaunchPlan`), :mod:`~aios_cloud.provider.scheduler` (:class:`SchedulerProvider`),
:mod:`~aios_cloud.provider.data` (requests, hosts, cluster info, catalog entries, prices, dry-run
commands), :mod:`~aios_cloud.provider.states`, :mod:`~aios_cloud.provider.errors` and
:mod:`~aios_cloud.provider.requirements`. The names below are the interface a plugin imports
(``from aios_cloud.provider import CloudProvider``).
"""

from __future__ import annotations

from aios_cloud.provider.base import CloudProvider, LaunchPlan, Provider, provisioning
from aios_cloud.provider.data import (
    CatalogEntry,
    CloudCommand,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    ReservedPrice,
)
from aios_cloud.provider.errors import (
    CapacityError,
    CloudError,
    ClusterNotFound,
    CredentialsError,
    FailureKind,
    NotOfferedError,
    QuotaError,
)
from aios_cloud.provider.requirements import check_requirements, registry_aios
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.provider.states import (
    DELETING,
    FAILED,
    HEALTHY,
    MAINTENANCE,
    PENDING,
    PREEMPTED,
    QUEUED,
    READY,
    STARTING,
    STATES,
    STOPPED,
    STOPPING,
    TERMINATED,
    UNHEALTHY,
    UNKNOWN,
)

__all__ = [
    "provisioning",
    "Provider",
    "check_requirements",
    "registry_aios",
    "CapacityError",
    "CatalogEntry",
    "CloudCommand",
    "CloudError",
    "CloudProvider",
    "LaunchPlan",
    "SchedulerProvider",
    "ClusterHost",
    "ClusterInfo",
    "ClusterNotFound",
    "ClusterRequest",
    "CredentialsError",
    "FailureKind",
    "NotOfferedError",
    "QuotaError",
    "ReservedPrice",
    "STATES",
    "PENDING",
    "QUEUED",
    "READY",
    "STOPPING",
    "STOPPED",
    "STARTING",
    "DELETING",
    "PREEMPTED",
    "TERMINATED",
    "FAILED",
    "UNKNOWN",
    "HEALTHY",
    "UNHEALTHY",
    "MAINTENANCE",
]
