"""The ``ssh`` cloud's :class:`SshHostsProvider` (see :mod:`aios_cloud.sshhosts`)."""

from __future__ import annotations

import builtins
import sys
from dataclasses import replace
from typing import Any

from aios.errors import AiosError

from aios_cloud.features import AUTOSTOP, CONTROLLER, HOST_LIST, LABELS, SETUP, SSH_LOGIN
from aios_cloud.provider.base import CloudProvider, Echo, LaunchPlan
from aios_cloud.provider.data import (
    CatalogEntry,
    CloudCommand,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
)
from aios_cloud.provider.errors import CloudError
from aios_cloud.provider.requirements import check_requirements
from aios_cloud.provider.states import HEALTHY, READY, STOPPED
from aios_cloud.records import request_from_record
from aios_cloud.request import LaunchRequest
from aios_cloud.sshhosts.dryrun import render_launch
from aios_cloud.sshhosts.hosts import (
    ACCELERATORS,
    ZONE,
    SshHost,
    cluster_hosts,
    cluster_record,
    host_specs,
)
from aios_cloud.sshhosts.options import host_python, launch_options
from aios_cloud.sshhosts.plan import clean, plan_hosts, reach
from aios_cloud.sshhosts.probe import probe_command
from aios_cloud.sshhosts.shell import (
    VENV_PYTHON,
    cleanup_command,
    dry_ssh,
    host_check_lines,
    probe_python,
    torch_setup,
    venv_setup,
)


def _log(msg: str) -> None:
    sys.stderr.write(f"[aios] {msg}\n")
    sys.stderr.flush()


class SshHostsProvider(CloudProvider):
    """Hosts the user already has, reached over SSH. See the module docstring."""

    name = "ssh"
    storage_scheme = ""
    cli = "ssh"
    default_ssh_user = ""  # each host carries its own user
    default_accelerator = "auto"
    # the cli: no aios-made key is installed (the user's own SSH setup logs in), and a
    # managed run may keep its checkpoints on a path every host mounts (checked at launch)
    user_hosts = True
    shared_paths = True
    # capacity (spot, queued, reserved), images, disks, projects, regions and zones are the
    # clouds'; autostop stops machines, and aios never stops hosts it did not create; the
    # hosts have no prices to bound a spend with
    features = frozenset({SSH_LOGIN, SETUP, HOST_LIST, LABELS, CONTROLLER})
    feature_hints = {
        AUTOSTOP: "your hosts bill nothing to aios; `aios down NAME` ends aios's processes there",
    }

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.python_cmd = "python3"
        self.log = _log

    # -------------------------------------------------------------- the launch options
    def launch_extra(self, request: LaunchRequest, existing: bool = False) -> dict[str, Any]:
        """Check ``aios launch``'s host options (one line, exit 2) and return what the cluster
        request carries: the host list and how to use it (no secrets: the key is a path)."""
        self.python_cmd = host_python(request, self.python_cmd)
        return launch_options(request, existing, self.python_cmd)

    # -------------------------------------------------------------- catalog
    def catalog(self) -> list[CatalogEntry]:
        what = {
            "auto": "host (CPU; a host with accelerators is refused)",
            "cpu": "host (its CPUs)",
            "gpu": "host (its NVIDIA GPUs)",
            "tpu": "host (its TPU chips)",
            "trainium": "host (its Neuron devices)",
        }
        return [
            CatalogEntry(
                cloud=self.name,
                accelerator=a,
                devices=1,
                device_kind=what[a],
                memory_gb=0.0,
                hosts=1,
                runtime="your hosts' own",
                zones=(ZONE,),
                backend=backend,
                extra={"price": "n/a (your hosts)"},
            )
            for a, (backend, _) in ACCELERATORS.items()
        ]

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        self.entry(request.accelerator)
        specs = host_specs(request)
        if request.nodes not in (1, len(specs)):
            raise AiosError(
                f"--nodes {request.nodes} does not match the {len(specs)} hosts listed",
                "leave --nodes out: every listed host is a node",
            )
        if request.zone not in (None, ZONE) or request.region:
            raise AiosError("--zone/--region choose cloud locations", "drop them for --cloud ssh")
        if request.image or request.disk_gb:
            raise AiosError(
                "--image/--disk-gb choose what aios creates; --cloud ssh uses your hosts as they are",
                "drop them",
            )
        if request.extra.get("python"):
            self.python_cmd = request.extra["python"]
        return replace(request, nodes=len(specs), zone=ZONE, ssh_user="")

    def describe_credentials(self) -> str:
        return "your SSH keys, agent and ~/.ssh/config"

    # -------------------------------------------------------------- reaching the hosts

    # -------------------------------------------------------------- lifecycle
    def create(self, request: ClusterRequest) -> ClusterInfo:
        rec = cluster_record(request.name)
        recovering = bool(rec and rec.hosts)
        hosts, notes = plan_hosts(request, recovering, self.python_cmd)
        for n in notes:
            self.log(n)
        self.log(
            f"{len(hosts)} hosts: "
            + ", ".join(
                f"worker {h.worker_id} {h.ip} ({h.devices}, {h.nprocs} proc)" for h in hosts
            )
        )
        return self._info(request.name, request.accelerator, READY, list(hosts))

    def returned_hosts(
        self, request: ClusterRequest, hosts: builtins.list[ClusterHost]
    ) -> builtins.list[str]:
        """The listed hosts the run continued without (``--min-hosts``) that answer again."""
        have = {(h.ssh_user, h.ip, h.port) for h in hosts}
        specs = host_specs(request)
        missing = [s for s in specs if (s.user, s.host, s.port) not in have]
        if not missing or len(missing) == len(specs):
            return []
        key = request.extra.get("identity")
        every = cluster_hosts(specs, key)
        probe = [h for h in every if (h.ssh_user, h.ip, h.port) not in have]
        python = request.extra.get("python") or self.python_cmd
        try:
            probes, _ = reach(request.name, probe, key, 0.0, python)
        except CloudError:  # answers with another key or refuses the login: not back
            return []
        return [f"{h.ssh_user}@{h.ip}:{h.port}" for h in probe if h.worker_id in probes]

    def _info(self, name: str, accel: str, state: str, hosts: list[ClusterHost]) -> ClusterInfo:
        return ClusterInfo(name, self.name, ZONE, accel, state, HEALTHY, hosts=hosts)

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        rec = cluster_record(name)
        if rec is None:
            return None
        hosts: list[ClusterHost] = [
            SshHost(**{k: v for k, v in h.items() if k in _SSH_HOST_FIELDS}) for h in rec.hosts
        ]
        state = STOPPED if rec.state == STOPPED else READY
        return self._info(name, rec.accelerator, state, hosts)

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        return []  # every ssh cluster has its local record; nothing else exists to find

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        rec = cluster_record(name)
        if rec is None:
            raise CloudError(f"no ssh cluster named '{name}'", "see `aios status`")
        request = request_from_record(rec)
        hosts, notes = plan_hosts(request, True, self.python_cmd)
        for n in notes:
            self.log(n)
        return self._info(name, rec.accelerator, READY, list(hosts))

    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        raise CloudError(
            "autostop stops or deletes machines; aios never stops hosts it did not create",
            f"your hosts bill nothing to aios; `aios down {name}` ends aios's processes there",
        )

    def stop(self, name: str, zone: str | None) -> None:
        clean(name, False, self.log)

    def delete(self, name: str, zone: str | None) -> None:
        clean(name, True, self.log)

    # -------------------------------------------------------------- runtime
    def setup_commands(
        self, accelerator: str, requirements: builtins.list[str], backend: str | None = None
    ) -> builtins.list[str]:
        """With aios's own environment (no ``--python``): create it in the cluster's directory
        (``uv venv`` where uv is installed, else the host's ``python3 -m venv``), with the
        system's site packages visible so that a torch the host already has is used as it is,
        and install there only the requirements it lacks (nothing is upgraded, nothing goes into
        a system interpreter). With ``--python``: that interpreter is used as it is, nothing is
        installed (the host checks say in one line when it lacks torch)."""
        check_requirements(requirements)
        if self.python_cmd != VENV_PYTHON:
            return []
        return [*venv_setup(requirements), torch_setup(backend or self.backend_for(accelerator))]

    def host_checks(self, accelerator: str, nodes: int) -> builtins.list[str]:
        """Run on every host after setup (also with ``--no-setup``): the version-set check of the
        backend's stack (cpu: torch installed), then aios's own device discovery there (``aios
        devices --backend B --json``), each failing with one line naming the host."""
        return host_check_lines(accelerator, self.python_cmd)

    def backend_for(self, accelerator: str) -> str:
        self.entry(accelerator)
        return ACCELERATORS[accelerator][0]

    def python(self, accelerator: str, backend: str | None = None) -> str:
        """``--python`` as given, else aios's own environment (:data:`VENV_PYTHON`)."""
        return self.python_cmd

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        """``aios stop`` ends aios's processes on the hosts; the hosts keep running (never
        stopped: aios did not create them)."""
        return None

    def repair(self, info: ClusterInfo) -> str:
        raise CloudError("hosts aios did not create are not repaired", "")

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> builtins.list[CloudCommand]:
        extra = request.extra
        py = probe_python(extra.get("python") or self.python_cmd)
        return [
            CloudCommand(
                dry_ssh(h, extra.get("identity"), probe_command(request.name, py)),
                f"worker {h.worker_id}: reach and inspect (read only)",
            )
            for h in cluster_hosts(host_specs(request), extra.get("identity"))
        ]

    def render(self, action: str, name: str, zone: str | None) -> builtins.list[CloudCommand]:
        rec = cluster_record(name)
        if rec is None:
            return []
        key = (rec.request.get("extra") or {}).get("identity")
        hosts = cluster_hosts(host_specs(rec.request), key)
        if action in ("delete", "stop"):
            cmd = cleanup_command(name, action == "delete")
            what = (
                "end aios's processes, remove aios's files (the synced files the host's "
                "fleet/manifest.json lists too; files the job wrote are kept)"
                if action == "delete"
                else "end aios's processes; the host keeps running"
            )
        elif action in ("start", "describe"):
            cmd, what = (
                probe_command(name, probe_python(self.python_cmd)),
                "reach and inspect (read only)",
            )
        else:
            return []
        return [CloudCommand(dry_ssh(h, key, cmd), f"worker {h.worker_id}: {what}") for h in hosts]

    def render_launch(self, plan: LaunchPlan, echo: Echo) -> None:
        """``aios launch --cloud ssh --dry-run``: the path the launch takes, as commands that
        run as printed (``bash -e`` on this machine). Each host is reached and inspected from
        here; then, as the launch does, the code goes to worker 0 once and worker 0 copies it to
        the other hosts, and setup and the start reach every other host through worker 0 (your
        key forwarded by an ssh-agent, never copied)."""
        render_launch(plan, echo, self.name, self.render_create(plan.cluster))


_SSH_HOST_FIELDS = {f for f in SshHost.__dataclass_fields__}
