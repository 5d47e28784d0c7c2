"""Stage 7 (:func:`watch`): follow the job here, or hand it to a controller host or a
background watcher; ``--down`` deletes the cluster after it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from aios_cloud import lifecycle, signals, watching
from aios_cloud.controller import start_controller
from aios_cloud.launch.context import Launch
from aios_cloud.provider.base import CloudProvider
from aios_cloud.store import Store, cluster_dir
from aios_cloud.watching import Watcher, WatchOptions

# ------------------------------------------------------------------------------ 7. watch


def watch(launch: Launch) -> int:
    """Follow the job to its end here, or hand it to a controller host (``--controller``) or a
    background watcher (``--detach``, Ctrl-C); ``--down`` deletes the cluster after it."""
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
        signals.interrupt_handled()
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
    opts = WatchOptions(poll=poll, describe_every=max(poll, 3 * poll), follow=True)
    return Watcher(
        store,
        provider,
        job_id,
        config,
        printer=launch.printer,
        log=launch.log,
        options=opts,
        sleep=signals.interruptible_sleep,  # a Ctrl-C the collector swallowed still detaches
    ).run()


def start_on_controller(launch: Launch) -> None:
    """``--controller``: the recovery loop runs on that host; a watcher here if it cannot."""
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
