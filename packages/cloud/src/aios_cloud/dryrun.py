"""``aios launch --dry-run`` for a cloud whose hosts aios creates: every step as the command that
does it, in the order the launch takes them (nothing is called, no SSH connection is made)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from aios.config.schema import redact

from aios_cloud.codesync import collect, data_line, secret_files
from aios_cloud.head import HELPER_PYTHON
from aios_cloud.jobs import host_commands, shell_word
from aios_cloud.provider.base import CloudProvider, Echo, LaunchPlan
from aios_cloud.records import (
    dry_run_lines,
    placeholder_hosts,
    record_hosts,
    remote_root,
    with_public_key,
)
from aios_cloud.request import JobSpec
from aios_cloud.store import ClusterRecord


def render_launch(provider: CloudProvider, plan: LaunchPlan, echo: Echo) -> None:
    """The default :meth:`CloudProvider.render_launch`: provision (the provider's
    :meth:`~CloudProvider.render_create`, the zones it fails over to), the code sync through
    worker 0, setup, and each worker's command, as a launch on a cloud the provider creates
    takes them."""
    request, spec, config = plan.cluster, plan.spec, plan.config
    existing, key_path, autostop_line = plan.existing, plan.key_path, plan.autostop_line
    echo("# dry run: nothing is created, no SSH connection is made")
    if existing:
        echo(f"# cluster {request.name} exists; it is reused")
    else:
        echo(f"# 1. provision ({provider.cli or provider.name})")
        home = Path(
            os.environ.get("AIOS_HOME") or Path.home() / ".aios"
        ).expanduser()  # read only: no mkdir
        key = (
            Path(key_path).expanduser()
            if key_path
            else home / "clusters" / request.name / "id_ed25519"
        )
        if Path(
            str(key) + ".pub"
        ).is_file():  # the public key a launch installs (public: printed as sent)
            request = with_public_key(request, str(key))
        elif not key_path:  # created by the launch, for this cluster alone
            request = dataclasses.replace(
                request, ssh_public_key=f"ssh-ed25519 <created at launch: {key}.pub>"
            )
        for line in dry_run_lines(provider.render_create(request)):
            echo(line)
        zones = provider.zones(request.accelerator)
        if len(zones) > 1:
            echo(
                "# on a stockout or quota error: retry in "
                f"{', '.join(z for z in zones if z != request.zone)} (with backoff)"
            )
    entry = provider.entry(request.accelerator)
    n = max(1, entry.hosts) * request.nodes
    hosts = placeholder_hosts(n, request.ssh_user)
    rec = ClusterRecord(
        request.name,
        provider.name,
        request.zone,
        request.accelerator,
        request.spot,
        "DRY-RUN",
        hosts=[dataclasses.asdict(h) for h in hosts],
        ssh_user=request.ssh_user,
        ssh_key=None,
    )
    shown = key_path or f"$AIOS_HOME/clusters/{request.name}/id_ed25519"
    head = f"ssh -i {shown} -o ControlMaster=auto {hosts[0].ssh_user}@{hosts[0].ip}"
    render_job(rec, spec, config, head, echo)
    if spec.checkpoint_dir:
        echo(
            f"# managed: on preemption recreate (or move zone), re-sync, re-setup, resume from {spec.checkpoint_dir}"
        )
    if autostop_line:
        echo(autostop_line)


def render_job(
    rec: ClusterRecord, spec: JobSpec, config: Any, head_ssh: str, echo: Echo, step: int = 2
) -> None:
    """Steps 2-4 of every launch on hosts aios reaches over SSH, as :mod:`aios_cloud.jobs` takes
    them: the code to worker 0 (``head_ssh``: the ssh command that reaches it) through the fleet
    helper, which copies it to the other hosts; setup and the start on every host, run by
    worker 0; each host's command."""
    hosts = record_hosts(rec)
    root = remote_root(rec.name)
    files = collect(spec.workdir, spec.excludes)
    bundle = "; aios adds itself (code/.aios-site) to what is sent" if spec.bundle else ""
    echo(
        f"# {step}. code sync: {len(files)} files from {spec.workdir} (gitignore honoured; "
        f".git, checkpoints, untracked data folders excluded){bundle}"
    )
    left = data_line(spec.workdir, spec.excludes)
    if left:
        echo(f"# {left}")
    secrets = secret_files(spec.workdir, spec.excludes)
    if secrets:
        echo(
            f"# left out {len(secrets)} secret-looking files: "
            f"{', '.join(secrets[:8])}{', ...' if len(secrets) > 8 else ''} (use --env NAME)"
        )
    echo(
        f"{head_ssh} '{HELPER_PYTHON} {root}/fleet/fleet-<sha>.py have|put {root}'  # the "
        "content manifest, then only the files worker 0 lacks"
    )
    if len(hosts) > 1:
        echo(
            f"# worker 0 copies the code to the other {len(hosts) - 1} hosts over the cluster "
            "network (each gets only the files it lacks); setup, start, status, logs and cancel "
            "go through worker 0 too"
        )
    if spec.setup_lines:
        echo(f"# {step + 1}. setup on every worker (cd {root}/code):")
        for line in spec.setup_lines:
            for part in line.splitlines():
                echo(f"#    {part}")
    plans = host_commands(rec, spec, config)
    env = {k: v for k, v in spec.env.items()}
    if spec.checkpoint_dir:
        env["AIOS_CHECKPOINT__DIR"] = spec.checkpoint_dir
    for name in spec.forward_env:
        env[name] = "<forwarded from your environment>"
    env = redact(env)
    echo(f"# {step + 2}. run on every worker (detached; logs in {root}/jobs/<id>/worker.log)")
    for h in hosts:
        plan = plans[h.worker_id]
        full = {**env, **plan.env}
        # as run.sh and the env file write them: a leading ~/ expands on the host
        prefix = " ".join(f"{k}={shell_word(str(v))}" for k, v in sorted(full.items()))
        cmd = " ".join(shell_word(c) for c in plan.command)
        echo(f"({h.label}) cd {root}/code && {prefix} {cmd}")


__all__ = ["render_job", "render_launch"]
