"""Catalog and validation: the instance types offered, their zones and AMIs, and the checks a
request passes before anything is created (as ``sky/clouds/aws.py`` holds for SkyPilot)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aios_cloud.provider import (
    CatalogEntry,
    CloudError,
    ClusterRequest,
)

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.base import AwsBase
from aios_cloud_aws.errors import RegionUnavailable
from aios_cloud_aws.session import region_of_zone
from aios_cloud_aws.settings import (
    DLAMI_PYTHON,
    neuron_ami_parameter,
    neuron_image,
)


class AwsOfferings(AwsBase):
    """The EC2 provider's catalog and validation."""

    # ------------------------------------------------------------------ catalog
    def catalog(self) -> list[CatalogEntry]:
        out = []
        for t in cat.INSTANCE_TYPES.values():
            out.append(
                CatalogEntry(
                    cloud="aws",
                    accelerator=t.name,
                    devices=t.accelerators,
                    device_kind=t.accelerator,
                    memory_gb=t.accelerator_memory_gib,
                    hosts=1,
                    runtime=self.settings.gpu_ami_parameter
                    if t.backend == "cuda"
                    else self.settings.neuron_ami_parameter or neuron_ami_parameter(t.name),
                    on_demand_hourly=t.on_demand_hourly,
                    spot_hourly=t.spot_hourly,
                    peak_tflops=t.peak_bf16_tflops,
                    zones=t.regions,
                    backend=t.backend,
                    extra={
                        "vcpus": t.vcpus,
                        "ram_gib": t.memory_gib,
                        "efa_interfaces": t.efa_interfaces,
                        "network_gbps": t.network_gbps,
                        **({"neuron_cores": t.neuron_cores} if t.neuron_cores else {}),
                    },
                )
            )
        return out

    def entry(self, accelerator: str) -> CatalogEntry:
        cat.lookup(accelerator)  # the AWS wording for an unknown type
        return super().entry(accelerator)

    def zones(self, accelerator: str) -> list[str]:
        """Availability zones of the active region offering ``accelerator`` (live), in failover
        order: ``aws.zones`` when set, the zones of ``aws.subnet_ids``, else every offering zone."""
        itype = cat.lookup(accelerator, self.region)
        if self.settings.zones:
            return list(self.settings.zones)
        if self.offline:
            return cat.region_zones(self.region)
        ec2 = self.ec2()
        if self.settings.subnet_ids:
            subnets = self._call(ec2, "DescribeSubnets", SubnetIds=list(self.settings.subnet_ids))[
                "Subnets"
            ]
            by_id = {s["SubnetId"]: s["AvailabilityZone"] for s in subnets}
            return [by_id[s] for s in self.settings.subnet_ids if s in by_id]
        resp = self._call(
            ec2,
            "DescribeInstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [itype.name]}],
        )
        zones = sorted({o["Location"] for o in resp.get("InstanceTypeOfferings", [])})
        if not zones:
            raise RegionUnavailable(
                f"no availability zone of {self.region} offers {accelerator} now",
                f"use --region with one of: {', '.join(r for r in itype.regions if r != self.region)}",
            )
        return zones

    # ------------------------------------------------------------------ validation
    def validate(self, request: ClusterRequest) -> ClusterRequest:
        region = (
            request.region
            or (region_of_zone(request.zone) if request.zone else None)
            or self.settings.region
        )
        self.region = region
        itype = cat.lookup(request.accelerator, region)
        if request.zone and region_of_zone(request.zone) != region:
            raise CloudError(
                f"zone {request.zone} is not in region {region}",
                f"use a zone of {region} (e.g. {region}a)",
            )
        if request.nodes < 1:
            raise CloudError(
                f"--nodes must be at least 1, not {request.nodes}", "pass --nodes 1 or more"
            )
        if request.queued or request.valid_after or request.valid_until:
            raise CloudError(
                "--queued/--valid-after/--valid-until are Cloud TPU queued resources; EC2 has none",
                "drop them; for reserved EC2 capacity pass --reservation (a capacity block or ODCR id)",
            )
        if (
            request.zone
            and region in cat.REGION_ZONES
            and request.zone not in cat.REGION_ZONES[region]
        ):
            raise CloudError(
                f"zone {request.zone} does not exist in {region}",
                f"use one of: {', '.join(cat.REGION_ZONES[region])}",
            )
        reservation = request.extra.get("reservation")
        if reservation:
            kind, _, rid = reservation.rpartition(":")
            if not rid.startswith("cr-") or kind not in ("", "block"):
                raise CloudError(
                    f"--reservation {reservation} is not a capacity reservation id",
                    "pass cr-... (an On-Demand Capacity Reservation) or block:cr-... (a Capacity Block for ML)",
                )
            if request.spot:
                raise CloudError(
                    "--spot and --reservation contradict each other (reserved capacity is not spot)",
                    "pass only one",
                )
        if request.disk_gb is not None and request.disk_gb < 8:
            raise CloudError(
                f"--disk-gb {request.disk_gb} is too small for the root volume",
                "pass at least 8 (default: aws.disk_gb)",
            )
        if self.settings.efa == "on" and not itype.efa_capable:
            raise CloudError(
                f"{itype.name} has no EFA interfaces",
                "set aws.efa=auto or off, or pick an EFA type (p4d/p5/trn1.32xlarge/trn2)",
            )
        if request.spot and itype.spot_hourly is None:
            self.log(
                f"note: no recorded spot price for {itype.name}; it is mostly sold through capacity blocks"
            )
        image = self.settings.ami or (
            request.image if request.image and request.image.startswith("ami-") else None
        )
        ssh_user = self.settings.ssh_user if request.ssh_user in ("", "aios") else request.ssh_user
        return replace(
            request,
            region=region,
            image=image,
            ssh_user=ssh_user,
            disk_gb=request.disk_gb or self.settings.disk_gb,
        )

    # ------------------------------------------------------------------ AMI
    def ami_source(self, accelerator: str | cat.InstanceType) -> tuple[str, str]:
        """Where the image of ``accelerator`` comes from: ``("ssm", PARAMETER)`` (a public SSM
        parameter AWS keeps pointing at the newest DLAMI) or ``("name", FILTER)`` (the newest
        Amazon-owned image whose name matches, through DescribeImages). The Neuron version sets
        name their DLAMI: since Neuron 2.32 the venv the plan runs ships only in the separate
        torch-neuronx DLAMI, not in the multi-framework one an SSM parameter names
        (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/dlami/index.html).
        ``accelerator``: the type's name, or its catalog entry when the caller has it."""
        itype = (
            accelerator if isinstance(accelerator, cat.InstanceType) else cat.lookup(accelerator)
        )
        if itype.backend != "neuron":
            return "ssm", self.settings.gpu_ami_parameter
        if self.settings.neuron_ami_parameter:
            return "ssm", self.settings.neuron_ami_parameter
        image = neuron_image(itype.name)
        if image.get("ami_name_filter"):
            return "name", image["ami_name_filter"]
        return "ssm", neuron_ami_parameter(itype.name)

    def ami_parameter(self, accelerator: str) -> str:
        """The SSM parameter or the image name filter of :meth:`ami_source`."""
        return self.ami_source(accelerator)[1]

    def resolve_ami(
        self, accelerator: str | cat.InstanceType, region: str, image: str | None = None
    ) -> tuple[str, str]:
        """``(ami_id, source)``: a user AMI, else the DLAMI id read from the public SSM parameter
        or found by name (the newest available Amazon-owned image)."""
        if image:
            return image, "user AMI"
        kind, name = self.ami_source(accelerator)
        if kind == "name":
            ec2 = self.ec2(region)
            images = self._call(
                ec2,
                "DescribeImages",
                Owners=["amazon"],
                Filters=[
                    {"Name": "name", "Values": [name]},
                    {"Name": "state", "Values": ["available"]},
                ],
            ).get("Images", [])
            if not images:
                raise CloudError(
                    f"no Amazon image named '{name}' in {region}",
                    "set aws.ami to a Neuron DLAMI id of this region (one that ships the venv "
                    f"{self.python(_name(accelerator))} runs from)",
                )
            newest = max(images, key=lambda i: str(i.get("CreationDate", "")))
            return newest["ImageId"], f"newest Amazon image named {name}: {newest.get('Name')}"
        ssm = self.clients.client("ssm", region)
        value = self._call(ssm, "GetParameter", Name=name)["Parameter"]["Value"]
        return value, f"SSM {name}"

    def _root_device(self, ec2: Any, ami: str) -> str:
        images = self._call(ec2, "DescribeImages", ImageIds=[ami]).get("Images", [])
        if not images:
            raise CloudError(
                f"AMI {ami} is not available in this region",
                "set aws.ami to an AMI of this region, or unset it to use the DLAMI",
            )
        return images[0].get("RootDeviceName") or "/dev/sda1"

    # ------------------------------------------------------------------ hosts / runtime
    def python(self, accelerator: str, backend: str | None = None) -> str:
        if self.settings.python:
            return self.settings.python
        backend = backend or self.backend_for(accelerator)
        if backend == "neuron":
            return neuron_image(accelerator)["python"]
        return DLAMI_PYTHON.get(backend, "python3")


def _name(accelerator: str | cat.InstanceType) -> str:
    return accelerator.name if isinstance(accelerator, cat.InstanceType) else accelerator
