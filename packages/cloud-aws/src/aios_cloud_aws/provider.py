"""The AWS EC2 :class:`aios_cloud.CloudProvider`: GPU (P4d/P5/P5e) and Trainium (Trn1/Trn2).

A cluster is ``nodes`` instances launched in one ``RunInstances`` call (``MinCount == MaxCount``:
all or nothing) in one availability zone, with everything aios creates tagged
``aios:cluster=NAME``: instances, volumes, network interfaces, spot requests, the security group,
the key pair, the cluster placement group and Elastic IPs. :meth:`delete` finds all of it by tag,
so ``aios down`` works even without the local record, and a failed create calls it before
raising (nothing is left behind).

Zones: the core's failover (:func:`aios_cloud.failover.create_with_failover`) calls
:meth:`create` once per availability zone; EC2 capacity errors (``InsufficientInstanceCapacity``
...) become :class:`CapacityError` so it moves on to the next zone.

Laid out by job: :mod:`~aios_cloud_aws.base` (clients and calls), :mod:`~aios_cloud_aws.offerings`
(catalog and validation), :mod:`~aios_cloud_aws.network`, :mod:`~aios_cloud_aws.iam`,
:mod:`~aios_cloud_aws.dryrun` (the plan and its ``aws`` commands), :mod:`~aios_cloud_aws.instances`
(lifecycle); this module adds the hosts' runtime (python, setup, environment, checks).
"""

from __future__ import annotations

from typing import Any

from aios.launcher.contract import CLOUD_ENV, DEADLINE_ENV, DEADLINE_SOURCE_ENV
from aios_cloud.provider.data import ClusterInfo
from aios_cloud.provider.errors import CloudError, FailureKind
from aios_cloud.provider.requirements import check_requirements

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.base import (  # noqa: F401  (their old home)
    LIVE_STATES,
    NOT_FOUND_RETRIES,
    SPOT_TERMINATION_CODES,
    ElasticIpQuotaError,
)
from aios_cloud_aws.ec2params import (
    use_efa,
)
from aios_cloud_aws.errors import TransientAwsError
from aios_cloud_aws.instances import AwsInstances, _epoch
from aios_cloud_aws.session import region_of_zone
from aios_cloud_aws.settings import (
    SPOT_WATCH_ENV,
)


class AwsProvider(AwsInstances):
    """EC2 provider. ``config``: the resolved aios config (its ``aws`` section is read)."""

    def setup_commands(
        self, accelerator: str, requirements: list[str], backend: str | None = None
    ) -> list[str]:
        import shlex

        py = shlex.quote(self.python(accelerator))
        lines = [f"{py} -m pip install --quiet --upgrade pip"]
        aios_deps = [r for r in self.settings.aios_requirements if r]
        check_requirements(aios_deps, "aios_requirements")
        check_requirements(requirements)
        if aios_deps:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in aios_deps)
            )
        if requirements:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in requirements)
            )
        return lines

    def remote_env(self, info: ClusterInfo) -> dict[str, str]:
        """Region and the spot watcher switch for the hosts; credentials never travel (the hosts
        use their instance profile for S3)."""
        # only reserved AIOS_RUN_* names: any other AIOS_ name is parsed as a config key on the
        # hosts, and an `aws` key is an error there when the image's aios lacks this plugin
        region = info.raw.get("region") or (region_of_zone(info.zone) if info.zone else self.region)
        env = {"AWS_DEFAULT_REGION": region, CLOUD_ENV: "aws"}
        if info.spot:
            env[SPOT_WATCH_ENV] = "1"
        block = info.raw.get("capacity_block")
        if block:
            # a Capacity Block gives no notice on the hosts (no IMDS instance-action; only an
            # EventBridge event): its reclaim, read at launch, is every rank's known deadline

            reclaim = _epoch(block["terminates_from"])
            if reclaim is not None:
                deadline = reclaim - self.settings.capacity_block_margin
                env[DEADLINE_ENV] = f"{deadline:.0f}"
                env[DEADLINE_SOURCE_ENV] = "capacity-block"
        return env

    def classify_error(self, exc: BaseException) -> FailureKind:
        if isinstance(exc, TransientAwsError):
            return "transient"
        return super().classify_error(exc)

    def controller_settings(self) -> dict[str, Any]:
        d = self.settings.model_dump(exclude_none=True)
        d.pop("profile", None)  # the controller host uses its own instance profile
        d.update(self.agent_settings())
        return d

    def agent_settings(self) -> dict[str, Any]:
        # on the hosts: the instance profile's credentials (it needs ec2:StopInstances /
        # ec2:TerminateInstances on instances tagged aios:cluster)
        return {"region": self.region}

    def host_checks(self, accelerator: str, nodes: int) -> list[str]:
        """A multi-node EFA launch checks on every host, before training, that libfabric's EFA
        provider is usable (NCCL's aws-ofi-nccl and the Neuron collectives go through it);
        without it they fall back to TCP sockets at a fraction of the bandwidth, or fail."""
        itype = cat.lookup(accelerator)
        if not (self.settings.efa_check and use_efa(self.settings, itype, nodes)):
            return []
        path = "PATH=/opt/amazon/efa/bin:$PATH"
        return [
            f'{path} fi_info -p efa -t FI_EP_RDM >/dev/null 2>&1 || {{ echo "[aios] EFA is not usable on $(hostname): '
            f"'fi_info -p efa -t FI_EP_RDM' found no EFA provider ({itype.name} x{nodes} "
            "needs it for NCCL/Neuron collectives); "
            f'use an EFA-enabled AMI (the DLAMI) or set aws.efa=off" >&2; exit 1; }}'
        ]

    def check_storage(
        self, url: str, env_names: tuple[str, ...] | list[str] | set[str] = ()
    ) -> None:
        forwarded = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(
            env_names
        )  # the user's explicit choice
        if url.startswith("s3://") and not self.settings.iam_instance_profile and not forwarded:
            bucket = url[5:].split("/", 1)[0]
            raise CloudError(
                f"the hosts would have no credentials to write {url}: aws.iam_instance_profile is not set",
                f"set aws.iam_instance_profile to an instance profile whose role can read/write s3://{bucket} "
                "(aios never copies your keys to the hosts)",
            )


__all__ = ["AwsProvider", "ElasticIpQuotaError"]
