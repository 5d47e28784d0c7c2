"""The native sharded strategies: FSDP2, tensor parallel on a 2-D mesh, HSDP. Any accelerator.

* ``fsdp`` (:class:`FSDPStrategy`): ``torch.distributed.fsdp.fully_shard`` per block, then on the
  root. Blocks are the modules whose class name is in ``fsdp.wrap`` (``fsdp.wrap=[Block]``), or
  those a callable passed as ``rt.setup(..., wrap_policy=fn)`` accepts; with neither, the members
  of every top-level ``nn.ModuleList`` / ``nn.Sequential`` (the transformer-block convention).
  Parameters become ``DTensor`` shards (about 1/N of each weight per rank). With ``mesh.tp > 1``
  the mesh is 2-D (``dp`` x ``tp``): the tensor-parallel plan is applied first, then FSDP over
  ``dp``.
* ``tp`` (:class:`TPStrategy`): DTensor ``parallelize_module`` with a user plan on the ``tp``
  dimension (``mesh.tp``; all ranks when unset), FSDP over ``dp`` when ``dp > 1``.
* ``hsdp`` (:class:`HSDPStrategy`): a (``replicate``, ``shard``) mesh, replicated across nodes
  (``mesh.replicate``, default one group per node) and sharded within.

The plan: ``rt.setup(model, opt, tp_plan=plan)`` or ``mesh.tp_plan="module:attribute"`` (the
attribute a ``{module path: ParallelStyle}`` dict or ``fn(model, tp_mesh) -> dict``; module
``__main__`` is the training script).

Precision comes from the aios precision as an FSDP ``MixedPrecisionPolicy`` (``bf16-mixed``:
parameters in bfloat16 for compute, gradients reduced in float32; no autocast needed), CPU offload
from ``fsdp.cpu_offload`` (``CPUOffloadPolicy``), activation checkpointing and ``torch.compile``
per block from ``fsdp.activation_checkpointing`` / ``fsdp.compile``. Gradient accumulation
micro-steps run with gradient sync and post-backward resharding off
(``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``); the last
micro-step reduces once. Clipping computes the total norm over every shard (per mesh, then
combined). ``checkpoint_format = "dcp"``; the strategy's ``module_state_dict`` /
``optimizer_state_dict`` also gather a full state on the saving rank
(``get_model_state_dict(..., full_state_dict=True, cpu_offload=True)``) so the ``full`` format
keeps working. Torch is imported inside methods.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from aios.errors import AiosError, ConfigError
from aios.strategies.ddp import DDPStrategy, parallelized, register_exit_hook
from aios.strategies.precision import Precision, TruePrecision

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch.distributed.fsdp import FSDPModule

    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator


# ------------------------------------------------------------------------------ precision


class ShardedPrecision(Precision):
    """Mixed precision carried by FSDP's ``MixedPrecisionPolicy``: parameters are cast for the
    forward/backward by FSDP itself, so ``autocast()`` is a no-op."""

    def __init__(
        self, name: str, device_type: str, param_dtype: str | None, reduce_dtype: str | None
    ) -> None:
        super().__init__(device_type)
        self.name = name
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype


def sharded_precision(precision: str, config: Any, accelerator: Accelerator | None) -> Precision:
    """The precision policy of the sharded strategies (``StrategySpec.precision``)."""
    device_type = accelerator.device_type if accelerator is not None else "cpu"
    fsdp = config.fsdp
    if precision == "fp32":
        return ShardedPrecision("fp32", device_type, None, None)
    if precision == "bf16-mixed":
        reduce = "float32" if fsdp.reduce_dtype == "auto" else fsdp.reduce_dtype
        return ShardedPrecision(
            "bf16-mixed",
            device_type,
            accelerator.autocast_dtype if accelerator is not None else "bfloat16",
            reduce,
        )
    if precision == "bf16-true":
        return TruePrecision(device_type)
    raise ConfigError(
        f"precision '{precision}' is not supported with strategy '{config.strategy}'",
        "use precision=bf16-mixed (FSDP keeps fp32 shards, computes in bf16) or fp32",
    )


# ------------------------------------------------------------------------------ helpers


def load_object(ref: str, what: str) -> Any:
    """``module:attribute`` (``__main__`` = the running script)."""
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise ConfigError(
            f"{what} {ref!r} is not 'module:attribute'", f"write {what} as e.g. mymodel:TP_PLAN"
        )
    try:
        module = (
            sys.modules["__main__"] if mod_name == "__main__" else importlib.import_module(mod_name)
        )
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{what} {ref!r} cannot be loaded ({type(exc).__name__}: {exc})",
            "name an importable module and an attribute it defines",
        ) from None
    return obj


def default_blocks(model: Any) -> list[Any]:
    """The members (with parameters) of every outermost ``nn.ModuleList``/``nn.Sequential``
    below the root."""
    import torch.nn as nn

    out: list[Any] = []

    def walk(m: Any) -> None:
        for child in m.children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)):
                out.extend(c for c in child.children() if any(True for _ in c.parameters()))
            else:
                walk(child)

    walk(model)
    return out


def _broadcast_tensors(tensors: list[Any], dist: Any, src: int) -> None:
    """Every rank's ``tensors`` become rank ``src``'s, one broadcast per (dtype, device)."""
    import torch

    by_dtype: dict[Any, list[Any]] = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for group in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            wire = flat.to(torch.uint8) if flat.dtype == torch.bool else flat  # gloo has no bool
            dist.broadcast(wire, src=src)
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(wire[offset : offset + n].view_as(t))
                offset += n


def broadcast_module_states(module: Any, dist: Any, src: int = 0) -> None:
    """Make every materialized parameter and buffer of ``module`` equal to rank ``src``'s (as
    ``DistributedDataParallel`` does at construction), one broadcast per dtype. Tensors on the
    ``meta`` device are left alone: a model built on ``meta`` is initialised after sharding."""
    from torch.distributed.tensor import DTensor

    tensors = [
        t
        for t in (*module.parameters(), *module.buffers())
        if not t.is_meta and not isinstance(t, DTensor)
    ]
    _broadcast_tensors(tensors, dist, src)


def broadcast_buffers(modules: list[Any], dist: Any, src: int = 0) -> None:
    """Every rank's buffers (BatchNorm running statistics, counters) become rank ``src``'s: the
    rule of ``DistributedDataParallel(broadcast_buffers=True)``, whose rank 0 buffers are the
    model's. Buffers are plain tensors under FSDP2 and tensor parallelism, so each rank would
    otherwise keep statistics of its own data and a checkpoint whichever rank DCP picked. One
    broadcast per dtype; nothing when there are no buffers."""
    from torch.distributed.tensor import DTensor

    tensors = [
        t
        for m in modules
        for t in m.buffers()
        if not t.is_meta and not isinstance(t, DTensor) and t.numel()
    ]
    _broadcast_tensors(tensors, dist, src)


def flatten_plan(plan: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """One ``{module path: ParallelStyle}`` dict from a plan written per submodule, as
    pytorch/examples and torchtitan write them: ``{"layers.0": {"attention.wq":
    ColwiseParallel(), ...}, "output": ColwiseParallel()}`` gives ``{"layers.0.attention.wq":
    ..., "output": ...}`` (any depth; ``*`` patterns as ``parallelize_module`` reads them)."""
    out: dict[str, Any] = {}
    for key, value in plan.items():
        path = f"{prefix}.{key}" if prefix and key else (key or prefix)
        if isinstance(value, dict):
            out.update(flatten_plan(value, path))
        else:
            out[path] = value
    return out


def _dtype(name: str | None) -> Any:
    import torch

    return getattr(torch, name) if name else None


def own_data_split(module: Any, world: int) -> tuple[int, int] | None:
    """``(data rank, data world)`` of a model the script parallelized on its own mesh, or
    ``None`` where aios's mesh decides (the script used ``rt.mesh``, or a plain ``fully_shard``
    over every rank, which is aios's own split):

    * ``fully_shard`` (FSDP2): its data-parallel mesh (the shard mesh, or replicate x shard
      for HSDP) is the data split; the other dimensions of the script's mesh (tensor parallel)
      read the same batch;
    * ``DTensor`` parameters without ``fully_shard`` on one mesh of every rank (tensor parallel
      over the whole world): every rank reads the same batch.

    A mesh that covers only some ranks with no data-parallel mesh of its own is left to the
    caller (which refuses it in one line)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for sub in module.modules():
        if not isinstance(sub, FSDPModule):
            continue
        # FSDP2 keeps each group's data-parallel mesh on its state's parameter group (torch
        # 2.7+: FSDPState._fsdp_param_group.mesh_info.mesh); no public accessor exists
        group = sub._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        mesh = group.mesh_info.mesh
        if mesh.size() == world:
            return None  # data parallel over every rank: aios's own split
        coord = mesh.get_coordinate() or [0]
        rank = 0
        for d, c in enumerate(coord):
            rank = rank * mesh.size(d) + c
        return rank, mesh.size()
    meshes = {
        id(p.device_mesh): p.device_mesh for p in module.parameters() if isinstance(p, DTensor)
    }
    if len(meshes) == 1:
        (mesh,) = meshes.values()
        if mesh.size() == world and mesh.get_coordinate() is not None:
            return 0, 1
    return None


# ------------------------------------------------------------------------------ strategies


class FSDPStrategy(DDPStrategy):
    """FSDP2 over a device mesh (see the module docstring)."""

    name = "fsdp"
    checkpoint_format = "dcp"
    #: the mesh dimensions data are sharded over (and FSDP shards parameters over)
    shard_dims: tuple[str, ...] = ("dp",)

    def __init__(self, config: AiosConfig, accelerator: Any = None) -> None:
        super().__init__(config, accelerator)
        self.mesh: Any = None
        self.tp_size = 1
        self.wrap_policy: Callable[[Any], bool] | None = None
        self.tp_plan: Any = None
        self.blocks: list[Any] = []
        self._modules: list[Any] = []
        self._opt_module: dict[int, Any] = {}
        self._optimizers: list[Any] = []
        self._replaced: dict[int, Any] = {}
        self._cache: dict[int, Any] = {}
        self._precision: Any = None
        #: ``(data rank, data world)`` of a model the script parallelized itself on its own mesh
        #: (:func:`own_data_split`), which replaces the one of aios's mesh
        self._own_split: tuple[int, int] | None = None

    # ---------------------------------------------------------------- options from rt.setup
    def configure(self, wrap_policy: Any = None, tp_plan: Any = None, **other: Any) -> None:
        """Options passed to ``rt.setup(...)``: ``wrap_policy`` (a callable ``module -> bool``
        or a list of class names) and ``tp_plan`` (a dict or ``fn(model, tp_mesh) -> dict``)."""
        if other:
            super().configure(**other)
        if wrap_policy is not None:
            if isinstance(wrap_policy, (list, tuple, set)):
                names = set(wrap_policy)
                self.wrap_policy = lambda m: type(m).__name__ in names
            elif callable(wrap_policy):
                self.wrap_policy = wrap_policy
            else:
                raise AiosError(
                    f"wrap_policy must be a callable or a list of class names, not {type(wrap_policy).__name__}",
                    "pass e.g. wrap_policy=['Block']",
                )
        if tp_plan is not None:
            self.tp_plan = tp_plan

    # ---------------------------------------------------------------- mesh
    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        m = self.config.mesh
        world = self.world_size
        tp = int(m.tp)
        if world % tp:
            raise ConfigError(
                f"mesh.tp={tp} does not divide the world size {world}",
                f"set mesh.tp to a divisor of {world}",
            )
        dp = world // tp if m.dp == "auto" else int(m.dp)
        if dp * tp != world:
            raise ConfigError(
                f"mesh.dp={dp} x mesh.tp={tp} = {dp * tp} processes, but the world size is {world}",
                f"make mesh.dp x mesh.tp = {world} (or leave mesh.dp=auto)",
            )
        if tp == 1:
            return (dp,), ("dp",)
        return (dp, tp), ("dp", "tp")

    def setup_environment(self) -> None:
        super().setup_environment()
        import torch.distributed as dist

        if not dist.is_initialized():  # one process: FSDP still wants a (trivial) group
            dist.init_process_group(self.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
            self._owns_group = True
            register_exit_hook(owns_group=True)
        self._dist = dist
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = self.mesh_shape()
        self.mesh = init_device_mesh(self.device_type, shape, mesh_dim_names=names)
        self.tp_size = self.mesh["tp"].size() if "tp" in names else 1

    def shard_mesh(self) -> Any:
        return (
            self.mesh[self.shard_dims]
            if len(self.shard_dims) > 1
            else self.mesh[self.shard_dims[0]]
        )

    @property
    def data_rank(self) -> int:
        if self._own_split is not None:
            return self._own_split[0]
        if self.mesh is None:
            return self.rank
        rank = 0
        for d in self.shard_dims:
            rank = rank * self.mesh[d].size() + self.mesh[d].get_local_rank()
        return rank

    @property
    def data_world(self) -> int:
        if self._own_split is not None:
            return self._own_split[1]
        if self.mesh is None:
            return self.world_size
        n = 1
        for d in self.shard_dims:
            n *= self.mesh[d].size()
        return n

    # ---------------------------------------------------------------- the model
    def _plan(self, model: Any) -> Any:
        plan = self.tp_plan
        if plan is None and self.config.mesh.tp_plan:
            plan = load_object(self.config.mesh.tp_plan, "mesh.tp_plan")
        if callable(plan) and not isinstance(plan, dict):
            plan = plan(model, self.mesh["tp"])
        if not plan:
            raise ConfigError(
                f"strategy {self.config.strategy} with mesh.tp={self.tp_size} needs a tensor-parallel plan",
                "pass rt.setup(model, opt, tp_plan={...}) or set mesh.tp_plan=module:attribute",
            )
        return flatten_plan(plan)

    def _select_blocks(self, model: Any) -> list[Any]:
        policy = self.wrap_policy
        if policy is None and self.config.fsdp.wrap:
            names = set(self.config.fsdp.wrap)
            policy = lambda m: type(m).__name__ in names  # noqa: E731
            blocks = [m for m in model.modules() if m is not model and policy(m)]
            if not blocks:
                found = sorted({type(m).__name__ for m in model.modules()})
                raise ConfigError(
                    f"fsdp.wrap={sorted(names)} matches no module of the model",
                    f"module classes in the model: {', '.join(found)}",
                )
            return blocks
        if policy is not None:
            return [m for m in model.modules() if m is not model and policy(m)]
        return default_blocks(model)

    def adopts(self, module: torch.nn.Module) -> str | None:
        """The sharded strategies take the script's own sharding as it is."""
        return None

    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        s = self.config.fsdp
        self._precision = precision
        own = parallelized(module)
        on_rt_mesh = own == "dtensor" and self._off_mesh(module) is None
        split = own_data_split(module, self.world_size) if own and not on_rt_mesh else None
        if own == "fully_shard" or split is not None:
            # the script parallelized it on its own mesh: kept as it is, never wrapped twice,
            # and the data split its mesh implies (tensor-parallel peers read the same batch)
            if split is not None:
                self._own_split = split
            if self.world_size > 1:
                broadcast_module_states(module, self._dist)  # its plain tensors: rank 0's
            self._modules.append(module)
            return module
        if own == "dtensor":
            self._check_script_mesh(module)
        if not any(t.is_meta for t in module.parameters()):  # a meta model is sharded as it is
            module = module.to(self.device)
        module = precision.convert_module(module)
        if self.world_size > 1:
            broadcast_module_states(module, self._dist)  # one model, as under DDP
        before = {name: p for name, p in module.named_parameters()}
        if self.tp_size > 1 and own is None:  # (own == "dtensor": the script's plan on rt.mesh)
            from torch.distributed.tensor.parallel import parallelize_module

            module = parallelize_module(module, self.mesh["tp"], self._plan(module))
        blocks = self._select_blocks(module)
        if s.activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for b in blocks:
                checkpoint(b)
        if s.compile:
            for b in blocks:
                b.compile(backend=self.accelerator.compile_backend or "inductor")
        kwargs: dict[str, Any] = {
            "mesh": self.shard_mesh(),
            "reshard_after_forward": s.reshard_after_forward,
        }
        if isinstance(precision, ShardedPrecision) and precision.param_dtype:
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=_dtype(precision.param_dtype),
                reduce_dtype=_dtype(precision.reduce_dtype),
            )
        if s.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(
                pin_memory=self.accelerator.non_blocking_copies
            )
        for b in blocks:
            fully_shard(b, **kwargs)
        fully_shard(module, **kwargs)
        # sharding replaces the Parameters: an optimizer built on the originals is remapped
        after = dict(module.named_parameters())
        self._replaced.update(
            {id(p): after[n] for n, p in before.items() if n in after and after[n] is not p}
        )
        self.blocks = blocks
        self._modules.append(module)
        return module

    def _off_mesh(self, module: Any) -> tuple[str, Any] | None:
        """The first ``DTensor`` parameter of ``module`` (name, mesh) that is not on aios's
        ``tp`` mesh (``rt.mesh["tp"]``), or ``None``."""
        from torch.distributed.tensor import DTensor

        tp = self.mesh["tp"] if self.tp_size > 1 else None
        for name, p in module.named_parameters():
            if not isinstance(p, DTensor):
                continue
            m = p.device_mesh
            same = (
                tp is not None
                and m.mesh_dim_names == tp.mesh_dim_names
                and m.mesh.tolist() == tp.mesh.tolist()
            )
            if not same:
                return name, m
        return None

    def _check_script_mesh(self, module: Any) -> None:
        """A model whose parameters the script made ``DTensor``s itself (tensor parallel) on a
        mesh of some ranks only: aios adds FSDP over ``dp`` only when they live on its ``tp``
        mesh (``rt.mesh["tp"]``)."""
        off = self._off_mesh(module)
        if off is not None:
            name, m = off
            where = f"mesh {tuple(m.mesh_dim_names or ())} {m.mesh.tolist()}"
            raise ConfigError(
                f"parameter {name!r} is a DTensor on the script's own {where}: aios cannot "
                f"add strategy {self.name} over a mesh it did not make",
                "parallelize on rt.mesh['tp'] (run with mesh.tp=N), shard the model completely "
                "yourself (fully_shard), or make your tensor-parallel mesh span every rank: aios "
                "keeps either as it is",
            )

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self._optimizers.append(optimizer)
        if self._replaced:
            if optimizer.state and any(id(p) in self._replaced for p in optimizer.state):
                raise AiosError(
                    f"strategy {self.name}: the optimizer already holds state for unsharded parameters",
                    "set up the model and optimizer with rt.setup before the first step (or "
                    "load the optimizer state after rt.setup)",
                )
            for g in optimizer.param_groups:
                g["params"] = [self._replaced.get(id(p), p) for p in g["params"]]
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for m in self._modules:
            if any(id(p) in ids for p in m.parameters()):
                self._opt_module[id(optimizer)] = m
                break
        else:
            if self._modules:
                raise AiosError(
                    f"strategy {self.name}: the optimizer was built before rt.setup(model) sharded the parameters",
                    "pass the model and the optimizer to rt.setup together (rt.setup(model, "
                    "opt)), or set up the model first and build the optimizer from its "
                    "parameters",
                )
        return optimizer

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return getattr(module, "_orig_mod", module)  # fully_shard changes the class in place

    # ---------------------------------------------------------------- the step
    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        if not enabled or module is None or not hasattr(module, "set_requires_gradient_sync"):
            yield
            return
        fsdp_module = cast("FSDPModule", module)  # fully_shard made it one (checked above)
        fsdp_module.set_requires_gradient_sync(False)
        fsdp_module.set_reshard_after_backward(False)
        try:
            yield
        finally:
            fsdp_module.set_requires_gradient_sync(True)
            fsdp_module.set_reshard_after_backward(True)

    def clip_grad_norm(self, module: Any, optimizer: Any, max_norm: float, precision: Any) -> Any:
        precision.unscale(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        total = total_grad_norm([p.grad for p in params])
        import torch
        from torch.distributed.tensor import DTensor

        # one foreach per (mesh, placements): a tp plan leaves the unplanned layers on the dp
        # mesh, and one foreach over gradients on two meshes fails
        groups: dict[Any, list[Any]] = {}
        for p in params:
            g = p.grad
            key = (
                (id(g.device_mesh), tuple(g.placements))
                if isinstance(g, DTensor)
                else ("local", g.device.type)
            )
            groups.setdefault(key, []).append(p)
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
        return precision.step(optimizer)

    def on_step_end(self, step: int) -> None:
        """Buffers follow DDP's rule: rank 0's are the model's. After every optimizer step each
        rank's buffers become rank 0's (DDP copies them before every forward), so checkpoints
        (written at step boundaries), a resume and an evaluation see rank 0's statistics on
        every rank."""
        if self.world_size > 1 and self._modules:
            broadcast_buffers(self._modules, self._dist)

    def saves_on_this_rank(self) -> bool:
        """Called on every rank at the start of a save: rank 0's buffers first (a save between
        steps), then the shards are gathered to the saving rank (collective), before it builds
        the state dicts."""
        if self.world_size > 1 and self._modules:
            broadcast_buffers(self._modules, self._dist)
        self.gather_full_state(self._modules, self._optimizers)
        if not self.is_main:  # only the saving rank builds state dicts from the cache
            self._cache = {}
        return self.is_main

    # ---------------------------------------------------------------- checkpoints (full format)
    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    def _full_module(self, module: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.unwrap(module), options=self._options())

    def _full_optimizer(self, optimizer: Any, module: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model = self._opt_module.get(id(optimizer), module)
        return get_optimizer_state_dict(self.unwrap(model), optimizer, options=self._options())

    def gather_full_state(self, modules: list[Any], optimizers: list[Any]) -> None:
        """Collective: gather full states on rank 0 (cached for the state-dict calls)."""
        self._cache = {}
        for m in modules:
            self._cache[id(m)] = self._full_module(m)
        for o in optimizers:
            self._cache[id(o)] = self._full_optimizer(o, self._opt_module.get(id(o)))

    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        cached = self._cache.pop(id(module), None)
        return cached if cached is not None else self._full_module(module)

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        cached = self._cache.pop(id(optimizer), None)
        return cached if cached is not None else self._full_optimizer(optimizer, module)

    def load_module_state_dict(self, module: torch.nn.Module, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(
            self.unwrap(module), state, options=StateDictOptions(full_state_dict=True)
        )

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        module: torch.nn.Module | None = None,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        model = self._opt_module.get(id(optimizer), module)
        if model is not None:
            state = _fqn_keyed(self.unwrap(model), optimizer, state)
        if not state.get("state") and not optimizer.state:
            # a stateless optimizer (SGD without momentum): only the hyperparameters to restore
            # (torch's loader needs at least one state tensor to find the device)
            for group, saved in zip(
                optimizer.param_groups, state.get("param_groups", []), strict=True
            ):
                group.update({k: v for k, v in saved.items() if k != "params"})
            return
        set_optimizer_state_dict(
            self.unwrap(model),  # type: ignore[arg-type]  # None: torch names the problem
            optimizer,
            state,
            options=StateDictOptions(full_state_dict=True),
        )

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        if self.mesh is not None:
            out["mesh"] = dict(zip(self.mesh.mesh_dim_names or (), self.mesh.shape, strict=False))
        out["sharded_blocks"] = len(self.blocks)
        return out


def _fqn_keyed(model: Any, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state as torch's ``Optimizer.state_dict()`` writes it (parameters as
    positions: a ``full`` checkpoint of ddp or xla) in the form keyed by parameter names that
    ``set_optimizer_state_dict`` reads; any other state as it is. The saved positions are this
    optimizer's parameters in the same order (the same script built both)."""
    groups = state.get("param_groups") or []
    saved = [i for g in groups for i in g.get("params", [])]
    if not saved or not all(isinstance(i, int) for i in saved):
        return state
    names = {id(p): n for n, p in model.named_parameters()}
    current = [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
    if len(current) != len(saved) or None in current:
        return state  # torch's loader names what does not fit
    fqn = dict(zip(saved, current, strict=True))
    return {
        "state": {fqn[k]: v for k, v in (state.get("state") or {}).items() if k in fqn},
        "param_groups": [{**g, "params": [fqn[i] for i in g["params"]]} for g in groups],
    }


class TPStrategy(FSDPStrategy):
    """Tensor/sequence parallel with a user plan on ``mesh.tp`` (all ranks when ``mesh.tp`` is
    left at 1 and ``mesh.dp`` at auto); FSDP over ``dp`` when ``dp > 1``."""

    name = "tp"

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        m = self.config.mesh
        if int(m.tp) == 1:
            dp = 1 if m.dp == "auto" else int(m.dp)
            if self.world_size % dp:
                raise ConfigError(
                    f"mesh.dp={dp} does not divide the world size {self.world_size}",
                    f"set mesh.dp to a divisor of {self.world_size}",
                )
            return (dp, self.world_size // dp), ("dp", "tp")
        shape, names = super().mesh_shape()
        return shape, names

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.tp_size == 1 and self.world_size > 1:  # pragma: no cover - mesh_shape prevents it
            raise ConfigError("strategy tp needs mesh.tp > 1", "set mesh.tp")


class HSDPStrategy(FSDPStrategy):
    """FSDP2 sharded within a group and replicated across groups (``mesh.replicate``; default
    one group per node): mesh ``(replicate, shard)``."""

    name = "hsdp"
    shard_dims = ("replicate", "shard")

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        m = self.config.mesh
        world = self.world_size
        if int(m.tp) != 1:
            raise ConfigError(
                "strategy hsdp does not combine with mesh.tp > 1 yet",
                "use strategy=fsdp with mesh.tp for 2-D FSDP x TP",
            )
        rep = (
            (self.cluster.nnodes if self.cluster is not None else 1)
            if m.replicate == "auto"
            else int(m.replicate)
        )
        if rep < 1 or world % rep:
            raise ConfigError(
                f"mesh.replicate={rep} does not divide the world size {world}",
                f"set mesh.replicate to a divisor of {world}",
            )
        return (rep, world // rep), ("replicate", "shard")

    def shard_mesh(self) -> Any:
        return self.mesh  # a 2-D mesh: fully_shard replicates on dim 0 and shards on dim 1


# ------------------------------------------------------------------------------ norms


def total_grad_norm(grads: list[Any], norm_type: float = 2.0) -> Any:
    """The global norm of ``grads`` (plain tensors and ``DTensor`` shards on any meshes): one
    norm per (mesh, placements) group made whole with ``full_tensor()`` (which reduces the
    partial norms across the shards), then combined."""
    import torch
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[Any]] = {}
    for g in grads:
        key = (
            (id(g.device_mesh), tuple(g.placements))
            if isinstance(g, DTensor)
            else ("local", g.device.type)
        )
        groups.setdefault(key, []).append(g)
    parts = []
    for gs in groups.values():
        n = torch.nn.utils.get_total_norm(gs, norm_type)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        parts.append(n.float())
    if not parts:
        return torch.zeros(())
    if len(parts) == 1:
        return parts[0]
    return torch.linalg.vector_norm(torch.stack([p.to(parts[0].device) for p in parts]), norm_type)
