"""Trainium instance facts, for planning off-instance (``neuron.instance_type=...``) and for
naming what ``neuron-ls`` reports. Public AWS specifications; no pricing (cloud-aws owns that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class InstanceType:
    """One Trainium instance type.

    :param devices: Neuron devices (Trainium chips).
    :param physical_cores_per_device: physical NeuronCores per device.
    :param default_lnc: the default logical NeuronCore config (physical cores per logical core).
    :param memory_per_device: device HBM in bytes.
    :param efa_interfaces: EFA network interfaces (0: no EFA, single-node only).
    :param target: the neuronx-cc ``--target`` for this family.
    :param core_kind: the NeuronCore generation.
    """

    name: str
    devices: int
    physical_cores_per_device: int
    default_lnc: int
    memory_per_device: int
    vcpus: int
    efa_interfaces: int
    target: str
    core_kind: str
    chip: str

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def physical_cores(self) -> int:
        return self.devices * self.physical_cores_per_device

    def supported_lnc(self) -> tuple[int, ...]:
        return (1, 2) if self.default_lnc == 2 else (1,)

    def logical_cores_per_device(self, lnc: int | None = None) -> int:
        return self.physical_cores_per_device // (lnc or self.default_lnc)

    def logical_cores(self, lnc: int | None = None) -> int:
        return self.devices * self.logical_cores_per_device(lnc)


_TRN1: dict[str, Any] = dict(
    physical_cores_per_device=2,
    default_lnc=1,
    memory_per_device=32 * GIB,
    target="trn1",
    core_kind="NeuronCore-v2",
    chip="Trainium",
)
_TRN2: dict[str, Any] = dict(
    physical_cores_per_device=8,
    default_lnc=2,
    memory_per_device=96 * GIB,
    target="trn2",
    core_kind="NeuronCore-v3",
    chip="Trainium2",
)

INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("trn1.2xlarge", devices=1, vcpus=8, efa_interfaces=0, **_TRN1),
        InstanceType("trn1.32xlarge", devices=16, vcpus=128, efa_interfaces=8, **_TRN1),
        InstanceType(
            "trn1n.32xlarge",
            devices=16,
            vcpus=128,
            efa_interfaces=16,
            **{**_TRN1, "target": "trn1n"},
        ),
        InstanceType("trn2.3xlarge", devices=1, vcpus=12, efa_interfaces=1, **_TRN2),
        InstanceType("trn2.48xlarge", devices=16, vcpus=192, efa_interfaces=16, **_TRN2),
        InstanceType("trn2u.48xlarge", devices=16, vcpus=192, efa_interfaces=16, **_TRN2),
    )
}


def lookup(name: str) -> InstanceType:
    """The facts for ``name``; ``ValueError`` naming the known types otherwise."""
    key = str(name).strip().lower()
    if key in INSTANCE_TYPES:
        return INSTANCE_TYPES[key]
    known = ", ".join(INSTANCE_TYPES)
    if key.startswith(("inf1", "inf2")):
        raise ValueError(
            f"'{name}' is an Inferentia instance (inference only); aios trains on: {known}"
        )
    raise ValueError(f"unknown Trainium instance type '{name}'; known: {known}")


def family_defaults(instance_type: str | None) -> InstanceType | None:
    """Best-effort facts for an instance type string (``None`` when unknown)."""
    if not instance_type:
        return None
    try:
        return lookup(instance_type)
    except ValueError:
        return None
