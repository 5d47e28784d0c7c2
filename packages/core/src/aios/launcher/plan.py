"""Launch plans shared by backends. Building a plan never imports torch.

Backends call :func:`elastic_plan` from their ``BackendSpec.launch_plan`` to start one process per
device through PyTorch's elastic launcher (``torch.distributed.run``), adding their own env.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from aios.errors import LaunchError
from aios.ft import plan as ft_plan
from aios.types import HostPlan, LaunchPlan, LaunchRequest

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig

from aios.launcher.contract import BACKEND_ENV, CONFIG_ENV  # noqa: F401 - re-exported

#: torch's c10d rendezvous: a fresh store (and port) for the workers of every rendezvous round
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: Backends whose processes never use an autoloaded torch device extension: their workers (and
#: the elastic agent) start with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, so an installed TorchTPU
#: does not add its import (seconds, ~300 MB) to every ``import torch``. A value already in the
#: backend's env wins.
NO_AUTOLOAD_BACKENDS = ("cpu", "cuda")


#: intra-op threads of every rank (OpenMP, torch's CPU kernels); a value the user set wins
THREADS_ENV = "OMP_NUM_THREADS"


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (what a scheduler bound its task to:
    Slurm's task/affinity, a cgroup cpuset, taskset), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def rank_threads(nprocs: int, cpus: int | None = None) -> int:
    """Threads per rank: the CPUs this process may use (:func:`usable_cpus`) shared among the
    ``nprocs`` ranks it starts (at least 1)."""
    return max(1, (usable_cpus() if cpus is None else cpus) // max(1, nprocs))


def plans_here(request: LaunchRequest) -> bool:
    """A plan for this machine (aios-run's), not for remote hosts planned from here."""
    return request.accelerator is None and all(h.address == "localhost" for h in request.hosts)


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


def groups_command(
    config: AiosConfig,
    request: LaunchRequest,
    python: str,
    nnodes: int,
    node_rank: int,
    master: str,
    nprocs: int,
) -> list[str]:
    """A host's command under replica groups (:mod:`aios.ft`): aios-run starts the host's
    share of the groups; node 0's starts the lighthouse and the run's store on
    ``master:master_port``."""
    return [
        python,
        "-m",
        "aios.cli.run",
        *("--nnodes", str(nnodes), "--node-rank", str(node_rank)),
        *("--master-addr", master, "--master-port", str(config.master_port)),
        *("--nprocs", str(nprocs), f"ft.replica_groups={config.ft.replica_groups}"),
        *(["-m", request.script] if request.module else [request.script]),
        *request.args,
    ]


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
    if THREADS_ENV not in os.environ and plans_here(request):
        # every backend's ranks: this host's CPUs for this run (its affinity: a Slurm task bound
        # to its CPUs sees those), shared among its ranks; remote hosts count their own
        base_env.setdefault(THREADS_ENV, str(rank_threads(nprocs)))
    if backend in NO_AUTOLOAD_BACKENDS:
        base_env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    plans: list[HostPlan] = []
    direct = nnodes == 1 and nprocs == 1 and config.launch.max_restarts == 0
    master = config.master_addr
    if len(hosts) > 1:
        master = hosts[0].internal_address or hosts[0].address
    groups = int(config.ft.replica_groups)
    if groups > 1 and len(hosts) > 1:  # refused here, before any host starts, as aios-run does
        ft_plan.check(config, backend, world)
    for i, host in enumerate(hosts):
        node_rank = config.node_rank if len(hosts) == 1 else i
        if direct:
            cmd = script_command(request, python)
        elif groups > 1 and len(hosts) > 1:
            cmd = groups_command(config, request, python, nnodes, node_rank, master, nprocs)
        else:
            cmd = [
                python,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nnodes),
                "--nproc-per-node",
                str(nprocs),
                "--max-restarts",
                str(config.launch.max_restarts),
                "--monitor-interval",
                str(config.launch.monitor_interval),
            ]
            restarts = config.launch.max_restarts > 0
            if (nnodes > 1 or restarts) and config.launch.rdzv_backend == "c10d":
                # with restarts every attempt is a fresh rendezvous round whose workers get their
                # own store port (TORCH_DISABLE_SHARE_RDZV_TCP_STORE), never a stale one
                cmd += [
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"{master}:{config.master_port}",
                    "--rdzv-id",
                    config.launch.rdzv_id,
                ]
                if len(hosts) == 1:
                    # one node per aios-run (its rank given): node 0 alone hosts the rendezvous
                    # store, so a node started first on the same machine waits for it (the
                    # store's connect timeout) instead of taking node 0's port. Plans of several
                    # hosts leave it to torch (the host whose address is the endpoint hosts it)
                    cmd += ["--rdzv-conf", f"is_host={1 if node_rank == 0 else 0}"]
            else:
                cmd += [
                    "--node-rank",
                    str(node_rank),
                    "--master-addr",
                    master,
                    "--master-port",
                    str(config.master_port),
                ]
            if config.launch.log_prefix and world > 1:
                cmd += ["--tee", "3"]
            cmd += ["-m", request.script] if request.module else [request.script]
            cmd += list(request.args)
        ranks = []
        for local in range(nprocs):
            rank = node_rank * nprocs + local
            ranks.append(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(local),
                    "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(nprocs),
                    "GROUP_RANK": str(node_rank),
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(config.master_port),
                }
            )
        host_env = dict(base_env)
        if not direct and config.launch.max_restarts > 0 and config.launch.rdzv_backend == "c10d":
            host_env[FRESH_STORE_ENV] = "1"
        plans.append(HostPlan(host=host, nprocs=nprocs, env=host_env, command=cmd, ranks=ranks))
    plan_notes = list(notes or [])
    if not direct and config.launch.max_restarts > 0 and config.launch.rdzv_backend == "static":
        plan_notes.append(
            "launch.rdzv_backend=static keeps one store for every attempt, so restarted workers can"
            " read the previous attempt's addresses; the default c10d gives each attempt a fresh one"
        )
    return LaunchPlan(
        backend=backend,
        launcher="direct" if direct else "elastic",
        world_size=world,
        hosts=plans,
        notes=plan_notes,
    )
