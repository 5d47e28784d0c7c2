"""Step semantics on XLA devices (TPU through PJRT; reused for Neuron with ``pjrt_device="NEURON"``).

:class:`XlaStrategy` (multi-process data parallel, one process per chip, started by
``torch_xla.launch``):

* no DDP wrapper: gradients are all-reduced **once** per optimizer step (``xm.reduce_gradients``
  semantics, mean over replicas), before clipping or stepping, and not at all when the user
  already wrapped the model in ``DistributedDataParallel``;
* one graph cut (``torch_xla.sync()``) per optimizer step, and per batch in the device loader;
* data: rank-sharded sampler, ``drop_last`` on by default, ``MpDeviceLoader`` prefetch;
* RNG: data order from a CPU ``torch.Generator``; device RNG seeded with ``xm.set_rng_state``;
* ``fused=True`` AdamW/Adam (a CUDA kernel path) is switched off with a warning;
* checkpoints: tensors synced, then moved to CPU on the saving rank only;
* a :class:`~aios_backend_xla.compile_guard.CompileGuard` counts compilations per step;
* :meth:`metrics` reports torch_xla's compile / execute / transfer metrics for diagnostics.json.

:class:`XlaSpmdStrategy` (``strategy: spmd``): one process per host, a 1-D ``data`` mesh over all
devices, batches sharded on dim 0, parameters replicated, gradient reduction inserted by the
SPMD partitioner.

Public extension points (the Neuron backend builds on them; no private method is part of the
contract): pass ``pjrt_device``; override :attr:`name`, :meth:`prepare_env` (env before the
runtime starts), :attr:`group_before_runtime` (True when processes come from torchrun rather than
``torch_xla.launch``: the ``xla`` process group is then created before the runtime is queried),
:meth:`init_process_group`, :meth:`read_compiles` (compile counter), :attr:`data_rank` /
:attr:`data_world` (data sharding), :meth:`reduce_once` (gradient reduction), :meth:`input_sharding`,
:meth:`check_batch` or :meth:`metrics`. The node rank comes from :func:`aios.environments.base.detect`.
Everything heavy is imported inside methods.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aios.data.loaders import DeviceLoader
from aios.environments.base import detect
from aios.errors import ConfigError
from aios.plugins.registry import get_registry
from aios.strategies.base import Strategy

from aios_backend_xla.compile_guard import CompileGuard, read_uncached_compiles
from aios_backend_xla.loader import BatchSharding, XlaDeviceLoader, xla_shard_loader
from aios_backend_xla.precision import check_deprecated_env
from aios_backend_xla.settings import XlaSettings, settings_of

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from aios.config.settings import AiosConfig
    from aios.strategies.precision import Precision

log = logging.getLogger("aios.xla")

# Optimizer options that select CUDA-only code paths; switched off with a warning on XLA.
CUDA_ONLY_OPTIONS = ("fused",)


class XlaStrategy(Strategy):
    """Data parallel over XLA devices, one process per device.

    :param config: the resolved aios config.
    :param pjrt_device: the PJRT device type this process drives (``TPU``, ``CPU`` for the
        XLA:CPU opt-in, ``NEURON`` for the Neuron backend's subclass).
    :param settings: backend settings; default: ``config.xla`` or :class:`XlaSettings` defaults.
    """

    name = "xla"
    autocast_device_type = "xla"

    def __init__(
        self, config: AiosConfig, pjrt_device: str = "TPU", settings: XlaSettings | None = None
    ) -> None:
        super().__init__(config)
        self.pjrt_device = pjrt_device.upper()
        self.settings = settings or settings_of(config)
        self.guard: CompileGuard | None = None
        self._reduced: set[int] = set()
        self._ddp_wrapped = False
        self._hooks: list[Any] = []
        self._param_map: dict[int, tuple[Any, Any]] = {}
        self._owns_group = False
        self.steps = 0

    @property
    def fp16_speed(self) -> bool:
        """Only a GPU behind PJRT computes float16 fast; TPUs, Trainium and XLA:CPU do
        bfloat16 (a float16 forward there is named by the run)."""
        return self.pjrt_device in ("CUDA", "GPU")

    @property
    def hardware(self) -> str:
        return f"the {self.name} backend on PJRT_DEVICE={self.pjrt_device}"

    # ---------------------------------------------------------------- process / device
    def prepare_env(self) -> None:
        """Environment that must be in place before the XLA runtime starts."""
        check_deprecated_env()
        current = os.environ.get("PJRT_DEVICE", "").upper()
        if current and current.split("_")[0] != self.pjrt_device:
            raise ConfigError(
                f"PJRT_DEVICE={current} but the {self.name} backend was set up for {self.pjrt_device}",
                f"unset PJRT_DEVICE or set PJRT_DEVICE={self.pjrt_device}",
            )
        os.environ["PJRT_DEVICE"] = (
            self.pjrt_device
        )  # explicit: never torch_xla's silent CPU default
        cache = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        if cache:
            cache = os.path.expanduser(cache)
            os.makedirs(cache, exist_ok=True)
            os.environ["XLA_PERSISTENT_CACHE_PATH"] = cache
            local = int(os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0") or 0)
            os.environ.setdefault("XLA_PERSISTENT_CACHE_READ_ONLY", "0" if local == 0 else "1")

    #: create the ``xla`` process group before querying the runtime (workers started by torchrun)
    group_before_runtime = False

    def setup_environment(self) -> None:
        self.prepare_env()

        info = detect(None, get_registry())
        if self.group_before_runtime and (info.world_size or 1) > 1:
            self.init_process_group()
        import torch_xla
        import torch_xla.runtime as xr

        self.device = torch_xla.device()
        self.world_size = xr.world_size()
        self.rank = xr.global_ordinal()
        self.local_rank = xr.local_ordinal()
        self.node_rank = info.node_rank
        if self.world_size > 1:
            self.init_process_group()
        self.start_guard()

    def init_process_group(self) -> None:
        """A torch.distributed group over the replicas (backend ``xla``), for scripts and
        libraries that call ``torch.distributed``; aios's own collectives do not need it."""
        import torch.distributed as dist
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)

        if not dist.is_initialized():
            dist.init_process_group("xla", init_method="xla://")
            self._owns_group = True

    def start_guard(self) -> None:
        self.guard = CompileGuard(
            self.settings.warmup_steps,
            self.settings.max_recompiles,
            self.read_compiles,
            backend=self.name,
        )

    def read_compiles(self) -> int:
        return read_uncached_compiles()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---------------------------------------------------------------- user objects
    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        self._ddp_wrapped = isinstance(module, DistributedDataParallel)
        inner = self.unwrap(module)
        inner = precision.convert_module(inner)  # bf16-true: convert on CPU, then move once
        self._param_map.update(move_module(inner, self.device))
        if self.guard is not None:
            guard = self.guard

            import torch

            def record(mod: Any, args: Any, kwargs: Any) -> None:
                mode = ("train" if mod.training else "eval") + (
                    "" if torch.is_grad_enabled() else ", no_grad"
                )
                guard.observe(args, "forward", mode)
                if kwargs:
                    guard.observe(kwargs, "forward", mode)

            self._hooks.append(inner.register_forward_pre_hook(record, with_kwargs=True))
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        remap_optimizer(optimizer, self._param_map, self.device)
        for opt in CUDA_ONLY_OPTIONS:
            if optimizer.defaults.get(opt) or any(g.get(opt) for g in optimizer.param_groups):
                warnings.warn(
                    f"{type(optimizer).__name__}({opt}=True) selects a CUDA kernel that does "
                    "not run on XLA; aios turned it off",
                    UserWarning,
                    stacklevel=2,
                )
                optimizer.defaults[opt] = False
                for g in optimizer.param_groups:
                    if opt in g:
                        g[opt] = False
        return optimizer

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:

        if isinstance(loader, DeviceLoader):
            return loader
        seed = self.config.seed if self.config.seed is not None else 0
        cpu = xla_shard_loader(
            loader, self.data_rank, self.data_world, seed, shuffle, self.settings.drop_last
        )
        self.check_batch(cpu)
        return XlaDeviceLoader(
            cpu,
            self.device,
            prefetch=self.settings.prefetch,
            input_sharding=self.input_sharding(),
            world=self.data_world,
        )

    @property
    def data_rank(self) -> int:
        return self.rank

    @property
    def data_world(self) -> int:
        return self.world_size

    def input_sharding(self) -> Any:
        return None

    def check_batch(self, loader: Any) -> None:
        pass

    def teardown(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False

    # ---------------------------------------------------------------- the step
    def reduce_once(self, optimizer: torch.optim.Optimizer) -> None:
        key = id(optimizer)
        if key in self._reduced:
            return
        self._reduced.add(key)
        if self.world_size > 1 and not self._ddp_wrapped:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self.reduce_once(optimizer)

    def clip_grad_norm(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        precision: Precision,
    ) -> Any:
        import torch

        self.reduce_once(optimizer)  # clip the global (reduced) gradient, exactly once
        precision.unscale(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
        self.reduce_once(optimizer)
        taken = precision.step(optimizer)
        self._reduced.discard(id(optimizer))
        return taken  # the graph is cut by mark_step() at the step boundary (runtime.step)

    def mark_step(self) -> None:
        import torch_xla

        torch_xla.sync()

    def on_step_end(self, step: int) -> None:
        self.steps = step
        if self.guard is not None:
            self.guard.step_end(step)

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        if self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.rendezvous("aios-barrier")

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        kinds = {
            "sum": xm.REDUCE_SUM,
            "mean": xm.REDUCE_SUM,
            "max": xm.REDUCE_MAX,
            "min": xm.REDUCE_MIN,
        }
        if op not in kinds:
            raise ValueError(f"unknown reduce op {op!r}")
        out = xm.all_reduce(kinds[op], tensor, scale=1.0 / self.world_size if op == "mean" else 1.0)
        return out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        import torch_xla.core.xla_model as xm

        return xm.all_gather(tensor.unsqueeze(0), dim=0)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        import torch_xla.core.xla_model as xm

        return xm.mesh_reduce(
            "aios-broadcast", (self.rank, obj), lambda items: next(o for r, o in items if r == src)
        )

    def any_rank(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        import torch_xla.core.xla_model as xm

        return bool(xm.mesh_reduce("aios-any", bool(flag), any))

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (out of graph, through the PJRT rendezvous)."""
        if self.world_size == 1:
            return [obj]
        import torch_xla.core.xla_model as xm

        return list(xm.mesh_reduce("aios-gather", obj, list))

    # ---------------------------------------------------------------- checkpoints
    def _to_cpu(self, data: Any) -> Any:
        """Sync pending updates, then move XLA tensors to CPU on the saving rank only."""
        import torch_xla.core.xla_model as xm

        return xm._maybe_convert_to_cpu(data, convert=self.saves_on_this_rank())

    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        return self._to_cpu(self.unwrap(module).state_dict())

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        return self._to_cpu(optimizer.state_dict())

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        module: torch.nn.Module | None = None,
    ) -> None:
        optimizer.load_state_dict(state)  # torch casts state tensors to each param's device
        self.mark_step()

    def load_module_state_dict(self, module: torch.nn.Module, state: dict[str, Any]) -> None:
        self.unwrap(module).load_state_dict(state)
        self.mark_step()

    def rng_state(self) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        return {"xla": int(xm.get_rng_state())}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "xla" in state:
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(int(state["xla"]))

    def seed(self, seed: int) -> None:
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(int(seed))

    def generator(self, seed: int | None = None) -> torch.Generator:
        """A CPU generator for sampling (``torch.Generator(device="xla")`` is not supported)."""
        import torch

        g = torch.Generator("cpu")
        chosen = self.config.seed if seed is None else seed
        g.manual_seed(0 if chosen is None else chosen)
        return g

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pjrt_device": self.pjrt_device,
            "strategy": self.name,
            "world_size": self.world_size,
        }
        out.update(xla_metrics())
        if self.guard is not None:
            out["compile_guard"] = self.guard.summary()
        return out

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        # Gradients are reduced in optimizer_step, so accumulation needs nothing here; a
        # user-applied DDP wrapper keeps its own no_sync.
        if enabled and self._ddp_wrapped:
            with module.no_sync():  # type: ignore[operator]
                yield
        else:
            yield


def move_module(module: torch.nn.Module, device: Any) -> dict[int, tuple[Any, Any]]:
    """Move parameters and buffers to ``device`` keeping ``Parameter`` objects and ties.

    A plain ``module.to(xla)`` creates new ``Parameter`` objects (XLA tensors cannot be
    shallow-copied into CPU ones), separately for every module holding a tied weight: ties break
    and an optimizer built before the move keeps stepping the old CPU tensors. The move runs with
    ``torch.__future__`` swap-on-conversion, which swaps the device data into the existing
    objects. Where swapping is impossible (a tensor with weak references), each distinct tensor is
    moved once and put back everywhere it was used; the returned ``{id(old): (old, new)}`` lets
    :func:`remap_optimizer` re-point optimizers.
    """
    import torch

    prev = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(device)
        return {}
    except RuntimeError:
        pass
    finally:
        torch.__future__.set_swap_module_params_on_conversion(prev)
    target = torch.device(device)
    memo: dict[int, Any] = {}
    moved: dict[int, tuple[Any, Any]] = {}
    for mod in module.modules():
        for key, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                if p.device == target:
                    memo[id(p)] = p
                else:
                    new = torch.nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
                    if p.grad is not None:
                        new.grad = p.grad.detach().to(device)
                    memo[id(p)] = new
                    moved[id(p)] = (p, new)
            mod._parameters[key] = memo[id(p)]
        for key, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                memo[id(b)] = b.to(device)
            mod._buffers[key] = memo[id(b)]
    return moved


def remap_optimizer(
    optimizer: torch.optim.Optimizer, moved: dict[int, tuple[Any, Any]], device: Any
) -> None:
    """Point an optimizer built before :func:`move_module`'s fallback at the moved parameters
    (and move any state it already has). Entries hold the old object, so ids are never reused."""
    if not moved:
        return
    state = optimizer.state
    for group in optimizer.param_groups:
        new_params = []
        for p in group["params"]:
            entry = moved.get(id(p))
            q = entry[1] if entry is not None and entry[0] is p else p
            if q is not p and p in state:
                state[q] = {
                    k: (
                        v.to(device)
                        if hasattr(v, "to") and getattr(v, "dim", lambda: 1)() > 0
                        else v
                    )
                    for k, v in state.pop(p).items()
                }
            new_params.append(q)
        group["params"] = new_params


def xla_metrics() -> dict[str, Any]:
    """torch_xla's debug metrics as plain numbers (seconds, counts)."""
    try:
        import torch_xla.debug.metrics as met
    except ImportError:  # pragma: no cover
        return {}

    def metric(name: str) -> dict[str, Any]:
        data = met.metric_data(name)
        if not data:
            return {"count": 0, "total_s": 0.0}
        count, total, _ = data
        return {"count": int(count), "total_s": round(float(total) / 1e9, 6)}

    counters = {n: int(met.counter_value(n) or 0) for n in met.counter_names()}
    return {
        "compile": {
            **metric("CompileTime"),
            "uncached": counters.get("UncachedCompile", 0),
            "cached": counters.get("CachedCompile", 0),
        },
        "execute": metric("ExecuteTime"),
        "transfer_to_device": metric("TransferToDeviceTime"),
        "transfer_from_device": metric("TransferFromDeviceTime"),
        "aten_fallbacks": {
            n.removeprefix("aten::"): c for n, c in counters.items() if n.startswith("aten::")
        },
        "mark_steps": counters.get("MarkStep", 0),
    }


class XlaSpmdStrategy(XlaStrategy):
    """SPMD data parallel: one process per host drives every local device through a mesh.

    ``torch_xla.runtime.use_spmd()`` runs before any tensor is created; the mesh is 1-D
    (``data``) over all global devices; the loader shards each batch on dim 0; parameters stay
    replicated and the partitioner inserts the gradient all-reduce.
    """

    name = "xla-spmd"

    def setup_environment(self) -> None:
        self.prepare_env()
        import numpy as np
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        self.device = torch_xla.device()
        self.num_devices = xr.global_runtime_device_count()
        self.mesh = xs.Mesh(np.arange(self.num_devices), (self.num_devices,), ("data",))
        xs.set_global_mesh(self.mesh)
        self.rank = xr.process_index()
        self.world_size = xr.process_count()
        self.local_rank = 0
        self.node_rank = self.rank
        self.start_guard()

    def input_sharding(self) -> Any:
        return BatchSharding(self.mesh, "data")

    def check_batch(self, loader: Any) -> None:
        bs = getattr(loader, "batch_size", None)
        if bs and bs % self.num_devices:
            raise ConfigError(
                f"SPMD shards each batch over {self.num_devices} devices but the batch size is {bs}",
                f"use a batch size divisible by {self.num_devices}",
            )

    def reduce_once(self, optimizer: torch.optim.Optimizer) -> None:
        return  # the SPMD partitioner reduces gradients inside the compiled step

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        return tensor  # values computed from sharded batches are already global

    def any_rank(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        return super().any_rank(flag)

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["spmd_devices"] = self.num_devices
        return out
