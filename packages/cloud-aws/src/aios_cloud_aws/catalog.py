"""The EC2 accelerator instance catalog: recorded data, offline (no boto3 import).

Prices are us-east-1 Linux list prices in USD per instance-hour, recorded on
:data:`PRICES_RECORDED` (on-demand from the EC2 price list after the June 2025 P4d/P5 price cut;
spot is a typical recent us-east-1 value: spot prices move every few minutes and differ per
availability zone, so they are an estimate for ``aios cost``, never a bid). Types that
us-east-1 does not offer carry the price of the first region listed for them
(``price_region``).

Regions are where each type was offered (on demand, spot or through capacity blocks) when
recorded. At launch time the live answers decide: ``DescribeInstanceTypeOfferings`` which zones
offer a type and ``DescribeInstanceTypes`` the facts of a type this table does not list
(:func:`from_describe`); the table only fills in facts (devices, EFA interfaces, prices) and is
what ``aios catalog`` and ``--dry-run`` show without credentials. A type without a recorded
price is planned with "unknown price", never refused. A Capacity Block is billed as an upfront
reservation fee (``DescribeCapacityBlockOfferings`` ``UpfrontFee``), not as on-demand hours.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from aios_backend_neuron import catalog as neuron_catalog

from aios_cloud_aws.errors import UnknownInstanceType

PRICES_RECORDED = "2025-06-30"
PRICE_SOURCE = "AWS EC2 on-demand price list (us-east-1, Linux); spot: typical us-east-1 value"


@dataclass(frozen=True)
class InstanceType:
    """One EC2 accelerator instance type.

    :param accelerators: accelerator devices (GPUs or Trainium chips) per instance.
    :param accelerator_memory_gib: HBM per device, GiB.
    :param neuron_cores: NeuronCores per instance (Trainium only; physical cores).
    :param efa_interfaces: EFA network cards usable for multi-node traffic (0: no EFA).
    :param peak_bf16_tflops: dense bf16 peak of the whole instance.
    :param backend: the aios backend that trains on it.
    """

    name: str
    family: str
    accelerator: str
    accelerators: int
    accelerator_memory_gib: float
    vcpus: int
    memory_gib: int
    efa_interfaces: int
    network_gbps: int
    on_demand_hourly: float | None
    spot_hourly: float | None
    peak_bf16_tflops: float
    backend: str
    regions: tuple[str, ...]
    neuron_cores: int = 0
    price_region: str = "us-east-1"
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: False for a type this table does not list (facts from DescribeInstanceTypes, or none yet)
    listed: bool = True

    @property
    def total_accelerator_memory_gib(self) -> float:
        return self.accelerators * self.accelerator_memory_gib

    @property
    def efa_capable(self) -> bool:
        return self.efa_interfaces > 0

    def hourly(self, spot: bool) -> float | None:
        return self.spot_hourly if spot else self.on_demand_hourly

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regions"] = list(self.regions)
        d["notes"] = list(self.notes)
        d["total_accelerator_memory_gib"] = self.total_accelerator_memory_gib
        d["prices_recorded"] = PRICES_RECORDED
        return d


_P4D_REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "eu-west-1",
    "eu-central-1",
    "ap-northeast-1",
    "ap-northeast-2",
)
_P5_REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "eu-north-1",
    "eu-west-2",
    "ap-northeast-1",
    "ap-south-1",
    "ap-southeast-2",
    "sa-east-1",
)
_P5E_REGIONS = ("us-east-2", "us-west-2")
_TRN1_REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "eu-north-1",
    "ap-northeast-1",
    "ap-south-1",
    "ap-southeast-4",
)
_TRN2_REGIONS = ("us-east-2", "us-west-2")
_P5EN_REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-north-1", "us-west-1")
_P6_REGIONS = ("us-east-1", "us-west-2")


def _trainium(name: str, **cloud: Any) -> InstanceType:
    """A Trainium type: the chip facts (devices, HBM, vCPUs, EFA interfaces, NeuronCores) come
    from backend-neuron's catalog, the one place they live; prices, regions, host RAM and
    bandwidth are the cloud's."""
    t = neuron_catalog.lookup(name)
    return InstanceType(
        name=name,
        family=t.family,
        accelerator=f"AWS {t.chip}",
        accelerators=t.devices,
        accelerator_memory_gib=t.memory_per_device // neuron_catalog.GIB,
        vcpus=t.vcpus,
        efa_interfaces=t.efa_interfaces,
        backend="neuron",
        neuron_cores=t.physical_cores,
        **cloud,
    )


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType(
            name="p4d.24xlarge",
            family="p4d",
            accelerator="NVIDIA A100 40GB",
            accelerators=8,
            accelerator_memory_gib=40,
            vcpus=96,
            memory_gib=1152,
            efa_interfaces=4,
            network_gbps=400,
            on_demand_hourly=21.96,
            spot_hourly=9.47,
            peak_bf16_tflops=8 * 312.0,
            backend="cuda",
            regions=_P4D_REGIONS,
            notes=("NVSwitch; 4x100 Gbps EFA",),
        ),
        InstanceType(
            name="p5.48xlarge",
            family="p5",
            accelerator="NVIDIA H100 80GB",
            accelerators=8,
            accelerator_memory_gib=80,
            vcpus=192,
            memory_gib=2048,
            efa_interfaces=32,
            network_gbps=3200,
            on_demand_hourly=55.04,
            spot_hourly=31.46,
            peak_bf16_tflops=8 * 989.0,
            backend="cuda",
            regions=_P5_REGIONS,
            notes=("NVSwitch; 32x100 Gbps EFAv2",),
        ),
        InstanceType(
            name="p5e.48xlarge",
            family="p5e",
            accelerator="NVIDIA H200 141GB",
            accelerators=8,
            accelerator_memory_gib=141,
            vcpus=192,
            memory_gib=2048,
            efa_interfaces=32,
            network_gbps=3200,
            on_demand_hourly=63.30,
            spot_hourly=None,
            peak_bf16_tflops=8 * 989.0,
            backend="cuda",
            regions=_P5E_REGIONS,
            price_region="us-east-2",
            notes=("mostly sold through EC2 Capacity Blocks for ML; no recorded spot price",),
        ),
        # EFA layouts as EC2 describes them (DescribeInstanceTypes NetworkInfo.EfaInfo
        # .MaximumEfaInterfaces: p5en 16, p6-b200 8, p6-b300 16)
        InstanceType(
            name="p5en.48xlarge",
            family="p5en",
            accelerator="NVIDIA H200 141GB",
            accelerators=8,
            accelerator_memory_gib=141,
            vcpus=192,
            memory_gib=2048,
            efa_interfaces=16,
            network_gbps=3200,
            on_demand_hourly=63.296,
            spot_hourly=None,
            peak_bf16_tflops=8 * 989.0,
            backend="cuda",
            regions=_P5EN_REGIONS,
            notes=("NVSwitch; 16x200 Gbps EFAv3; no recorded spot price",),
        ),
        InstanceType(
            name="p6-b200.48xlarge",
            family="p6-b200",
            accelerator="NVIDIA B200 179GB",
            accelerators=8,
            accelerator_memory_gib=179,
            vcpus=192,
            memory_gib=2048,
            efa_interfaces=8,
            network_gbps=3200,
            on_demand_hourly=None,
            spot_hourly=None,
            peak_bf16_tflops=8 * 2250.0,
            backend="cuda",
            regions=_P6_REGIONS,
            notes=("NVLink 5; 8x400 Gbps EFAv4; no recorded price",),
        ),
        InstanceType(
            name="p6-b300.48xlarge",
            family="p6-b300",
            accelerator="NVIDIA B300 268GB",
            accelerators=8,
            accelerator_memory_gib=268,
            vcpus=192,
            memory_gib=4096,
            efa_interfaces=16,
            network_gbps=6400,
            on_demand_hourly=None,
            spot_hourly=None,
            peak_bf16_tflops=8 * 2250.0,
            backend="cuda",
            regions=_P6_REGIONS,
            notes=("NVLink 5; 16x400 Gbps EFAv4; no recorded price",),
        ),
        _trainium(
            "trn1.2xlarge",
            memory_gib=32,
            network_gbps=12,
            on_demand_hourly=1.34375,
            spot_hourly=0.4011,
            peak_bf16_tflops=190.0,
            regions=_TRN1_REGIONS,
            notes=("no EFA: single node only",),
        ),
        _trainium(
            "trn1.32xlarge",
            memory_gib=512,
            network_gbps=800,
            on_demand_hourly=21.50,
            spot_hourly=6.4505,
            peak_bf16_tflops=16 * 190.0,
            regions=_TRN1_REGIONS,
            notes=("NeuronLink ring; 8x100 Gbps EFA",),
        ),
        _trainium(
            "trn2.48xlarge",
            memory_gib=2048,
            network_gbps=3200,
            on_demand_hourly=44.70,
            spot_hourly=None,
            peak_bf16_tflops=16 * 667.0,
            regions=_TRN2_REGIONS,
            price_region="us-east-2",
            notes=(
                "NeuronLink 2D torus; 16x200 Gbps EFAv3; mostly capacity blocks; no recorded spot price",
            ),
        ),
        # Trn2 UltraServer: four trn2u.48xlarge joined by NeuronLink (64 chips), sold through
        # capacity blocks (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html)
        _trainium(
            "trn2u.48xlarge",
            memory_gib=2048,
            network_gbps=3200,
            on_demand_hourly=None,
            spot_hourly=None,
            peak_bf16_tflops=16 * 667.0,
            regions=("us-east-2",),
            price_region="us-east-2",
            notes=("Trn2 UltraServer member (4 x 16 chips over NeuronLink); capacity blocks only",),
        ),
    )
}

#: types described live (:func:`from_describe`) this process, by name
LIVE: dict[str, InstanceType] = {}

_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[0-9]*[a-z]+[0-9]*$")


# Availability zones per region (recorded with the prices). Which of them offer a type is asked
# live (DescribeInstanceTypeOfferings) at launch; --dry-run shows these.
REGION_ZONES: dict[str, tuple[str, ...]] = {
    "us-east-1": tuple(f"us-east-1{c}" for c in "abcdef"),
    "us-east-2": tuple(f"us-east-2{c}" for c in "abc"),
    "us-west-2": tuple(f"us-west-2{c}" for c in "abcd"),
    "eu-west-1": tuple(f"eu-west-1{c}" for c in "abc"),
    "eu-west-2": tuple(f"eu-west-2{c}" for c in "abc"),
    "eu-central-1": tuple(f"eu-central-1{c}" for c in "abc"),
    "eu-north-1": tuple(f"eu-north-1{c}" for c in "abc"),
    "ap-northeast-1": ("ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"),
    "ap-northeast-2": tuple(f"ap-northeast-2{c}" for c in "abcd"),
    "ap-south-1": tuple(f"ap-south-1{c}" for c in "abc"),
    "ap-southeast-2": tuple(f"ap-southeast-2{c}" for c in "abc"),
    "ap-southeast-4": tuple(f"ap-southeast-4{c}" for c in "abc"),
    "sa-east-1": tuple(f"sa-east-1{c}" for c in "abc"),
}


def region_zones(region: str) -> list[str]:
    return list(REGION_ZONES.get(region, (f"{region}a", f"{region}b", f"{region}c")))


def known() -> list[str]:
    return sorted(INSTANCE_TYPES)


def get(name: str) -> InstanceType | None:
    return INSTANCE_TYPES.get(name)


def unlisted(name: str) -> InstanceType:
    """A type this table does not list, before EC2 described it: its facts unknown, planned
    with "unknown price" (the live answers decide at launch)."""
    family = name.split(".", 1)[0]
    backend = "neuron" if family.startswith(("trn", "inf")) else "cuda"
    return InstanceType(
        name=name,
        family=family,
        accelerator="unknown (described by EC2 at launch)",
        accelerators=0,
        accelerator_memory_gib=0,
        vcpus=0,
        memory_gib=0,
        efa_interfaces=0,
        network_gbps=0,
        on_demand_hourly=None,
        spot_hourly=None,
        peak_bf16_tflops=0.0,
        backend=backend,
        regions=(),
        notes=("not in aios's table: facts from EC2 (DescribeInstanceTypes)",),
        listed=False,
    )


def from_describe(d: dict[str, Any]) -> InstanceType:
    """An instance type from EC2's ``DescribeInstanceTypes`` answer, with the table's recorded
    facts (prices, regions, notes) where it lists the type. Remembered in :data:`LIVE`."""
    name = d["InstanceType"]
    base = INSTANCE_TYPES.get(name) or unlisted(name)
    gpus = (d.get("GpuInfo") or {}).get("Gpus") or []
    neuron = (d.get("NeuronInfo") or {}).get("NeuronDevices") or []
    dev = gpus or neuron
    count = sum(int(g.get("Count", 0)) for g in dev)
    mem_mib = int(((dev[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)) if dev else 0)
    efa = int(((d.get("NetworkInfo") or {}).get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0))
    from dataclasses import replace

    t = replace(
        base,
        accelerator=base.accelerator
        if base.listed
        else (
            f"{dev[0].get('Manufacturer', '')} {dev[0].get('Name', '')}".strip() if dev else "CPU"
        ),
        accelerators=count or base.accelerators,
        accelerator_memory_gib=round(mem_mib / 1024) if mem_mib else base.accelerator_memory_gib,
        vcpus=int((d.get("VCpuInfo") or {}).get("DefaultVCpus", 0)) or base.vcpus,
        memory_gib=int((d.get("MemoryInfo") or {}).get("SizeInMiB", 0)) // 1024 or base.memory_gib,
        efa_interfaces=efa,
        backend=base.backend if base.listed else ("neuron" if neuron else "cuda"),
    )
    LIVE[name] = t
    return t


def lookup(name: str, region: str | None = None) -> InstanceType:
    """The facts of ``name``: as EC2 described it this process (:data:`LIVE`), the table's, or
    :func:`unlisted` for a well-formed name the table lacks (EC2 decides at launch). A malformed
    name is refused in one line. ``region`` is not checked here: which zones offer a type is
    EC2's live answer (:func:`region_note` for the recorded regions)."""

    t = LIVE.get(name) or INSTANCE_TYPES.get(name)
    if t is not None:
        return t
    if _TYPE_RE.match(name or ""):
        return unlisted(name)
    raise UnknownInstanceType(f"'{name}' is not an EC2 instance type name", unknown_fix(name))


def unknown_fix(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, known(), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{hint}see `aios catalog --cloud aws` (listed: {', '.join(known())})"


def region_note(t: InstanceType, region: str) -> str | None:
    """A line when the recorded regions of ``t`` do not include ``region`` (offline plans)."""
    if t.listed and t.regions and region not in t.regions:
        return (
            f"{t.name} was recorded in {', '.join(t.regions)}, not {region}: EC2's answer at "
            "launch decides"
        )
    return None
