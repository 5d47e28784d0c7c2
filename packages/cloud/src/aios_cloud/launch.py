"""``aios launch`` as named stages, driven by a checked :class:`~aios_cloud.request.LaunchRequest`
(the CLI only parses options into the request and prints):

1. :func:`plan`: resolve the cloud and the provider, then check everything against them (the
   accelerator, the cluster request the provider validates, setup, checkpoints) and build the
   :class:`~aios_cloud.request.JobSpec`; a batch scheduler (Slurm, Kubernetes) gets the request
   instead (:meth:`~aios_cloud.provider.SchedulerProvider.launch_job`);
2. :func:`render` (``--dry-run``): the provider renders the path the launch takes, and stops;
3. :func:`prepare`: credentials, the autostop agent's rights, the checkpoint bucket, the SSH key:
   before anything is billed;
4. :func:`provision`: create the cluster (zone failover) or reuse the recorded one;
5. :func:`sync`, :func:`setup`, :func:`start`: the code through worker 0, the setup, the job on
   every host (and the autostop agent);
6. :func:`cleanup` when any of 4-5 failed: the cluster this launch created is deleted, a job it
   started on a reused one is stopped;
7. :func:`watch`: follow the job (or hand it to a controller host / a background watcher) and
   delete the cluster after it with ``--down``.

SkyPilot's ``sky/execution.py`` stages its launch the same way.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import random
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aios.errors import AiosError

from aios_cloud.dryrun import render_launch
from aios_cloud.features import check_features
from aios_cloud.provider import (
    CloudProvider,
    ClusterRequest,
    LaunchPlan,
    SchedulerProvider,
    provisioning,
)
from aios_cloud.records import Log, cloud_name, get_provider
from aios_cloud.request import JobSpec, LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import ClusterRecord, Store

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$")
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
    from aios_cloud import shapes
    from aios_cloud.request import Candidate

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
            from aios_cloud.bundle import build

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


def check_cost_limit(
    request: LaunchRequest, provider: CloudProvider, cloud: str, clusters: list[ClusterRequest]
) -> None:
    """``--max-cost`` projects the spend from what the capacity is billed at: the catalog's
    hourly price of every type the job may run on, or reserved capacity's fee per hour where it
    is billed as an upfront fee (:meth:`CloudProvider.reservation_prices`; a dry run calls no
    cloud, so the fee is read at launch)."""
    from aios_cloud import shapes

    pricing = "spot" if request.spot else "on-demand"
    for c in clusters:
        reserved = (
            provider.reservation_prices(c, live=not request.dry_run) if request.reservation else []
        )
        if reserved:
            if not request.dry_run and reserved[0].hourly is None:
                raise AiosError(
                    f"--max-cost needs what {reserved[0].what} costs per hour, and {cloud} does "
                    "not tell its fee",
                    "drop --max-cost (the reservation's end bounds the run); `aios cost --cloud "
                    f"{cloud} -a {c.accelerator} --reservation {request.reservation}` shows what "
                    "is known",
                )
            continue
        if shapes.hourly(provider, c.accelerator, request.spot, c.nodes) is None:
            raise AiosError(
                f"--max-cost needs the price of {c.accelerator}, and the {cloud} catalog lists "
                f"no {pricing} price for it",
                f"drop --max-cost, or pick a type with a price (`aios catalog --cloud {cloud}`)",
            )


def cost_limit_line(launch: Launch) -> str | None:
    """``--dry-run``: what ``--max-cost`` will do."""
    from aios_cloud import shapes

    limit, request = launch.request.cost_limit, launch.request
    if limit is None:
        return None
    c = launch.cluster
    reserved = launch.provider.reservation_prices(c, live=False) if request.reservation else []
    if reserved:
        price = reserved[0].hourly
        how = "the reservation's upfront fee per hour of its term, read at launch"
    else:
        price = shapes.hourly(launch.provider, c.accelerator, request.spot, c.nodes)
        how = "catalog price x time on each shape"
    hours = f", about {limit / price:.1f} h at {shapes.money(price)}/h" if price else ""
    down = " and the cluster deleted (--down)" if request.down_after else ""
    return (
        f"# cost limit: --max-cost {shapes.money(limit)}: the watcher projects the job's spend "
        f"({how}){hours}; before it passes the limit the job is checkpointed (SIGTERM, the "
        f"checkpoint.grace_seconds notice) and stopped{down}"
    )


def check_checkpoints(request: LaunchRequest, provider: CloudProvider) -> None:
    """A managed run needs a checkpoint directory that outlives the hosts, which they can write."""
    ckpt = request.checkpoint_dir
    bucket = f"{provider.storage_scheme or 'gs'}://BUCKET/PATH"
    if request.managed and not ckpt:
        raise AiosError(
            "--max-restarts needs --checkpoint-dir on a bucket, so a recreated cluster can resume",
            f"add --checkpoint-dir {bucket}",
        )
    if ckpt and request.managed and "://" not in ckpt and not provider.shared_paths:
        raise AiosError(
            f"--checkpoint-dir {ckpt} is local to the hosts and dies with them",
            f"use a bucket URL such as {bucket}",
        )
    if ckpt and "://" in ckpt:  # the hosts must be able to write there
        provider.check_storage(ckpt, {*request.env, *request.forward_env})


def check_autostop(provider: CloudProvider, cluster: ClusterRequest, autodown: bool) -> None:
    """Before anything is created: a plain ``--autostop`` (stop when idle) on capacity that
    cannot be stopped would leave it billing; offer ``--autodown`` instead."""
    why = None if autodown else provider.stop_refusal(cluster.spot, cluster.accelerator)
    if why:
        raise AiosError(
            f"--autostop stops the cluster when idle, but {why}",
            "use --autostop N --autodown (delete it when idle)",
        )


# ------------------------------------------------------------------------------ 2. dry run


def render(launch: Launch) -> None:
    """``--dry-run``: the provider renders every step the launch would take; nothing is called."""
    request, provider, cluster = launch.request, launch.provider, launch.cluster
    line = None
    if request.autostop is not None:
        check_autostop(provider, cluster, request.autodown)
        if not launch.existing:
            cluster = provider.prepare_autostop(cluster, request.autostop_action, dry_run=True)
        line = (
            f"# 5. autostop: an agent on worker 0 runs `{launch.spec.python} -m aios_cloud.agent "
            f"~/aios/{cluster.name}/agent.json` and "
            f"{'deletes' if request.autodown else 'stops'} the cluster after "
            f"{request.autostop:g} min without a running job (a @reboot crontab entry restarts "
            "it after a reboot; reinstalled after recovery and `aios start`)"
        )
    for price in price_lines(launch):
        launch.echo(price)
    limit_line = cost_limit_line(launch)
    if limit_line:
        launch.echo(limit_line)
    provider.render_launch(
        LaunchPlan(
            cluster,
            launch.spec,
            launch.config,
            existing=launch.existing is not None,
            key_path=request.ssh_key,
            autostop_line=line,
            standard=render_launch,
        ),
        launch.echo,
    )


def price_lines(launch: Launch) -> list[str]:
    """The dry run's prices: each candidate per hour (the catalog's, spot or on-demand as
    asked), the one launched first, and what a recovery without capacity moves to."""
    from aios_cloud import shapes

    request, provider = launch.request, launch.provider
    if provider.user_hosts or launch.existing is not None:
        return []
    pricing = "spot" if request.spot else "on-demand"
    clusters = launch.clusters or [launch.cluster]
    if len(clusters) == 1:
        c = clusters[0]
        p = shapes.hourly(provider, c.accelerator, request.spot, c.nodes)
        reserved = provider.reservation_prices(c, live=False) if request.reservation else []
        if reserved:
            # billed as an upfront fee for its term (a Capacity Block), not by the hour
            return [
                f"# price: {c.nodes} x {c.accelerator} in {r.line()}; not the {pricing} "
                f"{shapes.money(p)}/h"
                for r in reserved
            ]
        return [f"# price: {c.nodes} x {c.accelerator}, {shapes.money(p)}/h ({pricing})"]
    how = "cheapest first (--cheapest)" if request.cheapest else "in the order given"
    out = [f"# candidates, {how}, {pricing} prices from the catalog:"]
    for i, c in enumerate(clusters):
        p = shapes.hourly(provider, c.accelerator, request.spot, c.nodes)
        cand = launch.spec.candidate(c.accelerator)
        role = (
            "chosen: launched first"
            if i == 0
            else f"if {clusters[i - 1].accelerator} has no capacity"
        )
        backend = f", backend {cand.backend}" if cand else ""
        out.append(
            f"#   {i + 1}. {c.nodes} x {c.accelerator}: {shapes.money(p)}/h{backend} ({role})"
        )
    return out


# ------------------------------------------------------------------------------ 3. prepare


def prepare(launch: Launch) -> None:
    """Everything that can fail before anything is billed, and the SSH key."""
    from aios_cloud import signals
    from aios_cloud.records import cluster_key
    from aios_cloud.ssh import ensure_client_key

    request, provider = launch.request, launch.provider
    if request.autostop is not None:
        check_autostop(provider, launch.cluster, request.autodown)
    # killed while creating: unwind like Ctrl-C so nothing is left running in the cloud; every
    # ssh is a subprocess the handler kills, so no stuck host holds the cleanup up
    signals.install_signal_handlers()
    signals.check_open_files(launch.log)
    if launch.existing is None:
        provider.describe_credentials()  # no credentials: one line, before anything is created
        if request.autostop is not None:
            # the agent's rights to stop/delete the cluster, before anything is billed
            launch.cluster = provider.prepare_autostop(launch.cluster, request.autostop_action)
    if request.checkpoint_dir and "://" in request.checkpoint_dir:
        check_bucket(request.checkpoint_dir)
    if request.ssh_key:
        launch.key = str(Path(request.ssh_key).expanduser())
    elif launch.existing is not None and launch.existing.ssh_key:
        launch.key = launch.existing.ssh_key
    elif provider.user_hosts:
        launch.key = None  # hosts the user already has: their own ssh login, no key of aios's
    else:  # a key of this cluster's own: the head host may hold it to reach the other hosts
        launch.key = str(ensure_client_key(cluster_key(launch.name)))


def check_bucket(url: str) -> None:
    """The checkpoint bucket must exist (a managed run writes there from every host)."""
    from aios.checkpoint import filesystem

    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    try:
        ok = fs.exists(bucket)
    except Exception as exc:  # noqa: BLE001 - credentials, network: one line
        raise AiosError(
            f"cannot check bucket {url.split('://')[0]}://{bucket}: {type(exc).__name__}: "
            f"{str(exc)[:160]}",
            "check your credentials and the bucket name",
        ) from None
    if not ok:
        scheme = url.split("://")[0]
        hint = (
            f"gcloud storage buckets create gs://{bucket}"
            if scheme == "gs"
            else (f"aws s3 mb s3://{bucket}" if scheme == "s3" else f"create the bucket {bucket}")
        )
        raise AiosError(
            f"bucket {scheme}://{bucket} not found", f"create it ({hint}) or fix --checkpoint-dir"
        )


# ------------------------------------------------------------------------------ 4. provision


def provision(launch: Launch) -> None:
    """Create the cluster (zone failover; nothing left behind on failure) or reuse it."""
    from aios_cloud import lifecycle
    from aios_cloud.records import with_public_key

    if launch.existing is not None:
        launch.record = launch.existing
        launch.log(
            f"reusing cluster {launch.name} ({launch.record.accelerator} in {launch.record.zone})"
        )
        return
    from aios_cloud.provider import CapacityError, NotOfferedError, QuotaError

    clusters = launch.clusters or [launch.cluster]
    for i, cluster in enumerate(clusters):
        if not launch.provider.user_hosts:
            assert launch.key is not None
            cluster = with_public_key(cluster, launch.key)
        try:
            launch.record = lifecycle.provision(
                launch.require_store(),
                launch.provider,
                cluster,
                launch.key,
                launch.log,
                failover=not launch.request.no_failover,
            )
        except (CapacityError, QuotaError, NotOfferedError) as exc:
            if i + 1 == len(clusters):
                raise
            nxt = clusters[i + 1].accelerator
            launch.log(
                f"no capacity for {cluster.accelerator} ({exc.message}); trying the next "
                f"candidate, {nxt}"
            )
            continue
        if cluster.accelerator != launch.cluster.accelerator:
            use_candidate(launch, clusters[i])
        if len(clusters) > 1:  # each candidate as validated, for a recovery that moves on
            from aios_cloud.records import request_dict

            store, rec = launch.require_store(), launch.require_record()
            candidates = {c.accelerator: request_dict(c) for c in clusters}
            store.update_cluster(rec.name, request={**rec.request, "candidates": candidates})
            launch.record = store.get_cluster(rec.name)
        break
    launch.created = True
    rec = launch.require_record()
    launch.log(
        f"cluster {launch.name} ready in {rec.zone}: "
        + ", ".join(f"worker {h['worker_id']} {h['ip']}" for h in rec.hosts)
    )


def use_candidate(launch: Launch, cluster: ClusterRequest) -> None:
    """The launch goes on with candidate ``cluster`` (its own backend, interpreter and setup)."""
    c = launch.spec.candidate(cluster.accelerator)
    assert c is not None
    launch.cluster = cluster
    launch.spec = launch.spec.for_candidate(c)


# ------------------------------------------------------------------------------ 5. the job


def add_job(launch: Launch) -> None:
    """Record the job (state: setting up)."""
    from aios_cloud.store import JOB_SETTING_UP

    request, store = launch.request, launch.require_store()
    launch.job_id = store.add_job(
        launch.name,
        shlex.join([request.script, *request.args]),
        backend=launch.spec.backend,
        managed=request.managed,
        max_restarts=request.max_restarts,
        checkpoint_dir=request.checkpoint_dir,
        spec=launch.spec.to_dict(),
    )
    store.update_job(launch.job_id, state=JOB_SETTING_UP)


def sync(launch: Launch) -> None:
    """Reach every host, then ship the code through worker 0."""
    from aios_cloud import jobs

    rec = launch.require_record()
    jobs.reach(rec, launch.printer, launch.log)
    jobs.sync_code(rec, launch.spec, launch.printer, launch.log)


def setup(launch: Launch) -> None:
    """The setup lines and the provider's host checks on every host."""
    from aios_cloud import jobs

    jobs.run_setup(launch.require_record(), launch.spec, launch.printer, launch.log)


def start(launch: Launch) -> None:
    """Start the job on every host (detached), then the autostop agent."""
    from aios_cloud import jobs, lifecycle, shapes
    from aios_cloud.store import JOB_RUNNING

    rec, store, request = launch.require_record(), launch.require_store(), launch.request
    job_id = launch.require_job()
    info = launch.provider.describe(rec.name, rec.zone)
    launch.starting = True
    env = launch.provider.remote_env(info) if info else {}
    procs = jobs.start_job(rec, job_id, launch.spec, launch.config, env, launch.printer, launch.log)
    store.update_job(job_id, state=JOB_RUNNING)
    shapes.begin(
        store,
        rec,
        job_id,
        procs,
        shapes.record_hourly(launch.provider, rec),
        shapes.newest_step(rec, launch.spec.checkpoint_dir),
        "launched",
    )
    if request.autostop is None:
        return
    lifecycle.reinstall_agent(
        store,
        launch.provider,
        rec,
        launch.printer,
        launch.log,
        autostop={
            "idle_seconds": request.autostop * 60,
            "action": request.autostop_action,
            "python": launch.spec.python,
            "poll": min(30.0, max(0.5, request.autostop * 60 / 4)),
        },
    )
    what = "autodown" if request.autodown else "autostop"
    store.event(
        launch.name,
        "autostop",
        f"{what} after {request.autostop:g} min idle (agent on worker 0)",
    )


# ------------------------------------------------------------------------------ 6. cleanup


def cleanup(launch: Launch, exc: BaseException) -> None:
    """A stage failed (or the launch was interrupted): the job is recorded failed; a cluster this
    launch created is deleted, a job it started on a reused cluster is stopped."""
    from aios_cloud import jobs, lifecycle, signals
    from aios_cloud.store import JOB_FAILED

    store, name = launch.require_store(), launch.name
    if launch.job_id is not None:
        store.update_job(launch.job_id, state=JOB_FAILED)
        store.event(
            name,
            "job-failed",
            f"job {launch.job_id}: launch failed: {str(exc)[:200]}",
            launch.job_id,
        )
    if launch.created:
        launch.log(f"launch failed; deleting {name} so nothing is left behind")
        try:
            with signals.signals_deferred():
                lifecycle.down_cluster(store, launch.provider, launch.require_record())
        except Exception as cleanup_exc:  # noqa: BLE001
            launch.log(f"cleanup failed: {cleanup_exc}; delete it with `aios down {name}`")
        else:
            if isinstance(exc, AiosError):  # never point at the cluster just deleted
                exc.fix = (
                    f"{name} was deleted, nothing is left running; fix the cause and launch again"
                )
    elif launch.starting:  # what started on a reused cluster stops too (Ctrl-C again skips it)
        try:
            jobs.cancel_job(launch.require_record(), launch.require_job())
        except Exception as cancel_exc:  # noqa: BLE001
            launch.log(
                f"could not stop job {launch.job_id}: {cancel_exc}; run `aios cancel {name}`"
            )


# ------------------------------------------------------------------------------ 7. watch


def watch(launch: Launch) -> int:
    """Follow the job to its end here, or hand it to a controller host (``--controller``) or a
    background watcher (``--detach``, Ctrl-C); ``--down`` deletes the cluster after it."""
    from aios_cloud import lifecycle, watching

    request, store, name = launch.request, launch.require_store(), launch.name
    job_id = launch.require_job()
    if request.controller:
        start_on_controller(launch)
        return 0
    if request.detach:
        pid = spawn_watcher(launch)
        launch.log(
            f"job {job_id} running on {name}; watcher pid {pid}. `aios logs {name} -f`, `aios "
            f"status {name}`, `aios down {name}`"
        )
        return 0
    try:
        code = watch_here(store, launch.provider, job_id, launch.config, request.poll, launch)
    except KeyboardInterrupt:
        # Ctrl-C while watching detaches, as --detach does: a background watcher takes over, so
        # nothing runs unwatched (a lost host still stops an unmanaged job everywhere, a managed
        # one is still recovered) and --down is still honoured
        pid = spawn_watcher(launch)
        what = "manages" if request.managed else "watches"
        down = " and deletes the cluster when it ends (--down)" if request.down_after else ""
        launch.log(
            f"detached: job {job_id} keeps running on {name}; a background watcher (pid {pid}) "
            f"{what} it{down}. `aios logs {name} -f`, `aios cancel {name}`, `aios down {name}`"
        )
        return 130
    except BaseException as exc:  # SIGTERM, or the watch itself failed: nothing runs unwatched
        watching.after_watch_failure(
            store,
            launch.provider,
            job_id,
            launch.created,
            exc,
            launch.log,
            lambda: spawn_watcher(launch),
        )
        raise
    if request.down_after:
        rec = store.get_cluster(name)
        if rec:
            launch.log(f"deleting {name} (--down)")
            lifecycle.down_cluster(store, launch.provider, rec)
    return code


def watch_here(
    store: Store, provider: CloudProvider, job_id: int, config: Any, poll: float, launch: Launch
) -> int:
    """Watch the job from this process, its output printed here."""
    from aios_cloud.watching import Watcher, WatchOptions

    opts = WatchOptions(poll=poll, describe_every=max(poll, 3 * poll), follow=True)
    return Watcher(
        store, provider, job_id, config, printer=launch.printer, log=launch.log, options=opts
    ).run()


def start_on_controller(launch: Launch) -> None:
    """``--controller``: the recovery loop runs on that host; a watcher here if it cannot."""
    from aios_cloud.controller import start_controller

    request, store = launch.request, launch.require_store()
    job_id = launch.require_job()
    assert request.controller is not None
    try:
        start_controller(
            store,
            launch.provider,
            launch.require_record(),
            job_id,
            launch.spec,
            request.controller,
            launch.key,
            request.controller_python or sys.executable,
            request.poll,
            request.down_after,
            launch.log,
        )
    except BaseException:
        # nothing watches the job otherwise: fall back to a watcher here, loudly
        pid = spawn_watcher(launch)
        launch.log(
            f"the controller could not be started; a watcher on this machine (pid {pid}) "
            f"manages job {job_id} instead"
        )
        raise
    launch.log(
        f"`aios status {launch.name} --refresh` shows the job as the controller sees it; "
        f"`aios down {launch.name}`"
    )


def spawn_watcher(launch: Launch) -> int:
    """A detached ``python -m aios_cloud.watch`` for the job; its pid is recorded."""
    job_id = launch.require_job()
    pid = spawn_watcher_process(
        launch.require_store(),
        job_id,
        launch.cloud,
        launch.request.config_file,
        launch.request.poll,
        launch.request.down_after,
    )
    launch.require_store().update_job(job_id, watcher_pid=pid)
    return pid


def spawn_watcher_process(
    store: Store, job_id: int, cloud: str, config_file: str | None, poll: float, down: bool
) -> int:
    """Start ``python -m aios_cloud.watch JOB`` detached (its log in the cluster's directory)."""
    from aios_cloud.store import cluster_dir

    job = store.get_job(job_id)
    assert job is not None
    logf = cluster_dir(job.cluster) / f"watcher-{job_id}.log"
    argv = [sys.executable, "-m", "aios_cloud.watch", str(job_id), "--cloud", cloud]
    argv += ["--poll", str(poll)]
    if config_file:
        argv += ["--config", config_file]
    if down:
        argv.append("--down")
    with open(logf, "ab") as f:
        p = subprocess.Popen(
            argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return p.pid


# ------------------------------------------------------------------------------ helpers


def _config(config_file: str | None) -> Any:
    from aios.config.schema import resolve

    return resolve(config_file=config_file, check_backend=False)


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise AiosError(
            f"cluster name '{name}' is invalid",
            "use 1-48 lowercase letters, digits and dashes, starting with a letter",
        )
    return name


def default_name() -> str:
    """``aios-USER-XXXX``."""
    user = re.sub("[^a-z0-9]", "", getpass.getuser().lower())[:12] or "user"
    return f"aios-{user}-{random.randint(0, 0xFFFF):04x}"


__all__ = [
    "Launch",
    "add_job",
    "check_autostop",
    "check_bucket",
    "check_checkpoints",
    "cleanup",
    "cluster_request",
    "job_spec",
    "plan",
    "prepare",
    "provision",
    "render",
    "run",
    "setup",
    "start",
    "sync",
    "watch",
]
