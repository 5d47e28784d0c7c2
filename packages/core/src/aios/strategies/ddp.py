"""``DDPStrategy``: one process per device, ``torch.distributed`` process group,
``DistributedDataParallel``, over ANY native :class:`aios.devices.accelerator.Accelerator` (``cpu`` over
gloo, ``cuda`` over NCCL, ``xpu``, ``neuron``, ...). The device specifics (which device, TF32,
NCCL environment, RNG, memory statistics) live in the accelerator; this module has no device
branches.

Stable surface for subclasses (``aios-backend-cuda``'s and the sharded strategies build on it):

* ``DDPStrategy(config, accelerator=None)`` (``None``: :class:`aios.devices.accelerator.CpuAccelerator`),
* ``accelerator``, ``device_type`` and ``dist_backend`` (the accelerator's),
* ``cluster`` (:class:`aios.environments.base.ClusterInfo` from :func:`aios.environments.base.detect`; ranks and the
  node rank come from it and nowhere else),
* ``select_device() -> torch.device`` (the accelerator's device for ``local_rank``, made current),
* ``init_process_group()`` (called by ``setup_environment`` when ``world_size > 1`` and no group
  exists yet; an existing group, e.g. created by the script itself, is reused),
* ``wrap_module(module) -> module`` (``DistributedDataParallel(module, **ddp_kwargs)``),
* ``ddp_kwargs`` (dict, passed to ``DistributedDataParallel``),
* ``process_group_timeout`` (seconds, default 1800),
* ``collective_device`` (device for tensors used in object/flag collectives).

A single process (``WORLD_SIZE`` unset or 1) creates no process group and no DDP wrapper; every
collective is then the identity. Data are sharded with
:func:`aios.data.loaders.shard_dataloader` (a ``DistributedSampler`` whose order depends only on the seed
and epoch, resumable mid-epoch) and batches are moved to the device by
:class:`aios.data.loaders.DeviceLoader`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aios.data.loaders import DeviceLoader, shard_dataloader
from aios.devices.accelerator import CpuAccelerator
from aios.environments.base import detect
from aios.errors import AiosError, ConfigError
from aios.launcher.gloo import wait_for_idle_workers
from aios.plugins.registry import get_registry
from aios.strategies.base import Strategy

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator
    from aios.environments.base import ClusterInfo
    from aios.strategies.precision import Precision

_REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
#: torch's switch for a barrier at the end of ``init_process_group`` (off by default)
INIT_BARRIER_ENV = "TORCH_DIST_INIT_BARRIER"
_EXIT_HOOK = False
_OWNS_GROUP = False


def _at_exit() -> None:
    """Run once at interpreter exit, while Python is still whole (the runtime's own exit handler,
    registered later, has already closed it): let gloo's worker threads finish and park (see
    :mod:`aios.launcher.gloo`; a worker still holding a collective when finalization begins aborts the
    process), then destroy the default group when aios created it."""
    try:
        wait_for_idle_workers()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    if not _OWNS_GROUP:
        return
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


def register_exit_hook(owns_group: bool) -> None:
    """Install :func:`_at_exit` once per process; ``owns_group``: aios created the default group
    and destroys it at exit (a group the script made is left to the script)."""
    global _EXIT_HOOK, _OWNS_GROUP
    _OWNS_GROUP = _OWNS_GROUP or owns_group
    if not _EXIT_HOOK:
        import atexit

        atexit.register(_at_exit)
        _EXIT_HOOK = True


def parallelized(module: Any) -> str | None:
    """How the script already parallelized ``module``: ``"fully_shard"`` (an ``FSDPModule``),
    ``"dtensor"`` (``DTensor`` parameters: ``parallelize_module`` or ``distribute_tensor``), or
    ``None``."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(module, FSDPModule):
        return "fully_shard"
    if any(isinstance(p, DTensor) for p in module.parameters()):
        return "dtensor"
    return None


class DDPStrategy(Strategy):
    """Data parallel over ``torch.distributed`` on a native accelerator:
    ``DDPStrategy(config, accelerator=...)`` (the CPU accelerator when none is given)."""

    name = "ddp"
    #: always set: the native strategies run on an accelerator (cpu when none is given)
    accelerator: Accelerator

    def __init__(self, config: AiosConfig, accelerator: Accelerator | None = None) -> None:
        super().__init__(config)
        if accelerator is None:
            accelerator = CpuAccelerator(config)
        self.accelerator = accelerator
        self.device_type = accelerator.device_type
        self.dist_backend = accelerator.dist_backend
        self.autocast_device_type = accelerator.device_type
        self.cluster: ClusterInfo | None = None
        self.ddp_kwargs: dict[str, Any] = {}
        self.process_group_timeout = 1800.0
        self.collective_device: Any = None
        self._owns_group = False
        self._dist: Any = None  # torch.distributed when a group is in use

    # ---------------------------------------------------------------- process / device
    def select_device(self) -> Any:
        device = self.accelerator.device(self.local_rank)
        self.accelerator.set_device(device)
        return device

    def init_process_group(self) -> None:
        import torch.distributed as dist

        kwargs: dict[str, Any] = dict(
            backend=self.dist_backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.process_group_timeout),
        )
        if self.accelerator.collectives_on_device and self.device is not None:
            kwargs["device_id"] = self.device
        # torch's store-based barrier after the group is made: no rank returns from init before
        # every rank's group is connected. Without it a rank that ends soon after init (a script
        # that only prints its rank) closes its sockets while a slower rank's gloo is still
        # connecting to it ("Gloo connectFullMesh failed ... Connection closed by peer"). The
        # script's own setting wins; subgroups made later are not affected.
        ours = INIT_BARRIER_ENV not in os.environ
        if ours:
            os.environ[INIT_BARRIER_ENV] = "1"
        try:
            dist.init_process_group(**kwargs)
        finally:
            if ours:
                del os.environ[INIT_BARRIER_ENV]
        self._owns_group = True
        register_exit_hook(owns_group=True)

    def setup_environment(self) -> None:
        import torch.distributed as dist

        self.cluster = info = detect(None, get_registry())
        self.rank = info.rank or 0
        self.world_size = info.world_size or 1
        self.local_rank = info.local_rank if info.local_rank is not None else self.rank
        self.node_rank = info.node_rank
        self.accelerator.setup()
        self.device = self.select_device()
        if self.world_size > 1:
            if not dist.is_available():  # pragma: no cover - torch built without distributed
                raise AiosError(
                    "this torch build has no torch.distributed",
                    "install a torch build with distributed support",
                )
            if not dist.is_initialized():
                self.init_process_group()
            else:
                self._check_own_group(dist)
                self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
                register_exit_hook(owns_group=False)  # the script's group: drained, not destroyed
            self._dist = dist
        if self.collective_device is None:
            self.collective_device = self.device if self.accelerator.collectives_on_device else None

    def _check_own_group(self, dist: Any) -> None:
        """A group the script created itself must be the launcher's: the same ranks and size.
        A script that passes its own ``--world-size`` (default 1) or ``--rank`` makes N copies
        that each train alone on the same files."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if (world, rank) != (self.world_size, self.rank):
            raise ConfigError(
                f"the script's own process group has rank {rank} of {world}, but the launcher "
                f"started this process as rank {self.rank} of {self.world_size}: the copies do "
                "not train together",
                "let aios.init() create the group (drop the script's init_process_group), or "
                "pass it rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE'])",
            )

    def teardown(self) -> None:
        """Stop using the process group. The default group itself stays up until the process
        exits (destroyed by an exit handler): re-creating it in the same process under
        torchelastic's agent store reuses stale rendezvous keys and hangs, so a second
        ``aios.init()`` in the process reuses the group instead."""
        self._dist = None

    # ---------------------------------------------------------------- setup of user objects
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if not any(p.requires_grad for p in module.parameters()):
            return module
        ids = (
            [self.device.index]
            if self.accelerator.collectives_on_device
            and self.device is not None
            and self.device.index is not None
            else None
        )
        return _forwarding_ddp()(module, device_ids=ids, **self.ddp_kwargs)

    def adopts(self, module: torch.nn.Module) -> str | None:
        """A model the script sharded itself goes to ``fsdp``, which keeps its sharding."""
        return "fsdp" if self.world_size > 1 and parallelized(module) is not None else None

    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        if self.world_size > 1:
            own = parallelized(module)
            if own is not None:
                how = "with fully_shard" if own == "fully_shard" else "into DTensors"
                raise ConfigError(
                    f"the script already sharded the model {how}; strategy {self.name} "
                    "replicates whole models and cannot combine with it",
                    "run with strategy=fsdp: aios keeps the script's sharding and saves it "
                    "with DCP (aios-run strategy=fsdp ...)",
                )
        module = precision.convert_module(module.to(self.device))
        if self.world_size > 1:
            module = self.wrap_module(module)
        return module

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:
        if isinstance(loader, DeviceLoader):
            return loader
        seed = self.config.seed if self.config.seed is not None else 0
        sharded = shard_dataloader(loader, self.data_rank, self.data_world, seed, shuffle)
        return DeviceLoader(
            sharded,
            self.device,
            non_blocking=self.accelerator.non_blocking_copies,
            seed=seed,
            rank=self.rank,
            world=self.data_world,
        )

    @property
    def data_rank(self) -> int:
        """This process's index among data-parallel replicas (the rank, unless a model-parallel
        dimension makes several ranks share one batch)."""
        return self.rank

    @property
    def data_world(self) -> int:
        return self.world_size

    # ---------------------------------------------------------------- the step
    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        if enabled and hasattr(module, "no_sync") and self.world_size > 1:
            with module.no_sync():  # type: ignore[operator]  # DDP's, checked by hasattr
                yield
        else:
            yield

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
        return precision.step(optimizer)

    @property
    def plain_step(self) -> bool:
        """Plain unless a subclass steps its own way."""
        return type(self).optimizer_step is DDPStrategy.optimizer_step

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        if self._dist is not None:
            if (
                self.accelerator.collectives_on_device
                and self.device is not None
                and self.device.index is not None
            ):
                self._dist.barrier(device_ids=[self.device.index])
            else:
                self._dist.barrier()

    def _op(self, op: str) -> Any:
        ReduceOp = self._dist.ReduceOp  # noqa: N806
        return {
            "sum": ReduceOp.SUM,
            "mean": ReduceOp.SUM,
            "max": ReduceOp.MAX,
            "min": ReduceOp.MIN,
            "prod": ReduceOp.PRODUCT,
        }[op]

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """A reduced copy of ``tensor`` (``sum``, ``mean``, ``max``, ``min``, ``prod``); the input
        is left unchanged."""
        if op not in _REDUCE_OPS:
            raise AiosError(f"unknown reduce op {op!r}", f"use one of: {', '.join(_REDUCE_OPS)}")
        if self._dist is None:
            return tensor.detach().clone()
        out = tensor.detach().clone()
        if op == "mean" and not out.is_floating_point():
            out = out.float()
        self._dist.all_reduce(out, op=self._op(op))
        if op == "mean":
            out /= self.world_size
        return out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[world_size, *tensor.shape]`` (same shape on every rank)."""
        if self._dist is None:
            return tensor.detach().unsqueeze(0).clone()
        import torch

        t = tensor.detach().contiguous()
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        self._dist.all_gather(out, t)
        return torch.stack(out)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self._dist is None:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=src, device=self.collective_device)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, on every rank."""
        if self._dist is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def any_rank(self, flag: bool) -> bool:
        if self._dist is None:
            return bool(flag)
        import torch

        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.collective_device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return bool(t.item())

    # ---------------------------------------------------------------- checkpoints
    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        return _to_cpu(self.unwrap(module).state_dict())

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        return _to_cpu(optimizer.state_dict())

    def rng_state(self) -> dict[str, Any]:
        return self.accelerator.rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.accelerator.set_rng_state(state)

    def seed(self, seed: int) -> None:
        self.accelerator.manual_seed(seed)

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.name,
            "dist_backend": self.dist_backend if self._dist is not None else None,
            "world_size": self.world_size,
            "device": str(self.device),
            "accelerator": self.accelerator.name,
            "cluster": self.cluster.name if self.cluster is not None else None,
        }
        out.update(self.accelerator.memory_stats())
        return out


_FORWARDING: type | None = None


def _forwarding_ddp() -> type:
    """``DistributedDataParallel`` that forwards unknown attributes to the wrapped module, so
    ``model.generate(...)`` or ``model.config`` work the same with one process and with many
    (no extra cost on ``forward``)."""
    global _FORWARDING
    if _FORWARDING is None:
        from torch.nn.parallel import DistributedDataParallel

        class AiosDDP(DistributedDataParallel):
            def __getattr__(self, name: str) -> Any:
                try:
                    return super().__getattr__(name)
                except AttributeError:
                    module = super().__getattr__("module")
                    return getattr(module, name)

        _FORWARDING = AiosDDP
    return _FORWARDING


def _to_cpu(obj: Any) -> Any:
    if hasattr(obj, "device") and hasattr(obj, "cpu"):
        if obj.device.type == "cpu":
            return obj
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
