"""A cluster's lifecycle: provision (with zone failover and cleanup), stop, start, down, and
the autostop agent on the head host."""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
import time
from collections.abc import Callable
from typing import Any

from aios.errors import AiosError

from aios_cloud.failover import create_with_failover, zone_order
from aios_cloud.jobs import shell_word
from aios_cloud.provider.base import CloudProvider, Provider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.states import STOPPED
from aios_cloud.records import Log, record_hosts, remote_root, request_dict, runner_for, save_hosts
from aios_cloud.ssh import (
    SshRunner,
)
from aios_cloud.store import (
    JOB_CANCELLED,
    JOB_FINAL,
    ClusterRecord,
    Store,
    cluster_dir,
)


def provision(
    store: Store,
    provider: CloudProvider,
    request: ClusterRequest,
    ssh_key: str | None,
    log: Log,
    failover: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    backoff: float = 2.0,
) -> ClusterRecord:
    """Claim the name, create with zone failover, record the hosts. On any failure nothing is
    left behind: every zone tried is cleaned up by the failover loop and the record removed."""
    request = provider.prepare(request)
    rec = ClusterRecord(
        name=request.name,
        cloud=provider.name,
        zone=request.zone,
        accelerator=request.accelerator,
        spot=request.spot,
        state="PENDING",
        request=request_dict(request),
        ssh_user=request.ssh_user,
        ssh_key=ssh_key,
    )
    if not store.claim_cluster(rec):
        raise AiosError(
            f"a cluster named '{request.name}' already exists",
            f"use another --name, or `aios down {request.name}` first",
        )
    try:
        zones = zone_order(provider, request, pinned=not failover)
        result = create_with_failover(
            provider, request, zones, log=log, sleep=sleep, backoff=backoff
        )
        for a in result.attempts:
            store.event(request.name, "failover", f"{a.zone}: {a.kind}: {a.message[:200]}")
        store.event(
            request.name,
            "created",
            f"{result.info.accelerator} in {result.zone} ({len(result.info.hosts)} hosts)",
        )
        # a zone change must be remembered for later recreations
        req = dataclasses.replace(request, zone=result.zone)
        store.update_cluster(request.name, request=request_dict(req))
        runner = SshRunner([], cluster_dir(request.name) / "known_hosts")
        runner.reset_host_keys()
        return save_hosts(store, store.get_cluster(request.name) or rec, result.info, provider)
    except BaseException as exc:
        leftover = getattr(exc, "aios_leftover_zone", None)
        if leftover:
            # the cloud side could not be cleaned up: keep the record so `aios down` finds it
            store.update_cluster(
                request.name,
                zone=leftover,
                state="LEFTOVER",
                request=request_dict(dataclasses.replace(request, zone=leftover)),
            )
            store.event(
                request.name,
                "leftover",
                f"interrupted while creating in {leftover}; cleanup did not finish; `aios "
                f"down {request.name}` deletes it",
            )
        else:
            store.delete_cluster(request.name)
        raise


def stop_cluster(store: Store, provider: Provider, rec: ClusterRecord) -> None:
    provider.stop(rec.name, rec.zone)
    store.update_cluster(rec.name, state=STOPPED)
    store.event(rec.name, "stopped", "stopped by the user")


def start_cluster(
    store: Store, provider: CloudProvider, rec: ClusterRecord, log: Log | None = None
) -> ClusterRecord:
    info = provider.start(rec.name, rec.zone)
    runner_for(rec).reset_host_keys()  # a stopped/started VM comes back with new host keys
    store.event(rec.name, "started", "started by the user")
    new = save_hosts(store, rec, info, provider)
    reinstall_agent(store, provider, new, None, log or (lambda m: None))
    return new


def autostop_of(rec: ClusterRecord) -> dict[str, Any] | None:
    """The cluster's autostop setting (kept in its record), or None."""
    return rec.request.get("autostop") or None


def remember_autostop(store: Store, name: str, autostop: dict[str, Any] | None) -> None:
    """Keep (or, with None, forget) the autostop setting in the record, so the agent is
    installed again after a managed recovery and after `aios start`."""
    rec = store.get_cluster(name)
    if rec is not None:
        request = {k: v for k, v in rec.request.items() if k != "autostop"}
        if autostop:
            request["autostop"] = autostop
        store.update_cluster(name, request=request)


def reinstall_agent(
    store: Store,
    provider: CloudProvider,
    rec: ClusterRecord,
    printer: Callable[[str, str], None] | None,
    log: Log,
    autostop: dict[str, Any] | None = None,
) -> None:
    """Install the autostop agent again where the cluster has an autostop setting (``autostop``,
    else the record's): a recreated cluster has a fresh head host, a started one lost its
    processes. Without this the cluster bills on with nothing to stop it."""
    cfg = autostop or autostop_of(rec)
    if not cfg:
        return
    remember_autostop(store, rec.name, cfg)
    install_agent(
        rec, provider, cfg["idle_seconds"], cfg["action"], cfg["python"], printer, log, cfg["poll"]
    )
    store.event(rec.name, "autostop", f"agent installed on worker 0 ({cfg['action']} when idle)")


def down_cluster(store: Store, provider: Provider, rec: ClusterRecord) -> None:
    for job in store.jobs(rec.name):
        if job.state not in JOB_FINAL:
            store.update_job(job.id, state=JOB_CANCELLED)
    provider.delete(rec.name, rec.zone)
    store.delete_cluster(rec.name)
    runner_for(rec).reset_host_keys()


def install_agent(
    rec: ClusterRecord,
    provider: CloudProvider,
    idle_seconds: float,
    action: str,
    python: str,
    printer: Callable[[str, str], None] | None,
    log: Log,
    poll: float = 30.0,
) -> None:
    """Start the autostop/autodown agent (:mod:`aios_cloud.agent`) on the head host, replacing
    one already running there. It needs the shipped aios (code/.aios-site) or an installed one."""
    import json

    why = provider.stop_refusal(rec.spot, rec.accelerator) if action == "stop" else None
    if why:
        raise AiosError(
            f"{rec.name} cannot be stopped when idle: {why}",
            "use --autodown (delete when idle) instead of a plain --autostop",
        )
    root = remote_root(rec.name)
    cfg: dict[str, Any] = {
        "cluster": rec.name,
        "zone": rec.zone,
        "cloud": rec.cloud,
        "action": action,
        "idle_seconds": float(idle_seconds),
        "poll": float(poll),
        "settings": provider.agent_settings(),
    }
    head = record_hosts(rec)[0]
    runner = runner_for(rec, printer)
    site = f'PYTHONPATH="{root}/code/.aios-site${{PYTHONPATH:+:$PYTHONPATH}}"'
    agent = f"{shell_word(python)} -m aios_cloud.agent {root}/agent.json >> {root}/agent.log 2>&1"
    # back after a reboot of the head host: cron runs @reboot entries when it starts
    # (crontab(5)); the entry is tagged with the cluster, replaced on every install
    tag = f"# aios-agent {rec.name} (autostop)"
    boot = f"@reboot cd {root} && {site} {agent} < /dev/null & echo $! > {root}/agent.pid {tag}"
    cmd = (
        f"set -e; mkdir -p {root}; umask 077; cat > {root}/agent.json; "
        f'if [ -f {root}/agent.pid ]; then kill "$(cat {root}/agent.pid)" 2>/dev/null || true; fi; '
        f"cd {root}; {site} setsid nohup {agent} "
        f"< /dev/null & echo $! > {root}/agent.pid; echo started; "
        "if command -v crontab >/dev/null 2>&1; then "
        f"{{ crontab -l 2>/dev/null | grep -vF {shlex.quote(tag)} || true; echo {shlex.quote(boot)}; }} "
        "| crontab - && echo reboot:cron; else echo reboot:none; fi"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        tmp = f.name
    try:
        r = runner.run_one(head, cmd, stdin_path=tmp, stream=False)
    finally:
        os.unlink(tmp)
    runner.check([r], "autostop agent")
    what = "delete" if action == "down" else "stop"
    log(
        f"autostop: the agent on {head.label} will {what} {rec.name} after "
        f"{idle_seconds / 60:g} min without a running job"
    )
    if "reboot:cron" not in "\n".join(r.stdout):
        log(
            f"note: the autostop agent will not come back if {head.label} reboots (no crontab "
            "there); aios reinstalls it at its next start or recovery"
        )


def remove_agent(rec: ClusterRecord, printer: Callable[[str, str], None] | None) -> None:
    root = remote_root(rec.name)
    runner = runner_for(rec, printer)
    head = record_hosts(rec)[0]
    tag = shlex.quote(f"# aios-agent {rec.name} (autostop)")
    r = runner.run_one(
        head,
        f'rm -f {root}/agent.json; if [ -f {root}/agent.pid ]; then kill "$(cat '
        f'{root}/agent.pid)" 2>/dev/null || true; fi; '
        f"if crontab -l 2>/dev/null | grep -qF {tag}; then "
        f"crontab -l | grep -vF {tag} | crontab -; fi",
        stream=False,
    )
    runner.check([r], "autostop cancel")
