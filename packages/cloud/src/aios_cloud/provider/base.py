"""The provider interface: :class:`Provider` (what every ``--cloud`` is to the commands) and
:class:`CloudProvider` (a cloud whose clusters are hosts aios provisions and reaches)."""

from __future__ import annotations

import builtins
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from aios_cloud.features import CloudFeature
from aios_cloud.provider.data import (
    CatalogEntry,
    CloudCommand,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    ReservedPrice,
)
from aios_cloud.provider.errors import (
    CapacityError,
    CloudError,
    FailureKind,
    NotOfferedError,
    QuotaError,
)
from aios_cloud.provider.requirements import check_requirements
from aios_cloud.request import JobSpec, LaunchRequest

Echo = Callable[[str], None]


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
