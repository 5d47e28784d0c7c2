"""Hook specifications for aios plugins.

Every hook aios calls is declared here, named ``aios_*``. A plugin is a module (named by an
entry point in the ``aios`` group, entry-point name = distribution name) that implements some of
them with ``@aios.hookimpl``.

Two kinds of hooks:

* ``aios_register_*(register)`` hooks run once when the registry loads. They must be cheap: they
  hand aios small descriptor objects (:class:`aios.types.BackendSpec`, ...) and must not import
  heavy runtimes (torch, torch_xla, boto3, google libraries). Import those inside the callables
  the descriptors carry.
* The other hooks answer a question at a point of aios's work (``aios_doctor_checks``,
  ``aios_preemption_watchers``, ``aios_check_rules``, ...). aios calls them **once at setup**:
  what they return is used directly on the per-step path, which never goes through plugin
  dispatch.

A backend's components are fields of its descriptor, not hooks: ``BackendSpec.discover`` (device
discovery), ``.launch_plan`` (launch), ``.precision``, ``.doctor``; strategies come through
``aios_register_strategies`` (``StrategySpec.factory``, ``.precision``, ``.launch_env``),
accelerators through ``aios_register_accelerators``. The registry calls them isolated
(:meth:`aios.plugins.registry.Registry.discover_devices`, ``.launch_plan``).

Heavy types are only imported for type checking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from aios.check.rules.base import CheckRule
    from aios.config.settings import AiosConfig
    from aios.environments.base import ClusterEnvironment
    from aios.types import (
        AcceleratorSpec,
        BackendSpec,
        CheckpointFormatSpec,
        CloudSpec,
        CommandSpec,
        DoctorCheck,
        LoggerSpec,
        PreemptionWatcher,
        StorageSpec,
        StrategySpec,
    )

PROJECT = "aios"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------------------------
# Registration (run once when the registry loads; must not import heavy runtimes)
# --------------------------------------------------------------------------------------------


@hookspec
def aios_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register compute backends.

    :param register: call ``register(BackendSpec(...))`` once per backend. The spec carries the
        backend ``name`` (what ``--backend`` accepts), its auto-selection ``priority`` (highest
        available wins for ``--backend auto``), a ``probe`` callable that says whether the
        backend can run on this machine **without importing its heavy runtime or initialising
        it**, and the ``install_hint`` shown when it cannot.

    Two plugins registering the same name is an error naming both; neither is used.
    All results are collected (not ``firstresult``). Any plugin may implement it.

    .. versionadded:: 0.1
    """


@hookspec
def aios_register_strategies(register: Callable[[StrategySpec], None]) -> None:
    """Register training strategies (what ``strategy=NAME`` accepts).

    :param register: call ``register(StrategySpec(name=..., factory=..., backends=(...),
        accelerators=(...)))`` per strategy. ``factory(config, accelerator, backend)`` builds the
        :class:`aios.strategies.base.Strategy` once per process at :func:`aios.init` (import torch and
        your library inside it). ``backends`` names the backends it runs on; ``accelerators``
        names native accelerators (``"*"``: any), so one definition serves every native device.

    ``config.strategy`` is validated against this registry: an unknown name is a one-line error
    listing the registered strategies, a strategy the selected backend cannot run is a one-line
    error naming both and the strategies that backend supports. Two plugins registering one
    (name, backend or accelerator) pair is an error naming both; a built-in pair is never
    displaced. All results are collected.

    .. versionadded:: 0.2
    """


@hookspec
def aios_register_accelerators(register: Callable[[AcceleratorSpec], None]) -> None:
    """Register native torch device kinds (``cuda``, ``xpu``, ``tpu``, ``neuron``, ...).

    :param register: call ``register(AcceleratorSpec(name=..., factory=...))``;
        ``factory(config)`` returns an :class:`aios.devices.accelerator.Accelerator` (device, process-group
        backend, RNG, memory statistics, autocast dtype, worker environment). A backend uses it
        by naming it in ``BackendSpec.accelerator``; the native strategies (``ddp``, ``fsdp``,
        ``tp``, ``hsdp``) then run on it with no device branches.

    The built-in ``cpu`` accelerator cannot be replaced: a plugin claiming it is an error naming
    both, and the built-in is kept. All results are collected.

    .. versionadded:: 0.2
    """


@hookspec
def aios_register_cluster_environments(register: Callable[[ClusterEnvironment], None]) -> None:
    """Register cluster environments (schedulers and launchers that place processes).

    :param register: call ``register(env)`` with an :class:`aios.environments.base.ClusterEnvironment`
        instance carrying its ``name`` and ``priority``. :func:`aios.environments.base.detect` asks the
        environments, highest priority first, whether they recognise the process environment
        (``detect(environ)``, cheap, no torch, no network) and takes the first one's
        ``info(environ)`` (nodes, node rank, master address, ranks when already started).

    Built in: ``local`` and ``torchelastic``. All results are collected; two plugins claiming
    one name is an error naming both (a built-in name is kept).

    .. versionadded:: 0.2
    """


@hookspec
def aios_register_clouds(register: Callable[[CloudSpec], None]) -> None:
    """Register cloud providers for ``aios launch --cloud NAME`` and the other cloud commands.

    :param register: call ``register(CloudSpec(...))``; the spec's ``factory`` builds the
        :class:`aios_cloud.CloudProvider` lazily, so registering costs no cloud SDK import.

    All results are collected. Two plugins claiming one cloud name is an error naming both.

    .. versionadded:: 0.1
    """


@hookspec
def aios_register_commands(register: Callable[[CommandSpec], None]) -> None:
    """Contribute subcommands to the ``aios`` CLI (aios-cloud adds ``launch``, ``status``, ...).

    :param register: call ``register(CommandSpec(name=..., target="module:attr", help=...))``
        per command. ``target`` names the :class:`click.Command`; it is imported only when the
        command runs (or its own ``--help`` is asked), so ``aios --help`` lists the command from
        the spec alone and imports no torch and none of the command's code.

    A core command's name cannot be taken (an error naming the plugin; the core command is
    kept); two plugins claiming one name is an error naming both, and neither is used. A command
    whose ``target`` fails to import is reported by name (``aios NAME`` exits 2 with the plugin
    and the error), never fatal to the other commands. All results are collected (not
    ``firstresult``).

    .. versionadded:: 0.3
    """


@hookspec
def aios_register_storage(register: Callable[[StorageSpec], None]) -> None:
    """Register URL schemes usable for checkpoints, data and ``aios sync`` (``gs``, ``s3``, ...).

    :param register: call ``register(StorageSpec(scheme=..., protocol=..., requires=...,
        install_hint=...))``. aios opens such URLs through fsspec with ``protocol`` and
        ``storage_options(url)``; ``requires`` names the import that must succeed (for a clear
        install hint before fsspec's own error).

    All results are collected.

    .. versionadded:: 0.1
    """


@hookspec
def aios_register_loggers(register: Callable[[LoggerSpec], None]) -> None:
    """Register metric loggers (TensorBoard, Weights & Biases, ...).

    :param register: call ``register(LoggerSpec(name=..., enabled=..., factory=...))``.
        ``enabled(config)`` decides from the config and environment whether the logger runs;
        ``factory(config, run_dir)`` builds it on rank 0 only. Secrets are read from the
        environment by the logger and never written to configs or run records.

    All results are collected.

    .. versionadded:: 0.1
    """


@hookspec
def aios_register_checkpoint_formats(register: Callable[[CheckpointFormatSpec], None]) -> None:
    """Register checkpoint formats: how training state becomes files in a checkpoint.

    :param register: call ``register(CheckpointFormatSpec(name=..., factory=...))``.
        ``factory()`` returns an :class:`aios.checkpoint.formats.base.CheckpointFormat` (``save``,
        ``load``, ``all_ranks_write``, ``supports_resharding``); a strategy whose
        ``checkpoint_format`` is ``name`` saves with it, and a checkpoint whose marker names it
        is read with it. Core registers ``full`` and ``dcp``; those names are taken.

    All results are collected; two plugins registering one name is an error. Prove a format
    with :class:`aios.testing.checkpoint_format_contract.CheckpointFormatContract`.

    .. versionadded:: 0.3
    """


@hookspec
def aios_config_sections() -> dict[str, type] | None:
    """Contribute config sections.

    :return: a mapping of section name to a pydantic model class (``extra="forbid"``), e.g.
        ``{"xla": XlaSettings}``. The section is validated with the rest of the config and
        appears under that key in YAML, ``key=value`` overrides (``xla.spmd=true``) and
        ``AIOS_XLA__SPMD`` env vars. Two plugins contributing one section name is an error.

    All results are collected.

    .. versionadded:: 0.1
    """


# --------------------------------------------------------------------------------------------
# Questions asked at setup (once; what they return is used directly)
# --------------------------------------------------------------------------------------------


@hookspec
def aios_doctor_checks(backend: str | None, config: AiosConfig | None) -> list[DoctorCheck] | None:
    """Health checks for ``aios doctor``.

    :param backend: the backend asked about, or ``None`` for "everything installed".
    :param config: the resolved config, if one was given.
    :return: a list of :class:`aios.types.DoctorCheck` (pass/warn/fail, message, fix), or
        ``None``. A plugin raising here is reported as a failed check naming the plugin.

    All results are collected.

    .. versionadded:: 0.1
    """


@hookspec
def aios_preemption_watchers(config: AiosConfig) -> list[PreemptionWatcher] | None:
    """Sources of preemption notices besides SIGTERM (e.g. the EC2 spot notice in IMDSv2, the
    GCE ``preempted`` metadata key).

    :param config: the resolved config.
    :return: watchers whose ``start(notify)`` begins polling in a daemon thread and calls
        ``notify(notice)`` once when a notice arrives, with an :class:`aios.types.Notice`
        (source, reason, deadline; a plain reason string is still accepted); the runtime then
        checkpoints at the next step boundary exactly as for SIGTERM. Return ``None`` when not
        applicable.

    Deadlines: a notice's ``deadline`` is the wall-clock time (``time.time()`` epoch seconds)
    by which the host will be gone (AWS's ``instance-action`` time, the maintenance start the
    metadata server announces); ``None`` when the source does not say. The runtime writes the
    emergency checkpoint only when its measured cost fits before the earliest deadline any rank
    heard, otherwise it keeps the last committed checkpoint and says so in one line. Announce as
    early as the source allows: the runtime acts at the next step boundary. A known end that the
    launcher can compute ahead (a Capacity Block's end, a queued resource's ``--valid-until``)
    needs no watcher: set ``AIOS_RUN_DEADLINE`` (epoch seconds) and ``AIOS_RUN_DEADLINE_SOURCE``
    in every rank's environment and aios's own :class:`aios.resilience.notices.DeadlineWatcher` announces
    it when the time left falls to what the emergency checkpoint needs.

    All results are collected. Called once per process at setup.

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 notices carry a source and a deadline
    """


@hookspec
def aios_report_target(target: str) -> str | None:
    """Resolve a name given to ``aios report`` that is no local path (a cluster name).

    :param target: what the user typed.
    :return: a local run record directory (``<logging.run_dir>/<run id>``) or a checkpoint
        directory/URL to report on (e.g. the cloud plugin syncs the cluster's run records down
        and returns the newest), or ``None`` when this plugin does not know the name. The first
        non-``None`` result is used. Cloud events that belong in the account (capacity waits,
        provisioning) are written into the run record with :func:`aios.runrecord.goodput.write_event`.
        An :class:`aios.errors.AiosError` raised for a name the plugin knows (a cluster with no
        run record yet) is shown as it is, one line. May reach remote hosts: its time limit is
        ten times ``AIOS_PLUGIN_TIMEOUT``.

    .. versionadded:: 0.2
    """


@hookspec
def aios_env_info() -> dict[str, Any] | None:
    """Extra lines for ``aios env`` (versions, settings).

    :return: a flat mapping of name to value (``{"torch_xla": "2.9.0", "libtpu": "0.0.21"}``),
        or ``None``. Values whose key looks secret (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``) are
    redacted by aios before printing. All results are collected.

    .. versionadded:: 0.1
    """


@hookspec
def aios_check_rules() -> list[type[CheckRule]] | None:
    """Rules for ``aios check``: what ties a script to one accelerator, found statically.

    :return: rule classes (subclasses of :class:`aios.check.CheckRule`), or ``None``. Each
        declares the codes it reports, the AST node types it looks at and its own examples of
        wrong code (reported, at a line, naming a replacement) and right code (no finding);
        :class:`aios.testing.check_rule_contract.CheckRuleContract` proves a class against
        them. Core's own rules come through this hook too, first; on one line and code the
        first finding stands. All results are collected. Called once per ``aios check``; must
        not import torch (rules read the AST, nothing is imported or run).

    .. versionadded:: 0.3
    """
