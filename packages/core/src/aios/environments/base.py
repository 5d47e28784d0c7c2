"""The cluster-environment seam: where this process sits in a job (nodes, node rank, master).

A :class:`ClusterEnvironment` reads the environment a scheduler or launcher set (torchelastic's
``RANK``/``GROUP_RANK``, Slurm's ``SLURM_*``, Kubernetes' ``JOB_COMPLETION_INDEX``, ...) and
answers a :class:`ClusterInfo`. Environments are registered through
:func:`aios.plugins.hookspecs.aios_register_cluster_environments` (each instance carries its ``name`` and
``priority``); :func:`detect` returns the highest-priority environment that recognises the
process's environment, else ``local``. Node rank is derived here and nowhere else.

Cheap: no torch import, no network.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aios.errors import ConfigError
from aios.launcher.contract import NNODES_ENV, NODE_RANK_ENV


@dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits. ``rank``/``world_size``/``local_rank``/``local_world_size`` are
    set when something already started one process per rank (torchelastic, ``srun`` with
    several tasks per node); ``None`` when aios-run still has to start them."""

    name: str
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int | None
    hosts: tuple[str, ...] = ()
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None


class ClusterEnvironment(ABC):
    """One kind of cluster environment; stateless. ``detect`` must be cheap (env only).

    :attr:`name` is what ``ClusterInfo.name`` and ``aios env`` show; the registry sets
    :attr:`plugin` to the registering plugin; :func:`detect` tries environments by descending
    :attr:`priority`."""

    name: str = "local"
    priority: int = 0
    plugin: str = ""

    @abstractmethod
    def detect(self, environ: Mapping[str, str]) -> bool:
        """Whether ``environ`` is this environment's (cheap: read the mapping only)."""

    @abstractmethod
    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        """Where this process sits, read from ``environ`` (called only after :meth:`detect`)."""


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for n in names:
        v = environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ConfigError(
                    f"environment variable {n}={v!r} is not an integer",
                    f"unset {n} or set it to a number",
                ) from None
    return default


class LocalEnvironment(ClusterEnvironment):
    """No scheduler: plain ``python train.py``, or a worker of a launcher that is not
    torchelastic (``torch_xla.launch``), whose host plan sets ``AIOS_RUN_NODE_RANK`` /
    ``AIOS_RUN_NNODES``."""

    name = "local"
    priority = 0

    def detect(self, environ: Mapping[str, str]) -> bool:
        return True

    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        return ClusterInfo(
            name=self.name,
            nnodes=_int(environ, NNODES_ENV, default=1) or 1,
            node_rank=_int(environ, NODE_RANK_ENV, default=0) or 0,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(environ, "MASTER_PORT"),
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
        )


class TorchElasticEnvironment(ClusterEnvironment):
    """A worker started by ``torch.distributed.run`` (torchrun / aios-run's elastic launcher):
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node rank),
    ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``."""

    name = "torchelastic"
    priority = 100

    def detect(self, environ: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)

    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        world = _int(environ, "WORLD_SIZE", default=1) or 1
        rank = _int(environ, "RANK", default=0) or 0
        local = _int(environ, "LOCAL_RANK", default=rank) or 0
        local_world = _int(environ, "LOCAL_WORLD_SIZE", default=None)
        node = _int(environ, "GROUP_RANK", "NODE_RANK", default=0) or 0
        nnodes = _int(environ, "GROUP_WORLD_SIZE", default=None)
        if nnodes is None:
            nnodes = max(1, world // local_world) if local_world else 1
        return ClusterInfo(
            name=self.name,
            nnodes=nnodes,
            node_rank=node,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(environ, "MASTER_PORT"),
            rank=rank,
            world_size=world,
            local_rank=local,
            local_world_size=local_world,
        )


BUILTIN_ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (
    LocalEnvironment(),
    TorchElasticEnvironment(),
)


class EnvironmentSource(Protocol):
    """What :func:`detect` reads from the plugin registry (``aios.plugins.registry.Registry``
    is one): the registered environments by name. Declared here so that this seam sits below
    the registry, which imports it."""

    @property
    def cluster_envs(self) -> Mapping[str, ClusterEnvironment]: ...


def detect(environ: Mapping[str, str] | None, registry: EnvironmentSource) -> ClusterInfo:
    """The :class:`ClusterInfo` of the highest-priority environment registered in ``registry``
    that detects ``environ`` (``None``: ``os.environ``), else ``local``. The caller gives the
    registry (``aios.plugins.registry.get_registry()`` in a process that loaded the plugins)."""
    env = os.environ if environ is None else environ
    envs: Iterable[ClusterEnvironment]
    envs = list(registry.cluster_envs.values()) or list(BUILTIN_ENVIRONMENTS)
    for ce in sorted(envs, key=lambda e: (-e.priority, e.name)):
        if ce.name != "local" and ce.detect(env):
            return ce.info(env)
    return LocalEnvironment().info(env)
