"""Launch plans shared by backends. Building a plan never imports torch.

Backends call :func:`elastic_plan` from their ``aios_launch_plan`` hook to start one process per
device through PyTorch's elastic launcher (``torch.distributed.run``), adding their own env.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from aios.errors import LaunchError
from aios.types import HostPlan, LaunchPlan, LaunchRequest

if TYPE_CHECKING:  # pragma: no cover
    from aios.config import AiosConfig

from aios.contract import BACKEND_ENV, CONFIG_ENV  # noqa: E402,F401 - re-exported


def resolve_nprocs(config: AiosConfig, devices: int) -> int:
    """Processes per node: the configured number, or one per device (at least 1)."""
    if config.nprocs == "auto":
        return max(1, devices)
    if devices and config.nprocs > devices:
        raise LaunchError(
            f"--nprocs {config.nprocs} asks for more processes than the {devices} devices found",
            f"use --nprocs {devices} or fewer",
        )
    return int(config.nprocs)


def script_command(request: LaunchRequest, python: str | None = None) -> list[str]:
    python = getattr(request, "python", None) or python or sys.executable
    head = [python, "-m", request.script] if request.module else [python, request.script]
    return [*head, *request.args]


def elastic_plan(
    backend: str,
    config: AiosConfig,
    request: LaunchRequest,
    nprocs: int,
    env: dict[str, str] | None = None,
    python: str | None = None,
    notes: list[str] | None = None,
) -> LaunchPlan:
    """One host plan per host in ``request.hosts``: ``python -m torch.distributed.run`` with the
    node rank, rendezvous endpoint and restart budget from ``config``. With one process on one
    node and no restarts, the script runs directly (no launcher process). The interpreter is
    ``request.python`` (the hosts'), else ``python``, else this one."""
    python = getattr(request, "python", None) or python or sys.executable
    hosts = request.hosts
    nnodes = max(config.nnodes, len(hosts))
    world = nnodes * nprocs
    base_env = {BACKEND_ENV: backend, **(env or {})}
    plans: list[HostPlan] = []
    direct = nnodes == 1 and nprocs == 1 and config.launch.max_restarts == 0
    master = config.master_addr
    if len(hosts) > 1:
        master = hosts[0].internal_address or hosts[0].address
    for i, host in enumerate(hosts):
        node_rank = config.node_rank if len(hosts) == 1 else i
        if direct:
            cmd = script_command(request, python)
        else:
            cmd = [
                python, "-m", "torch.distributed.run",
                "--nnodes", str(nnodes),
                "--nproc-per-node", str(nprocs),
                "--max-restarts", str(config.launch.max_restarts),
                "--monitor-interval", str(config.launch.monitor_interval),
            ]
            if nnodes > 1 and config.launch.rdzv_backend == "c10d":
                cmd += [
                    "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{master}:{config.master_port}",
                    "--rdzv-id", config.launch.rdzv_id,
                ]
            else:
                cmd += [
                    "--node-rank", str(node_rank),
                    "--master-addr", master,
                    "--master-port", str(config.master_port),
                ]
            if config.launch.log_prefix and world > 1:
                cmd += ["--tee", "3"]
            cmd += ["-m", request.script] if request.module else [request.script]
            cmd += list(request.args)
        ranks = []
        for local in range(nprocs):
            rank = node_rank * nprocs + local
            ranks.append({
                "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": str(node_rank),
                "MASTER_ADDR": master, "MASTER_PORT": str(config.master_port),
            })
        plans.append(HostPlan(host=host, nprocs=nprocs, env=dict(base_env), command=cmd, ranks=ranks))
    return LaunchPlan(backend=backend, launcher="direct" if direct else "elastic", world_size=world, hosts=plans, notes=list(notes or []))
