"""Where a process stands in its run, as its strategy and replica group answer it: device,
ranks, the device mesh, the data- and tensor-parallel indices and the replica groups
(``rt.rank``, ``rt.dp_rank``, ``rt.mesh``, ``rt.replica_group``, ...), and the collectives
over its peers (``rt.all_reduce``, ``rt.broadcast``, ...).
:class:`aios.runtime.Runtime` is one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aios.errors import AiosError
from aios.strategies.base import Strategy
from aios.strategies.fsdp import FSDPStrategy

if TYPE_CHECKING:
    import torch

    from aios.ft.replica import Replica


class Ranks:
    """The placement answers and the collectives of a process with a ``strategy`` and (under
    ``ft.replica_groups``) a ``replica``."""

    strategy: Strategy
    #: this rank's replica group under ``ft.replica_groups`` (:mod:`aios.ft.replica`)
    replica: Replica | None

    @property
    def device(self) -> torch.device:
        return self.strategy.device

    @property
    def rank(self) -> int:
        return self.strategy.rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_main(self) -> bool:
        return self.strategy.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.strategy.local_rank == 0

    @property
    def mesh(self) -> Any:
        """The device mesh of the sharded strategies (``fsdp``, ``tp``, ``hsdp``): a
        ``torch.distributed.device_mesh.DeviceMesh`` with dimensions ``("dp",)``, ``("dp",
        "tp")`` (``mesh.tp=N``) or ``("replicate", "shard")``. A script that parallelizes its
        own model does it on this mesh (``parallelize_module(block, rt.mesh["tp"], plan)``) and
        seeds its inputs by :attr:`dp_rank`. Other strategies have none (an error says so)."""
        if not isinstance(self.strategy, FSDPStrategy) or self.strategy.mesh is None:
            raise AiosError(
                f"strategy {self.strategy.name} has no device mesh (rt.mesh)",
                "run with strategy=fsdp (mesh.tp=N for a 'tp' dimension), tp or hsdp",
            )
        return self.strategy.mesh

    @property
    def dp_rank(self) -> int:
        """This process's index among the data-parallel replicas (ranks of one tensor-parallel
        group share it and must read the same batch): the strategy's ``data_rank``."""
        return self.strategy.data_rank

    @property
    def dp_size(self) -> int:
        """The number of data-parallel replicas (the world size without tensor parallelism): the
        strategy's ``data_world``."""
        return self.strategy.data_world

    @property
    def tp_rank(self) -> int:
        """This process's index in its tensor-parallel group (0 without one)."""
        st = self.strategy
        if isinstance(st, FSDPStrategy) and st.tp_size > 1:
            return int(st.mesh["tp"].get_local_rank())
        return 0

    @property
    def tp_size(self) -> int:
        """Ranks per tensor-parallel group (``mesh.tp``; 1 without tensor parallelism)."""
        return self.strategy.tp_size if isinstance(self.strategy, FSDPStrategy) else 1

    @property
    def replica_group(self) -> int:
        """This process's replica group (0 to ``replica_groups - 1``; 0 without
        ``ft.replica_groups``)."""
        return self.replica.group if self.replica is not None else 0

    @property
    def replica_groups(self) -> int:
        """The replica groups of the run (``ft.replica_groups``; 1 without it)."""
        return self.replica.groups if self.replica is not None else 1

    @property
    def replica_participants(self) -> int:
        """The replica groups in this step's quorum, whose gradients the step averages (a group
        that is healing is not one of them for its first step)."""
        return self.replica.participants if self.replica is not None else 1

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        self.strategy.barrier()

    def all_reduce(self, value: torch.Tensor | float, op: str = "mean") -> torch.Tensor:
        """Reduce a tensor (or a Python number) over ranks; returns a new tensor."""
        import torch

        if not isinstance(value, torch.Tensor):
            value = torch.tensor(
                value, dtype=torch.float64 if isinstance(value, float) else None, device=self.device
            )
        return self.strategy.all_reduce(value, op)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.strategy.all_gather(tensor)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.strategy.broadcast_object(obj, src)

    def gather_object(self, obj: Any) -> list[Any]:
        return self.strategy.gather_object(obj)
