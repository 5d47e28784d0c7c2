"""Small descriptor types exchanged through hooks. Importing this module is cheap (no torch)."""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

from aios.errors import PluginError

# ------------------------------------------------------------------------------ registration


def load_target(target: str) -> object:
    """What a ``"module:attribute"`` target names, its module imported (once per process: it
    stays in ``sys.modules``). The one resolver of the names plugins hand in instead of
    objects: :class:`Lazy` and a plugin command's :attr:`CommandSpec.target`. Raises what the
    import raises, ``AttributeError`` for a name the module lacks."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


#: what a :class:`Lazy` target returns (inferred from the spec field it is given to)
R = TypeVar("R")


@dataclass(frozen=True)
class Lazy(Generic[R]):
    """A callable named, not imported: ``Lazy("module:attribute")``. A plugin's hook module
    gives one where a spec takes a callable (``StrategySpec.factory``,
    ``AcceleratorSpec.factory``, ``CheckpointFormatSpec.factory``, ...), so that loading the
    plugin (``aios --help`` loads every plugin's hook module) imports none of what it names.
    A call imports the target (:func:`load_target`) and calls it with the same arguments. A
    target that cannot be loaded is one line naming the plugin that registered it (the
    registry fills in ``plugin``)."""

    target: str
    plugin: str = ""

    def __call__(self, *args: object, **kwargs: object) -> R:
        who = f'plugin "{self.plugin}"' if self.plugin else "a plugin"
        fix = (
            f"reinstall {self.plugin or 'it'} from the aios checkout, or disable it with "
            f"AIOS_DISABLE_PLUGINS={self.plugin or 'NAME'} (aios --debug shows the traceback)"
        )
        try:
            fn = load_target(self.target)
        except Exception as exc:
            raise PluginError(
                f"{who} names {self.target}, which cannot be loaded: {type(exc).__name__}: {exc}",
                fix,
            ) from exc
        if not callable(fn):
            raise PluginError(
                f"{who} names {self.target}, which is a {type(fn).__name__}, not a callable", fix
            )
        return cast(R, fn(*args, **kwargs))  # what the spec field it was given to declares


@dataclass(frozen=True)
class Availability:
    """Answer of a backend probe: can this backend run here, and if not, why."""

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class BackendSpec:
    """A compute backend, registered through :func:`aios.plugins.hookspecs.aios_register_backends`.

    :param name: what ``--backend`` accepts (``cpu``, ``cuda``, ``xla``, ``neuron``, ...).
    :param priority: auto-selection order; the highest available backend wins ``--backend auto``.
        Built-ins: cpu 0, cuda 100, xla 200, neuron 200.
    :param probe: cheap availability check; must not import or initialise the heavy runtime.
        ``probe(config=None) -> Availability``: it receives the resolved config when there is
        one (for explicit opt-ins such as ``xla.allow_cpu``), else ``None``. The 0.1 form
        ``probe()`` still registers through one adapter that warns with
        :class:`DeprecationWarning` (removed in 0.4 at the earliest).
    :param install_hint: the command that makes the backend usable
        (``pip install -e './packages/core[xla]' ./packages/backend-xla (from the aios checkout)``).
    :param device_type: the torch device type the backend trains on.
    :param description: one line for ``aios plugins`` / ``aios devices``.
    """

    name: str
    priority: int
    probe: Callable[..., Availability]
    install_hint: str = ""
    device_type: str = "cpu"
    description: str = ""
    plugin: str = ""  # filled in by the registry: the plugin (distribution) that registered it
    #: the native :class:`aios.devices.accelerator.Accelerator` this backend trains on (a name in the
    #: accelerator registry), or ``None`` for a non-native device stack (torch_xla).
    accelerator: str | None = None
    #: the strategy ``strategy=auto`` resolves to on this backend.
    default_strategy: str = "ddp"
    #: device discovery: ``discover(config) -> DeviceReport`` (``config`` is ``None`` for
    #: ``aios devices`` without one). Must not initialise a device runtime (for XLA that would
    #: break ``xmp.spawn`` later): read sysfs, metadata servers, NVML, env vars instead.
    discover: Callable[[Any], DeviceReport] | None = None
    #: launch: ``launch_plan(config, request) -> LaunchPlan`` (per-host env and command,
    #: processes per host). Must not import torch: ``aios-run --dry-run`` prints the plan.
    launch_plan: Callable[[Any, LaunchRequest], LaunchPlan] | None = None
    #: ``precision(precision, config, accelerator) -> Precision | None`` (``None``: the core
    #: default over the accelerator). Raise
    #: :class:`aios.errors.ConfigError` for a precision the hardware cannot do.
    precision: Callable[..., Any] | None = None
    #: ``doctor(config, explicit) -> list[DoctorCheck]``: ``explicit`` is True for
    #: ``aios doctor --backend NAME``, False for "everything installed".
    doctor: Callable[..., Any] | None = None


@dataclass(frozen=True)
class StrategySpec:
    """A training strategy (``strategy=NAME``), registered through
    :func:`aios.plugins.hookspecs.aios_register_strategies`.

    :param name: what ``strategy=`` accepts (``ddp``, ``fsdp``, ``tp``, ``hsdp``, ``deepspeed``,
        ``spmd``, ...). One name may be registered several times for different backends
        (``ddp`` natively and by a backend with its own stack); two specs claiming one
        (name, backend) pair is an error naming both plugins.
    :param factory: ``factory(config, accelerator, backend) -> aios.strategies.base.Strategy``, called
        once per process at :func:`aios.init`; ``accelerator`` is the backend's
        :class:`aios.devices.accelerator.Accelerator` instance or ``None`` for a non-native backend.
    :param backends: backend names it runs on ...
    :param accelerators: ... or native accelerator names (``"*"``: any native accelerator).
    :param precision: optional ``precision(precision, config, accelerator) -> Precision`` that
        overrides the backend's precision policy under this strategy (DeepSpeed's engine
        scales the loss itself).
    :param launch_env: optional ``launch_env(config, backend) -> dict`` merged into the launch
        plan's environment (``DS_ACCELERATOR=cpu`` on the cpu backend).
    """

    name: str
    factory: Callable[..., Any]
    backends: tuple[str, ...] = ()
    accelerators: tuple[str, ...] = ()
    description: str = ""
    precision: Callable[..., Any] | None = None
    launch_env: Callable[..., dict[str, str]] | None = None
    plugin: str = ""

    def supports(self, backend: str, accelerator: str | None) -> bool:
        if backend in self.backends:
            return True
        return accelerator is not None and (
            "*" in self.accelerators or accelerator in self.accelerators
        )


@dataclass(frozen=True)
class AcceleratorSpec:
    """A native torch device kind (``cpu``, ``cuda``, ``tpu``, ``neuron``, ``xpu``, ``mps``),
    registered through :func:`aios.plugins.hookspecs.aios_register_accelerators`.

    :param factory: ``factory(config) -> aios.devices.accelerator.Accelerator``; imports nothing heavy
        until its methods are called.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class CloudSpec:
    """A cloud provider for the ``aios launch|status|exec|...`` commands.

    :param factory: ``factory(config) -> aios_cloud.CloudProvider``; imports its SDK lazily.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""
    install_hint: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """An ``aios`` subcommand contributed by a plugin, loaded only when it is invoked.

    :param name: the subcommand name (``aios NAME``); a core command's name cannot be taken.
    :param target: ``"module:attribute"`` of the :class:`click.Command`, imported on first use
        (so ``aios --help`` imports nothing of the plugin beyond its entry-point module).
    :param help: the one-line help shown by ``aios --help``.
    """

    name: str
    target: str
    help: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class StorageSpec:
    """A URL scheme usable for checkpoints, data and ``aios sync``.

    :param scheme: the URL scheme (``gs``, ``s3``).
    :param protocol: the fsspec protocol that serves it.
    :param requires: module that must import for the protocol to work (``gcsfs``, ``s3fs``).
    :param storage_options: ``storage_options(url) -> dict`` of fsspec options (endpoints from
        env, never secrets written anywhere).
    """

    scheme: str
    protocol: str
    requires: str = ""
    install_hint: str = ""
    storage_options: Callable[[str], dict[str, Any]] | None = None
    plugin: str = ""


@dataclass(frozen=True)
class LoggerSpec:
    """A metrics logger. ``enabled(config) -> bool``; ``factory(config, run_dir) -> logger``
    where the logger has ``log(metrics: dict, step: int)`` and ``close()``."""

    name: str
    enabled: Callable[..., bool]
    factory: Callable[..., Any]
    plugin: str = ""


@dataclass(frozen=True)
class CheckpointFormatSpec:
    """A checkpoint format (:class:`aios.checkpoint.formats.base.CheckpointFormat`): how training
    state becomes files. ``name`` is what a strategy's ``checkpoint_format`` names and what the
    checkpoint's marker records; ``factory() -> CheckpointFormat`` builds one (import heavy
    modules inside it: the registry loads without them)."""

    name: str
    factory: Callable[[], Any]
    plugin: str = ""


# ------------------------------------------------------------------------------ discovery


@dataclass
class DeviceInfo:
    """One device (a GPU, a TPU chip, a NeuronCore, the CPU)."""

    index: int
    name: str
    memory_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeviceReport:
    """What a backend finds on this machine, for ``aios devices`` and launch planning.

    :param kind: human name of the device kind (``NVIDIA GPU``, ``TPU v4 chip``, ``NeuronCore-v2``).
    :param available: whether the backend can train here right now.
    :param topology: free-form topology facts (slice type, hosts, NVLink matrix, ...).
    :param notes: lines worth showing (mixed GPU models, logical-core config, ...).
    """

    backend: str
    kind: str
    available: bool
    devices: list[DeviceInfo] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def count(self) -> int:
        return len(self.devices)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["count"] = self.count
        return d


# ------------------------------------------------------------------------------ doctor

CheckStatus = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class DoctorCheck:
    """One ``aios doctor`` line. ``fix`` says what to do when the status is not ``pass``."""

    name: str
    status: CheckStatus
    message: str
    fix: str = ""
    backend: str | None = None
    plugin: str = ""


# ------------------------------------------------------------------------------ launch


@dataclass(frozen=True)
class Host:
    """A machine a launch runs on. Locally there is one, ``Host("localhost")``."""

    address: str = "localhost"
    internal_address: str | None = None
    worker_id: int = 0


@dataclass
class LaunchRequest:
    """What to launch: the script and its args, and the hosts (one locally)."""

    script: str
    args: list[str] = field(default_factory=list)
    module: bool = False  # python -m
    hosts: list[Host] = field(default_factory=lambda: [Host()])
    accelerator: str | None = None  # e.g. "v4-16" or "trn1.32xlarge", for planning off-host
    # interpreter on the hosts; None = this one (sys.executable). `aios launch` sets the remote
    # one (the provider's image interpreter or --python).
    python: str | None = None


def _shell_value(v: str) -> str:
    if v.startswith("~/"):
        rest = (
            v[2:].replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
        )
        return f'"$HOME/{rest}"'
    return shlex.quote(v)


@dataclass
class HostPlan:
    """The command and environment for one host of a launch."""

    host: Host
    nprocs: int
    env: dict[str, str]
    command: list[str]
    # Per-rank environment that the launcher sets (shown by --dry-run); informative only.
    ranks: list[dict[str, str]] = field(default_factory=list)

    def shell(self) -> str:
        """The command as one shell line with its env prefix. A value starting with ``~/`` is
        written ``"$HOME/..."`` so it expands on the host that runs the line."""
        env = " ".join(f"{k}={_shell_value(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(c) for c in self.command)
        return f"{env} {cmd}" if env else cmd


@dataclass
class LaunchPlan:
    """A backend's answer to :attr:`BackendSpec.launch_plan`.

    :param launcher: how processes start: ``elastic`` (torch.distributed.run), ``xla``
        (torch_xla.launch), ``direct`` (one process, no launcher).
    :param world_size: total processes over all hosts.
    :param preload: modules every process of the plan imports that ``aios-run``'s zygote may
        import once ahead of them, with the processes' environment (:mod:`aios.launcher.warm`):
        only modules whose import starts no thread and no device runtime (e.g. ``torch_xla``,
        whose runtime starts at the first use of a device). A ``direct`` plan with some is
        started warm too.
    :param runtime_env: variables of the processes' environment that they read only when used
        (device variables read when the device runtime starts, aios settings read by
        ``aios.init``), never while importing :attr:`preload`, torch or aios: the processes may
        differ in these from the zygote and still fork from it.
    """

    backend: str
    launcher: str
    world_size: int
    hosts: list[HostPlan]
    notes: list[str] = field(default_factory=list)
    preload: list[str] = field(default_factory=list)
    runtime_env: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for h, hp in zip(d["hosts"], self.hosts, strict=True):
            h["shell"] = hp.shell()
        return d


# ------------------------------------------------------------------------------ preemption


@dataclass(frozen=True)
class Notice:
    """One interruption notice: where it came from, why, and by when the host will be gone.

    ``source`` is a short stable name (``sigterm``, ``aws-spot``, ``capacity-block``,
    ``gce-preempted``, ``tpu-maintenance``, ``gke-spot``, ``k8s-delete``, ``slurm``,
    ``queued-resource``, ``file``, or a third-party watcher's own); ``reason`` is one line for the
    user; ``deadline`` is the wall-clock time (``time.time()`` seconds) by which the process will be
    killed, or ``None`` when the source does not say.
    """

    source: str
    reason: str
    deadline: float | None = None


class PreemptionWatcher:
    """Base for preemption notice sources (see :func:`aios.plugins.hookspecs.aios_preemption_watchers`).

    ``start(notify)`` begins polling (a daemon thread) and calls ``notify`` once with a
    :class:`Notice` when the interruption is announced. ``notify`` also accepts a plain reason
    string (the 0.1 form: a notice without a deadline).
    """

    name = "watcher"

    def start(self, notify: Callable[[Notice | str], None]) -> None:  # pragma: no cover
        raise NotImplementedError

    def stop(self) -> None:
        pass
