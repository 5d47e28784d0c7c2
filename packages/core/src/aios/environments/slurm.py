"""The Slurm cluster environment: ``srun aios-run train.py`` inside an allocation.

Read from the variables ``srun`` sets for every task of a job step (``man srun``, section
OUTPUT ENVIRONMENT VARIABLES): ``SLURM_PROCID`` (global task rank), ``SLURM_NODEID`` (node index
in the step), ``SLURM_LOCALID`` (task index on its node), ``SLURM_STEP_NUM_NODES`` /
``SLURM_NNODES``, ``SLURM_STEP_NUM_TASKS`` / ``SLURM_NTASKS``, ``SLURM_STEP_TASKS_PER_NODE`` /
``SLURM_TASKS_PER_NODE`` (``2(x3),1``), ``SLURM_NTASKS_PER_NODE`` and ``SLURM_STEP_NODELIST`` /
``SLURM_JOB_NODELIST`` (a compressed hostlist, expanded by :func:`expand_hostlist` as Slurm
does: ranges, zero padding, several bracket groups, commas).

* One task per node (``srun --ntasks-per-node=1 aios-run ...``): aios-run starts the node's
  processes itself; node rank = ``SLURM_NODEID``, nodes = the step's node count.
* Several tasks per node (``srun --ntasks-per-node=4 aios-run ...``): Slurm already started one
  process per rank; :class:`~aios.environments.base.ClusterInfo` carries ``rank``/``world_size``/
  ``local_rank``/``local_world_size`` and aios-run runs the script directly as that rank.
* The master address is ``MASTER_ADDR`` when set (aios's sbatch scripts export the first node's
  ``NodeAddr``), else the first host of the node list; the port is ``MASTER_PORT`` when set, else
  derived from the job id (``15000 + job_id % 20000``) so two jobs sharing a node do not collide.
* The batch script of a multi-node allocation (no ``SLURM_STEP_ID``: only the first node runs
  it) is an error naming the fix (start it with ``srun``), never a silent single-node run.

Cheap: environment only, no subprocess, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aios.environments.base import ClusterEnvironment, ClusterInfo
from aios.errors import ConfigError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_brackets(pattern: str) -> list[str]:
    """``rack[1-2]-n[01-02]`` -> ``rack1-n01 rack1-n02 rack2-n01 rack2-n02`` (left group outer)."""
    start = pattern.find("[")
    if start < 0:
        if "]" in pattern:
            raise ConfigError(
                f"Slurm host list {pattern!r} has an unmatched ']'", "check SLURM_JOB_NODELIST"
            )
        return [pattern]
    end = pattern.find("]", start)
    if end < 0:
        raise ConfigError(
            f"Slurm host list {pattern!r} has an unmatched '['", "check SLURM_JOB_NODELIST"
        )
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    values: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ConfigError(
                f"Slurm host list {pattern!r}: '{part}' is not a number or a range",
                "check SLURM_JOB_NODELIST",
            )
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            values.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(
                f"Slurm host list {pattern!r}: range {part} goes backwards",
                "check SLURM_JOB_NODELIST",
            )
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        values.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    rest = _expand_brackets(tail)
    return [f"{head}{v}{r}" for v in values for r in rest]


def _split_top(hostlist: str) -> list[str]:
    """Split on the commas that are outside brackets."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in hostlist:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm compressed host list as ``scontrol show hostnames`` does:
    ``node[01-03,7],gpu-a[1-2]-b[1-2],login`` -> ``node01 node02 node03 node07 gpu-a1-b1
    gpu-a1-b2 gpu-a2-b1 gpu-a2-b2 login``. Zero padding is kept from the range's start."""
    hosts: list[str] = []
    for item in _split_top(hostlist):
        hosts.extend(_expand_brackets(item))
    return hosts


def expand_tasks_per_node(spec: str) -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]`` (the ``SLURM_TASKS_PER_NODE`` format)."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part)
        if not m:
            raise ConfigError(
                f"Slurm tasks-per-node {spec!r} is not in the N(xM),... format",
                "check SLURM_TASKS_PER_NODE",
            )
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for n in names:
        v = environ.get(n)
        if v not in (None, ""):
            try:
                return int(str(v))
            except ValueError:
                raise ConfigError(
                    f"environment variable {n}={v!r} is not an integer",
                    f"unset {n} or fix the Slurm job",
                ) from None
    return None


class SlurmEnvironment(ClusterEnvironment):
    """A task of a Slurm job step (``srun``), or the batch script of a one-node allocation."""

    name = "slurm"
    priority = 50  # below torchelastic (100): torchrun inside srun is the inner launcher

    def detect(self, environ: Mapping[str, str]) -> bool:
        return (
            bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))
            and "SLURM_PROCID" in environ
        )

    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        in_step = "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ
        nodelist = (
            environ.get("SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST")
            or environ.get("SLURM_JOB_NODELIST")
            or environ.get("SLURM_NODELIST")
            or ""
        )
        hosts = tuple(expand_hostlist(nodelist)) if nodelist else ()
        nnodes = (
            (_int(environ, "SLURM_STEP_NUM_NODES") if in_step else None)
            or _int(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
            or max(1, len(hosts))
        )
        if hosts and len(hosts) != nnodes:
            raise ConfigError(
                f"Slurm node list {nodelist!r} has {len(hosts)} hosts but the step has {nnodes} nodes",
                "check SLURM_JOB_NODELIST / SLURM_NNODES",
            )
        job_id = _int(environ, "SLURM_JOB_ID", "SLURM_JOBID") or 0
        port = _int(environ, "MASTER_PORT")
        if port is None:
            port = 15000 + job_id % 20000
        master = environ.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
        if not in_step:
            if nnodes > 1:
                raise ConfigError(
                    f"aios-run is running in the batch script of a {nnodes}-node Slurm "
                    "allocation, on its first node only",
                    "start it on every node: srun --ntasks-per-node=1 aios-run ...",
                )
            return ClusterInfo(
                name=self.name,
                nnodes=1,
                node_rank=0,
                master_addr=master,
                master_port=port,
                hosts=hosts[:1],
            )
        node = _int(environ, "SLURM_NODEID") or 0
        rank = _int(environ, "SLURM_PROCID") or 0
        ntasks = (
            (_int(environ, "SLURM_STEP_NUM_TASKS") if in_step else None)
            or _int(environ, "SLURM_NTASKS", "SLURM_NPROCS")
            or nnodes
        )
        per_node_spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get(
            "SLURM_TASKS_PER_NODE"
        )
        per_node = expand_tasks_per_node(per_node_spec) if per_node_spec else []
        if per_node and len(per_node) == nnodes:
            local_world = per_node[node]
        else:
            local_world = _int(environ, "SLURM_NTASKS_PER_NODE") or max(1, ntasks // nnodes)
        if node >= nnodes:
            raise ConfigError(
                f"SLURM_NODEID={node} is outside the step's {nnodes} nodes",
                "check the Slurm job environment",
            )
        if ntasks == nnodes and local_world == 1:
            # one task per node: aios-run starts this node's processes
            return ClusterInfo(
                name=self.name,
                nnodes=nnodes,
                node_rank=node,
                master_addr=master,
                master_port=port,
                hosts=hosts,
            )
        local = _int(environ, "SLURM_LOCALID") or 0
        return ClusterInfo(
            name=self.name,
            nnodes=nnodes,
            node_rank=node,
            master_addr=master,
            master_port=port,
            hosts=hosts,
            rank=rank,
            world_size=ntasks,
            local_rank=local,
            local_world_size=local_world,
        )


__all__ = ["SlurmEnvironment", "expand_hostlist", "expand_tasks_per_node"]
