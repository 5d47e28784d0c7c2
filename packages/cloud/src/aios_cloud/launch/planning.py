"""Stage 1 (:func:`plan`): the request checked against the cloud, into cluster requests and
the job's :class:`~aios_cloud.request.JobSpec`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from aios.errors import AiosError

from aios_cloud import shapes
from aios_cloud.bundle import build
from aios_cloud.launch.checks import check_checkpoints, check_name, default_name
from aios_cloud.launch.context import Echo, Launch
from aios_cloud.launch.pricing import check_cost_limit
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.records import Log
from aios_cloud.request import Candidate, JobSpec, LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import ClusterRecord, Store

# ------------------------------------------------------------------------------ 1. plan


def plan(
    request: LaunchRequest,
    provider: CloudProvider,
    cloud: str,
    config: Any,
    store: Store | None,
    existing: ClusterRecord | None,
    echo: Echo,
    log: Log,
    printer: LinePrinter,
) -> Launch:
    """Check the request against the provider; the cluster request and the job spec. With
    several candidates (``-a TYPE1,TYPE2,...``) every one is checked here, once, and the spec
    records each one's backend, interpreter, setup and price."""
    names = request.candidates
    if len(names) > 1 and existing is None:
        for a in names:  # an unknown type: one line naming it, before anything else
            provider.entry(a)
        names = shapes.order(provider, names, request.spot, request.nodes, request.cheapest)
    name = check_name(request.name or default_name())
    first = names[0] if names else None
    if existing and len(names) > 1:
        first = existing.accelerator if existing.accelerator in names else first
    cluster = cluster_request(request, provider, cloud, existing, first, name)
    clusters = [cluster]
    if existing is None:
        clusters += [
            cluster_request(request, provider, cloud, None, a, name)
            for a in names
            if a != cluster.accelerator
        ]
    specs = []
    for c in clusters:
        backend = request.backend or provider.backend_for(c.accelerator)
        specs.append(job_spec(request, provider, c, backend, check=c is cluster))
    spec = specs[0]
    if request.cost_limit is not None:
        check_cost_limit(request, provider, cloud, clusters)
        spec.max_cost = request.cost_limit
    if len(clusters) > 1:
        spec.candidates = [
            dataclasses.asdict(
                Candidate(
                    c.accelerator,
                    sp.backend,
                    sp.python,
                    sp.setup_lines,
                    shapes.hourly(provider, c.accelerator, request.spot, c.nodes),
                )
            )
            for c, sp in zip(clusters, specs, strict=True)
        ]
    return Launch(
        request,
        provider,
        cloud,
        config,
        store,
        existing,
        cluster,
        spec,
        echo,
        log,
        printer,
        clusters=clusters,
    )


def cluster_request(
    request: LaunchRequest,
    provider: CloudProvider,
    cloud: str,
    existing: ClusterRecord | None,
    accelerator: str | None = None,
    name: str | None = None,
) -> ClusterRequest:
    """The cluster to create (validated by the provider) or the recorded one to reuse;
    ``accelerator``: the candidate (default: the only type of ``-a``)."""
    labels = request.labels()
    extra = provider.launch_extra(request, existing is not None)
    name = name or request.name
    accelerator = accelerator or (request.candidates[0] if request.candidates else None)
    if existing and accelerator and accelerator != existing.accelerator:
        raise AiosError(
            f"cluster {name} exists with {existing.accelerator}, not {request.accelerator}",
            f"use another --name or `aios down {name}`",
        )
    accelerator = (
        accelerator or (existing.accelerator if existing else None) or provider.default_accelerator
    )
    if not accelerator:
        raise AiosError(
            "--accelerator is required for a new cluster", f"see `aios catalog --cloud {cloud}`"
        )
    name = check_name(name or default_name())
    cluster = ClusterRequest(
        name=name,
        accelerator=accelerator,
        nodes=request.nodes,
        zone=request.zone,
        region=request.region,
        spot=request.spot,
        queued=request.queued,
        valid_after=request.valid_after,
        valid_until=request.valid_until,
        image=request.image,
        disk_gb=request.disk_gb,
        labels={**labels, "aios-cluster": name},
        project=request.project,
        ssh_user=request.ssh_user or provider.default_ssh_user,
        extra=extra,
    )
    return provider.validate(cluster) if not existing else cluster


def job_spec(
    request: LaunchRequest,
    provider: CloudProvider,
    cluster: ClusterRequest,
    backend: str,
    check: bool = True,
) -> JobSpec:
    """What runs on the hosts: setup (the backend's stack, the user's requirements, the
    provider's host checks), the interpreter, the environment, the checkpoint directory."""
    accelerator = cluster.accelerator
    if request.setup_script:
        setup_lines = [Path(request.setup_script).read_text()]
    elif request.no_setup:
        setup_lines = []
    else:
        reqs = request.requirement_lines()
        if not request.no_bundle:
            reqs = [*build(backend, provider.name).requirements, *reqs]
        setup_lines = provider.setup_commands(accelerator, reqs, backend)
    if check:
        check_checkpoints(request, provider)
    return JobSpec(
        script=request.script,
        args=request.args,
        module=request.module,
        backend=backend,
        python=request.python or provider.python(accelerator, backend),
        env=dict(request.env),
        forward_env=list(request.forward_env),
        workdir=os.path.abspath(request.workdir),
        excludes=list(request.exclude),
        setup_lines=[*setup_lines, *provider.host_checks(accelerator, cluster.nodes)],
        checkpoint_dir=request.checkpoint_dir,
        max_sync_mb=request.max_sync_mb,
        bundle=not request.no_bundle,
    )
