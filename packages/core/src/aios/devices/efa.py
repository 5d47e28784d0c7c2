"""EFA (Elastic Fabric Adapter) capabilities of AWS instance families, and the libfabric
variables they call for. Plain data, no imports beyond the standard library: backend-cuda's NCCL
presets, cloud-aws's launch plans and cloud-k8s's EKS manifests all read this one table, for the
instance type the ranks will run on (never the machine that plans the launch).

Facts, from AWS's EC2 User Guide:

* Which types have EFA and how many EFA interfaces the largest size takes ("Supported instance
  types", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types, and
  ``DescribeInstanceTypes`` ``NetworkInfo.EfaInfo.MaximumEfaInterfaces``).
* "RDMA read is supported on all instances with Nitro version 4 and later"
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html). The Nitro version of each
  family is in its "Platform summary"
  (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-nitro-instances.html): g4dn, g5 and
  p3dn are Nitro v3 (EFA without RDMA read); p4d/p4de, trn1/trn1n are v4; p5/p5e/p5en and trn2
  are v5; p6 later still.

libfabric's EFA provider (``fi_efa(7)``, ``FI_EFA_USE_DEVICE_RDMA``): set to 1 it uses the
device's RDMA and aborts the process when the device has no RDMA read; unset, it uses RDMA only
where the device offers it. So the variable is set only for families the table says have RDMA
read; elsewhere it stays unset (never a guess from the local machine's devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EFA_FAMILIES", "EfaFamily", "efa_family", "efa_interfaces", "fabric_env"]


@dataclass(frozen=True)
class EfaFamily:
    """One instance family's EFA facts.

    :param nitro: the AWS Nitro System version of the family.
    :param interfaces: the family's EFA-capable sizes and each one's maximum EFA interfaces (a
        size not listed has no EFA).
    """

    family: str
    nitro: int
    interfaces: dict[str, int] = field(default_factory=dict)

    @property
    def rdma_read(self) -> bool:
        """RDMA read: every Nitro v4 and later instance (AWS, "Elastic Fabric Adapter")."""
        return self.nitro >= 4


def _family(family: str, nitro: int, **sizes: int) -> EfaFamily:
    return EfaFamily(family, nitro, {f"{family}.{s.replace('_', '')}": n for s, n in sizes.items()})


EFA_FAMILIES: dict[str, EfaFamily] = {
    f.family: f
    for f in (
        # Nitro v3: EFA without RDMA read
        _family("p3dn", 3, _24xlarge=1),
        _family("g4dn", 3, _8xlarge=1, _12xlarge=1, _16xlarge=1, metal=1),
        _family("g5", 3, _8xlarge=1, _12xlarge=1, _16xlarge=1, _24xlarge=1, _48xlarge=1),
        # Nitro v4 and later: RDMA read
        _family("p4d", 4, _24xlarge=4),
        _family("p4de", 4, _24xlarge=4),
        _family("trn1", 4, _32xlarge=8),
        _family("trn1n", 4, _32xlarge=16),
        _family("p5", 5, _48xlarge=32),
        _family("p5e", 5, _48xlarge=32),
        _family("p5en", 5, _48xlarge=16),
        _family("trn2", 5, _48xlarge=16),
        _family("p6-b200", 6, _48xlarge=8),
        _family("p6-b300", 6, _48xlarge=16),
    )
}


def efa_family(instance_type: str | None) -> EfaFamily | None:
    """The table's entry for ``instance_type``'s family (``g5`` for ``g5.48xlarge``), or None
    when the table does not list the family."""
    if not instance_type:
        return None
    return EFA_FAMILIES.get(instance_type.split(".", 1)[0].lower())


def efa_interfaces(instance_type: str | None) -> int:
    """EFA interfaces ``instance_type`` takes (0: no EFA, or a type the table does not list)."""
    fam = efa_family(instance_type)
    return fam.interfaces.get((instance_type or "").lower(), 0) if fam else 0


#: libfabric's EFA provider, on every EFA host
EFA_BASE_ENV = {
    "FI_PROVIDER": "efa",  # libfabric uses the EFA provider, never TCP/sockets
    "FI_EFA_FORK_SAFE": "1",  # dataloader workers fork after EFA is opened
}
#: only where the device has RDMA read (Nitro v4+): GPUDirect/Neuron RDMA through the NIC
EFA_RDMA_ENV = {"FI_EFA_USE_DEVICE_RDMA": "1"}


def fabric_env(instance_type: str | None) -> dict[str, str]:
    """The libfabric variables for ranks on ``instance_type``: none without EFA interfaces,
    ``FI_PROVIDER=efa``/``FI_EFA_FORK_SAFE=1`` with them, and ``FI_EFA_USE_DEVICE_RDMA=1``
    only on a family with RDMA read."""
    fam = efa_family(instance_type)
    if fam is None or efa_interfaces(instance_type) == 0:
        return {}
    return {**EFA_BASE_ENV, **(EFA_RDMA_ENV if fam.rdma_read else {})}
