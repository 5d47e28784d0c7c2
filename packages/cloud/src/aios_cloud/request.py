"""What ``aios launch`` was asked to do, as one typed value checked once.

The CLI turns its options into a :class:`LaunchRequest` (:meth:`LaunchRequest.from_options`),
which checks everything that does not depend on the cloud (one line naming the option and the
fix, exit 2). The launch stages (:mod:`aios_cloud.launch`) and the batch schedulers
(:meth:`aios_cloud.provider.SchedulerProvider.launch_job`) read it; nothing downstream reads
click's options.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aios.config.redact import is_secret
from aios.errors import AiosError

# the options only ``--cloud ssh`` takes (hosts the user already has)
HOST_OPTIONS = (
    "hosts",
    "hosts_file",
    "nprocs_per_host",
    "network",
    "host_wait",
    "worker_port",
    "min_hosts",
)


@dataclass
class LaunchRequest:
    """``aios launch``'s options (names as the flags, ``-`` as ``_``; defaults as the CLI's).

    :param script: the script (a path relative to ``workdir``) or, with ``module``, a module.
    :param script_args: the script's own arguments (a leading ``--`` is dropped: :attr:`args`).
    The rest mirror the flags documented by ``aios launch --help``.
    """

    script: str
    script_args: tuple[str, ...] = ()
    cloud: str | None = None
    accelerator: str | None = None
    name: str | None = None
    zone: str | None = None
    region: str | None = None
    nodes: int = 1
    spot: bool = False
    max_restarts: int = 0
    queued: bool = False
    valid_after: str | None = None
    valid_until: str | None = None
    image: str | None = None
    disk_gb: int | None = None
    label: tuple[str, ...] = ()
    project: str | None = None
    backend: str | None = None
    checkpoint_dir: str | None = None
    workdir: str = "."
    exclude: tuple[str, ...] = ()
    max_sync_mb: int = 512
    requirements: str | None = None
    setup_script: str | None = None
    no_setup: bool = False
    no_bundle: bool = False
    python: str | None = None
    env_items: tuple[str, ...] = ()
    ssh_key: str | None = None
    hosts: str | None = None
    hosts_file: str | None = None
    nprocs_per_host: int | None = None
    network: str | None = None
    worker_port: int | None = None
    host_wait: float | None = None
    min_hosts: int | None = None
    cheapest: bool = False
    ssh_user: str | None = None
    no_failover: bool = False
    module: bool = False
    detach: bool = False
    down_after: bool = False
    autostop: float | None = None
    autodown: bool = False
    controller: str | None = None
    controller_python: str | None = None
    reservation: str | None = None
    poll: float = 5.0
    #: ``--max-cost USD`` as typed (checked into :attr:`cost_limit`)
    max_cost: str | None = None
    dry_run: bool = False
    config_file: str | None = None
    # filled by :meth:`check` from ``env_items``: values set here, names forwarded from here
    env: dict[str, str] = field(default_factory=dict, repr=False)
    forward_env: list[str] = field(default_factory=list)
    #: filled by :meth:`check` from ``max_cost``: the spending limit in USD (None: none)
    cost_limit: float | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> LaunchRequest:
        """The request for click's parsed ``options`` (unknown keys are a programming error),
        checked."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"LaunchRequest has no option {', '.join(unknown)}")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in options.items()
        }
        req = cls(**values)
        req.check()
        return req

    @property
    def args(self) -> list[str]:
        """The script's arguments (without the ``--`` that separates them)."""
        a = list(self.script_args)
        return a[1:] if a and a[0] == "--" else a

    @property
    def candidates(self) -> list[str]:
        """``-a TYPE1,TYPE2,...``: the accelerator types in the order given (empty: none given)."""
        return [a.strip() for a in (self.accelerator or "").split(",") if a.strip()]

    @property
    def managed(self) -> bool:
        return self.max_restarts > 0

    @property
    def autostop_action(self) -> str:
        return "down" if self.autodown else "stop"

    def given(self, option: str) -> bool:
        """Whether ``option`` (a field name) was set to something other than its default."""
        f = next(f for f in dataclasses.fields(self) if f.name == option)
        return bool(getattr(self, f.name)) and getattr(self, f.name) != f.default

    def host_options(self) -> list[str]:
        """The ``--cloud ssh`` options given, as flags."""
        return [
            "--" + o.replace("_", "-")
            for o in HOST_OPTIONS
            if getattr(self, o) is not None and getattr(self, o) != ""
        ]

    def check(self) -> None:
        """Everything that does not depend on the cloud: one line naming the option and the fix."""
        if self.script.startswith("-"):
            # click leaves unknown options in SCRIPT's place (ignore_unknown_options, for the
            # script's own flags after it): an option before SCRIPT is a typo, not a script name
            raise AiosError(
                f"no such option: {self.script.split('=', 1)[0]}",
                "see `aios launch --help`; the script's own options go after SCRIPT (or after --)",
            )
        if self.disk_gb is not None and self.disk_gb < 1:
            raise AiosError(
                f"--disk-gb must be a positive size in GB, got {self.disk_gb}",
                "pass e.g. --disk-gb 512, or omit it for the default",
            )
        if self.max_sync_mb < 1:
            raise AiosError(
                f"--max-sync-mb must be positive, got {self.max_sync_mb}",
                "pass e.g. --max-sync-mb 512",
            )
        if self.poll <= 0:
            raise AiosError(f"--poll must be positive, got {self.poll}", "pass e.g. --poll 5")
        if self.controller and not (self.managed or self.down_after):
            raise AiosError(
                "--controller runs a managed job's recovery loop (or --down)",
                "add --max-restarts N --checkpoint-dir URL, or --down",
            )
        if self.controller:
            split_target(self.controller)
        if self.autodown and self.autostop is None:
            raise AiosError(
                "--autodown needs --autostop MINUTES (how long the cluster may idle)",
                "add e.g. --autostop 30",
            )
        if self.autostop is not None and self.autostop < 0:
            raise AiosError(
                f"--autostop must be 0 or more minutes, got {self.autostop:g}",
                "pass e.g. --autostop 30",
            )
        if self.nodes < 1:
            raise AiosError(
                f"--nodes must be at least 1, got {self.nodes}", "pass --nodes 1 or more"
            )
        if self.max_restarts < 0:
            raise AiosError(
                f"--max-restarts must be 0 or more, got {self.max_restarts}",
                "pass --max-restarts N",
            )
        if (self.valid_after or self.valid_until) and not self.queued:
            raise AiosError(
                "--valid-after/--valid-until only apply to queued resources", "add --queued"
            )
        if self.setup_script and self.no_setup:
            raise AiosError("--setup-script and --no-setup contradict each other", "pass only one")
        if not Path(self.workdir).is_dir():
            raise AiosError(
                f"--workdir {self.workdir} is not a directory", "pass the project directory to sync"
            )
        if not self.module and not (Path(self.workdir) / self.script).is_file():
            raise AiosError(
                f"script {self.script} not found in {os.path.abspath(self.workdir)}",
                "pass a path relative to --workdir, or -m for a module",
            )
        for path, flag, what in (
            (self.requirements, "--requirements", "an existing requirements.txt"),
            (self.setup_script, "--setup-script", "an existing shell script"),
        ):
            if path and not Path(path).is_file():
                raise AiosError(f"{flag} {path} does not exist", f"pass {what}")
        if self.ssh_key and not Path(self.ssh_key).expanduser().is_file():
            raise AiosError(
                f"SSH key {self.ssh_key} does not exist",
                "pass an existing private key with --ssh-key, or omit it to let aios create one",
            )
        if self.accelerator is not None:
            names = [a.strip() for a in self.accelerator.split(",")]
            if not all(names):
                raise AiosError(
                    f"-a '{self.accelerator}' has an empty entry",
                    "list the types separated by commas, e.g. -a p5.48xlarge,trn1.32xlarge",
                )
            twice = sorted({a for a in names if names.count(a) > 1})
            if twice:
                raise AiosError(
                    f"-a lists {', '.join(twice)} more than once", "list each type once"
                )
        if self.cheapest and len(self.candidates) < 2:
            raise AiosError(
                "--cheapest orders the candidates of -a by price; -a names fewer than two",
                "pass several types, e.g. -a v6e-16,v5litepod-16 --cheapest",
            )
        if self.min_hosts is not None:
            if self.min_hosts < 1:
                raise AiosError(
                    f"--min-hosts must be at least 1, got {self.min_hosts}",
                    "pass e.g. --min-hosts 2",
                )
            if not self.managed:
                raise AiosError(
                    "--min-hosts is how many hosts a managed run may continue on",
                    "add --max-restarts N --checkpoint-dir DIR",
                )
        self.env, self.forward_env = parse_env(list(self.env_items))
        self.cost_limit = parse_usd(self.max_cost) if self.max_cost is not None else None

    def labels(self) -> dict[str, str]:
        """``--label`` as a dict (``KEY=VALUE`` each)."""
        out = {}
        for item in self.label:
            k, eq, v = item.partition("=")
            if not eq or not k:
                raise AiosError(
                    f"--label '{item}' is not KEY=VALUE", "write it as --label key=value"
                )
            out[k] = v
        return out

    def requirement_lines(self) -> list[str]:
        """The packages ``--requirements`` lists (comments and blank lines left out)."""
        if not self.requirements:
            return []
        return [
            ln.strip()
            for ln in Path(self.requirements).read_text().splitlines()
            if ln.strip() and not ln.startswith("#")
        ]


@dataclass
class Candidate:
    """One accelerator type of ``-a TYPE1,TYPE2,...`` and how a job runs there (its backend,
    interpreter and setup differ per accelerator family); ``hourly``: the catalog's price of
    the whole cluster per hour at the launch's pricing (spot or on-demand), None when unknown."""

    accelerator: str
    backend: str
    python: str
    setup_lines: list[str] = field(default_factory=list)
    hourly: float | None = None


@dataclass
class JobSpec:
    """What runs on the cluster. Stored in the job record (no secret values: ``forward_env``
    names variables whose values are read from the launching environment each time the job
    starts, and are written to a mode-600 file on the hosts, never into a command line)."""

    script: str
    args: list[str] = field(default_factory=list)
    module: bool = False
    backend: str = "cpu"
    python: str = "python3"
    env: dict[str, str] = field(default_factory=dict)
    forward_env: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    workdir: str = "."
    excludes: list[str] = field(default_factory=list)
    setup_lines: list[str] = field(default_factory=list)
    checkpoint_dir: str | None = None
    max_sync_mb: int = 512
    bundle: bool = True  # ship this aios (core + loaded plugins) in code/.aios-site
    # ``-a TYPE1,TYPE2,...``: each candidate's runtime (:class:`Candidate` as dicts), in the
    # order a recovery tries them; empty for a single type
    candidates: list[dict[str, Any]] = field(default_factory=list)
    #: ``--max-cost``: the job is checkpointed and stopped before its spend passes this (USD)
    max_cost: float | None = None

    def candidate(self, accelerator: str) -> Candidate | None:
        """The runtime recorded for ``accelerator`` (None: not a candidate of this job)."""
        for c in self.candidates:
            if c["accelerator"] == accelerator:
                return Candidate(**c)
        return None

    def for_candidate(self, c: Candidate) -> JobSpec:
        """This spec running on candidate ``c``: its backend, interpreter and setup."""
        return dataclasses.replace(
            self, backend=c.backend, python=c.python, setup_lines=list(c.setup_lines)
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def parse_usd(text: str) -> float:
    """``--max-cost``: an amount in US dollars (``50``, ``12.5``, ``$50``), more than 0."""
    import math

    s = str(text).strip().removeprefix("$").replace(",", "").strip()
    try:
        value = float(s)
    except ValueError:
        raise AiosError(
            f"--max-cost '{text}' is not an amount in US dollars", "pass e.g. --max-cost 50"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise AiosError(
            f"--max-cost must be more than 0 US dollars, got {text}", "pass e.g. --max-cost 50"
        )
    return value


def parse_env(items: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--env K=V`` (plain values) and ``--env K`` (forward K from this environment). A value
    given inline for a secret-looking name is refused: it would land in the state database."""
    env: dict[str, str] = {}
    forward: list[str] = []
    for item in items:
        key, eq, value = item.partition("=")
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise AiosError(
                f"--env '{item}' is not NAME=VALUE or NAME",
                "write e.g. --env LOG_LEVEL=debug or --env WANDB_API_KEY",
            )
        if not eq:
            forward.append(key)
        elif is_secret(key):
            raise AiosError(
                f"--env {key}=... puts a secret on the command line and in the aios state",
                f"export {key} in your shell and pass --env {key} to forward it",
            )
        else:
            env[key] = value
    return env, forward


def split_target(target: str) -> tuple[str | None, str, int]:
    """``USER@HOST[:PORT]`` (``--controller``) as ``(user or None, host, port)``."""
    user, at, rest = target.rpartition("@")
    host, colon, port = rest.partition(":")
    if not host or (colon and not port.isdigit()):
        raise AiosError(
            f"--controller '{target}' is not USER@HOST[:PORT]", "e.g. --controller ubuntu@10.0.0.5"
        )
    return (user if at else None), host, int(port) if colon else 22


__all__ = [
    "HOST_OPTIONS",
    "Candidate",
    "JobSpec",
    "LaunchRequest",
    "parse_env",
    "parse_usd",
    "split_target",
]
