"""The cloud provider interface every aios cloud implements.

``aios-cloud-gcp`` (Cloud TPU VMs and pod slices) and ``aios-cloud-aws`` (EC2 GPU and Trainium
instances) both implement :class:`CloudProvider`; third-party clouds do the same and register a
:class:`aios.types.CloudSpec` whose ``factory(config)`` returns the provider. The cloud commands
(``aios launch|status|exec|logs|ssh|sync|stop|start|down|catalog|cost``) live in core and only talk
to this interface, the SQLite store (:mod:`aios_cloud.store`) and the SSH runner
(:mod:`aios_cloud.ssh`).

Rules for implementers:

* Importing the module that defines the provider must not import the cloud SDK; import it inside
  methods (``aios --help`` and ``--dry-run`` never pay for it).
* Every method that would touch the cloud has a ``render_*`` twin returning the equivalent CLI
  commands (``gcloud compute tpus tpu-vm create ...``, ``aws ec2 run-instances ...``); ``--dry-run``
  prints those and calls nothing else.
* Bad input (unknown accelerator, a zone that does not offer it, missing project, no credentials)
  raises :class:`aios.errors.AiosError` subclasses with a one-line message and fix.
* A ``create`` that fails must leave nothing behind: delete what it started (the core also calls
  :meth:`CloudProvider.delete` after a failed create; it must be idempotent).
* Capacity errors are classified by :meth:`CloudProvider.classify_error` so the core's zone failover
  (:func:`aios_cloud.failover.create_with_failover`) can move to the next zone.
* No secret (keys, tokens) is ever stored in the :class:`ClusterRecord` or printed.
"""

from __future__ import annotations

import builtins
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from aios.errors import AiosError

from aios_cloud.features import CloudFeature
from aios_cloud.request import JobSpec, LaunchRequest

if TYPE_CHECKING:
    from aios_cloud.store import ClusterRecord, JobRecord, Store

Echo = Callable[[str], None]

# ------------------------------------------------------------------------------ errors


class CloudError(AiosError):
    """A cloud operation failed (one line; the fix says what to do)."""


class CapacityError(CloudError):
    """The zone has no capacity for the type now (GCE ``RESOURCE_EXHAUSTED``/stockout, EC2
    ``InsufficientInstanceCapacity``). The core fails over to the next zone."""


class QuotaError(CloudError):
    """The project/account quota does not cover the request. The core fails over to the next
    zone (quotas are regional) and reports the quota when every zone failed."""


class NotOfferedError(CloudError):
    """The zone does not offer the type (GCE ``INVALID_ARGUMENT`` "accelerator type not
    available in zone", EC2 ``Unsupported``). The core moves on to the next zone."""


class CredentialsError(CloudError):
    """No usable credentials (ADC, gcloud, AWS profile)."""


class ClusterNotFound(CloudError):
    """The named cluster does not exist (in the store or in the cloud)."""


FailureKind = Literal["stockout", "quota", "unavailable", "transient", "fatal"]


# ------------------------------------------------------------------------------ requirements

# ``aios``, ``aios-core[aws]``, ``aios_cloud_gcp>=1``: names on the public registry that belong to
# unrelated projects. Hosts get aios from the synced checkout (the bundle), never from there.
_AIOS_REQ = re.compile(
    r"^\s*aios(?:[-_.][A-Za-z0-9_.-]*)?\s*(?:\[[^\]]*\])?\s*(?:[<>=!~;@].*)?$", re.IGNORECASE
)


def registry_aios(requirement: str) -> bool:
    """Whether ``requirement`` would fetch an ``aios*`` distribution from a package index (a
    local path or a URL to a wheel built from the checkout is fine)."""
    r = requirement.strip()
    if (
        not r
        or r.startswith(("-", ".", "/", "~"))
        or "://" in r.split("@", 1)[0]
        or r.endswith(".whl")
    ):
        return False
    if "@" in r and ("file:" in r or "://" in r):
        return False
    return bool(_AIOS_REQ.match(r))


def check_requirements(
    requirements: list[str] | tuple[str, ...], where: str = "setup requirements"
) -> None:
    """Refuse an ``aios*`` requirement that would come from the public registry."""
    for r in requirements:
        if registry_aios(r):
            raise CloudError(
                f"{where} ask for '{r.strip()}' from the package registry, where that name "
                "belongs to an unrelated project",
                "drop it: aios is shipped to the hosts with the synced code (or list a wheel "
                "path built from your checkout)",
            )


# ------------------------------------------------------------------------------ states

# Normalised cluster states. Providers map their own (TPU ``READY``/``PREEMPTED``, EC2
# ``running``/``stopped``) onto these.
PENDING = "PENDING"  # creating / queued / booting
QUEUED = "QUEUED"  # a queued resource waiting for capacity or its time window
READY = "READY"
STOPPING = "STOPPING"
STOPPED = "STOPPED"
STARTING = "STARTING"
DELETING = "DELETING"
PREEMPTED = "PREEMPTED"  # spot capacity taken back: the hosts are gone
TERMINATED = "TERMINATED"
FAILED = "FAILED"
UNKNOWN = "UNKNOWN"
STATES = (
    PENDING,
    QUEUED,
    READY,
    STOPPING,
    STOPPED,
    STARTING,
    DELETING,
    PREEMPTED,
    TERMINATED,
    FAILED,
    UNKNOWN,
)

HEALTHY = "HEALTHY"
UNHEALTHY = "UNHEALTHY"
# The cloud is maintaining the hosts (TPU ``UNHEALTHY_MAINTENANCE``). A host event on a VM of a
# TPU slice interrupts the whole slice (https://cloud.google.com/kubernetes-engine/docs/how-to/handle-disruption-gpu-tpu):
# the watcher treats it as lost hosts (managed recovery), never as something that resumes.
MAINTENANCE = "MAINTENANCE"


# ------------------------------------------------------------------------------ data types


@dataclass
class ClusterRequest:
    """What ``aios launch`` asks a cloud for.

    :param name: cluster name (lowercase letters, digits, dashes; the cloud resource name).
    :param accelerator: the accelerator or instance type: ``v5litepod-8``, ``v4-16``,
        ``trn1.32xlarge``, ``p5.48xlarge``.
    :param nodes: number of slices (TPU) or instances (EC2). A TPU pod slice is one node with
        several hosts.
    :param zone: the zone (``us-west4-a``); ``None`` lets the provider pick from :meth:`zones`.
    :param region: the region, for clouds that are regional (AWS); derived from zone otherwise.
    :param spot: spot/preemptible capacity.
    :param queued: create through a queued resource (TPU) / capacity reservation, waiting for
        capacity instead of failing on a stockout.
    :param valid_after: queued only: earliest start (RFC 3339 or ``+2h`` relative).
    :param valid_until: queued only: give up when not provisioned by then.
    :param image: runtime version (TPU ``v2-alpha-tpuv5-lite``) or AMI id; ``None``: the
        provider's default for the accelerator's generation.
    :param disk_gb: boot disk size, ``None`` for the provider default.
    :param labels: labels/tags put on every resource (aios adds ``aios-cluster=NAME``).
    :param project: GCP project / AWS account alias, when the cloud needs one.
    :param ssh_user: login user on the hosts.
    :param ssh_public_key: public key text installed for ``ssh_user`` (never the private key).
    :param extra: provider-specific options (``network``, ``subnet``, ``service_account``...).
    """

    name: str
    accelerator: str
    nodes: int = 1
    zone: str | None = None
    region: str | None = None
    spot: bool = False
    queued: bool = False
    valid_after: str | None = None
    valid_until: str | None = None
    image: str | None = None
    disk_gb: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    project: str | None = None
    ssh_user: str = "aios"
    ssh_public_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def with_zone(self, zone: str) -> ClusterRequest:
        return replace(self, zone=zone)


@dataclass
class ClusterHost:
    """One machine of a cluster (a TPU VM worker, an EC2 instance).

    :param worker_id: the host's index in the slice/cluster (TPU worker id, 0 = coordinator).
    :param ip: address aios connects to over SSH (external IP, or internal when running inside
        the VPC).
    :param internal_ip: address the hosts use between themselves (master address).
    :param ssh_user: login user; ``ssh_key`` the private key *path* (never its content).
    :param port: SSH port (22 on clouds; test hosts may use others). ``0``: not given, the SSH
        client's configuration decides (``--cloud ssh`` host aliases); ``ssh_user`` ``""``
        likewise.
    :param instance_id: cloud id of the machine, if it has its own.
    :param internal_port: the port the other hosts reach this host's sshd at on their shared
        network (``None``: :attr:`port`); differs behind NAT or port forwarding.
    """

    worker_id: int
    ip: str
    internal_ip: str | None = None
    ssh_user: str = "aios"
    ssh_key: str | None = None
    port: int = 22
    instance_id: str | None = None
    internal_port: int | None = None

    @property
    def label(self) -> str:
        return f"worker {self.worker_id}, {self.ip}"


@dataclass
class ClusterInfo:
    """The cloud's view of a cluster, as :meth:`CloudProvider.describe` returns it.

    :param state: one of :data:`STATES`.
    :param health: ``HEALTHY``, ``UNHEALTHY`` or ``UNKNOWN``; ``health_detail`` carries the cloud's
        own wording (``UNHEALTHY_TENSORFLOW``, ``UNHEALTHY_MAINTENANCE``, EC2 status check).
    :param preempted: the spot capacity was reclaimed (state ``PREEMPTED`` or the hosts report
        ``preempted``); the core recreates the cluster for a managed run.
    :param raw: the provider's own record (for ``aios status --json``); no secrets.
    :param waiting: why a cluster that has not started waits, when that wait does not end by
        itself (a job a queue holds), with the fix; ``aios status --refresh`` shows it after the
        state. Empty otherwise.
    """

    name: str
    cloud: str
    zone: str | None
    accelerator: str
    state: str = UNKNOWN
    health: str = UNKNOWN
    health_detail: str = ""
    spot: bool = False
    hosts: list[ClusterHost] = field(default_factory=list)
    runtime: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    created: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    waiting: str = ""

    @property
    def preempted(self) -> bool:
        return self.state == PREEMPTED

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def unhealthy(self) -> bool:
        return self.health == UNHEALTHY

    @property
    def in_maintenance(self) -> bool:
        return self.health == MAINTENANCE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CatalogEntry:
    """One accelerator type a cloud offers, for ``aios catalog`` and ``aios cost``.

    :param accelerator: the type name users pass to ``--accelerator``.
    :param devices: accelerator devices in the whole type (TPU chips, GPUs, Trainium chips).
    :param device_kind: what a device is (``TPU v5e chip``, ``H100 80GB``, ``Trainium1``).
    :param memory_gb: accelerator memory per device (HBM), GB.
    :param hosts: machines in one slice/instance of this type.
    :param runtime: default runtime version / image family.
    :param on_demand_hourly: USD per hour for the whole type, on demand (``None``: unknown).
    :param spot_hourly: USD per hour for the whole type, spot.
    :param peak_tflops: dense bf16 peak TFLOP/s of the whole type (all devices), for ``aios cost``.
    :param zones: zones (or regions) that offer it.
    :param backend: the aios backend that trains on it (``xla``, ``neuron``, ``cuda``).
    :param extra: per-host facts that are not about the accelerator, shown by ``aios catalog``
        (table and ``--json``). Known keys (all optional): ``vcpus``, ``ram_gib`` (host RAM),
        ``efa_interfaces`` (EFA network cards; 0 = none), ``network_gbps``, ``neuron_cores``;
        providers may add their own (JSON-serialisable values).
    """

    cloud: str
    accelerator: str
    devices: int
    device_kind: str
    memory_gb: float
    hosts: int = 1
    runtime: str = ""
    on_demand_hourly: float | None = None
    spot_hourly: float | None = None
    peak_tflops: float | None = None
    zones: tuple[str, ...] = ()
    backend: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def hourly(self, spot: bool) -> float | None:
        return self.spot_hourly if spot else self.on_demand_hourly

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["zones"] = list(self.zones)
        return d

    def host_summary(self) -> str:
        """``192 vCPU, 2048 GiB RAM, 32 EFA`` from :attr:`extra` (``-`` when unknown)."""
        x = self.extra or {}
        parts = []
        if x.get("vcpus"):
            parts.append(f"{x['vcpus']} vCPU")
        if x.get("ram_gib"):
            parts.append(f"{x['ram_gib']:g} GiB RAM")
        if "efa_interfaces" in x:
            parts.append(f"{x['efa_interfaces']} EFA" if x["efa_interfaces"] else "no EFA")
        return ", ".join(parts) or "-"


@dataclass(frozen=True)
class ReservedPrice:
    """What reserved capacity costs where it is billed otherwise than by the catalog's hour: an
    upfront fee for its whole term (an AWS Capacity Block, paid when bought).

    :param what: the reservation or offer, in words (type, count, zone, dates).
    :param fee: the fee for the whole term; ``None`` when not known (a dry run calls no cloud; a
        bought block's fee is on the bill, not in the cloud's API).
    :param currency: the fee's currency (``USD``).
    :param hours: the term's length in hours (the fee per hour is ``fee / hours``).
    :param how: where the fee comes from, or how to see it when ``fee`` is ``None``.
    """

    what: str
    fee: float | None = None
    currency: str = "USD"
    hours: float | None = None
    how: str = ""

    @property
    def hourly(self) -> float | None:
        """The fee per hour of the term (``None`` when the fee or the term is unknown)."""
        return None if self.fee is None or not self.hours else self.fee / self.hours

    def line(self) -> str:
        """One line: the fee, its term and the fee per hour, or that it is not known here."""
        how = f" ({self.how})" if self.how else ""
        if self.fee is None:
            return f"{self.what}: an upfront fee for the whole term, not billed by the hour{how}"
        term = f" for {self.hours:g} h" if self.hours else ""
        per = f" = {self.hourly:,.2f} {self.currency}/h" if self.hourly is not None else ""
        return f"{self.what}: upfront fee {self.fee:,.2f} {self.currency}{term}{per}{how}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hourly": self.hourly}


@dataclass
class CloudCommand:
    """A rendered, equivalent cloud CLI command for ``--dry-run`` (``gcloud ...``, ``aws ...``)."""

    argv: list[str]
    comment: str = ""
    # argv positions that are shell expressions (``$(aws ec2 describe-instances ...)``) and are
    # printed unquoted, so the line runs as printed
    shell_args: tuple[int, ...] = ()

    def shell(self) -> str:
        line = " ".join(
            a if i in self.shell_args else shlex.quote(a) for i, a in enumerate(self.argv)
        )
        return f"{line}  # {self.comment}" if self.comment else line


@dataclass
class LaunchPlan:
    """What a launch will do, as :meth:`CloudProvider.render_launch` prints it for ``--dry-run``.

    :param cluster: the validated cluster request (``ssh_public_key`` as the launch would send it).
    :param spec: what runs on the hosts (setup lines, python, env).
    :param config: the resolved aios config (the backend's launch plan reads it).
    :param existing: the cluster exists and is reused (nothing is provisioned).
    :param key_path: ``--ssh-key`` as given (``None``: aios's key for this cluster).
    :param autostop_line: the autostop step, already worded, or ``None``.
    :param standard: the standard rendering (:func:`aios_cloud.dryrun.render_launch`) that
        :meth:`CloudProvider.render_launch` uses by default; the launch fills it in.
    """

    cluster: ClusterRequest
    spec: JobSpec
    config: Any
    existing: bool = False
    key_path: str | None = None
    autostop_line: str | None = None
    standard: Callable[[CloudProvider, LaunchPlan, Echo], None] | None = None


# ------------------------------------------------------------------------------ the interface


class Provider(ABC):
    """What every ``--cloud`` is to the commands (``aios status|stop|start|down|catalog|cost``),
    whether it provisions hosts (:class:`CloudProvider`) or submits jobs to a batch scheduler
    (:class:`SchedulerProvider`). Built by ``CloudSpec.factory(config)``.

    Class attributes:

    :cvar name: the ``--cloud`` value (``gcp``, ``aws``).
    :cvar storage_scheme: URL scheme of its object store (``gs``, ``s3``), used for checkpoints of
        managed runs.
    :cvar cli: name of the cloud's own CLI (``gcloud``, ``aws``) for dry-run output.
    """

    name: ClassVar[str] = ""
    storage_scheme: ClassVar[str] = ""
    cli: ClassVar[str] = ""

    # -------------------------------------------------------------- capabilities the CLI reads
    #: A batch scheduler (Slurm, Kubernetes): ``aios launch`` submits a job through
    #: :meth:`SchedulerProvider.launch_job` instead of provisioning hosts; ``aios logs`` and
    #: ``aios cancel`` go through it too. Set by :class:`SchedulerProvider` (and only there).
    scheduler: ClassVar[bool] = False
    #: Hosts the user already has (``--cloud ssh``): the user's own SSH login (no key of aios's),
    #: never stopped, replaced or deleted by aios.
    user_hosts: ClassVar[bool] = False
    #: The hosts share the paths a managed run checkpoints to (an NFS mount), so a local
    #: ``--checkpoint-dir`` survives a restart; otherwise a managed run needs a bucket URL.
    shared_paths: ClassVar[bool] = False
    #: ``--accelerator`` when none is given for a new cluster (``None``: required).
    default_accelerator: ClassVar[str | None] = None
    #: Login user on the hosts when ``--ssh-user`` is not given (providers may set it per
    #: instance from their config section).
    default_ssh_user: str = "aios"
    #: What of ``aios launch``'s options this cloud supports (:mod:`aios_cloud.features`):
    #: the launch refuses an option of any feature not declared here, in one line, before
    #: anything else runs. Default: none (a cloud declares what it does).
    features: ClassVar[frozenset[CloudFeature]] = frozenset()
    #: What to do instead of a feature this cloud does not support, where there is more to say
    #: than "drop the option" (``{SSH_LOGIN: "set slurm.login / slurm.ssh_key instead"}``).
    feature_hints: ClassVar[Mapping[CloudFeature, str]] = {}

    @abstractmethod
    def catalog(self) -> list[CatalogEntry]:
        """Every accelerator type offered, with devices, memory, runtime, prices, peak TFLOP/s
        and zones. Must work offline (a built-in table; refreshing from the cloud is optional)."""

    def entry(self, accelerator: str) -> CatalogEntry:
        """The catalog entry for ``accelerator``; :class:`aios.errors.AiosError` when unknown."""
        for e in self.catalog():
            if e.accelerator == accelerator:
                return e
        known = ", ".join(sorted({e.accelerator for e in self.catalog()})[:12])
        raise CloudError(
            f"unknown accelerator '{accelerator}' for cloud {self.name}",
            f"pick one from `aios catalog --cloud {self.name}` (e.g. {known})",
        )

    def zones(self, accelerator: str) -> list[str]:
        """Zones offering ``accelerator``, in failover order."""
        return list(self.entry(accelerator).zones)

    def zone_region(self, zone: str) -> str:
        """The region ``zone`` belongs to (``us-central1-a`` -> ``us-central1``); the failover
        stays in ``--region`` when one is given."""
        return zone.rsplit("-", 1)[0]

    def reservation_prices(
        self, request: ClusterRequest, hours: float | None = None, live: bool = True
    ) -> builtins.list[ReservedPrice]:
        """What the reserved capacity ``request.extra["reservation"]`` costs where it is billed
        otherwise than by the catalog's hour (an AWS Capacity Block: an upfront fee): for a
        reservation id, that reservation's fee where the cloud tells it; for a kind without an
        id (``block``), what the cloud offers for ``request.nodes`` x ``request.accelerator``
        over ``hours``. ``live`` False (``--dry-run``): no cloud call, the fee is ``None`` and
        ``how`` says how to see it. Default ``[]``: billed by the hour, as the catalog says."""
        return []

    @abstractmethod
    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        """The cluster's current state, hosts and health; ``None`` when it does not exist."""

    @abstractmethod
    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        """Clusters aios created (labelled ``aios-cluster``) in ``zone`` or everywhere."""

    @abstractmethod
    def start(self, name: str, zone: str | None) -> ClusterInfo:
        """Start a stopped cluster and wait for ``READY``. Host IPs and host keys may change."""

    @abstractmethod
    def stop(self, name: str, zone: str | None) -> None:
        """Stop the cluster (disks kept, billing for compute stops)."""

    @abstractmethod
    def delete(self, name: str, zone: str | None) -> None:
        """Delete the cluster and everything created for it. Idempotent: deleting a missing
        cluster is not an error."""

    def hosts(self, info: ClusterInfo) -> builtins.list[ClusterHost]:
        """SSH-reachable hosts of a described cluster, ordered by worker id."""
        return sorted(info.hosts, key=lambda h: h.worker_id)

    def backend_for(self, accelerator: str) -> str:
        """The aios backend that trains on ``accelerator`` (``xla`` for TPU...)."""
        return self.entry(accelerator).backend

    def python(self, accelerator: str, backend: str | None = None) -> str:
        """The interpreter jobs run with on the hosts of ``accelerator`` (the one that has torch
        in the provider's image: a DLAMI's conda/venv python, the TPU VM's ``python3``).
        ``aios launch --python`` overrides it."""
        return "python3"

    def agent_settings(self) -> dict[str, Any]:
        """This provider's config section as the autostop agent on the head host must use it
        (:mod:`aios_cloud.agent`): endpoints and project, never credentials (the hosts use
        their service account / instance profile)."""
        return {}

    def controller_settings(self) -> dict[str, Any]:
        """What a managed-job controller host needs beyond :meth:`agent_settings` to recreate the
        cluster (zones, images, network...): the config section without credentials."""
        return {}

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        """Why a cluster of this capacity and ``accelerator`` cannot be stopped and started
        again (spot TPUs, one-time EC2 spot instances, multi-host TPU slices: only deleted), or
        ``None`` when it can."""
        return "spot capacity cannot be stopped, only deleted" if spot else None

    def can_stop(self, spot: bool, accelerator: str | None = None) -> bool:
        """Whether a cluster of this capacity can be stopped and started again
        (:meth:`stop_refusal` gives the reason when not)."""
        return self.stop_refusal(spot, accelerator) is None

    @abstractmethod
    def render(self, action: str, name: str, zone: str | None) -> builtins.list[CloudCommand]:
        """Equivalent CLI commands for ``describe``, ``start``, ``stop``, ``delete``, ``list``."""

    def describe_credentials(self) -> str:
        """Where credentials come from (``ADC``, ``gcloud``, ``AWS profile default``), never
        their value. Raise :class:`CredentialsError` when there are none."""
        return "default"


class CloudProvider(Provider):
    """A cloud aios provisions hosts on (``gcp``, ``aws``, the user's own ``ssh`` hosts): create,
    reach them over SSH, set them up, start the job on every host."""

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        """Check and complete a request before anything is created (zone offers the type,
        project set, credentials present, image chosen). Returns the completed request.
        Providers extend this; the default checks the accelerator and zone."""
        entry = self.entry(request.accelerator)
        if request.zone and entry.zones and request.zone not in entry.zones:
            raise CloudError(
                f"zone '{request.zone}' does not offer {request.accelerator}",
                f"use one of: {', '.join(entry.zones)}",
            )
        if request.image is None:
            request = replace(request, image=entry.runtime or None)
        return request

    def prepare(self, request: ClusterRequest) -> ClusterRequest:
        """Account-level steps before the first create, once per launch (not in a dry run):
        e.g. import the SSH key into the user's OS Login profile and log in as its POSIX user.
        Returns the request to create (``ssh_user`` may change)."""
        return request

    @abstractmethod
    def create(self, request: ClusterRequest) -> ClusterInfo:
        """Create the cluster in ``request.zone`` and wait until it is ``READY`` (or, for a
        queued request, until provisioned). Raise :class:`CapacityError` / :class:`QuotaError` on
        stockout/quota (after cleaning up), other :class:`CloudError` for anything else."""

    def setup_commands(
        self, accelerator: str, requirements: builtins.list[str], backend: str | None = None
    ) -> builtins.list[str]:
        """Shell lines run on every host after create/recreate: install the pinned
        torch/torch_xla/libtpu (or torch_tpu, neuron, cuda) set of ``backend`` (default: the
        accelerator's, :meth:`backend_for`) from :data:`aios.plugins.versions.STACKS` and the user's
        requirements. aios itself is never installed from a registry: it is shipped with the
        code (:mod:`aios_cloud.bundle`). Run from the synced code directory."""
        check_requirements(requirements)
        lines = ["python3 -m pip install --quiet --upgrade pip"]
        if requirements:
            lines.append(
                "python3 -m pip install --quiet " + " ".join(shlex.quote(r) for r in requirements)
            )
        return lines

    def remote_env(self, info: ClusterInfo) -> dict[str, str]:
        """Extra environment for every host (besides the backend launch plan's)."""
        return {}

    def host_checks(self, accelerator: str, nodes: int) -> builtins.list[str]:
        """Shell lines run on every host after setup that fail (non-zero, one ``[aios]`` line)
        when the hosts cannot run the job as planned (EFA missing on a multi-node EFA launch).
        Run even with ``--no-setup``."""
        return []

    def prepare_autostop(
        self, request: ClusterRequest, action: str, dry_run: bool = False
    ) -> ClusterRequest:
        """Before a launch with ``--autostop`` (``action``: ``stop`` or ``down``) creates
        anything: make sure the agent on the head host will have the rights to ``action`` the
        cluster (an instance profile on AWS...), provisioning them or raising
        :class:`CloudError` that names the fix. ``dry_run``: only plan (nothing is called).
        Returns the request to create (it may name what the hosts must carry)."""
        return request

    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        """``aios autostop NAME MINUTES`` on a cluster that exists (launched without
        ``--autostop``): before the agent is installed, make sure the hosts give it the rights
        to ``action`` the cluster, granting them where the cloud allows that on running hosts
        (an instance profile attached on AWS), or raise :class:`CloudError` naming the fix.
        Default: nothing to check."""
        return None

    def check_storage(
        self, url: str, env_names: tuple[str, ...] | builtins.list[str] | set[str] = ()
    ) -> None:
        """Raise :class:`CloudError` when the hosts will have no credentials to write ``url``
        (a managed run's checkpoints); ``env_names`` are the variables the job gets (``--env``).
        Called before anything is created."""
        return None

    def classify_error(self, exc: BaseException) -> FailureKind:
        """How the failover loop treats a create error: ``stockout`` and ``quota`` move to the next
        zone, ``unavailable`` (the zone does not offer the type) moves on at once, ``transient``
        retries the same zone with backoff, ``fatal`` stops."""
        if isinstance(exc, CapacityError):
            return "stockout"
        if isinstance(exc, NotOfferedError):
            return "unavailable"
        if isinstance(exc, QuotaError):
            return "quota"
        return "fatal"

    def returned_hosts(
        self, request: ClusterRequest, hosts: builtins.list[ClusterHost]
    ) -> builtins.list[str]:
        """The hosts the cluster ``request`` lists beyond its current ``hosts`` that answer
        again (a managed run that continued on fewer, ``--cloud ssh --min-hosts``): the watcher
        grows the run back onto every host at its next checkpoint. Each as its label. Default:
        none (a cloud's cluster is recreated whole)."""
        return []

    def repair(self, info: ClusterInfo) -> str:
        """Fix an unhealthy cluster in place. Default: stop then start. Returns what was done;
        raise :class:`CloudError` when the cluster must be recreated instead."""
        self.stop(info.name, info.zone)
        self.start(info.name, info.zone)
        return "stop/start"

    def launch_extra(self, request: LaunchRequest, existing: bool) -> dict[str, Any]:
        """Check the ``aios launch`` options only this cloud takes and return what the cluster
        request carries for them (:attr:`ClusterRequest.extra`; never a secret). Called once per
        launch, before anything is created and after the request was checked against
        :attr:`features` (an option whose feature is not declared never reaches here);
        ``existing``: the cluster is reused. Default: the ``--reservation`` given."""
        return {"reservation": request.reservation} if request.reservation else {}

    @abstractmethod
    def render_create(self, request: ClusterRequest) -> builtins.list[CloudCommand]:
        """The cloud CLI commands equivalent to :meth:`create` (``gcloud compute tpus tpu-vm
        create ...`` or ``gcloud compute tpus queued-resources create ...``)."""

    def render_launch(self, plan: LaunchPlan, echo: Echo) -> None:
        """``aios launch --dry-run``: every step the launch takes, as the commands that do it
        (no cloud call, no SSH). Default: :func:`aios_cloud.dryrun.render_launch` (provision
        through :meth:`render_create`, the sync through worker 0, setup, the per-host
        commands); a cloud whose launch takes another path renders that path."""
        if plan.standard is None:
            raise CloudError(
                f"no dry-run rendering for cloud {self.name}",
                "build the LaunchPlan with standard=aios_cloud.dryrun.render_launch",
            )
        plan.standard(self, plan, echo)


class SchedulerProvider(Provider):
    """A batch scheduler behind the cloud commands (Slurm, Kubernetes): ``aios launch`` submits
    one job (there are no hosts to provision or SSH into), ``aios logs`` reads the job's output
    through the scheduler, ``aios cancel``/``stop``/``down`` cancel it. What the two share:

    * :meth:`launch_job` gets the checked :class:`~aios_cloud.request.LaunchRequest` (never the
      CLI's options) and returns the exit code of ``aios launch``;
    * :meth:`job_logs` prints a job's output (``follow``: until it ends);
    * :meth:`cancel` ends the cluster's job; :meth:`stop` and :meth:`delete` cancel it (a
      scheduler's job cannot be stopped and resumed in place: :meth:`start` refuses);
    * :meth:`list` gives the jobs aios submitted (records of this cloud in the store).
    """

    scheduler: ClassVar[bool] = True

    @abstractmethod
    def launch_job(self, request: LaunchRequest, store: Store | None, log: Echo) -> int:
        """Submit the job ``request`` describes (``request.dry_run``: print the plan, submit
        nothing; ``store`` is ``None`` then) and, unless ``request.detach``, follow it to the
        end. Returns the exit code for ``aios launch``."""

    @abstractmethod
    def job_logs(
        self, rec: ClusterRecord, job: JobRecord, follow: bool, dry_run: bool, echo: Echo
    ) -> int:
        """Print ``job``'s output (``follow``: until it ends; ``dry_run``: the command that
        would). Returns the exit code for ``aios logs``."""

    @abstractmethod
    def cancel(self, name: str) -> None:
        """Cancel the job of cluster ``name`` (nothing to do when it has ended or is unknown)."""

    def stop(self, name: str, zone: str | None) -> None:
        self.cancel(name)

    def delete(self, name: str, zone: str | None) -> None:
        self.cancel(name)

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        raise CloudError(
            f"a {self.name} job cannot be restarted in place",
            f"launch it again with `aios launch --cloud {self.name} --name {name} ...`",
        )

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        """The jobs aios submitted to this scheduler (from the store), as the scheduler sees
        them now."""
        from aios_cloud.store import Store

        out = []
        for rec in Store().clusters():
            if rec.cloud == self.name:
                info = self.describe(rec.name, rec.zone)
                if info is not None:
                    out.append(info)
        return out


def provisioning(provider: Provider, name: str) -> CloudProvider:
    """``provider`` as a cloud whose clusters are hosts aios reaches (stop/start them, install
    the autostop agent, watch the job on them), or the one-line refusal naming the cluster: a
    batch scheduler's cluster is one job."""
    if isinstance(provider, CloudProvider):
        return provider
    raise CloudError(
        f"{name} is a {provider.name} job, not hosts aios provisioned",
        f"use `aios status {name}`, `aios logs {name}` or `aios cancel {name}`",
    )


__all__ = [
    "provisioning",
    "Provider",
    "check_requirements",
    "registry_aios",
    "CapacityError",
    "CatalogEntry",
    "CloudCommand",
    "CloudError",
    "CloudProvider",
    "LaunchPlan",
    "SchedulerProvider",
    "ClusterHost",
    "ClusterInfo",
    "ClusterNotFound",
    "ClusterRequest",
    "CredentialsError",
    "FailureKind",
    "NotOfferedError",
    "QuotaError",
    "ReservedPrice",
    "STATES",
    "PENDING",
    "QUEUED",
    "READY",
    "STOPPING",
    "STOPPED",
    "STARTING",
    "DELETING",
    "PREEMPTED",
    "TERMINATED",
    "FAILED",
    "UNKNOWN",
    "HEALTHY",
    "UNHEALTHY",
    "MAINTENANCE",
]
