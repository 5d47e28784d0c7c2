"""``aios launch --cloud ssh --dry-run``: the launch's path as commands that run as printed."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from aios.config.schema import redact

from aios_cloud.codesync import collect, data_line, secret_files
from aios_cloud.jobs import host_commands, setup_script
from aios_cloud.provider.base import Echo, LaunchPlan
from aios_cloud.provider.data import CloudCommand, ClusterHost
from aios_cloud.records import remote_root
from aios_cloud.sshhosts.hosts import DEFAULT_HOST_WAIT, ZONE, SshHost, cluster_hosts, host_specs
from aios_cloud.sshhosts.shell import dry_ssh, ssh_dest
from aios_cloud.store import ClusterRecord


def render_launch(plan: LaunchPlan, echo: Echo, cloud: str, create: list[CloudCommand]) -> None:
    """``aios launch --cloud ssh --dry-run``: the path the launch takes, as commands that
    run as printed (``bash -e`` on this machine). Each host is reached and inspected from
    here; then, as the launch does, the code goes to worker 0 once and worker 0 copies it to
    the other hosts, and setup and the start reach every other host through worker 0 (your
    key forwarded by an ssh-agent, never copied)."""
    request, spec = plan.cluster, plan.spec
    key = request.extra.get("identity")
    nprocs = request.extra.get("nprocs_per_host")
    hosts = [
        SshHost(
            h.worker_id,
            h.ip,
            h.ip,
            ssh_user=h.ssh_user,
            port=h.port,
            internal_port=h.internal_port or int(request.extra.get("worker_port") or 22),
            nprocs=nprocs or 1,
        )
        for h in cluster_hosts(host_specs(request), key)
    ]
    root = remote_root(request.name)
    relay = _Relay(hosts, key, root)
    echo("# dry run: nothing changes on the hosts, no SSH connection is made")
    for h in hosts:
        if not h.ssh_user or not h.port:
            # the alias as written: ssh's own configuration picks user, port, address
            echo(
                f"# worker {h.worker_id}: ssh host {h.ip} as your ~/.ssh/config has it"
                + ("" if h.ssh_user else " (its User)")
                + ("" if h.port else " (its Port)")
            )
    echo("# 1. reach and inspect every host (addresses, devices, python and torch; read only)")
    for c in create:
        echo(c.shell())
    if len(hosts) > 1:
        echo(
            "# worker 0 reaches the other hosts with your key, through an ssh-agent here "
            "(forwarded, never copied)"
        )
        echo(relay.agent_start())
    files = collect(spec.workdir, spec.excludes)
    echo(
        f"# 2. code sync: {len(files)} files from {spec.workdir} (gitignore honoured; .git, "
        "checkpoints, untracked data folders excluded), once, to worker 0"
        + (
            "; aios adds itself (code/.aios-site), the lines below ship your files"
            if spec.bundle
            else ""
        )
    )
    left = data_line(spec.workdir, spec.excludes)
    if left:
        echo(f"# {left}")
    if secret_files(spec.workdir, spec.excludes):
        echo(
            f"# left out {len(secret_files(spec.workdir, spec.excludes))} secret-looking "
            "files (use --env NAME)"
        )
    # files are written over in place: what a job wrote under code/ (runs, checkpoints) stays
    untar = f"set -e; mkdir -p {root}/code; tar xzf - -C {root}/code"
    tar = f"tar czf - -C {shlex.quote(spec.workdir)} " + " ".join(shlex.quote(f) for f in files)
    echo(f"{tar} | {shlex.join(dry_ssh(hosts[0], key, untar))}")
    if len(hosts) > 1:
        echo(f"# worker 0 copies the code to the other {len(hosts) - 1} hosts")
        echo(relay.copy_code())
    if spec.setup_lines:
        echo("# 3. setup, then the version-set check, on every host (through worker 0)")
        script = setup_script(spec).rstrip("\n")
        for h in hosts:  # the script on stdin, as written (a quoted heredoc: no expansion)
            echo(relay.on(h, f"cd {root}/code && bash -s") + " <<'AIOS_SETUP'")
            echo(script)
            echo("AIOS_SETUP")
    rec = ClusterRecord(
        request.name,
        cloud,
        ZONE,
        request.accelerator,
        False,
        "DRY-RUN",
        hosts=[host_dict(h) for h in hosts],
    )
    plans = host_commands(rec, spec, plan.config)
    env = dict(spec.env)
    if spec.checkpoint_dir:
        env["AIOS_CHECKPOINT__DIR"] = spec.checkpoint_dir
    for n in spec.forward_env:
        env[n] = "<forwarded from your environment>"
    env = redact(env)
    echo(
        f"# 4. run on every host ({nprocs or 'discovered: accelerators found, else 1'} "
        f"processes each; node ranks in host order; the master address is worker 0's "
        f"address on the network the hosts share, found in step 1 (shown: its SSH address)); "
        f"all hosts at once through worker 0: here in the background of this shell, aios "
        f"starts it detached with logs in {root}/jobs/<id>/worker.log"
    )
    for h in hosts:
        hp = plans[h.worker_id]
        full = {**env, **hp.env}
        prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(full.items()))
        echo(relay.on(h, f"cd {root}/code && {prefix} {shlex.join(hp.command)}") + " &")
    echo("wait")
    if len(hosts) > 1:
        echo(relay.agent_stop())
    if spec.checkpoint_dir:
        echo(
            "# managed: a lost host stops the job on the others; aios waits "
            f"{request.extra.get('host_wait', DEFAULT_HOST_WAIT):g}s for every host, then "
            f"restarts on those that answer, resuming from {spec.checkpoint_dir}"
        )


class _Relay:
    """Commands on the hosts as the launch runs them: on worker 0 directly, on every other host
    through worker 0 (``ssh -A`` to worker 0, which runs ``ssh`` to the host at the address
    shown), host keys pinned in worker 0's ``ROOT/fleet/known_hosts``."""

    def __init__(self, hosts: list[SshHost], key: str | None, root: str) -> None:
        self.hosts, self.key, self.root = hosts, key, root
        self.head = hosts[0]

    def agent_start(self) -> str:
        add = f" && ssh-add -q {shlex.quote(self.key)}" if self.key else ""
        return f'eval "$(ssh-agent -s)" > /dev/null{add}'

    def agent_stop(self) -> str:
        return "ssh-agent -k > /dev/null"

    def _hop(self, h: ClusterHost, command: str) -> list[str]:
        """The ``ssh`` worker 0 runs to reach ``h``."""
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            # %d: the login's home on worker 0 (ssh's own token; the root starts with $HOME)
            f"UserKnownHostsFile={self.root.replace('$HOME', '%d', 1)}/fleet/known_hosts",
        ]
        port = h.internal_port if h.internal_port is not None else (h.port or 22)
        if port != 22:
            argv += ["-p", str(port)]
        return [*argv, ssh_dest(h), command]

    def on(self, h: ClusterHost, command: str) -> str:
        """``command`` on ``h``, through worker 0 unless ``h`` is worker 0."""
        if h.worker_id == self.head.worker_id:
            return shlex.join(dry_ssh(h, self.key, command))
        inner = f"mkdir -p {self.root}/fleet && " + shlex.join(self._hop(h, command))
        return shlex.join(["ssh", "-A", *dry_ssh(self.head, self.key, inner)[1:]])

    def copy_code(self) -> str:
        """Worker 0 sends its copy of the code to every other host (one stream each)."""
        untar = f"set -e; mkdir -p {self.root}/code; tar xzf - -C {self.root}/code"
        parts = [
            f"tar czf - -C {self.root}/code . | " + shlex.join(self._hop(h, untar))
            for h in self.hosts[1:]
        ]
        inner = f"set -e; mkdir -p {self.root}/fleet; " + "; ".join(parts)
        return shlex.join(["ssh", "-A", *dry_ssh(self.head, self.key, inner)[1:]])


def host_dict(h: ClusterHost) -> dict[str, Any]:
    return dataclasses.asdict(h)
