"""The runtime API a training script uses: one script, every backend.

.. code-block:: python

    import aios

    rt = aios.init()                                  # settings from aios-run, or auto-detected
    model, opt, loader = rt.setup(model, opt, loader) # device, DDP, sharded loader
    rt.register("sched", scheduler)                   # anything else with state_dict()
    rt.resume()                                       # newest complete checkpoint, if any
    while rt.global_step < max_steps:
        for x, y in loader:
            with rt.accumulate(model), rt.autocast():
                loss = loss_fn(model(x), y)
                rt.backward(loss)
            if rt.step(opt):                          # reduce, clip, step, zero_grad, checkpoint
                rt.log({"loss": loss}, every=10)

How it resolves (once, at :func:`init`): the config comes from ``aios-run`` (``AIOS_RUN_CONFIG``)
or, under plain ``python``/``torchrun``, from ``AIOS_CONFIG``/``AIOS_*`` env vars; the backend
(``auto``: the highest-priority available) gives the :class:`aios.strategy.Strategy`
(``aios_make_strategy``), the :class:`aios.precision.Precision` (``aios_make_precision``, else
:func:`aios.precision.default_precision`), preemption watchers (``aios_preemption_watchers``) and
loggers (``aios_register_loggers``, built lazily on rank 0). The per-step path then calls the
strategy and precision objects directly; no plugin dispatch happens after :func:`init`.

Semantics worth knowing:

* ``step(opt)`` is the optimizer-step boundary: with ``grad_accum=N`` it steps on every N-th
  call (returning ``False`` otherwise), clips to ``grad_clip``, steps through the strategy and
  precision (fp16 overflow steps are skipped and counted), zeroes gradients, cuts the lazy graph
  (XLA), writes the periodic checkpoint, and acts on preemption notices.
* ``backward(loss)`` divides by ``grad_accum``; wrap micro-steps in ``accumulate(model)`` to skip
  the gradient all-reduce on all but the last micro-step (DDP ``no_sync``).
* ``save``/``resume`` are collective: every rank calls them (the automatic ones in ``step`` do).
  Rank 0 writes, every rank reads (the checkpoint dir must be shared between nodes: a URL or a
  shared file system). What is saved: model, optimizers, schedulers and registered objects, the
  step and accumulation counters, the data position of every loader, the precision state (loss
  scale), and the RNG states of Python, NumPy, torch CPU and the device, for every rank.
* Preemption: SIGTERM or a watcher notice sets a flag; at the next step boundary all ranks agree,
  write an emergency checkpoint and exit with :data:`aios.preemption.EXIT_PREEMPTED` (75).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import sys
import time
import warnings
from typing import Any

from aios.errors import AiosError, CheckpointError, ConfigError
from aios.preemption import EXIT_PREEMPTED, PreemptionMonitor

__all__ = ["Runtime", "init", "current", "EXIT_PREEMPTED"]

CONFIG_ENV = "AIOS_RUN_CONFIG"
BACKEND_ENV = "AIOS_RUN_BACKEND"

_current: Runtime | None = None
_NULL = contextlib.nullcontext()


def current() -> Runtime | None:
    """The runtime of this process, if :func:`init` was called."""
    return _current


# ------------------------------------------------------------------------------ config


def _drop_secrets(obj: Any) -> Any:
    from aios.config import is_secret

    if isinstance(obj, dict):
        return {k: _drop_secrets(v) for k, v in obj.items() if not is_secret(str(k))}
    return obj


def explicit_config_json(cfg: Any) -> str:
    """What ``aios-run`` passes to workers in ``AIOS_RUN_CONFIG``: the keys that were set
    (file, env, overrides, flags), without secret-looking keys."""
    return json.dumps(_drop_secrets(cfg.model_dump(mode="json", exclude_unset=True)))


def resolve_config(
    config: Any = None,
    defaults: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> Any:
    """The config for this process. Precedence: ``defaults`` (from the script) < what
    ``aios-run`` resolved (``AIOS_RUN_CONFIG``) or, without aios-run, ``AIOS_CONFIG`` file and
    ``AIOS_*`` env vars < ``overrides`` < ``flags`` (keyword arguments of :func:`init`)."""
    from aios.config import AiosConfigBase, build_model, deep_merge, parse_overrides, resolve

    if isinstance(config, AiosConfigBase):
        return config
    model = build_model()
    if isinstance(config, dict):
        explicit: dict[str, Any] = config
    elif os.environ.get(CONFIG_ENV):
        try:
            explicit = json.loads(os.environ[CONFIG_ENV])
        except ValueError:
            raise ConfigError(f"{CONFIG_ENV} is not valid JSON", "launch through aios-run or unset it") from None
    else:
        explicit = resolve(check_backend=False).model_dump(mode="json", exclude_unset=True)
    merged = deep_merge(defaults or {}, explicit)
    merged = deep_merge(merged, parse_overrides(overrides or []))
    merged = deep_merge(merged, {k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return model.model_validate(merged)
    except Exception:
        # one-line error naming the key: re-run through resolve()'s formatter
        from pydantic import ValidationError

        from aios.config import _format_error  # noqa: PLC0415

        try:
            model.model_validate(merged)
        except ValidationError as err:
            raise _format_error(err, model, merged, {}) from None
        raise


# ------------------------------------------------------------------------------ init


_failing = False  # set when an exception escapes the script (see _install_excepthook)


def _install_excepthook() -> None:
    """An :class:`AiosError` escaping the user's script (bad config, unavailable backend, the XLA
    compile guard's limit, a corrupt checkpoint) ends it with one line and the error's exit code
    (2), after the normal exit handlers; ``AIOS_DEBUG=1`` keeps the traceback."""
    previous = sys.excepthook
    if getattr(previous, "_aios", False):
        return

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        global _failing
        _failing = True  # the error stays the last line: no "where it went" lines after it
        if not issubclass(exc_type, AiosError) or os.environ.get("AIOS_DEBUG", "") not in ("", "0"):
            previous(exc_type, exc, tb)
            return
        rank = os.environ.get("RANK")
        where = f" (rank {rank})" if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""
        sys.stderr.write(f"aios: error{where}: {exc}\n")
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(getattr(exc, "exit_code", 2))

    hook._aios = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def init(
    config: Any = None,
    *,
    defaults: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    **flags: Any,
) -> Runtime:
    """Create (or return) this process's :class:`Runtime`.

    :param config: an ``AiosConfig`` or a dict of settings; normally omitted (settings come from
        ``aios-run`` or the environment).
    :param defaults: the script's own defaults, e.g. ``{"checkpoint": {"dir": "ckpt", "every":
        100}}``; anything set on the command line, in the config file or env wins over them.
    :param overrides: ``key=value`` strings.
    :param flags: top-level settings that win over everything (``precision="bf16-mixed"``).

    Calling :func:`init` again returns the same runtime (a process has one).
    """
    global _current
    if _current is not None and not _current._closed:
        return _current
    _install_excepthook()
    cfg = resolve_config(config, defaults, overrides, flags)
    from aios.plugins import get_registry

    reg = get_registry()
    requested = os.environ.get(BACKEND_ENV) or cfg.backend
    spec = reg.select(requested, config=cfg)
    backend = spec.name
    strategy = reg.call_first("aios_make_strategy", backend=backend, config=cfg)
    if strategy is None:
        raise AiosError(f"backend '{backend}' provides no training strategy", f"reinstall the plugin that registers it ({spec.plugin or 'unknown'})")
    strategy.setup_environment()
    precision = reg.call_first("aios_make_precision", backend=backend, precision=cfg.precision, config=cfg)
    if precision is None:
        from aios.precision import default_precision

        precision = default_precision(cfg.precision, strategy.autocast_device_type)
    watchers: list[Any] = []
    for plugin, result, exc in reg.call_all("aios_preemption_watchers", config=cfg):
        if exc is not None:
            warnings.warn(f"aios: plugin {plugin!r} failed to provide preemption watchers: {exc}", stacklevel=2)
        elif result:
            watchers.extend(result)
    rt = Runtime(cfg, backend, strategy, precision, watchers=watchers, registry=reg)
    _current = rt
    return rt


# ------------------------------------------------------------------------------ progress


class Progress:
    """Rank-0 progress: a rich bar on a terminal, a plain line every ``every`` steps otherwise."""

    def __init__(self, total: int, description: str, enabled: bool, every: int, start: int = 0) -> None:
        self.total = total
        self.enabled = enabled
        self.every = max(1, every)
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._start = start
        if enabled and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=total, completed=start, info="")
        self.description = description

    def update(self, step: int, **metrics: Any) -> None:
        if not self.enabled:
            return
        info = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif step % self.every == 0 or step == self.total:
            rate = (step - self._start) / max(1e-9, time.perf_counter() - self._t0)
            print(f"{self.description} {step}/{self.total} {info} ({rate:.2f} steps/s)", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _fmt(v: Any) -> str:
    if hasattr(v, "item"):
        v = v.item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ------------------------------------------------------------------------------ runtime


class Runtime:
    """Devices, ranks, setup, the step, collectives, checkpoints, logging. Build with
    :func:`aios.init`."""

    def __init__(self, config: Any, backend: str, strategy: Any, precision: Any, watchers: list[Any] | None = None, registry: Any = None) -> None:
        self.config = config
        self.backend = backend
        self.strategy = strategy
        self.precision = precision
        self._registry = registry
        self._closed = False
        self._t_init = time.perf_counter()
        self._step = 0
        self._micro = 0
        self._accum = int(config.grad_accum)
        self._clip = config.grad_clip
        self._ckpt_every = int(config.checkpoint.every) if config.checkpoint.dir else 0
        self._world = int(strategy.world_size)
        self._modules: list[Any] = []
        self._optimizers: list[Any] = []
        self._schedulers: list[Any] = []
        self._loaders: list[Any] = []
        self._objects: dict[str, Any] = {}
        self._loggers: list[Any] | None = None
        self._pending: str | None = None
        from aios.precision import Precision

        self._plain_autocast = type(precision).autocast is Precision.autocast
        self._saved_step: int | None = None
        self._store: Any = None
        self._resumed_from: str | None = None
        self.last_grad_norm: Any = None
        #: check for preemption (one tiny all-reduce with several ranks) every N steps
        self.preemption_check_every = 1
        from aios.records import RunRecord, StepTimer, run_id_from_env

        self.timer = StepTimer(self._t_init)
        self._stamp = self.timer.append
        from aios.strategy import Strategy

        st = type(strategy)
        self._mark_step = None if st.mark_step is Strategy.mark_step else strategy.mark_step
        self._on_step_end = None if st.on_step_end is Strategy.on_step_end else strategy.on_step_end
        self._optimizer_step = strategy.optimizer_step
        # Specialise the hot path once: when the strategy and precision use the base behaviour
        # (plain loss.backward(), plain optimizer.step()), call torch directly.
        from aios.precision import Precision as _BasePrecision
        from aios.strategies.ddp import DDPStrategy

        pt = type(precision)
        self._direct_backward = st.backward is Strategy.backward and pt.backward is _BasePrecision.backward
        self._direct_step = st.optimizer_step is DDPStrategy.optimizer_step and pt.step is _BasePrecision.step
        self.record = RunRecord(config.logging.run_dir, run_id_from_env(), active=self.is_main)
        self.preemption = PreemptionMonitor()
        self.preemption.install()
        self.preemption.start_watchers(watchers or [], on_error=lambda m: warnings.warn("aios: " + m, stacklevel=2))
        if config.deterministic:
            self._deterministic()
        if config.seed is not None:
            self.seed_everything(config.seed)
        if config.checkpoint.dir and self.is_main:
            self.checkpoints.check_writable()
        self._write_start_record()
        atexit.register(self._atexit)

    # ---------------------------------------------------------------- identity
    @property
    def device(self) -> Any:
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
    def global_step(self) -> int:
        """Optimizer steps taken (restored by :meth:`resume`)."""
        return self._step

    @property
    def run_dir(self) -> str:
        return self.record.dir

    @property
    def should_stop(self) -> bool:
        """A preemption notice arrived on this rank (the step boundary acts on it)."""
        return self.preemption.requested

    def __repr__(self) -> str:
        return f"Runtime(backend={self.backend!r}, device={self.device}, rank={self.rank}/{self.world_size}, precision={self.precision.name!r})"

    # ---------------------------------------------------------------- setup
    def setup(self, *objects: Any, shuffle: bool | None = None) -> Any:
        """Set up models, optimizers, LR schedulers and data loaders, in any order; returns them
        in the same order (one object alone when one was given). Models go to the device, get
        the precision conversion and the data-parallel wrapper; optimizers are checked by the
        backend; loaders are sharded by rank and yield batches on the device; schedulers are
        registered for checkpoints."""
        import torch

        out: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                out.append(self.setup_module(obj))
            elif isinstance(obj, torch.optim.Optimizer):
                out.append(self.setup_optimizer(obj))
            elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (hasattr(obj, "state_dict") and hasattr(obj, "optimizer") and hasattr(obj, "step") and not hasattr(obj, "__iter__")):
                self._schedulers.append(obj)
                out.append(obj)
            elif hasattr(obj, "__iter__"):
                out.append(self.setup_dataloader(obj, shuffle=shuffle))
            else:
                raise AiosError(f"runtime.setup() got a {type(obj).__name__}", "pass torch modules, optimizers, LR schedulers or data loaders")
        return out[0] if len(out) == 1 else tuple(out)

    def setup_module(self, module: Any) -> Any:
        wrapped = self.strategy.setup_module(module, self.precision)
        self._modules.append(wrapped)
        return wrapped

    def setup_optimizer(self, optimizer: Any) -> Any:
        opt = self.strategy.setup_optimizer(optimizer)
        self._optimizers.append(opt)
        return opt

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:
        wrapped = self.strategy.setup_dataloader(loader, shuffle=shuffle)
        if hasattr(wrapped, "owner"):
            wrapped.owner = self
        self._loaders.append(wrapped)
        return wrapped

    def setup_dataloaders(self, *loaders: Any, shuffle: bool | None = None) -> Any:
        out = [self.setup_dataloader(ld, shuffle=shuffle) for ld in loaders]
        return out[0] if len(out) == 1 else tuple(out)

    def register(self, name: str, obj: Any) -> Any:
        """Include ``obj`` (anything with ``state_dict``/``load_state_dict``, e.g. a scheduler or
        an EMA) in checkpoints under ``name``."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise AiosError(f"runtime.register({name!r}, ...) needs an object with state_dict() and load_state_dict()", "wrap plain values in a small class or pass them as save(extra=...)")
        self._objects[name] = obj
        return obj

    def unwrap(self, module: Any) -> Any:
        """The user's module under the data-parallel wrapper."""
        return self.strategy.unwrap(module)

    # ---------------------------------------------------------------- the step
    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Autocast for the configured precision (a no-op for fp32 and bf16-true)."""
        if self._plain_autocast:
            return _NULL
        return self.precision.autocast()

    def accumulate(self, module: Any | None = None) -> contextlib.AbstractContextManager[None]:
        """Wrap forward+backward of one micro-step: gradient sync is skipped unless this is the
        last micro-step before an optimizer step."""
        if self._pending:
            self.run_pending()
        if self._accum == 1 or (self._micro + 1) % self._accum == 0:
            return _NULL
        module = module if module is not None else (self._modules[0] if self._modules else None)
        return self.strategy.no_sync(module, True)

    def backward(self, loss: Any, module: Any | None = None) -> None:
        """``loss.backward()`` through the precision policy (loss scaling); divided by
        ``grad_accum`` when accumulating."""
        if self._pending:
            self.run_pending()
        if self._accum > 1:
            loss = loss / self._accum
        self._micro += 1
        if self._direct_backward:
            loss.backward()
        else:
            self.strategy.backward(loss, module, self.precision)

    def clip_gradients(self, module: Any, optimizer: Any, max_norm: float) -> Any:
        """Clip the global gradient norm now (unscaling first); returns the norm."""
        return self.strategy.clip_grad_norm(module, optimizer, max_norm, self.precision)

    def step(self, optimizer: Any | None = None) -> bool:
        """The optimizer-step boundary (see the module docstring). Returns whether an optimizer
        step happened (False on accumulation micro-steps and on fp16-overflow skips)."""
        if self._micro % self._accum:
            return False
        precision = self.precision
        if optimizer is not None:
            if self._clip is not None:
                self.last_grad_norm = self.strategy.clip_grad_norm(self._modules[0] if self._modules else None, optimizer, self._clip, precision)
            if self._direct_step:
                optimizer.step()
                taken = True
            else:
                taken = self._optimizer_step(optimizer, precision)
            optimizer.zero_grad(set_to_none=True)
        else:
            taken = True
            for opt in self._optimizers:
                if self._clip is not None:
                    self.last_grad_norm = self.strategy.clip_grad_norm(self._modules[0] if self._modules else None, opt, self._clip, precision)
                taken = self._optimizer_step(opt, precision) and taken
                opt.zero_grad(set_to_none=True)
        if self._mark_step is not None:
            self._mark_step()
        self._step = step = self._step + 1
        if self._on_step_end is not None:
            self._on_step_end(step)
        self._stamp(time.perf_counter())
        # -- preemption: every rank must take the same decision at the same step. The checkpoint
        # itself is written at the boundary: when the next batch is requested from an aios loader
        # (or at the next backward/accumulate/close), so that what the script does after step()
        # (scheduler.step(), EMA updates) is in it and the data position is exact.
        if self._world > 1:
            if step % self.preemption_check_every == 0 and self.strategy.any_rank(self.preemption.reason is not None):
                self._pending = "preempt"
        elif self.preemption.reason is not None:
            self._pending = "preempt"
        if self._ckpt_every and step % self._ckpt_every == 0 and not self._pending:
            self._pending = "save"
        return taken

    def run_pending(self) -> None:
        """Write the checkpoint (or act on the preemption) decided at the last step boundary.
        Called by aios loaders before the next batch and by backward/accumulate/close."""
        pending, self._pending = self._pending, None
        if pending == "save":
            self.save()
        elif pending == "preempt":
            self._preempted()

    # ---------------------------------------------------------------- printing and logging
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed)."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def _get_loggers(self) -> list[Any]:
        if self._loggers is None:
            self._loggers = []
            if self.is_main and self._registry is not None:
                for name, spec in self._registry.loggers.items():
                    try:
                        if spec.enabled(self.config):
                            self._loggers.append(spec.factory(self.config, self.record.dir))
                    except Exception as exc:  # noqa: BLE001 - a logger must never stop training
                        warnings.warn(f"aios: logger {name!r} disabled: {type(exc).__name__}: {exc}", stacklevel=3)
        return self._loggers

    def log(self, metrics: dict[str, Any], step: int | None = None, every: int | None = None) -> None:
        """Log scalar metrics on rank 0 to the run record and the configured loggers
        (TensorBoard, W&B). Tensors are converted with ``.item()`` (a device sync on XLA: log
        every few steps, e.g. ``every=10``)."""
        step = self._step if step is None else step
        if not self.is_main or (every and step % every):
            return
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self.record.log_metrics(values, step)
        for lg in self._get_loggers():
            try:
                lg.log(values, step)
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"aios: logger {getattr(lg, 'name', lg)!r} failed: {exc}", stacklevel=2)

    def progress(self, total: int, description: str = "train") -> Progress:
        """A progress bar on rank 0 (plain lines when not on a terminal)."""
        every = max(self.config.logging.every, total // 20)  # plain lines: about 20 per run
        return Progress(total, description, self.is_main and self.config.logging.progress, every, start=self._step)

    # ---------------------------------------------------------------- collectives
    def barrier(self) -> None:
        self.strategy.barrier()

    def all_reduce(self, value: Any, op: str = "mean") -> Any:
        """Reduce a tensor (or a Python number) over ranks; returns a new tensor."""
        import torch

        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None, device=self.device)
        return self.strategy.all_reduce(value, op)

    def all_gather(self, tensor: Any) -> Any:
        return self.strategy.all_gather(tensor)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.strategy.broadcast_object(obj, src)

    def gather_object(self, obj: Any) -> list[Any]:
        fn = getattr(self.strategy, "gather_object", None)
        if fn is not None:
            return fn(obj)
        if self._world == 1:
            return [obj]
        raise AiosError(f"the {self.backend} strategy cannot gather Python objects", "gather tensors with all_gather instead")

    # ---------------------------------------------------------------- seeding and RNG
    def seed_everything(self, seed: int) -> None:
        """Seed Python, NumPy, torch and the device RNG (the same seed on every rank)."""
        import torch

        random.seed(seed)
        with contextlib.suppress(ImportError):
            import numpy as np

            np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.strategy.seed(seed)

    def _deterministic(self) -> None:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        if hasattr(torch.backends, "cudnn"):
            torch.backends.cudnn.benchmark = False

    def rng_state(self) -> dict[str, Any]:
        import torch

        state: dict[str, Any] = {"python": _py_rng_to_plain(random.getstate()), "torch": torch.get_rng_state()}
        with contextlib.suppress(ImportError):
            import numpy as np

            s = np.random.get_state()
            state["numpy"] = [s[0], torch.from_numpy(s[1].astype("int64")), int(s[2]), int(s[3]), float(s[4])]
        state["device"] = self.strategy.rng_state()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        import torch

        if "python" in state:
            v, internal, gauss = state["python"]
            random.setstate((v, tuple(internal), gauss))
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "numpy" in state:
            with contextlib.suppress(ImportError):
                import numpy as np

                name, keys, pos, has_gauss, cached = state["numpy"]
                np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
        if state.get("device"):
            self.strategy.set_rng_state(state["device"])

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoints(self) -> Any:
        """The :class:`aios.checkpoint.CheckpointStore` of ``checkpoint.dir``."""
        if self._store is None:
            if not self.config.checkpoint.dir:
                raise CheckpointError("no checkpoint directory is configured", "set checkpoint.dir=PATH_OR_URL (flag, config file or AIOS_CHECKPOINT__DIR)")
            from aios.checkpoint import CheckpointStore

            self._store = CheckpointStore(self.config.checkpoint.dir, keep=self.config.checkpoint.keep)
        return self._store

    def state_dict(self) -> dict[str, Any]:
        """The full training state of this process (model/optimizer tensors on CPU)."""
        s = self.strategy
        module = self._modules[0] if self._modules else None
        return {
            "format": 1,
            "step": self._step,
            "micro": self._micro,
            "modules": [s.module_state_dict(m) for m in self._modules],
            "optimizers": [s.optimizer_state_dict(o, module) for o in self._optimizers],
            "schedulers": [sch.state_dict() for sch in self._schedulers],
            "loaders": [ld.state_dict() if hasattr(ld, "state_dict") else None for ld in self._loaders],
            "objects": {k: v.state_dict() for k, v in self._objects.items()},
            "precision": self.precision.state_dict(),
            "world_size": self._world,
            "backend": self.backend,
        }

    def save(self, path: str | None = None, extra: dict[str, Any] | None = None) -> str | None:
        """Write a checkpoint of the full state (collective: call it on every rank). Without
        ``path`` it goes to ``checkpoint.dir`` as ``ckpt-<step>``, atomically, keeping the
        newest ``checkpoint.keep``. Returns the checkpoint path on rank 0."""
        t0 = time.perf_counter()
        rngs = self.gather_object(self.rng_state()) if self._world > 1 and hasattr(self.strategy, "gather_object") else [self.rng_state()]
        written: str | None = None
        error: BaseException | None = None
        if self.strategy.saves_on_this_rank():
            state = self.state_dict()
            state["rng"] = rngs
            state["extra"] = extra or {}
            meta = {"world_size": self._world, "backend": self.backend, "run_id": self.record.run_id}
            try:
                if path is None:
                    written = self.checkpoints.save(self._step, state, meta)
                else:
                    from aios.checkpoint import CheckpointStore, ckpt_name

                    parent, _, name = path.rstrip("/").rpartition("/")
                    store = CheckpointStore(parent or ".", keep=10**9)
                    written = store.save(self._step, state, meta)
                    if not name.startswith("ckpt-") or name != ckpt_name(self._step):
                        written = _rename_ckpt(store, written, path)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the barrier
                error = exc
        self.barrier()
        if error is not None:
            raise error
        self._saved_step = self._step
        if written:
            dt = time.perf_counter() - t0
            self.record.diag["checkpoints"].append({"step": self._step, "path": written, "seconds": round(dt, 4)})
            self._write_diagnostics()
        return written

    def load(self, path: str | int | None = None, strict: bool = True) -> dict[str, Any]:
        """Restore the full state from a checkpoint (a step number, a directory/URL, or the
        newest complete one in ``checkpoint.dir``). Collective. Returns the ``extra`` dict."""
        from aios.checkpoint import CheckpointStore

        if isinstance(path, str) and ("/" in path or "://" in path) and not (self.config.checkpoint.dir and path.startswith(str(self.config.checkpoint.dir))):
            parent = path.rstrip("/").rpartition("/")[0] or "."
            store = CheckpointStore(parent)
        else:
            store = self.checkpoints
        info = store.resolve(path)
        state = store.load(info)
        self.load_state_dict(state, strict=strict)
        self._resumed_from = store.display(info.path)
        return state.get("extra", {})

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        s = self.strategy
        counts = {"modules": len(self._modules), "optimizers": len(self._optimizers), "schedulers": len(self._schedulers)}
        for key, n in counts.items():
            if len(state.get(key, [])) != n:
                raise CheckpointError(
                    f"the checkpoint holds {len(state.get(key, []))} {key} but this script set up {n}",
                    "set up the same models/optimizers/schedulers as the run that saved it, or start fresh with checkpoint.resume=false",
                )
        module = self._modules[0] if self._modules else None
        try:
            for m, st in zip(self._modules, state["modules"], strict=True):
                if strict:
                    s.load_module_state_dict(m, st)
                else:
                    s.unwrap(m).load_state_dict(st, strict=False)
            for o, st in zip(self._optimizers, state["optimizers"], strict=True):
                s.load_optimizer_state_dict(o, st, module)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"the checkpoint does not fit this model/optimizer ({str(exc).splitlines()[0][:200]})",
                "use the model definition that saved it, or start fresh with checkpoint.resume=false",
            ) from None
        for sch, st in zip(self._schedulers, state["schedulers"], strict=True):
            sch.load_state_dict(st)
        for ld, st in zip(self._loaders, state.get("loaders", []), strict=False):
            if st is not None and hasattr(ld, "load_state_dict"):
                ld.load_state_dict(st)
        for k, st in state.get("objects", {}).items():
            if k in self._objects:
                self._objects[k].load_state_dict(st)
        self.precision.load_state_dict(state.get("precision", {}))
        self._step = int(state.get("step", 0))
        self._saved_step = self._step
        self._micro = int(state.get("micro", 0))
        rngs = state.get("rng") or []
        if rngs:
            self.set_rng_state(rngs[self.rank % len(rngs)])

    def resume(self) -> int:
        """Load the newest complete checkpoint in ``checkpoint.dir`` when ``checkpoint.resume``
        is on; returns the step to continue from (0 when starting fresh). Incomplete checkpoints
        (interrupted saves) are skipped with a warning; a corrupt one is an error."""
        if not self.config.checkpoint.dir or not self.config.checkpoint.resume:
            return self._step
        store = self.checkpoints
        chosen = None
        err: str | None = None
        if self.is_main:
            try:
                info = store.latest()
                chosen = info.path if info else None
            except CheckpointError as exc:
                err = exc.one_line()
        chosen, err = self.broadcast((chosen, err))
        if err:
            raise CheckpointError(err)
        if chosen is None:
            return self._step
        self.load(chosen if "://" not in self.config.checkpoint.dir else store.display(chosen))
        self.print(f"aios: resumed from {self._resumed_from} at step {self._step}")
        self.record.event("resume", path=self._resumed_from, step=self._step)
        return self._step

    # ---------------------------------------------------------------- preemption
    def _preempted(self) -> None:
        reason = self.preemption.reason or "notice on another rank"
        grace = self.config.checkpoint.grace_seconds
        path = None
        self.print(f"aios: preemption ({reason}) at step {self._step}: writing emergency checkpoint")
        if self.config.checkpoint.dir:
            path = self.save()
        elapsed = self.preemption.elapsed()
        event = {"reason": reason, "step": self._step, "checkpoint": path, "seconds_since_notice": round(elapsed, 3), "grace_seconds": grace}
        self.record.diag["preemptions"].append(event)
        status_dir = os.environ.get("AIOS_RUN_STATUS_DIR")
        if status_dir:
            with contextlib.suppress(OSError):
                with open(os.path.join(status_dir, f"rank{self.rank}"), "w") as f:
                    f.write(f"preempted {path or ''}")
        if elapsed > grace:
            self.print(f"aios: warning: emergency checkpoint took {elapsed:.1f}s, more than checkpoint.grace_seconds={grace}")
        if self.config.checkpoint.dir:
            self.print(f"aios: checkpoint for step {self._step} written; relaunch the same command to resume (exit {EXIT_PREEMPTED})")
        else:
            self.print(f"aios: no checkpoint.dir configured, progress is lost; exiting with {EXIT_PREEMPTED}")
        self.close(status="preempted")
        raise SystemExit(EXIT_PREEMPTED)

    # ---------------------------------------------------------------- records and shutdown
    def _write_start_record(self) -> None:
        if not self.is_main:
            return
        from aios.records import versions

        self.record.write_config(self.config)
        self.record.diag.update({
            "backend": self.backend, "strategy": type(self.strategy).__name__, "precision": self.precision.name,
            "world_size": self._world, "device": str(self.device), "versions": versions(),
        })
        try:
            rep = self._registry.call_first("aios_discover_devices", backend=self.backend, config=self.config) if self._registry else None
            if rep is not None:
                self.record.diag["devices"] = rep.to_dict()
        except Exception as exc:  # noqa: BLE001
            self.record.diag["devices"] = {"error": str(exc)}
        self.record.write_diagnostics(status="running")

    def _write_diagnostics(self, **extra: Any) -> None:
        if not self.is_main:
            return
        try:
            metrics = self.strategy.metrics()
        except Exception as exc:  # noqa: BLE001
            metrics = {"error": str(exc)}
        self.record.write_diagnostics(
            steps=self._step, step_timing=self.timer.summary(self._step), backend_metrics=metrics,
            skipped_steps=getattr(self.precision, "skipped_steps", 0), resumed_from=self._resumed_from, **extra,
        )

    def summary(self) -> dict[str, Any]:
        """Steps and timing of this process so far."""
        t = self.timer.summary()
        return {"steps": self._step, "elapsed_s": time.perf_counter() - self._t_init, "mean_step_s": t.get("mean_s")}

    def close(self, status: str = "finished") -> None:
        """Write the run record, close loggers, stop watchers, leave the process group."""
        global _current
        if self._closed:
            return
        if status == "finished" and self.config.checkpoint.dir and self._step and self._saved_step != self._step:
            self._pending = None
            self.save()  # the final checkpoint (checkpoint.every=0 means: only at the end)
        self._pending = None
        self._closed = True
        self.preemption.uninstall()
        with contextlib.suppress(Exception):
            self._write_diagnostics(status=status, finished=time.time())
        for lg in self._loggers or []:
            with contextlib.suppress(Exception):
                lg.close()
        self.record.close()
        if self.is_main and status != "failed" and not _failing:
            self._print_locations()
        if status in ("finished", "preempted") and self._world > 1:
            with contextlib.suppress(Exception):
                self.strategy.barrier()  # no rank leaves the group while a peer still talks to it
        with contextlib.suppress(Exception):
            self.strategy.teardown()
        if _current is self:
            _current = None
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)

    def _print_locations(self) -> None:
        """Where this run's record and checkpoints went: one line each, rank 0, at the end."""
        with contextlib.suppress(Exception):
            ckpt = self.config.checkpoint.dir or "none (set checkpoint.dir to keep them)"
            print(f"aios: run record: {self.run_dir}", file=sys.stderr, flush=True)
            print(f"aios: checkpoints: {ckpt}", file=sys.stderr, flush=True)

    def _atexit(self) -> None:
        self.close(status="exited")

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(status="failed" if exc_type and exc_type is not SystemExit else "finished")


def _py_rng_to_plain(state: tuple) -> list[Any]:
    v, internal, gauss = state
    return [v, list(internal), gauss]


def _rename_ckpt(store: Any, written: str, target: str) -> str:
    """Move a just-written checkpoint to an explicit target path (local only)."""
    if store.local and os.path.abspath(written) != os.path.abspath(target):
        if os.path.exists(target):
            raise CheckpointError(f"'{target}' already exists", "choose a new path or delete it")
        os.rename(written, target)
        return target
    return written
