"""Step semantics: the interface every strategy implements (built by a registered
:class:`aios.types.StrategySpec`'s ``factory``).

A :class:`Strategy` is built once per process at :func:`aios.init`; the runtime then calls its
methods directly on every step, with no plugin dispatch in between. Design notes for backends:

* CUDA / CPU (``DDPStrategy`` in :mod:`aios.strategies.ddp`): process group over NCCL/gloo,
  ``DistributedDataParallel``, ``no_sync`` during accumulation, ``DistributedSampler``.
* XLA / Neuron-on-XLA: no DDP wrapper; gradients all-reduced once in ``optimizer_step``
  (``xm.optimizer_step`` semantics), graph cut (``torch_xla.sync()``) at the step boundary,
  device loader with prefetch and fixed shapes, checkpoint tensors moved to CPU on the master.
* SPMD: one process, a mesh over all devices, inputs sharded on the batch axis.

Torch is imported lazily inside methods so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from aios.errors import AiosError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator
    from aios.strategies.precision import Precision

#: the checkpoint formats core knows (a plugin may register more through the
#: ``aios_register_checkpoint_formats`` hook; the name is what :attr:`Strategy.checkpoint_format`
#: returns): ``full`` = one state dict gathered on the saving rank, ``dcp`` = sharded
#: (torch.distributed.checkpoint), one file set per rank.
CheckpointFormatName = Literal["full", "dcp"] | str

#: the members of a strategy the runtime and the checkpoint manager read, by name (the contract
#: kit checks each; :class:`Strategy` declares each with its type)
RUNTIME_MEMBERS = (
    "name",
    "rank",
    "local_rank",
    "world_size",
    "node_rank",
    "device",
    "data_rank",
    "data_world",
    "checkpoint_format",
    "accelerator",
    "autocast_device_type",
)


class Strategy(ABC):
    """Placement, wrapping, reduction and stepping for one backend.

    Attributes every strategy sets in :meth:`setup_environment`: ``device`` (a ``torch.device``),
    ``rank``, ``local_rank``, ``world_size``, ``node_rank``.
    """

    name: ClassVar[str] = "base"
    #: torch device type used by ``torch.autocast`` on a NON-native backend ("xla"); native
    #: strategies take it from their :class:`aios.devices.accelerator.Accelerator` (one setting).
    autocast_device_type: str = "cpu"
    #: the checkpoint format the checkpoint manager writes for this strategy: ``full`` (one
    #: state dict gathered on the saving rank) or ``dcp`` (sharded, torch.distributed.checkpoint).
    checkpoint_format: CheckpointFormatName = "full"
    #: What a resume may change follows from the format: a resume must match the saved
    #: backend, strategy, format and world size, unless the format's
    #: ``CheckpointFormat.supports_resharding`` is true (``dcp``) and the run asks to reshard
    #: (``checkpoint.reshard`` / ``rt.resume(reshard=True)``); then the world size (and the
    #: strategy) may change and the data position is rescaled to the new :attr:`data_world`.
    #: the native accelerator this strategy runs on (``None`` for non-native stacks).
    accelerator: Accelerator | None = None

    def __init__(self, config: AiosConfig) -> None:
        self.config = config
        self.rank = 0
        self.local_rank = 0
        self.world_size = 1
        self.node_rank = 0
        self.device: Any = None

    # ---------------------------------------------------------------- process / device
    @abstractmethod
    def setup_environment(self) -> None:
        """Join the process group (if any) and pick this process's device."""

    def teardown(self) -> None:
        """Leave the process group and release resources. Default: nothing to release."""
        return None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """This process's index among the data-parallel replicas: the loader shard it reads.
        The rank, unless a model-parallel dimension makes several ranks share one batch."""
        return self.rank

    @property
    def fp16_speed(self) -> bool:
        """Whether this rank's device computes float16 faster than float32. False where its
        fast type is bfloat16 (TPU, Trainium, a CPU): the run names a float16 forward there.
        Default: the accelerator's ``supports_fp16`` (True without one)."""
        return self.accelerator.supports_fp16 if self.accelerator is not None else True

    @property
    def hardware(self) -> str:
        """What this rank computes on, for one-line messages (``the cuda accelerator``)."""
        if self.accelerator is not None:
            return f"the {self.accelerator.name} accelerator"
        return f"the {self.name} backend"

    @property
    def data_world(self) -> int:
        """The number of data-parallel replicas: ``global_batch = micro_batch x grad_accum x
        data_world`` (:func:`aios.runtime.derive_grad_accum`), and the world a checkpoint's data
        position is saved for."""
        return self.world_size

    @property
    def plain_step(self) -> bool:
        """Whether :meth:`optimizer_step` is a plain ``optimizer.step()`` (no reduction, graph
        cut or loss-scale handling of its own): the runtime then calls torch directly on its
        hot path when the precision's step is plain too. Default: no."""
        return False

    # ---------------------------------------------------------------- setup of user objects
    def configure(self, **options: Any) -> None:
        """Options passed to ``rt.setup(..., **options)`` before the objects are set up (the
        sharded strategies take ``wrap_policy`` and ``tp_plan``). Default: none accepted."""
        if options:
            raise AiosError(
                f"strategy {self.name} takes no setup options (got {', '.join(sorted(options))})",
                "drop them, or pick a strategy that uses them (fsdp, tp, hsdp)",
            )

    @abstractmethod
    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        """Move ``module`` to the device, apply ``precision.convert_module`` and wrap it for
        data parallelism. Return the module the script should call."""

    def adopts(self, module: torch.nn.Module) -> str | None:
        """The registered strategy that takes ``module`` as the script already parallelized it
        (its own ``fully_shard``, ``DTensor`` parameters) where this one cannot; ``None``: this
        strategy takes it. Under ``strategy=auto`` the runtime asks it of the first model and
        switches to the answer (one line says so). Default: ``None``."""
        return None

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Check or adapt the optimizer (e.g. refuse fused AdamW on XLA). Default: unchanged."""
        return optimizer

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:
        """Shard ``loader`` by rank and wrap it for the device (prefetch, fixed shapes).
        The returned object must support ``len()`` and ``set_epoch(epoch)`` when the input did."""
        return loader

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The user's module under any wrapper (for saving and for attribute access)."""
        return getattr(module, "module", module)

    # ---------------------------------------------------------------- the step
    def backward(
        self, loss: torch.Tensor, module: torch.nn.Module | None, precision: Precision
    ) -> None:
        precision.backward(loss)

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        """Skip gradient synchronisation for accumulation micro-steps (DDP ``no_sync``)."""
        yield

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """All-reduce gradients when the wrapper does not (XLA). Default: nothing to do."""
        return None

    @abstractmethod
    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
        """Reduce gradients as needed, step through ``precision`` (unscale, inf check) and
        return whether the step was taken (False when fp16 found inf/nan)."""

    def clip_grad_norm(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        precision: Precision,
    ) -> Any:
        import torch

        precision.unscale(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def mark_step(self) -> None:
        """Cut the lazy graph at a step boundary (XLA). Default: nothing."""
        return None

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        """Wait for every rank. Default (one process): nothing to wait for."""
        return None

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.unsqueeze(0)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj

    def any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is true on any rank (used to agree on preemption)."""
        return flag

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (the checkpoint manager agrees on
        a save's outcome with it). Default: the one object in a one-process run, else
        ``torch.distributed.all_gather_object`` over the default process group."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise AiosError(
                f"the {self.name} strategy cannot gather Python objects (no process group)",
                "implement Strategy.gather_object for this strategy",
            )
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    # ---------------------------------------------------------------- checkpoints
    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        """The full module state with tensors on CPU, valid on the saving rank."""
        return self.unwrap(module).state_dict()

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_module_state_dict(self, module: torch.nn.Module, state: dict[str, Any]) -> None:
        self.unwrap(module).load_state_dict(state)

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        module: torch.nn.Module | None = None,
    ) -> None:
        optimizer.load_state_dict(state)

    def saves_on_this_rank(self) -> bool:
        """Whether this rank writes the checkpoint files (rank 0 unless sharded).

        Contract: ``Runtime.save`` calls this exactly once on **every** rank at the start of
        each save, before the writing rank builds the state dicts, so a strategy with sharded
        state may do its collective work here (DeepSpeed ZeRO gathers its shards to rank 0)."""
        return self.is_main

    def rng_state(self) -> dict[str, Any]:
        """Device RNG state beyond torch's CPU generator (CUDA, XLA) for checkpoints."""
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned. Default: no device RNG state."""
        return None

    def seed(self, seed: int) -> None:
        """Seed the device RNG (CPU RNGs are seeded by the runtime)."""
        return None

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        """Backend metrics for the run's diagnostics JSON (compile counts, memory peaks)."""
        return {}

    def on_step_end(self, step: int) -> None:
        """Called after each optimizer step (compile guard, memory tracking). Default: nothing."""
        return None
