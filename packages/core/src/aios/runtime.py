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
(``auto``: the highest-priority available) gives the :class:`aios.strategies.base.Strategy`
(its registered :class:`aios.types.StrategySpec`), the :class:`aios.strategies.precision.Precision`
(the strategy's or backend's ``precision``, else
:func:`aios.strategies.precision.default_precision`), preemption watchers (``aios_preemption_watchers``) and
loggers (``aios_register_loggers``, built lazily on rank 0). The per-step path then calls the
strategy and precision objects directly; no plugin dispatch happens after :func:`init`.

Semantics worth knowing:

* ``step(opt)`` is the optimizer-step boundary: with ``grad_accum=N`` it steps on every N-th
  call (returning ``False`` otherwise), clips to ``grad_clip``, steps through the strategy and
  precision (fp16 overflow steps are skipped and counted), zeroes gradients, cuts the lazy graph
  (XLA), decides that the periodic checkpoint is due and acts on preemption notices. The
  checkpoint is cut at the next batch of an aios loader, else at the next ``accumulate``/
  ``backward`` with the RNG streams of the step (see
  :meth:`aios.checkpoint.manager.CheckpointManager.at_batch_boundary`).
* ``backward(loss)`` divides by ``grad_accum`` (``divide=False``: the script already did);
  wrap micro-steps in ``accumulate(model)`` to skip the gradient all-reduce on all but the last
  micro-step (DDP ``no_sync``). ``grad_accum`` may be derived from ``global_batch`` and
  ``micro_batch`` (:func:`derive_grad_accum`).
* ``save``/``resume`` are collective: every rank calls them (the automatic ones in ``step`` do).
  Rank 0 writes, every rank reads (the checkpoint dir must be shared between nodes: a URL or a
  shared file system). What is saved: model, optimizers, schedulers and registered objects, the
  step and accumulation counters, the data position of every loader, the precision state (loss
  scale), and the RNG states of Python, NumPy, torch CPU and the device, for every rank.
* Preemption: SIGTERM or a watcher notice sets a flag; at the next step boundary all ranks agree,
  write an emergency checkpoint and exit with :data:`aios.resilience.notices.EXIT_PREEMPTED` (75).
* ``resume`` takes the most recently written checkpoint of ``checkpoint.dir`` and says which
  (run, step, world size, backend); one written at another shape (world size, mesh, strategy,
  backend, format) resumes too, with one line saying what changed (``checkpoint.reshard=false``
  refuses it; see :meth:`aios.checkpoint.manager.CheckpointManager.resume`).
  ``checkpoint.keep`` counts the run lineage's checkpoints only; one run writes to a
  checkpoint dir at a time (see :mod:`aios.checkpoint`).

The parts: :class:`aios.checkpoint.state.TrainingState` (registered objects, counters, state dict, RNG),
:class:`aios.checkpoint.manager.CheckpointManager` (save/load/resume, the boundary save, preemption
save, lineage, lock; pluggable checkpoint formats), :class:`aios.runrecord.records.RunRecord`,
:class:`aios.resilience.notices.PreemptionMonitor`; :class:`Runtime` is the facade over them and the hot
path. ``Runtime(...)`` has no side effects; :meth:`Runtime.start` (called by :func:`init`) does
them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from aios.checkpoint.formats.dcp_process import fork_standby, standby_wanted
from aios.checkpoint.manager import CheckpointManager
from aios.checkpoint.state import TrainingState
from aios.checkpoint.surface import Checkpoints
from aios.config.process import explicit_config_json, resolve_config
from aios.data import workers as loader_workers
from aios.data.loaders import DeviceLoader
from aios.errors import AiosError, ConfigError
from aios.ft import data as ft_data
from aios.ft.replica import Replica
from aios.ft.replica import from_env as ft_group_from_env
from aios.launcher import excepthook
from aios.launcher import status as rank_status
from aios.launcher.contract import BACKEND_ENV
from aios.launcher.worker import watch_launcher
from aios.plugins.registry import get_registry
from aios.resilience import emergency, naming
from aios.resilience.notices import (
    EXIT_PREEMPTED,
    DeadlineWatcher,
    PreemptionMonitor,
    effective_grace,
)
from aios.resilience.watchdog import start_sidecar
from aios.resilience.workers import progress_stamp, register_worker, worker_closing
from aios.runrecord import attempt
from aios.runrecord.progress import Progress
from aios.runrecord.records import RunRecord, StepTimer, run_id_from_env
from aios.strategies import wiring
from aios.strategies.base import Strategy
from aios.strategies.precision import Precision
from aios.strategies.ranks import Ranks
from aios.strategies.wiring import derive_grad_accum, script_seed

if TYPE_CHECKING:
    import torch

    from aios.config.settings import AiosConfigBase
    from aios.plugins.registry import Registry
    from aios.types import Notice

__all__ = [
    "EXIT_PREEMPTED",
    "Progress",
    "Runtime",
    "current",
    "derive_grad_accum",
    "explicit_config_json",
    "init",
    "resolve_config",
]

_current: Runtime | None = None
_NULL = contextlib.nullcontext()


def current() -> Runtime | None:
    """The runtime of this process, if :func:`init` was called."""
    return _current


# ------------------------------------------------------------------------------ init


def init(
    config: AiosConfigBase | dict[str, Any] | None = None,
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
    excepthook.install()
    naming.refuse_rewritten_launch_env()
    cfg = resolve_config(config, defaults, overrides, flags)
    if cfg.ft.replica_groups > 1 and ft_group_from_env() is None:
        # the groups are aios-run's: under another launcher the setting would do nothing
        raise ConfigError(
            f"ft.replica_groups={cfg.ft.replica_groups} is set, but this process was not "
            "started in a replica group (aios-run starts them)",
            "run it with aios-run (over several hosts, on each: --nnodes H --node-rank K "
            "--master-addr A --master-port P) or with aios launch --env "
            "AIOS_FT__REPLICA_GROUPS=G, which start the groups; or drop ft.replica_groups",
        )
    if register_worker():  # under aios-run: step progress and stack dumps for its watchdog
        record = os.path.abspath(os.path.join(cfg.logging.run_dir, run_id_from_env()))
        start_sidecar(cfg.watchdog, record)  # a cluster job's torchrun: the watchdog beside it
    reg = get_registry()
    parts = wiring.build(reg, cfg, os.environ.get(BACKEND_ENV) or cfg.backend)
    strategy = parts.strategy
    _fork_checkpoint_standby(cfg, strategy)  # before any thread of ours and the process group
    watch_launcher()  # started by aios-run: never outlive it (see aios.launcher.worker)
    strategy.setup_environment()
    # init_process_group wrapped the excepthook: one rank prefix, the launcher's
    sys.excepthook = excepthook.without_torch_prefix(sys.excepthook)
    rank_status.mark_joined(strategy.world_size)
    derive_grad_accum(cfg, strategy)
    precision = wiring.precision_for(reg, cfg, parts)
    watchers = wiring.preemption_watchers(reg, cfg)
    rt = Runtime(cfg, parts.backend.name, strategy, precision, watchers=watchers, registry=reg)
    if ft_group_from_env() is not None:  # a replica group of aios-run (aios.ft)
        rt.replica = Replica(cfg, rt.training, strategy)
        rt.replica.attach(rt.checkpointer)  # one group writes the run's checkpoints
        rt.replica.end_alone = rt._end_alone  # restarted after the others finished
        if rt.replica.group:  # each group's rank 0 keeps its own record beside group 0's
            rt.record.dir = os.path.join(rt.record.dir, f"group{rt.replica.group}")
        rt.replica.start()
    _cap_grace(rt)
    _current = rt
    try:
        rt.start()
    except BaseException:
        _current = None
        with contextlib.suppress(Exception):
            rt.close(status="failed")
        raise
    return rt


def _fork_checkpoint_standby(cfg: AiosConfigBase, strategy: Strategy) -> None:
    """Fork DCP's checkpoint process now, while this process may still fork safely, when this
    run's background saves will need it (:func:`aios.checkpoint.formats.dcp_process.fork_standby`)."""
    ck = cfg.checkpoint
    device = strategy.accelerator.device_type if strategy.accelerator else None
    if standby_wanted(
        directory=ck.dir,
        async_save=ck.async_save,
        async_writer=ck.async_writer,
        fmt=strategy.checkpoint_format,
        device_type=device,
    ):
        fork_standby()


def _cap_grace(rt: Runtime) -> None:
    """The grace a SIGTERM's deadline gets: ``checkpoint.grace_seconds``, capped by what the
    platform gives (said once on rank 0 when it caps)."""
    configured = rt.config.checkpoint.grace_seconds
    grace, capped = effective_grace(configured)
    rt.preemption.grace = grace
    if capped and rt.is_main:
        print(
            f"aios: checkpoint.grace_seconds={configured:g} is more than this "
            f"platform gives after SIGTERM ({capped}): a SIGTERM's deadline is {grace:g}s",
            file=sys.stderr,
            flush=True,
        )


# ------------------------------------------------------------------------------ runtime


class Runtime(Ranks, Checkpoints):
    """Devices, ranks, setup, the step, collectives, checkpoints, logging. Build with
    :func:`aios.init`. The placement answers and collectives are
    :class:`aios.strategies.ranks.Ranks`'s, the checkpoint surface
    :class:`aios.checkpoint.surface.Checkpoints`'s."""

    def __init__(
        self,
        config: AiosConfigBase,
        backend: str,
        strategy: Strategy,
        precision: Precision,
        watchers: list[Any] | None = None,
        *,
        registry: Registry,
    ) -> None:
        # No side effects here (no files, signal handlers or threads): see start().
        self.config = config
        self.backend = backend
        self.strategy = strategy
        self.precision = precision
        self._registry = registry
        self._watchers = list(watchers or [])
        self._started = False
        self._closed = False
        self._checked_saves = False
        self._t_init = time.perf_counter()
        self._accum = int(config.grad_accum)
        self._clip = config.grad_clip
        self._world = int(strategy.world_size)
        self._loggers: list[Any] | None = None
        #: registered objects, counters, state dict and RNG (:mod:`aios.checkpoint.state`)
        self.training = TrainingState(strategy, precision, backend)
        self.last_grad_norm: Any = None
        #: check for preemption (one tiny all-reduce with several ranks) every N steps
        self.preemption_check_every = 1
        self.timer = StepTimer(self._t_init)
        # the step's time stamp, also reported to aios-run's watchdog (aios.resilience.workers)
        self._stamp = progress_stamp(self.timer.append)
        self._bind(strategy, precision)
        self.record = RunRecord(config.logging.run_dir, run_id_from_env(), active=self.is_main)
        #: notices (signals with the platform's grace as deadline, watchers): :mod:`aios.resilience.notices`
        self.preemption = PreemptionMonitor(
            grace=float(config.checkpoint.grace_seconds),
            lead=lambda: self._notice_lead(),
            on_defer=self._notice_deferred,
        )
        #: save/load/resume, the pending boundary save, lineage and lock (:mod:`aios.checkpoint.manager`)
        self.checkpointer = CheckpointManager(
            config,
            strategy,
            self.training,
            self.record,
            backend,
            print_fn=self.print,
            formats=registry.checkpoint_formats,
        )
        self.checkpointer.on_preempt = self._preempted
        self.checkpointer.step_time = self._recent_step_time
        self.checkpointer.on_saved = lambda: self._write_diagnostics(status="running")
        self._ckpt = self.checkpointer
        #: this rank's replica group under ``ft.replica_groups`` (:mod:`aios.ft.replica`)
        self.replica: Replica | None = None
        #: the step clock (monotonic seconds; tests inject one, with ``checkpointer.clock``)
        self.clock: Callable[[], float] = time.perf_counter

    def _bind(self, strategy: Strategy, precision: Precision) -> None:
        """Use ``strategy`` and ``precision``, specialising the hot path once: when they use the
        base behaviour (plain loss.backward(), plain optimizer.step()), call torch directly."""
        self.strategy, self.precision = strategy, precision
        st, pt = type(strategy), type(precision)
        self._plain_autocast = pt.autocast is Precision.autocast
        self._mark_step = None if st.mark_step is Strategy.mark_step else strategy.mark_step
        self._on_step_end = None if st.on_step_end is Strategy.on_step_end else strategy.on_step_end
        self._optimizer_step = strategy.optimizer_step
        self._direct_backward = (
            st.backward is Strategy.backward and pt.backward is Precision.backward
        )
        self._direct_step = strategy.plain_step and pt.step is Precision.step

    def start(self) -> Runtime:
        """The side effects of a runtime (called once by :func:`init`): the run record, signal
        handlers and preemption watchers, seeding, the checkpoint directory's check and writer
        lock (collective), and the exit handler."""
        if self._started:
            return self
        self._started = True
        config = self.config
        self.record.start()
        self.preemption.install()
        for w in self._watchers:  # core's known-end source (aios_preemption_watchers)
            if isinstance(w, DeadlineWatcher):
                w.lead = self._notice_lead
        loader_workers.install()  # forked DataLoader workers leave notices to this rank
        self.preemption.start_watchers(
            self._watchers, on_error=lambda m: warnings.warn("aios: " + m, stacklevel=2)
        )
        if config.deterministic:
            self.training.deterministic()
        self._seed_unless_the_script_did()
        atexit.register(self._atexit)
        self.checkpointer.start()
        self._write_start_record()
        return self

    def _seed_unless_the_script_did(self) -> None:
        """Seed every generator with ``seed``, unless the script seeded torch before
        :func:`init` and ``seed`` was not set (then the script's seeds stay). A ``seed`` set in
        the config (flag, file, env, ``defaults=``) replaces the script's, and rank 0 says so
        in one line."""
        seed = self.config.seed
        if seed is None:
            return
        script = script_seed()
        if script is not None and "seed" not in self.config.model_fields_set:
            return  # the script's own seed (torch.manual_seed before aios.init) is kept
        if script is not None and script != seed:
            self.print(
                f"aios: seed={seed} (config) replaces the seed the script set "
                f"(torch.manual_seed({script})); leave seed unset to keep the script's"
            )
        self.seed_everything(seed)

    def _recent_step_time(self) -> float | None:
        """The median of the recent optimizer steps' wall times (None before two steps)."""
        return emergency.recent_step_time(self.timer.stamps)

    def _notice_deferred(self, notice: Notice, ahead: float) -> None:
        self.print(emergency.deferred_line(notice, ahead))

    def _notice_lead(self) -> float:
        """Seconds before a known deadline at which to announce it (:func:`emergency.notice_lead`)."""
        grace = float(self.config.checkpoint.grace_seconds)
        return emergency.notice_lead(self.checkpointer, grace, self._recent_step_time())

    @property
    def grad_accum(self) -> int:
        """Micro-steps per optimizer step on this rank: ``grad_accum``, or derived from
        ``global_batch`` and ``micro_batch`` and the number of data-parallel ranks."""
        return self._accum

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (restored by :meth:`resume`)."""
        return self.training.step

    @property
    def run_dir(self) -> str:
        return self.record.dir

    @property
    def should_stop(self) -> bool:
        """A preemption notice arrived on this rank (the step boundary acts on it)."""
        return self.preemption.requested

    def __repr__(self) -> str:
        return (
            f"Runtime(backend={self.backend!r}, device={self.device}, "
            f"rank={self.rank}/{self.world_size}, precision={self.precision.name!r})"
        )

    # ---------------------------------------------------------------- setup
    def setup(self, *objects: Any, shuffle: bool | None = None, **options: Any) -> Any:
        """Set up models, optimizers, LR schedulers and data loaders, in any order; returns them
        in the same order (one object alone when one was given). Models go to the device, get
        the precision conversion and the data-parallel wrapper; optimizers are checked by the
        backend; loaders are sharded by rank and yield batches on the device; schedulers are
        registered for checkpoints. ``options`` go to the strategy first (``wrap_policy=``,
        ``tp_plan=`` for the sharded strategies)."""
        import torch

        if not self._checked_saves:
            self._checked_saves = True
            naming.refuse_saves_without_dir(self.config.checkpoint.dir)
        if options:
            self.strategy.configure(**options)
        out: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                out.append(self.setup_module(obj))
            elif isinstance(obj, torch.optim.Optimizer):
                out.append(self.setup_optimizer(obj))
            elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
                hasattr(obj, "state_dict")
                and hasattr(obj, "optimizer")
                and hasattr(obj, "step")
                and not hasattr(obj, "__iter__")
            ):
                self.training.schedulers.append(obj)
                out.append(obj)
            elif hasattr(obj, "__iter__"):
                out.append(self.setup_dataloader(obj, shuffle=shuffle))
            else:
                raise AiosError(
                    f"runtime.setup() got a {type(obj).__name__}",
                    "pass torch modules, optimizers, LR schedulers or data loaders",
                )
        return out[0] if len(out) == 1 else tuple(out)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if (
            self.config.strategy == "auto"
            and not self.training.modules
            and not self.training.optimizers
        ):
            name = self.strategy.adopts(module)
            if name is not None:
                self._adopt(name, self._registry)
        wrapped = self.strategy.setup_module(module, self.precision)
        self.training.modules.append(wrapped)
        return wrapped

    def _adopt(self, name: str, reg: Registry) -> None:
        """Under ``strategy=auto``: the script parallelized its first model itself, which the
        default strategy cannot take; the registered strategy ``name`` (the default strategy's
        :meth:`~aios.strategies.base.Strategy.adopts`) takes over, on the same process group and
        accelerator, before anything else was set up. Said in one line."""
        old = self.strategy
        new, precision = wiring.adopt(reg, self.config, self.backend, old, name)
        self._bind(new, precision)
        self.training.strategy, self.training.precision = new, precision
        self.checkpointer.use_strategy(new)
        if self.is_main:
            print(
                f"aios: the script parallelized its model itself (fully_shard or DTensor "
                f"parameters); strategy auto took {new.name} instead of {old.name}, which keeps "
                f"the model as it is and checkpoints it as '{new.checkpoint_format}'",
                file=sys.stderr,
                flush=True,
            )

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        opt = self.strategy.setup_optimizer(optimizer)
        self.training.optimizers.append(opt)
        return opt

    def setup_dataloader(self, loader: Any, shuffle: bool | None = None) -> Any:
        if self.replica is not None:  # the data stays global over the groups (aios.ft.data)
            seed = self.config.seed if self.config.seed is not None else 0
            wrapped = ft_data.shard(loader, self.replica, seed, shuffle, self.device, self.rank)
        else:
            wrapped = self.strategy.setup_dataloader(loader, shuffle=shuffle)
        # its workers leave SIGTERM/SIGINT to this rank (aios.data.workers)
        loader_workers.shield(wrapped.loader if isinstance(wrapped, DeviceLoader) else wrapped)
        if hasattr(wrapped, "owner"):
            wrapped.owner = self.checkpointer  # calls its at_batch_boundary() before each batch
        self.training.loaders.append(wrapped)
        return wrapped

    def setup_dataloaders(self, *loaders: Any, shuffle: bool | None = None) -> Any:
        out = [self.setup_dataloader(ld, shuffle=shuffle) for ld in loaders]
        return out[0] if len(out) == 1 else tuple(out)

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The user's module under the data-parallel wrapper."""
        return self.strategy.unwrap(module)

    # ---------------------------------------------------------------- the step
    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Autocast for the configured precision (a no-op for fp32 and bf16-true)."""
        if self._plain_autocast:
            return _NULL
        return self.precision.autocast()

    def accumulate(
        self, module: torch.nn.Module | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Wrap forward+backward of one micro-step: gradient sync is skipped unless this is the
        last micro-step before an optimizer step."""
        ck = self._ckpt
        if ck.pending:
            ck.at_batch_boundary(loader=False)
        if self._accum == 1 or (self.training.micro + 1) % self._accum == 0:
            return _NULL
        module = module if module is not None else self.training.main_module
        return self.strategy.no_sync(module, True)

    def backward(
        self, loss: torch.Tensor, module: torch.nn.Module | None = None, divide: bool = True
    ) -> None:
        """``loss.backward()`` through the precision policy (loss scaling). With
        ``grad_accum=N > 1`` the loss is divided by N, so the accumulated gradient is the mean
        over the micro-batches; ``divide=False`` for a loss the script already divided (as
        nanoGPT's ``loss / gradient_accumulation_steps``)."""
        ck = self._ckpt
        if ck.pending:
            ck.at_batch_boundary(loader=False)
        if self._accum > 1 and divide:
            loss = loss / self._accum
        if not self.training.micro and self.is_main:
            naming.name_placement(
                loss, sys._getframe(1), self.strategy, self.precision, self.training.modules
            )
        self.training.micro += 1
        if self.replica is not None:
            self.replica.begin_step()  # the quorum, when no aios loader began the step
        if self._direct_backward:
            loss.backward()
        else:
            self.strategy.backward(loss, module, self.precision)

    def clip_gradients(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float
    ) -> Any:
        """Clip the global gradient norm now (unscaling first); returns the norm."""
        return self.strategy.clip_grad_norm(module, optimizer, max_norm, self.precision)

    def step(self, optimizer: torch.optim.Optimizer | None = None) -> bool:
        """The optimizer-step boundary (see the module docstring). Returns whether an optimizer
        step happened (False on accumulation micro-steps and on fp16-overflow skips)."""
        tr = self.training
        if tr.micro % self._accum:
            return False
        precision = self.precision
        heard = self.preemption.reason is not None
        if self.replica is not None and not self.replica.commit(tr.modules, heard):
            for opt in [optimizer] if optimizer is not None else tr.optimizers:
                opt.zero_grad(set_to_none=True)  # not committed: the step is trained again
            return False
        if optimizer is not None:
            if self._clip is not None:
                self.last_grad_norm = self.strategy.clip_grad_norm(
                    tr.main_module, optimizer, self._clip, precision
                )
            if self._direct_step:
                optimizer.step()
                taken = True
            else:
                taken = self._optimizer_step(optimizer, precision)
            optimizer.zero_grad(set_to_none=True)
        else:
            taken = True
            for opt in tr.optimizers:
                if self._clip is not None:
                    self.last_grad_norm = self.strategy.clip_grad_norm(
                        tr.main_module, opt, self._clip, precision
                    )
                taken = self._optimizer_step(opt, precision) and taken
                opt.zero_grad(set_to_none=True)
        if self._mark_step is not None:
            self._mark_step()
        tr.step = step = tr.step + 1
        if self._on_step_end is not None:
            self._on_step_end(step)
        t = self.clock()
        self._stamp(t)
        # -- preemption: every rank must take the same decision at the same step. The checkpoint
        # itself is written at the boundary: when the next batch is requested from an aios loader
        # (or at the next backward/accumulate/close), so that what the script does after step()
        # (scheduler.step(), EMA updates) is in it and the data position is exact.
        ck = self._ckpt
        noticed = self.preemption.reason is not None
        if self.replica is not None:  # every group stops at the same step (aios.ft.replica)
            noticed = self.replica.notice
        if self._world > 1:
            if step % self.preemption_check_every == 0 and self.strategy.any_rank(noticed):
                ck.pending = "preempt"
        elif noticed:
            ck.pending = "preempt"
        every = ck.every
        if every:
            if step % every == 0 and not ck.pending:
                ck.pending = "save"
        elif step >= ck.check_step:  # checkpoint.max_lost: a collective, now and then
            ck.replan(step, t)
        if step >= ck.due_step and not ck.pending:
            ck.pending = "save"
        if ck.pending:
            ck.note_step()  # the RNG streams at the step: see CheckpointManager.at_batch_boundary
        return taken

    def run_pending(self) -> None:
        """Write the checkpoint (or act on the preemption) decided at the last step boundary
        (see :meth:`aios.checkpoint.manager.CheckpointManager.at_batch_boundary`)."""
        self._ckpt.at_batch_boundary()

    # ---------------------------------------------------------------- printing and logging
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed)."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def _get_loggers(self) -> list[Any]:
        if self._loggers is None:
            specs = self._registry.loggers if self.is_main else {}
            self._loggers = attempt.build_loggers(specs, self.config, self.record.dir)
        return self._loggers

    def log(
        self, metrics: dict[str, Any], step: int | None = None, every: int | None = None
    ) -> None:
        """Log scalar metrics on rank 0 to the run record and the configured loggers
        (TensorBoard, W&B). Tensors are converted with ``.item()`` (a device sync on XLA: log
        every few steps, e.g. ``every=10``)."""
        step = self.training.step if step is None else step
        if not self.is_main or (every and step % every):
            return
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self.record.log_metrics(values, step)
        attempt.log(self._get_loggers(), values, step)

    def progress(self, total: int, description: str = "train") -> Progress:
        """A progress bar on rank 0 (plain lines when not on a terminal)."""
        every = max(self.config.logging.every, total // 20)  # plain lines: about 20 per run
        return Progress(
            total,
            description,
            self.is_main and self.config.logging.progress,
            every,
            start=self.training.step,
        )

    # ---------------------------------------------------------------- preemption
    def _preempted(self) -> None:
        event = emergency.emergency(
            self.preemption,
            self.checkpointer,
            self.rank,
            self.training.step,
            self.config.checkpoint,
            self.print,
        )
        self.record.diag["preemptions"].append(event)
        self.close(status="preempted")
        raise SystemExit(EXIT_PREEMPTED)

    def _end_alone(self) -> NoReturn:
        """A replica group restarted after every other group finished (:mod:`aios.ft.replica`):
        nothing left to train. The record is closed as ``ended``: no final checkpoint (this
        group holds no trained state), no "no training step" line."""
        self.close(status="ended")
        raise SystemExit(0)

    # ---------------------------------------------------------------- records and shutdown
    def _write_start_record(self) -> None:
        if self.is_main:
            attempt.write_start(
                self.record,
                self.config,
                self.backend,
                self.strategy,
                self.precision,
                self._registry,
            )

    def _write_diagnostics(self, **extra: Any) -> None:
        if not self.is_main:
            return
        try:
            metrics = self.strategy.metrics()
        except Exception as exc:  # noqa: BLE001
            metrics = {"error": str(exc)}
        self.record.write_diagnostics(
            attempt=self._attempt(),
            steps=self.training.step,
            step_timing=self.timer.summary(self.training.step),
            backend_metrics=metrics,
            skipped_steps=getattr(self.precision, "skipped_steps", 0),
            resumed_from=self._resumed_from,
            **({"ft": self.replica.summary()} if self.replica is not None else {}),
            **extra,
        )

    def _attempt(self) -> dict[str, Any]:
        """This attempt's wall-clock marks for the goodput account (:mod:`aios.runrecord.goodput`)."""
        return attempt.marks(self.record, self.timer, self.training.step, self.checkpointer)

    def summary(self) -> dict[str, Any]:
        """Steps and timing of this process so far."""
        t = self.timer.summary()
        return {
            "steps": self.training.step,
            "elapsed_s": time.perf_counter() - self._t_init,
            "mean_step_s": t.get("mean_s"),
        }

    def close(self, status: str = "finished") -> None:
        """Write the run record, close loggers, stop watchers, leave the process group."""
        global _current
        if self._closed:
            return
        worker_closing()  # past the last step: the watchdog expects no more progress
        ck = self.checkpointer
        step = self.training.step
        try:
            if status in ("finished", "exited", "preempted") and self._started:
                ck.finish_pending()  # a background save is committed before the process ends
            if (
                status == "finished"
                and self.config.checkpoint.dir
                and step
                and ck.saved_step != step
                and self._started
            ):
                ck.pending = None
                self.save()  # the final checkpoint (checkpoint.every=0 means: only at the end)
                ck.finish_pending()  # committed before the process ends
        finally:
            ck.pending = None
            self._closed = True
            ck.close()
        self.preemption.uninstall()
        with contextlib.suppress(Exception):
            self._write_diagnostics(status=status, finished=time.time())
        if self.is_main and self._loggers:
            attempt.log_goodput(self.record.dir, self._loggers, self.training.step)
        for lg in self._loggers or []:
            with contextlib.suppress(Exception):
                lg.close()
        self.record.close()
        said = self.is_main and status != "failed" and not excepthook.failing()
        if said:
            tr = self.training
            naming.name_no_step(status, tr.micro, tr.step, self.checkpointer.loaded_step)
        if said and not self.replica_group:
            attempt.print_locations(self.run_dir, self.config.checkpoint.dir)
        if status in ("finished", "preempted", "ended") and self._world > 1:
            with contextlib.suppress(Exception):
                self.strategy.barrier()  # no rank leaves the group while a peer still talks to it
        if self.replica is not None:
            self.replica.close()
        with contextlib.suppress(Exception):
            self.strategy.teardown()
        if _current is self:
            _current = None
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)

    def _atexit(self) -> None:
        self.close(status="exited")

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(status="failed" if exc_type and exc_type is not SystemExit else "finished")
