"""Stages 3-6: :func:`prepare`, :func:`provision`, :func:`sync`, :func:`setup`, :func:`start`,
and :func:`cleanup` when one of them failed."""

from __future__ import annotations

import shlex
from pathlib import Path

from aios.errors import AiosError

from aios_cloud import jobs, lifecycle, shapes, signals
from aios_cloud.launch.checks import check_autostop, check_bucket
from aios_cloud.launch.context import Launch
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CapacityError, NotOfferedError, QuotaError
from aios_cloud.records import cluster_key, request_dict, with_public_key
from aios_cloud.ssh import ensure_client_key
from aios_cloud.store import JOB_FAILED, JOB_RUNNING, JOB_SETTING_UP

# ------------------------------------------------------------------------------ 3. prepare


def prepare(launch: Launch) -> None:
    """Everything that can fail before anything is billed, and the SSH key."""
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


# ------------------------------------------------------------------------------ 4. provision


def provision(launch: Launch) -> None:
    """Create the cluster (zone failover; nothing left behind on failure) or reuse it."""
    if launch.existing is not None:
        launch.record = launch.existing
        launch.log(
            f"reusing cluster {launch.name} ({launch.record.accelerator} in {launch.record.zone})"
        )
        return
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
    rec = launch.require_record()
    jobs.reach(rec, launch.printer, launch.log)
    jobs.sync_code(rec, launch.spec, launch.printer, launch.log)


def setup(launch: Launch) -> None:
    """The setup lines and the provider's host checks on every host."""
    jobs.run_setup(launch.require_record(), launch.spec, launch.printer, launch.log)


def start(launch: Launch) -> None:
    """Start the job on every host (detached), then the autostop agent."""
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
