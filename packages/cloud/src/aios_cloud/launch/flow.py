"""``aios launch`` end to end: the stages in order (:func:`run`)."""

from __future__ import annotations

from typing import Any

from aios.config.schema import resolve

from aios_cloud.features import check_features
from aios_cloud.launch.context import Echo
from aios_cloud.launch.dryrun import render
from aios_cloud.launch.follow import watch
from aios_cloud.launch.planning import plan
from aios_cloud.launch.stages import add_job, cleanup, prepare, provision, setup, start, sync
from aios_cloud.provider.base import provisioning
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.records import Log, cloud_name, get_provider
from aios_cloud.request import LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import Store


def run(request: LaunchRequest, echo: Echo, log: Log, printer: LinePrinter) -> int:
    """Launch ``request`` through every stage; the exit code of ``aios launch``."""
    store = None if request.dry_run else Store()
    existing = store.get_cluster(request.name) if (store and request.name) else None
    cloud = cloud_name(
        request.cloud or ("ssh" if request.hosts or request.hosts_file else None),
        existing.cloud if existing else None,
    )
    config = _config(request.config_file)
    provider = get_provider(cloud, config)
    # the one check of the options against what the cloud declares it supports
    check_features(cloud, provider.features, request, provider.feature_hints)
    if isinstance(provider, SchedulerProvider):
        # a batch scheduler (Slurm, Kubernetes): submits a job, no hosts to provision
        return provider.launch_job(request, store, log)
    hosts = provisioning(provider, request.name or cloud)
    launch = plan(request, hosts, cloud, config, store, existing, echo, log, printer)
    if request.dry_run:
        render(launch)
        return 0
    prepare(launch)
    provision(launch)
    try:
        add_job(launch)
        sync(launch)
        setup(launch)
        start(launch)
    except BaseException as exc:
        cleanup(launch, exc)
        raise
    return watch(launch)


# ------------------------------------------------------------------------------ helpers


def _config(config_file: str | None) -> Any:
    return resolve(config_file=config_file, check_backend=False)
