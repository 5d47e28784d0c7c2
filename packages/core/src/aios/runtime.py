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
import itertools
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aios.errors import AiosError, ConfigError
from aios.ft import data as ft_data
from aios.ft.replica import Replica
from aios.ft.replica import from_env as ft_group_from_env
from aios.launcher import guard, rewrites
from aios.launcher import status as rank_status
from aios.launcher.contract import BACKEND_ENV, CONFIG_ENV
from aios.resilience.notices import (
    EXIT_PREEMPTED,
    DeadlineWatcher,
    PreemptionMonitor,
    effective_grace,
)
from aios.strategies.base import Strategy
from aios.strategies.precision import Precision

if TYPE_CHECKING:
    import torch

    from aios.checkpoint import CheckpointStore
    from aios.config.schema import AiosConfigBase
    from aios.plugins.registry import Registry
    from aios.types import Notice

__all__ = ["Runtime", "init", "current", "EXIT_PREEMPTED"]

_current: Runtime | None = None
_NULL = contextlib.nullcontext()


def current() -> Runtime | None:
    """The runtime of this process, if :func:`init` was called."""
    return _current


# ------------------------------------------------------------------------------ config


def _drop_secrets(obj: Any) -> Any:
    from aios.config.schema import is_secret

    if isinstance(obj, dict):
        return {k: _drop_secrets(v) for k, v in obj.items() if not is_secret(str(k))}
    return obj


def explicit_config_json(cfg: Any) -> str:
    """What ``aios-run`` passes to workers in ``AIOS_RUN_CONFIG``: the keys that were set
    (file, env, overrides, flags), without secret-looking keys."""
    return json.dumps(_drop_secrets(cfg.model_dump(mode="json", exclude_unset=True)))


def resolve_config(
    config: AiosConfigBase | dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> AiosConfigBase:
    """The config for this process. Precedence: ``defaults`` (from the script) < what
    ``aios-run`` resolved (``AIOS_RUN_CONFIG``) or, without aios-run, ``AIOS_CONFIG`` file and
    ``AIOS_*`` env vars < ``overrides`` < ``flags`` (keyword arguments of :func:`init`)."""
    from aios.config.schema import AiosConfigBase, build_model, deep_merge, parse_overrides, resolve

    if isinstance(config, AiosConfigBase):
        return config
    model = build_model()
    if isinstance(config, dict):
        explicit: dict[str, Any] = config
    elif os.environ.get(CONFIG_ENV):
        try:
            explicit = json.loads(os.environ[CONFIG_ENV])
        except ValueError:
            raise ConfigError(
                f"{CONFIG_ENV} is not valid JSON", "launch through aios-run or unset it"
            ) from None
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

        from aios.config.schema import _format_error

        try:
            model.model_validate(merged)
        except ValidationError as err:
            raise _format_error(err, model, merged, {}) from None
        raise


# ------------------------------------------------------------------------------ init


_failing = False  # set when an exception escapes the script (see _install_excepthook)


def _without_torch_prefix(hook: Any) -> Any:
    """``hook`` without the ``[rankN]:`` prefix torch's ``init_process_group`` wraps around the
    excepthook, when the launcher (``aios-run``, torchrun with a log-line prefix) already
    prefixes every line of the worker: one prefix, not ``[rank0]:[rank0]:``."""
    if getattr(hook, "__name__", "") != "_distributed_excepthook" or not os.environ.get(
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
    ):
        return hook
    try:
        cells = dict(
            zip(hook.__code__.co_freevars, (c.cell_contents for c in hook.__closure__), strict=True)
        )
    except (AttributeError, TypeError, ValueError):
        return hook
    return cells.get("old_hook", hook)


def _install_excepthook() -> None:
    """An :class:`AiosError` escaping the user's script (bad config, unavailable backend, the XLA
    compile guard's limit, a corrupt checkpoint) ends it with one line and the error's exit code
    (2), after the normal exit handlers; ``AIOS_DEBUG=1`` keeps the traceback."""
    previous = _without_torch_prefix(sys.excepthook)
    if getattr(previous, "_aios", False):
        sys.excepthook = previous
        return

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        global _failing
        _failing = True  # the error stays the last line: no "where it went" lines after it
        quiet = bool(getattr(exc, "quiet", False))
        rank_status.mark_rank(
            "stopped (another rank failed)" if quiet else f"failed {time.monotonic_ns()}"
        )
        if not issubclass(exc_type, AiosError) or os.environ.get("AIOS_DEBUG", "") not in ("", "0"):
            previous(exc_type, exc, tb)
            return
        if quiet:  # another rank failed and prints the one line
            atexit._run_exitfuncs()
            os._exit(getattr(exc, "exit_code", 2))
        rank = os.environ.get("RANK")
        where = (
            f" (rank {rank})"
            if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1"
            else ""
        )
        out = sys.stderr
        try:
            out.fileno()
        except Exception:  # noqa: BLE001 - torch.distributed's excepthook captures sys.stderr around ours
            out = sys.__stderr__ or out
        out.write(f"aios: error{where}: {exc}\n")
        out.flush()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(getattr(exc, "exit_code", 2))

    hook._aios = True  # type: ignore[attr-defined]
    sys.excepthook = hook


#: the seed of torch's default CPU generator in a process nobody seeded (older torch; newer
#: torch draws a 64-bit seed from the OS at start)
_TORCH_DEFAULT_SEED = 67280421310721


def _script_seed() -> int | None:
    """The seed the script gave torch before :func:`init` (``torch.manual_seed(n)``, as every
    training script's ``--seed``), if any. An unseeded process has torch's fixed default seed or
    a 64-bit one drawn from the OS; one below 2**32 was set by the script (the chance that
    the OS drew it is 1 in 2**32)."""
    import torch

    seed = int(torch.initial_seed())
    return None if seed == _TORCH_DEFAULT_SEED or seed >= 2**32 else seed


def derive_grad_accum(cfg: Any, strategy: Strategy) -> None:
    """``grad_accum`` from ``global_batch`` and ``micro_batch`` once the number of data-parallel
    ranks is known: ``global_batch / (micro_batch x data ranks)``, exact or a one-line error
    (raised in :func:`init`, before the script builds its model; every rank finds the same, so
    rank 0 says it and the others stop quietly). A run resumed at another shape keeps its global
    batch this way: ``grad_accum`` follows the new data-parallel size."""
    g, m = cfg.global_batch, cfg.micro_batch
    if g is None and m is None:
        return
    if g is None or m is None:
        raise _from_rank0(
            strategy,
            f"{'micro_batch' if g is None else 'global_batch'} is set without "
            f"{'global_batch' if g is None else 'micro_batch'}",
            "set both (grad_accum is derived from them), or neither and set grad_accum",
        )
    ranks = int(strategy.data_world)
    per_step = m * ranks
    if g % per_step:
        raise _from_rank0(
            strategy,
            f"global_batch={g} is not a multiple of micro_batch={m} x {ranks} data-parallel "
            f"ranks = {per_step}",
            f"make global_batch a multiple of {per_step}, or change micro_batch or the process count",
        )
    accum = g // per_step
    if "grad_accum" in cfg.model_fields_set and cfg.grad_accum != accum:
        raise _from_rank0(
            strategy,
            f"grad_accum={cfg.grad_accum} contradicts global_batch={g} / (micro_batch={m} x "
            f"{ranks} ranks) = {accum}",
            "set grad_accum, or global_batch and micro_batch, not both",
        )
    cfg.grad_accum = accum


def _main_script() -> str | None:
    """The path of the script ``__main__`` runs, when it is a ``.py`` file."""
    main = sys.modules.get("__main__")
    path = main.__dict__.get("__file__") if main is not None else None
    return str(path) if path and str(path).endswith(".py") else None


def refuse_rewritten_launch_env() -> None:
    """Under ``aios-run``: the script rewrote ``RANK``/``WORLD_SIZE``/``MASTER_*`` after the
    launcher set them (:mod:`aios.launcher.rewrites`). One line naming the first such write, with
    its ``file:line`` where the script's own file shows it; exit 2 before anything trains."""
    changed = rewrites.rewritten(os.environ, rewrites.initial_environ())
    if not changed:
        return
    name, was, now = changed[0]
    where, path = "", _main_script()
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                line = rewrites.write_line(f.read(), name)
        except (OSError, UnicodeDecodeError):
            line = None
        if line is not None:
            where = f"{os.path.basename(path)}:{line}: "
    also = ", ".join(n for n, _, _ in changed[1:])
    raise ConfigError(
        f"{where}the script set {name}={now} after aios-run set it to {was}"
        + (f" (and rewrote {also})" if also else "")
        + ": its ranks would not form the launcher's process group and would train as "
        "separate copies",
        f"remove the assignment: aios-run sets {', '.join(rewrites.LAUNCH_VARS)} for every rank",
    )


def _from_rank0(strategy: Any, message: str, fix: str) -> ConfigError:
    """A config error every rank finds alike: rank 0 prints it, the others stop quietly."""
    err = ConfigError(message, fix)
    if int(getattr(strategy, "rank", 0) or 0) != 0:
        err.quiet = True  # type: ignore[attr-defined]  # read by the excepthook
    return err


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
    _install_excepthook()
    from aios.launcher.worker import watch_launcher

    watch_launcher()  # started by aios-run: never outlive it (see aios.launcher.worker)
    refuse_rewritten_launch_env()
    cfg = resolve_config(config, defaults, overrides, flags)
    from aios.resilience.watchdog import start_sidecar
    from aios.resilience.workers import register_worker

    if register_worker():  # under aios-run: step progress and stack dumps for its watchdog
        from aios.runrecord.records import run_id_from_env

        record = os.path.abspath(os.path.join(cfg.logging.run_dir, run_id_from_env()))
        start_sidecar(cfg.watchdog, record)  # a cluster job's torchrun: the watchdog beside it
    from aios.plugins.registry import get_registry

    reg = get_registry()
    requested = os.environ.get(BACKEND_ENV) or cfg.backend
    spec = reg.select(requested, config=cfg)
    backend = spec.name
    strategy, strategy_spec, accel = reg.make_strategy(cfg, spec)
    strategy.setup_environment()
    sys.excepthook = _without_torch_prefix(sys.excepthook)  # init_process_group wrapped it
    rank_status.mark_joined(strategy.world_size)
    derive_grad_accum(cfg, strategy)
    device_type = accel.device_type if accel is not None else strategy.autocast_device_type
    precision = reg.make_precision(cfg, spec, strategy_spec, accel, device_type)
    watchers: list[Any] = []
    for plugin, result, exc in reg.call_all("aios_preemption_watchers", config=cfg):
        if exc is not None:
            warnings.warn(
                f"aios: plugin {plugin!r} failed to provide preemption watchers: {exc}",
                stacklevel=2,
            )
        elif result:
            watchers.extend(result)
    rt = Runtime(cfg, backend, strategy, precision, watchers=watchers, registry=reg)
    if ft_group_from_env() is not None:  # a replica group of aios-run (aios.ft)
        rt.replica = Replica(cfg, rt.training, strategy)
        rt.replica.attach(rt.checkpointer)  # one group writes the run's checkpoints
        if rt.replica.group:  # each group's rank 0 keeps its own record beside group 0's
            rt.record.dir = os.path.join(rt.record.dir, f"group{rt.replica.group}")
        rt.replica.start()
    grace, capped = effective_grace(cfg.checkpoint.grace_seconds)
    rt.preemption.grace = grace
    if capped and rt.is_main:
        print(
            f"aios: checkpoint.grace_seconds={cfg.checkpoint.grace_seconds:g} is more than this "
            f"platform gives after SIGTERM ({capped}): a SIGTERM's deadline is {grace:g}s",
            file=sys.stderr,
            flush=True,
        )
    _current = rt
    try:
        rt.start()
    except BaseException:
        _current = None
        with contextlib.suppress(Exception):
            rt.close(status="failed")
        raise
    return rt


# ------------------------------------------------------------------------------ progress


class Progress:
    """Rank-0 progress: a rich bar on a terminal, a plain line every ``every`` steps otherwise."""

    def __init__(
        self, total: int, description: str, enabled: bool, every: int, start: int = 0
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.every = max(1, every)
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._start = start
        self._want_bar = enabled and sys.stdout.isatty()  # started on the first update (a thread)
        self.description = description

    def _start_bar(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._want_bar = False
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._bar.start()
        self._task = self._bar.add_task(
            self.description, total=self.total, completed=self._start, info=""
        )

    def update(self, step: int, **metrics: Any) -> None:
        if not self.enabled:
            return
        info = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        if self._want_bar:
            self._start_bar()
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif step % self.every == 0 or step == self.total:
            rate = (step - self._start) / max(1e-9, time.perf_counter() - self._t0)
            print(f"{self.description} {step}/{self.total} {info} ({rate:.2f} steps/s)", flush=True)

    def close(self) -> None:
        self._want_bar = False
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
        from aios.checkpoint.manager import CheckpointManager
        from aios.checkpoint.state import TrainingState
        from aios.runrecord.records import RunRecord, StepTimer, run_id_from_env

        #: registered objects, counters, state dict and RNG (:mod:`aios.checkpoint.state`)
        self.training = TrainingState(strategy, precision, backend)
        self.last_grad_norm: Any = None
        #: check for preemption (one tiny all-reduce with several ranks) every N steps
        self.preemption_check_every = 1
        self.timer = StepTimer(self._t_init)
        from aios.resilience.workers import progress_stamp

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
        from aios.data import workers as loader_workers

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
        script = _script_seed()
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
        st = self.timer.stamps
        n = min(len(st), 33)
        if n < 2:
            return None
        recent = list(itertools.islice(st, len(st) - n, len(st)))
        d = sorted(b - a for a, b in zip(recent, recent[1:], strict=False))
        return d[len(d) // 2]

    def _notice_deferred(self, notice: Notice, ahead: float) -> None:
        """A notice far ahead of its deadline (maintenance announced hours before): said once."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(notice.deadline or 0))
        self.print(
            f"aios: notice from {notice.source}: {notice.reason}; the host is gone at {when}: "
            f"training goes on and the emergency checkpoint starts in {ahead:.0f} s"
        )

    def _notice_lead(self) -> float:
        """Seconds before a known deadline (``AIOS_RUN_DEADLINE``) at which to announce it: what
        the emergency checkpoint needs by its measured cost (the configured grace until a save
        was measured), two steps to reach the boundary, and a margin."""
        ck = self.checkpointer
        est = ck.cost.estimate(ck.cost_key(False))
        need = (
            est[1] * ck.SAFETY if est is not None else float(self.config.checkpoint.grace_seconds)
        )
        return need + 2 * (self._recent_step_time() or 0.0) + 5.0

    # ---------------------------------------------------------------- identity
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
        from aios.strategies.fsdp import FSDPStrategy

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
        from aios.strategies.fsdp import FSDPStrategy

        st = self.strategy
        if isinstance(st, FSDPStrategy) and st.tp_size > 1:
            return int(st.mesh["tp"].get_local_rank())
        return 0

    @property
    def tp_size(self) -> int:
        """Ranks per tensor-parallel group (``mesh.tp``; 1 without tensor parallelism)."""
        from aios.strategies.fsdp import FSDPStrategy

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
            self._check_saves_have_dir()
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

    def _check_saves_have_dir(self) -> None:
        """The script (``__main__``) calls ``save_best``/``save()`` but ``checkpoint.dir`` is
        unset: one line now, not after the first epoch (:mod:`aios.resilience.preflight`)."""
        if self.config.checkpoint.dir:
            return
        main = sys.modules.get("__main__")
        path = main.__dict__.get("__file__") if main is not None else None
        if not path or not str(path).endswith(".py"):
            return
        from aios.resilience.preflight import needs_checkpoint_dir

        try:
            with open(path, encoding="utf-8") as f:
                found = needs_checkpoint_dir(f.read())
        except (OSError, UnicodeDecodeError):
            return
        if found is not None:
            line, call = found
            raise ConfigError(
                f"{os.path.basename(path)}:{line} calls {call}, which writes into "
                "checkpoint.dir, but none is set",
                "set checkpoint.dir=PATH (aios-run checkpoint.dir=ckpt ..., the config file, "
                "AIOS_CHECKPOINT__DIR or aios.init(defaults=...))",
            )

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
        old, backend = self.strategy, reg.backends[self.backend]
        spec = reg.strategy_spec(name, backend)
        new = spec.factory(self.config, old.accelerator, self.backend)
        new.setup_environment()
        accel = old.accelerator
        device_type = accel.device_type if accel is not None else new.autocast_device_type
        precision = reg.make_precision(self.config, backend, spec, accel, device_type)
        old.teardown()
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
        from aios.data.loaders import DeviceLoader
        from aios.data.workers import shield

        if self.replica is not None:  # the data stays global over the groups (aios.ft.data)
            seed = self.config.seed if self.config.seed is not None else 0
            wrapped = ft_data.shard(loader, self.replica, seed, shuffle, self.device, self.rank)
        else:
            wrapped = self.strategy.setup_dataloader(loader, shuffle=shuffle)
        # its workers leave SIGTERM/SIGINT to this rank (aios.data.workers)
        shield(wrapped.loader if isinstance(wrapped, DeviceLoader) else wrapped)
        if hasattr(wrapped, "owner"):
            wrapped.owner = self.checkpointer  # calls its at_batch_boundary() before each batch
        self.training.loaders.append(wrapped)
        return wrapped

    def setup_dataloaders(self, *loaders: Any, shuffle: bool | None = None) -> Any:
        out = [self.setup_dataloader(ld, shuffle=shuffle) for ld in loaders]
        return out[0] if len(out) == 1 else tuple(out)

    def register(self, name: str, obj: Any) -> Any:
        """Include ``obj`` in checkpoints under ``name``: anything with
        ``state_dict``/``load_state_dict`` (a scheduler, an EMA), or a plain value (a number,
        string, tensor, or a dict/list of them) with no wrapper. Returns ``obj``, or for a
        plain value registered after :meth:`resume` the resumed value. A dict or list is
        restored in place; a number lives in :attr:`values` (``rt.values[name]``: read and
        assign it there, and the checkpoints hold what is there)."""
        return self.training.register(name, obj)

    @property
    def values(self) -> dict[str, Any]:
        """Plain values registered with :meth:`register`, as saved in every checkpoint."""
        return self.training.values

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
        if not self.training.micro:
            self._name_placement(loss, sys._getframe(1))
        self.training.micro += 1
        if self.replica is not None:
            self.replica.begin_step()  # the quorum, when no aios loader began the step
        if self._direct_backward:
            loss.backward()
        else:
            self.strategy.backward(loss, module, self.precision)

    def _name_placement(self, loss: torch.Tensor, caller: Any) -> None:
        """At the first backward, what reading the script cannot tell: the forward ran on a
        device other than this rank's (the model or its inputs left on the host while the
        accelerator idles), or in float16 on an accelerator without fp16 speed. One line on the
        first rank, with the ``file:line`` of the script's ``rt.backward``; the run goes on."""
        device = self.device
        if device is None or not self.is_main:
            return
        where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
        if loss.device.type != device.type or (
            loss.device.index is not None
            and device.index is not None
            and loss.device.index != device.index
        ):
            on = ""
            for module in self.training.modules:
                for name, p in self.strategy.unwrap(module).named_parameters():
                    if p.device.type == loss.device.type:
                        on = f" (the model's parameter {name!r} is on {p.device} too)"
                        break
            print(
                f"aios: {where}: the loss was computed on {loss.device}, but this rank's device "
                f"is {device}{on}: the model or its inputs stayed off the device and the "
                "forward ran there; pass the model and loader through rt.setup (or move tensors "
                "with .to(rt.device))",
                file=sys.stderr,
                flush=True,
            )
            return
        if (
            str(loss.dtype) == "torch.float16"
            and not self.strategy.fp16_speed
            and self.precision.name != "fp16-mixed"
        ):
            print(
                f"aios: {where}: the loss is float16, but {self.strategy.hardware} has no "
                "float16 speed (its fast type is bfloat16): drop the script's .half()/float16 "
                "casts and run with precision=bf16-mixed",
                file=sys.stderr,
                flush=True,
            )

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
            self._loggers = []
            if self.is_main:
                for name, spec in self._registry.loggers.items():
                    try:
                        if spec.enabled(self.config):
                            self._loggers.append(spec.factory(self.config, self.record.dir))
                    except Exception as exc:  # noqa: BLE001 - a logger must never stop training
                        warnings.warn(
                            f"aios: logger {name!r} disabled: {type(exc).__name__}: {exc}",
                            stacklevel=3,
                        )
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
        for lg in self._get_loggers():
            try:
                lg.log(values, step)
            except Exception as exc:  # noqa: BLE001
                warnings.warn(
                    f"aios: logger {getattr(lg, 'name', lg)!r} failed: {exc}", stacklevel=2
                )

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

    # ---------------------------------------------------------------- seeding and RNG
    def seed_everything(self, seed: int) -> None:
        """Seed Python, NumPy, torch and the device RNG (the same seed on every rank)."""
        self.training.seed_everything(seed)

    def rng_state(self) -> dict[str, Any]:
        return self.training.rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.training.set_rng_state(state)

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoints(self) -> CheckpointStore:
        """The :class:`aios.checkpoint.CheckpointStore` of ``checkpoint.dir``."""
        return self.checkpointer.store

    def state_dict(self) -> dict[str, Any]:
        """The full training state of this process (model/optimizer tensors on CPU)."""
        return self.training.state_dict()

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        self.training.load_state_dict(state, strict=strict, rank=self.rank)
        self.checkpointer.saved_step = self.training.step

    def save(
        self,
        path: str | None = None,
        extra: dict[str, Any] | None = None,
        background: bool = False,
        replace: bool = False,
    ) -> str | None:
        """Write a checkpoint of the full state (collective: call it on every rank). Without
        ``path`` it goes to ``checkpoint.dir`` as ``ckpt-<step>``, atomically, keeping the
        newest ``checkpoint.keep`` of this run's lineage. Returns the checkpoint path on rank 0.
        ``path`` must not exist, unless ``replace=True``: then the aios checkpoint there is
        replaced atomically once the new one is committed (the old copy stays until then; a
        crash leaves one or the other, complete). ``background=True`` (sharded ``dcp``
        checkpoints) returns once the state is staged in memory and commits when written, like
        the periodic saves with ``checkpoint.async_save``; the path is then None. A save that
        fails on any rank stops every rank, with one line from the rank where it failed."""
        written = self.checkpointer.save(path, extra, background=background, replace=replace)
        if written:
            self._write_diagnostics()
        return written

    def save_best(self, metric: Any, name: str = "best", mode: str = "min") -> bool:
        """Collective: "save when it improves". When ``metric`` (rank 0's value decides) beats
        the best so far (lower for ``mode="min"``, higher for ``"max"``), write the checkpoint
        ``<checkpoint.dir>/<name>``, replacing the previous one atomically; returns whether it
        saved. The best value is part of every checkpoint (``rt.values["best/<name>"]``), so a
        resumed run compares against the best of the run it resumes, and an evaluation run
        again after a resume does not save again."""
        if mode not in ("min", "max"):
            raise AiosError(f"save_best(mode={mode!r})", "use mode='min' or mode='max'")
        if not self.config.checkpoint.dir:
            raise AiosError(
                "save_best needs checkpoint.dir",
                "set checkpoint.dir=PATH (flag, config file or aios.init(defaults=...))",
            )
        value = float(metric.item() if hasattr(metric, "item") else metric)
        value = float(self.broadcast(value))
        key = f"best/{name}"
        if key not in self.training.values:
            self.register(key, None)  # the resumed best, if the checkpoint holds one
        best = self.training.values[key]
        if best is not None and not (value < best if mode == "min" else value > best):
            return False
        self.training.values[key] = value  # in the checkpoint written now and every later one
        self.save(f"{self.config.checkpoint.dir.rstrip('/')}/{name}", replace=True)
        return True

    def load(
        self, path: str | int | None = None, strict: bool = True, reshard: bool | None = None
    ) -> dict[str, Any]:
        """Restore the full state from a checkpoint (a step number, a directory/URL, or the
        newest complete one in ``checkpoint.dir``). Collective. Returns the ``extra`` dict."""
        return self.checkpointer.load(path, strict=strict, reshard=reshard)

    def resume(self, reshard: bool | None = None) -> int:
        """Load the most recent complete checkpoint in ``checkpoint.dir`` when
        ``checkpoint.resume`` is on; returns the step to continue from (0 when starting fresh).
        Incomplete checkpoints (interrupted saves) are skipped with a warning; a corrupt one is
        an error. One written at another shape resumes (``checkpoint.reshard``, on by default):
        the data position, random streams and batch arithmetic carry over as the README's
        "Resuming at another shape" says."""
        return self.checkpointer.resume(reshard=reshard)

    @property
    def _resumed_from(self) -> str | None:
        return self.checkpointer.resumed_from

    # ---------------------------------------------------------------- preemption
    def _preempted(self) -> None:
        reason = self.preemption.reason or "notice on another rank"
        grace = self.config.checkpoint.grace_seconds
        step = self.training.step
        notice = self.preemption.notice
        left = self.preemption.time_left()
        when = f", {left:.1f}s before its deadline" if left is not None else ""
        source = f"{notice.source}: " if notice is not None and notice.source not in reason else ""
        self.print(f"aios: preemption ({source}{reason}{when}) at step {step}")
        event = self.checkpointer.emergency_save(
            reason, self.rank, self.preemption.elapsed, self.preemption.time_left
        )
        event["source"] = notice.source if notice is not None else "peer"
        event["time"] = time.time()
        if notice is not None and notice.deadline is not None:
            event["deadline"] = notice.deadline
        self.record.diag["preemptions"].append(event)
        elapsed = event["seconds_since_notice"]
        if elapsed > grace:
            self.print(
                f"aios: warning: emergency checkpoint took {elapsed:.1f}s, more than checkpoint.grace_seconds={grace}"
            )
        if self.config.checkpoint.dir and event.get("checkpoint"):
            self.print(
                f"aios: checkpoint for step {step} written; relaunch the same command to resume (exit {EXIT_PREEMPTED})"
            )
        elif self.config.checkpoint.dir:
            pass  # the manager said which checkpoint is kept
        else:
            self.print(
                f"aios: no checkpoint.dir configured, progress is lost; exiting with {EXIT_PREEMPTED}"
            )
        self.close(status="preempted")
        raise SystemExit(EXIT_PREEMPTED)

    # ---------------------------------------------------------------- records and shutdown
    def _write_start_record(self) -> None:
        if not self.is_main:
            return
        from aios.runrecord.records import versions

        self.record.write_config(self.config)
        self.record.diag.update(
            {
                "backend": self.backend,
                "strategy": type(self.strategy).__name__,
                "precision": self.precision.name,
                "world_size": self._world,
                "device": str(self.device),
                "versions": versions(),
            }
        )
        try:
            rep = (
                self._registry.call_first(
                    "aios_discover_devices", backend=self.backend, config=self.config
                )
                if self._registry
                else None
            )
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
        from aios.runrecord.records import launch_time

        off = time.time() - time.perf_counter()  # the step stamps are perf_counter readings
        st = self.timer.stamps
        self.timer.first_step_s  # noqa: B018 - fixes the first stamp while it is still kept
        first = self.timer.first
        ck = self.checkpointer
        start_step = ck.loaded_step or 0
        return {
            "launched": launch_time(self.record.started),
            "started": self.record.started,
            "first_step": None if first is None else first + off,
            "last_step": st[-1] + off if st else None,
            "start_step": start_step,
            "last_step_index": self.training.step,
            "committed_step": ck.committed_step,
        }

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
        from aios.resilience.workers import worker_closing

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
            self._log_goodput()
        for lg in self._loggers or []:
            with contextlib.suppress(Exception):
                lg.close()
        self.record.close()
        if self.is_main and status != "failed" and not _failing:
            self._name_no_step(status)
        if self.is_main and status != "failed" and not _failing and not self.replica_group:
            self._print_locations()
        if status in ("finished", "preempted") and self._world > 1:
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

    def _name_no_step(self, status: str) -> None:
        """A run that ends on its own terms without a single training step (the script returned
        or called ``sys.exit`` after its own gate, e.g. "not enough GPUs") says so in one line;
        a run resumed at its last step, or preempted, does not."""
        if (
            status in ("finished", "exited")
            and self.training.micro == 0
            and self.training.step == 0
            and self.checkpointer.loaded_step is None
        ):
            ended = guard.ended_at()
            where = f"{os.path.basename(ended[0])}:{ended[1]}: " if ended else ""
            how = "exited there" if ended else "ended"
            print(
                f"aios: {where}the script {how} without a single training step (rt.backward "
                "never ran after aios.init): nothing was trained; see its last output above "
                "for why",
                file=sys.stderr,
                flush=True,
            )

    def _log_goodput(self) -> None:
        """The run's goodput account (every attempt so far) to the metric loggers
        (TensorBoard): ``goodput/fraction``, ``goodput/productive_s``, ``badput/<cause>_s``."""
        from aios.runrecord import goodput

        try:
            r = goodput.account(goodput.read_attempts(self.record.dir))
        except Exception:  # noqa: BLE001 - an account must never fail the run's end
            return
        if r.wall_s <= 0:
            return
        values = {"goodput/fraction": r.goodput, "goodput/productive_s": r.seconds["productive"]}
        values.update({f"badput/{k}_s": v for k, v in r.badput.items()})
        for lg in self._loggers or []:
            with contextlib.suppress(Exception):
                lg.log(values, self.training.step)

    def _print_locations(self) -> None:
        """Where this run's record and checkpoints went: one line each, rank 0, at the end."""
        with contextlib.suppress(Exception):
            from aios.config.schema import redact_url

            ckpt = self.config.checkpoint.dir or "none (set checkpoint.dir to keep them)"
            print(f"aios: run record: {self.run_dir}", file=sys.stderr, flush=True)
            print(f"aios: checkpoints: {redact_url(ckpt)}", file=sys.stderr, flush=True)

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
