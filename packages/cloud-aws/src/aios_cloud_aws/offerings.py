"""Catalog and validation: the instance types offered, their zones and AMIs, and the checks a
request passes before anything is created (as ``sky/clouds/aws.py`` holds for SkyPilot)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aios_cloud.provider.data import CatalogEntry, ClusterRequest, ReservedPrice
from aios_cloud.provider.errors import CloudError

from aios_cloud_aws import catalog as cat
from aios_cloud_aws.base import AwsBase
from aios_cloud_aws.ec2time import epoch as _epoch
from aios_cloud_aws.ec2time import iso as _iso
from aios_cloud_aws.errors import RegionUnavailable, UnknownInstanceType, error_code, translate
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
                        "prices_recorded": cat.PRICES_RECORDED
                        if t.on_demand_hourly is not None
                        else "unknown price",
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
        t = cat.lookup(accelerator)  # the AWS wording for a malformed name
        if not t.listed:
            return _entry(t, "")
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
        if accelerator not in cat.LIVE:
            itype = self.describe_type(ec2, accelerator)
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
            others = [r for r in itype.regions if r != self.region]
            raise RegionUnavailable(
                f"region {self.region} does not offer {accelerator} now (no availability zone "
                "offers it: DescribeInstanceTypeOfferings)",
                f"use --region {others[0]} (recorded in: {', '.join(others)})"
                if others
                else "pick another --region (aws ec2 describe-instance-type-offerings)",
            )
        return zones

    def describe_type(self, ec2: Any, accelerator: str) -> cat.InstanceType:
        """EC2's own facts of ``accelerator`` (``DescribeInstanceTypes``), which decide over the
        table's (devices, EFA interfaces); a type EC2 does not know is refused in one line."""

        try:
            resp = ec2.describe_instance_types(InstanceTypes=[accelerator])
        except Exception as exc:
            if error_code(exc) == "InvalidInstanceType":
                raise UnknownInstanceType(
                    f"unknown instance type '{accelerator}' for cloud aws (EC2 does not know it)",
                    cat.unknown_fix(accelerator),
                ) from None
            raise translate(exc, "DescribeInstanceTypes") from exc
        found = resp.get("InstanceTypes") or []
        if not found:
            raise UnknownInstanceType(
                f"unknown instance type '{accelerator}' for cloud aws (EC2 does not know it)",
                cat.unknown_fix(accelerator),
            )
        return cat.from_describe(found[0])

    # ------------------------------------------------------------------ validation
    def validate(self, request: ClusterRequest) -> ClusterRequest:
        region = (
            request.region
            or (region_of_zone(request.zone) if request.zone else None)
            or self.settings.region
        )
        self.region = region
        itype = cat.lookup(request.accelerator, region)
        note = cat.region_note(itype, region)
        if note:
            self.log(f"note: {note}")
        if request.zone and region_of_zone(request.zone) != region:
            raise CloudError(
                f"zone {request.zone} is not in region {region}",
                f"use a zone of {region} (e.g. {region}a)",
            )
        if request.nodes < 1:
            raise CloudError(
                f"--nodes must be at least 1, not {request.nodes}", "pass --nodes 1 or more"
            )
        block = str(request.extra.get("reservation") or "").startswith("block:")
        if request.queued or request.valid_until or (request.valid_after and not block):
            raise CloudError(
                "--queued/--valid-after/--valid-until are Cloud TPU queued resources; EC2 has none",
                "drop them; for reserved EC2 capacity pass --reservation (a capacity block or ODCR "
                "id; --valid-after waits for a scheduled capacity block)",
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

    # ------------------------------------------------------------------ capacity block fees
    def reservation_prices(
        self, request: ClusterRequest, hours: float | None = None, live: bool = True
    ) -> list[ReservedPrice]:
        """A Capacity Block is billed as an upfront fee for its whole term, when bought, not as
        instance-hours (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html).
        ``--reservation block`` (no id): what EC2 offers now for ``request.nodes`` x
        ``request.accelerator`` over ``hours`` (``DescribeCapacityBlockOfferings``: up to 6
        offers, each with its ``UpfrontFee``); ``block:cr-...``: that block's fee where EC2 still
        offers its very type, count, zone and dates (a bought block's fee is on the bill, not in
        the API: then unknown, said so). An On-Demand Capacity Reservation (``cr-...``) is
        billed by the hour at the on-demand price: ``[]``."""
        kind, _, rid = str(request.extra.get("reservation") or "").rpartition(":")
        if kind != "block" and rid != "block":
            return []
        itype = cat.lookup(request.accelerator)
        if rid == "block":
            return self._block_offers(itype.name, request.nodes, hours, live)
        what = f"Capacity Block {rid}"
        if not live:
            return [
                ReservedPrice(
                    what,
                    how="paid when the block was bought; `aios cost --cloud aws -a "
                    f"{itype.name} --nodes {request.nodes} --hours H --reservation block` shows "
                    "what EC2 asks for such a block now",
                )
            ]
        region = request.region or self.region
        ec2 = self.ec2(region)
        crs = self._call(ec2, "DescribeCapacityReservations", CapacityReservationIds=[rid]).get(
            "CapacityReservations", []
        )
        cr = crs[0] if crs else {}
        if cr.get("ReservationType") != "capacity-block":
            raise CloudError(
                f"capacity reservation {rid} is not a Capacity Block",
                f"pass --reservation {rid} (an On-Demand Capacity Reservation is billed by the hour)",
            )
        start, end = _epoch(cr.get("StartDate")), _epoch(cr.get("EndDate"))
        count = int(cr.get("TotalInstanceCount") or request.nodes)
        zone = str(cr.get("AvailabilityZone") or "")
        term = (end - start) / 3600 if start is not None and end is not None else None
        what = (
            f"{what} ({count} x {cr.get('InstanceType')} in {zone}"
            + (f", {_iso(start)} to {_iso(end)}" if start is not None and end is not None else "")
            + ")"
        )
        fee = None
        if term:
            for o in self._offerings(str(cr.get("InstanceType")), count, term, start, end, region):
                if (
                    o.get("AvailabilityZone") == zone
                    and abs((_epoch(o.get("StartDate")) or 0) - (start or 0)) < 60
                    and abs((_epoch(o.get("EndDate")) or 0) - (end or 0)) < 60
                ):
                    fee = o
                    break
        if fee is None:
            return [
                ReservedPrice(
                    what,
                    hours=term,
                    how="paid when the block was bought: EC2 no longer offers these dates, so the "
                    "fee is on your bill (DescribeCapacityBlockOfferings has none)",
                )
            ]
        return [
            ReservedPrice(
                what,
                float(fee["UpfrontFee"]),
                str(fee.get("CurrencyCode") or "USD"),
                term,
                "DescribeCapacityBlockOfferings: what EC2 asks for this block's dates",
            )
        ]

    def _block_offers(
        self, itype: str, nodes: int, hours: float | None, live: bool
    ) -> list[ReservedPrice]:
        """What EC2 offers for a block of ``nodes`` x ``itype`` over ``hours``."""
        if not hours:
            raise CloudError(
                "--reservation block prices a Capacity Block to buy: it needs its length",
                "add --hours (whole days up to 14 days, whole weeks up to 182 days)",
            )
        duration = block_duration(hours)
        cmd = (
            f"aws ec2 describe-capacity-block-offerings --region {self.region} --instance-type "
            f"{itype} --instance-count {nodes} --capacity-duration-hours {duration}"
        )
        if not live:
            return [ReservedPrice(f"Capacity Block of {nodes} x {itype}", hours=duration, how=cmd)]
        out = []
        for o in self._offerings(itype, nodes, duration, None, None):
            start, end = _epoch(o.get("StartDate")), _epoch(o.get("EndDate"))
            term = (end - start) / 3600 if start is not None and end is not None else duration
            out.append(
                ReservedPrice(
                    f"Capacity Block of {o.get('InstanceCount', nodes)} x {itype} in "
                    f"{o.get('AvailabilityZone')}"
                    + (f", {_iso(start)} to {_iso(end)}" if start and end else ""),
                    float(o["UpfrontFee"]),
                    str(o.get("CurrencyCode") or "USD"),
                    term,
                    "DescribeCapacityBlockOfferings",
                )
            )
        if not out:
            raise CloudError(
                f"EC2 offers no Capacity Block of {nodes} x {itype} for {duration:g} h in "
                f"{self.region} now",
                "try another --hours, --nodes or --region (aws ec2 describe-capacity-block-offerings)",
            )
        return out

    def _offerings(
        self,
        itype: str,
        count: int,
        hours: float,
        start: float | None,
        end: float | None,
        region: str | None = None,
    ) -> list[dict[str, Any]]:
        """``DescribeCapacityBlockOfferings`` for ``count`` x ``itype`` over ``hours`` (rounded
        to a length EC2 takes), between ``start`` and ``end`` when given."""
        import datetime

        args: dict[str, Any] = {
            "InstanceType": itype,
            "InstanceCount": count,
            "CapacityDurationHours": block_duration(hours),
        }
        utc = datetime.timezone.utc
        if start is not None:
            args["StartDateRange"] = datetime.datetime.fromtimestamp(start, utc)
        if end is not None:
            args["EndDateRange"] = datetime.datetime.fromtimestamp(end, utc)
        resp = self._call(self.ec2(region), "DescribeCapacityBlockOfferings", **args)
        return list(resp.get("CapacityBlockOfferings", []))

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


def block_duration(hours: float) -> int:
    """The Capacity Block length EC2 takes nearest ``hours``: whole days up to 14 days, whole
    weeks up to 182 days
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html)."""
    days = max(1, round(hours / 24))
    if days <= 14:
        return days * 24
    return min(26, max(2, round(days / 7))) * 7 * 24


def _name(accelerator: str | cat.InstanceType) -> str:
    return accelerator.name if isinstance(accelerator, cat.InstanceType) else accelerator


def _entry(t: cat.InstanceType, runtime: str) -> CatalogEntry:
    return CatalogEntry(
        cloud="aws",
        accelerator=t.name,
        devices=t.accelerators,
        device_kind=t.accelerator,
        memory_gb=t.accelerator_memory_gib,
        hosts=1,
        runtime=runtime,
        on_demand_hourly=None,
        spot_hourly=None,
        peak_tflops=t.peak_bf16_tflops,
        zones=t.regions,
        backend=t.backend,
        extra={"prices_recorded": "unknown price", "efa_interfaces": t.efa_interfaces},
    )
