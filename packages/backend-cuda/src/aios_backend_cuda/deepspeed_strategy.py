"""``strategy: deepspeed``: DeepSpeed ZeRO (stages 1-3, CPU/NVMe offload) behind the aios
runtime API, so the script written for DDP runs unchanged.

Mapping of the runtime API onto the DeepSpeed engine:

* ``rt.setup(model, optimizer, loader, ...)``: the model and the optimizer are handed to
  ``deepspeed.initialize`` together on first use (the first forward, or a resume), when the
  loaders set up alongside give the micro batch size; the order of setup does not matter. The script gets
  back a :class:`DeepSpeedModule` (calls go to the engine) and a :class:`DeepSpeedOptimizer`
  view of its optimizer (the real ``param_groups``, so LR schedulers work; DeepSpeed steps it
  and zeroes the gradients).
* ``rt.backward(loss)``: ``engine.backward(loss, scale_wrt_gas=False)`` (the runtime already
  divides by ``grad_accum``); on micro-steps before the accumulation boundary ``engine.step()``
  follows at once, as DeepSpeed expects one ``step()`` per micro-batch.
* ``rt.step(opt)``: ``engine.step()`` at the boundary: ZeRO reduction, clipping (DeepSpeed's
  ``gradient_clipping`` = ``grad_clip``), loss scaling (fp16 overflow steps are skipped and
  counted), update. ``accumulate()``/``no_sync`` need nothing: DeepSpeed owns the boundary.
* ``rt.save()``/``rt.resume()``: every rank writes its ZeRO shards with
  ``engine.save_checkpoint`` into a private temporary directory; the shards are gathered to rank
  0 and stored inside aios's checkpoint (atomic, sha256-checked, local path or fsspec URL, keep-N).
  On load every rank restores them and calls ``engine.load_checkpoint``. The checkpoint also
  holds the full module state (16-bit weights consolidated under ZeRO-3) for use without
  DeepSpeed.

The DeepSpeed JSON is generated from the aios config (:func:`build_ds_config`): micro batch,
accumulation, train batch, ``grad_clip``, precision, ZeRO stage and offload; a user's JSON file
(``deepspeed.config``) is merged over it (its ``"auto"`` values keep the generated ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aios.errors import AiosError, ConfigError
from aios.strategies.ddp import _to_cpu
from aios.strategies.precision import Precision

from aios_backend_cuda.precision import check_bf16
from aios_backend_cuda.settings import DeepSpeedSettings
from aios_backend_cuda.strategy import CudaDDPStrategy

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from aios.config.settings import AiosConfig
    from aios.devices.accelerator import Accelerator

TAG = "aios"


# ------------------------------------------------------------------------------ config


def _merge_user(generated: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    out = dict(generated)
    for k, v in user.items():
        if v == "auto":
            continue
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_user(out[k], v)
        else:
            out[k] = v
    return out


def load_user_json(path: str) -> dict[str, Any]:
    try:
        with open(os.path.expanduser(path)) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"DeepSpeed config file '{path}' does not exist",
            "set deepspeed.config to an existing JSON file",
        ) from None
    except ValueError as exc:
        raise ConfigError(
            f"DeepSpeed config file '{path}' is not valid JSON ({exc})", "fix the JSON syntax"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"DeepSpeed config file '{path}' must hold a JSON object",
            'write {"zero_optimization": {...}, ...}',
        )
    return data


def build_ds_config(
    config: AiosConfig,
    world_size: int,
    micro_batch_size: int | None = None,
    device_type: str = "cuda",
) -> dict[str, Any]:
    """The DeepSpeed JSON for this run, from the aios config (and ``deepspeed.config`` on top)."""
    ds: DeepSpeedSettings = config.section("deepspeed") or DeepSpeedSettings()
    mb = int(ds.micro_batch_size or micro_batch_size or 1)
    gas = int(config.grad_accum)
    stage = int(ds.zero_stage)
    if ds.offload_param != "none" and stage != 3:
        raise ConfigError(
            f"deepspeed.offload_param={ds.offload_param} needs ZeRO stage 3 (deepspeed.zero_stage is {stage})",
            "set deepspeed.zero_stage=3 or deepspeed.offload_param=none",
        )
    if ds.offload_optimizer != "none" and stage == 0:
        raise ConfigError(
            "deepspeed.offload_optimizer needs ZeRO stage 1, 2 or 3",
            "set deepspeed.zero_stage to 1, 2 or 3",
        )
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        raise ConfigError(
            "NVMe offload needs deepspeed.nvme_path",
            "set deepspeed.nvme_path to a directory on a local NVMe drive",
        )
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": bool(ds.overlap_comm) and device_type == "cuda",
        "contiguous_gradients": bool(ds.contiguous_gradients),
        "reduce_bucket_size": int(ds.reduce_bucket_size),
    }
    pin = device_type == "cuda"
    for key, dev in (
        ("offload_optimizer", ds.offload_optimizer),
        ("offload_param", ds.offload_param),
    ):
        if dev == "cpu":
            zero[key] = {"device": "cpu", "pin_memory": pin}
        elif dev == "nvme":
            zero[key] = {"device": "nvme", "nvme_path": ds.nvme_path, "pin_memory": pin}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": gas,
        "train_batch_size": mb * gas * world_size,
        "gradient_clipping": float(config.grad_clip or 0.0),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the script's own torch optimizer
        "zero_force_ds_cpu_optimizer": False,  # offload with the script's optimizer (DeepSpeedCPUAdam is faster)
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if config.precision in ("bf16-mixed", "bf16-true"):
        out["bf16"] = {"enabled": True}
    elif config.precision == "fp16-mixed":
        out["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if ds.config:
        out = _merge_user(out, load_user_json(ds.config))
        user_mb, user_gas = (
            out["train_micro_batch_size_per_gpu"],
            out["gradient_accumulation_steps"],
        )
        if user_gas != gas:
            raise ConfigError(
                f"the DeepSpeed JSON sets gradient_accumulation_steps={user_gas} but grad_accum is {gas}",
                f"set grad_accum={user_gas} (aios owns accumulation) or drop the key from the JSON",
            )
        out["train_batch_size"] = int(user_mb) * gas * world_size
    return out


# ------------------------------------------------------------------------------ precision


def deepspeed_precision(
    precision: str, config: object, accelerator: Accelerator | None
) -> DeepSpeedPrecision:
    """``StrategySpec.precision`` of ``deepspeed``: DeepSpeed's engine scales the loss itself
    (bf16 refused on GPUs without it)."""
    if accelerator is not None and accelerator.name == "cuda":
        check_bf16(precision)
    return DeepSpeedPrecision(
        precision, accelerator.device_type if accelerator is not None else "cpu"
    )


class DeepSpeedPrecision(Precision):
    """Precision under DeepSpeed: the engine holds bf16/fp16 weights with fp32 master copies and
    does loss scaling; :meth:`autocast` still autocasts so float inputs meet 16-bit weights."""

    def __init__(self, precision: str, device_type: str) -> None:
        super().__init__(device_type)
        self.name = precision
        self.engine: Any = None
        self._dtype = {
            "bf16-mixed": "bfloat16",
            "bf16-true": "bfloat16",
            "fp16-mixed": "float16",
        }.get(precision)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self._dtype is None:
            yield
            return
        import torch

        with torch.autocast(self.device_type, dtype=getattr(torch, self._dtype)):
            yield

    @property
    def skipped_steps(self) -> int:
        return int(getattr(self.engine, "skipped_steps", 0) or 0)

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:  # set by Precision.__init__; the engine counts
        pass

    def backward(self, loss: Any) -> None:  # pragma: no cover - the strategy calls the engine
        raise AiosError(
            "under strategy deepspeed, backward goes through the runtime", "call rt.backward(loss)"
        )


# ------------------------------------------------------------------------------ module wrapper


def _module_base() -> type:
    import torch

    return torch.nn.Module


class _Lazy:
    cls: type | None = None


def DeepSpeedModule(module: Any, strategy: DeepSpeedStrategy) -> Any:  # noqa: N802 - a class factory
    """Wrap ``module`` so calls go to the DeepSpeed engine once it exists (an ``nn.Module``)."""
    if _Lazy.cls is None:
        nn_module = _module_base()

        class _DeepSpeedModule(nn_module):  # type: ignore[misc, valid-type]
            def __init__(self, module: Any, strategy: Any) -> None:
                super().__init__()
                self.module = module
                object.__setattr__(self, "_aios_strategy", strategy)

            @property
            def engine(self) -> Any:
                return self._aios_strategy.engine

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                engine = self._aios_strategy.ensure_engine()
                return engine(*args, **kwargs)

            def train(self, mode: bool = True) -> Any:
                super().train(mode)
                if self.engine is not None:
                    self.engine.train(mode)
                return self

        _DeepSpeedModule.__name__ = "DeepSpeedModule"
        _Lazy.cls = _DeepSpeedModule
    return _Lazy.cls(module, strategy)


def DeepSpeedOptimizer(optimizer: Any, strategy: DeepSpeedStrategy) -> Any:  # noqa: N802 - a class factory
    """The script's optimizer as seen under DeepSpeed: ``param_groups``, ``state``,
    ``state_dict`` are the real ones (LR schedulers work), ``zero_grad()`` is left to the engine
    (ZeRO keeps its own gradient buffers; clearing them breaks CPU offload) and ``step()`` goes
    through the engine."""
    import torch

    if _LazyOpt.cls is None:

        class _DeepSpeedOptimizer(torch.optim.Optimizer):
            def __init__(self, inner: Any, strategy: Any) -> None:  # no super().__init__: a view
                object.__setattr__(self, "_inner", inner)
                object.__setattr__(self, "_aios_strategy", strategy)
                object.__setattr__(self, "_optimizer_step_pre_hooks", {})
                object.__setattr__(self, "_optimizer_step_post_hooks", {})

            param_groups = property(lambda self: self._inner.param_groups)
            state = property(lambda self: self._inner.state)
            defaults = property(lambda self: self._inner.defaults)

            def __getattr__(self, name: str) -> Any:
                return getattr(object.__getattribute__(self, "_inner"), name)

            def zero_grad(self, set_to_none: bool = True) -> None:
                pass  # the engine zeroes gradients after each optimizer step

            def step(self, closure: Any = None) -> Any:
                raise AiosError(
                    "under strategy deepspeed the optimizer steps through the engine",
                    "call rt.step(optimizer) instead of optimizer.step()",
                )

            def state_dict(self) -> dict[str, Any]:
                return self._inner.state_dict()

            def load_state_dict(self, state_dict: dict[str, Any]) -> None:
                self._inner.load_state_dict(state_dict)

            def __repr__(self) -> str:
                return f"DeepSpeedOptimizer({self._inner!r})"

        _DeepSpeedOptimizer.__name__ = "DeepSpeedOptimizer"
        _LazyOpt.cls = _DeepSpeedOptimizer
    return _LazyOpt.cls(optimizer, strategy)


class _LazyOpt:
    cls: type | None = None


# ------------------------------------------------------------------------------ strategy


def make_deepspeed(
    config: AiosConfig, accelerator: Accelerator | None, backend: str
) -> DeepSpeedStrategy:
    """``StrategySpec.factory`` of ``deepspeed`` (cuda, and cpu over DeepSpeed's CPU
    accelerator)."""
    return DeepSpeedStrategy(config, accelerator)


class DeepSpeedStrategy(CudaDDPStrategy):
    """DeepSpeed ZeRO behind :class:`aios.strategies.base.Strategy` (see the module docstring). Reuses
    the DDP strategy's process group and collectives; DeepSpeed joins that group."""

    name = "deepspeed"

    def __init__(self, config: AiosConfig, accelerator: Any = None) -> None:
        super().__init__(config, accelerator)
        self.ds_settings: DeepSpeedSettings = config.section("deepspeed") or DeepSpeedSettings()
        self.engine: Any = None
        self.ds_config: dict[str, Any] | None = None
        self._module: Any = None
        self._wrapper: Any = None
        self._optimizer: Any = None
        self._loader_batch: int | None = None
        self._precision: Any = None
        self._shards: list[tuple[str, bytes]] | None = None
        self._consolidated: dict[str, Any] | None = None

    # ---------------------------------------------------------------- process / device
    def setup_environment(self) -> None:
        if self.device_type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        try:
            import deepspeed
        except ImportError:
            raise AiosError(
                "strategy deepspeed needs the deepspeed package",
                "pip install -e './packages/core[deepspeed]' ./packages/backend-cuda (from the aios checkout)",
            ) from None
        super().setup_environment()
        import torch.distributed as dist

        if not dist.is_initialized():  # one process: DeepSpeed still wants a process group
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            self.init_process_group()
        deepspeed.init_distributed(
            dist_backend=self.dist_backend, auto_mpi_discovery=False, dist_init_required=False
        )
        self._dist = dist

    # ---------------------------------------------------------------- setup
    def setup_module(self, module: torch.nn.Module, precision: Any) -> torch.nn.Module:
        if self._module is not None:
            raise AiosError(
                "strategy deepspeed trains one model per process",
                "set up a single model (wrap several in one nn.Module)",
            )
        self._precision = precision
        self._module = module.to(self.device)
        self._wrapper = DeepSpeedModule(self._module, self)
        return self._wrapper

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self._optimizer is not None:
            raise AiosError(
                "strategy deepspeed steps one optimizer per model",
                "set up a single optimizer (use parameter groups)",
            )
        self._optimizer = optimizer
        self.optimizer_impl.append(f"{type(optimizer).__name__}:deepspeed")
        return DeepSpeedOptimizer(optimizer, self)

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:
        if self._loader_batch is None:
            self._loader_batch = getattr(loader, "batch_size", None)
        return super().setup_dataloader(loader, shuffle)

    def ensure_engine(self) -> Any:
        """The engine, built on first use (the first forward, backward or checkpoint load) so
        that the loaders set up with the model give the micro batch size. Without an optimizer
        it is built for inference (or with the optimizer named in your DeepSpeed JSON)."""
        if self.engine is None:
            if self._module is None:
                raise AiosError(
                    "strategy deepspeed: no model was set up",
                    "call rt.setup(model, optimizer) before training",
                )
            self._initialize()
        return self.engine

    def _initialize(self) -> None:
        import deepspeed

        self.ds_config = build_ds_config(
            self.config, self.world_size, self._loader_batch, self.device_type
        )
        kwargs: dict[str, Any] = {
            "model": self._module,
            "config": self.ds_config,
            "dist_init_required": False,
        }
        if self._optimizer is not None:
            kwargs["optimizer"] = self._optimizer
        else:
            kwargs["model_parameters"] = [p for p in self._module.parameters() if p.requires_grad]
        self.engine, _, _, _ = deepspeed.initialize(**kwargs)
        if isinstance(self._precision, DeepSpeedPrecision):
            self._precision.engine = self.engine

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        inner = getattr(module, "module", module)
        return getattr(inner, "module", inner) if inner is self.engine else inner

    # ---------------------------------------------------------------- the step
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None, precision: Any) -> None:
        engine = self.ensure_engine()
        boundary = engine.is_gradient_accumulation_boundary()
        engine.backward(loss, scale_wrt_gas=False)
        if not boundary:
            engine.step()  # DeepSpeed counts micro-steps in step(); no update happens here

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        yield  # the engine reduces only at the accumulation boundary

    def clip_grad_norm(self, module: Any, optimizer: Any, max_norm: float, precision: Any) -> Any:
        """DeepSpeed clips inside ``engine.step()`` (``gradient_clipping`` = ``grad_clip``);
        returns the global norm of the previous step as DeepSpeed reports it."""
        return self.engine.get_global_grad_norm() if self.engine is not None else None

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        self.engine.step()
        return bool(getattr(self.engine, "_step_applied", True))

    # ---------------------------------------------------------------- checkpoints
    def saves_on_this_rank(self) -> bool:
        """Called once on every rank at the start of ``Runtime.save``: every rank writes its
        ZeRO shards (collective), they are gathered on rank 0, which then writes the checkpoint."""
        self._prepare_checkpoint()
        return self.is_main

    def _prepare_checkpoint(self) -> None:
        if self.engine is None:
            self._shards, self._consolidated = [], None
            return
        stage = int(self.ds_config["zero_optimization"]["stage"]) if self.ds_config else 0
        self._consolidated = (
            self.engine._zero3_consolidated_16bit_state_dict() if stage == 3 else None
        )
        tmp = tempfile.mkdtemp(prefix="aios-ds-save-")
        try:
            self.engine.save_checkpoint(tmp, tag=TAG, save_latest=False)
            mine: list[tuple[str, bytes]] = []
            root = os.path.join(tmp, TAG)
            for dirpath, _, files in os.walk(root):
                for name in sorted(files):
                    full = os.path.join(dirpath, name)
                    with open(full, "rb") as f:
                        mine.append((os.path.relpath(full, root), f.read()))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if self._dist is not None and self.world_size > 1:
            gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
            self._dist.gather_object(mine, gathered, dst=0)
            by_name: dict[str, bytes] = {}
            for part in gathered or []:
                by_name.update(dict(part))
            self._shards = sorted(by_name.items())
        else:
            self._shards = mine

    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        if self._consolidated is not None:
            return _to_cpu(self._consolidated)
        return _to_cpu(self.unwrap(module).state_dict())

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
    ) -> dict[str, Any]:
        import torch

        if self._shards is None:
            raise AiosError(
                "DeepSpeed optimizer state is sharded: save it with rt.save()",
                "call rt.save() on every rank",
            )
        files = {
            name: torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data
            else torch.zeros(0, dtype=torch.uint8)
            for name, data in self._shards
        }
        self._shards = None
        return {
            "deepspeed": {
                "format": 1,
                "zero_stage": self.ds_config["zero_optimization"]["stage"] if self.ds_config else 0,
                "world_size": self.world_size,
                "files": files,
            }
        }

    def load_module_state_dict(self, module: torch.nn.Module, state: dict[str, Any]) -> None:
        stage = int(self.ds_config["zero_optimization"]["stage"]) if self.ds_config else 0
        if stage < 3:  # ZeRO-3 parameters are partitioned: engine.load_checkpoint restores them
            self.unwrap(module).load_state_dict(state)

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        module: torch.nn.Module | None = None,
    ) -> None:
        ds = state.get("deepspeed") if isinstance(state, dict) else None
        if ds is None:
            raise AiosError(
                "this checkpoint was not written under strategy deepspeed",
                "resume it with the strategy that wrote it, or start fresh with checkpoint.resume=false",
            )
        if int(ds.get("world_size", self.world_size)) != self.world_size:
            raise AiosError(
                f"this ZeRO checkpoint was written by {ds.get('world_size')} ranks, this run has {self.world_size}",
                "resume with the same number of processes (DeepSpeed's universal checkpoints convert between sizes)",
            )
        engine = self.ensure_engine()
        tmp = tempfile.mkdtemp(prefix="aios-ds-load-")
        try:
            root = os.path.join(tmp, TAG)
            for name, t in ds["files"].items():
                path = os.path.join(root, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(t.numpy().tobytes())
            load_path, _ = engine.load_checkpoint(
                tmp,
                tag=TAG,
                load_module_strict=True,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
            if load_path is None:
                raise AiosError(
                    "DeepSpeed could not load the ZeRO checkpoint",
                    "start fresh with checkpoint.resume=false",
                )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def teardown(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.destroy()  # releases DeepSpeed's hooks and buffers before the group goes
        super().teardown()

    # ---------------------------------------------------------------- diagnostics
    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["strategy"] = "deepspeed"
        if self.ds_config:
            z = self.ds_config["zero_optimization"]
            out["zero_stage"] = z["stage"]
            out["offload_optimizer"] = z.get("offload_optimizer", {}).get("device", "none")
            out["offload_param"] = z.get("offload_param", {}).get("device", "none")
            out["train_batch_size"] = self.ds_config["train_batch_size"]
        if self.engine is not None:
            out["skipped_steps"] = int(self.engine.skipped_steps)
            out["global_steps"] = int(self.engine.global_steps)
        return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
