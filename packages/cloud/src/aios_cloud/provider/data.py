"""The data a provider takes and gives: cluster requests, hosts, cluster info, catalog entries
and prices, and the commands a dry run prints."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from aios_cloud.provider.states import MAINTENANCE, PREEMPTED, READY, UNHEALTHY, UNKNOWN

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
