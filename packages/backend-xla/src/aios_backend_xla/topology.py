"""Cloud TPU accelerator types: parse ``v4-16`` / ``v5litepod-8`` / ``v6e-4`` ... into facts.

Pure Python, no torch, no network: the cloud-gcp package imports this catalog to plan slices.

The number in an accelerator type counts **TensorCores** for v2, v3, v4 and v5p (two per chip;
``v4-16`` is 8 chips on 2 hosts) and **chips** for v5e (``v5litepod``) and v6e (one TensorCore per
chip; ``v6e-16`` is 16 chips on 4 hosts).

Public API (stable)::

    parse_accelerator_type("v4-16") -> TpuTopology
    GENERATIONS: dict[str, TpuGeneration]
    TpuTopology.to_dict()

A malformed or impossible type raises :class:`aios.errors.ConfigError` (one line, with the fix).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from aios.devices.pci import GOOGLE_PCI_VENDOR, TPU_PCI_DEVICE_IDS
from aios.errors import ConfigError

__all__ = [
    "TpuGeneration",
    "TpuTopology",
    "GENERATIONS",
    "ALIASES",
    "parse_accelerator_type",
    "known_types",
]


@dataclass(frozen=True)
class TpuGeneration:
    """Per-generation facts (public Cloud TPU documentation).

    :param name: canonical generation name (``v2``, ``v3``, ``v4``, ``v5e``, ``v5p``, ``v6e``).
    :param type_prefix: what ``gcloud --accelerator-type`` uses (``v5litepod`` for v5e).
    :param counts: what the number in the type string counts: ``tensorcores`` or ``chips``.
    :param cores_per_chip: TensorCores per chip.
    :param devices_per_chip: XLA devices a chip shows under PJRT (2 on v2/v3, 1 with megacore;
        2 on TPU7x, whose two TensorCores are two chiplets without megacore).
    :param processes_per_chip: processes torch_xla runs per chip (1; 2 on TPU7x, one per chiplet).
    :param max_chips_per_host: chips on one host VM.
    :param multihost_chips_per_host: chips per host in multi-host slices (4 on v5e/v6e).
    :param single_host_sizes: type numbers that fit one host (v5e/v6e: 1, 4, 8).
    :param hbm_gib_per_chip: HBM per chip in GiB.
    :param bf16_tflops_per_chip: peak dense bf16 TFLOP/s per chip.
    :param runtime_version: default TPU VM software version for torch_xla.
    :param pci_device_ids: PCI device ids under Google's vendor id 0x1ae0.
    :param max_size: largest type number offered.
    :param sizes: the exact set of type numbers offered, when the generation has a fixed list.
    """

    name: str
    type_prefix: str
    counts: str
    cores_per_chip: int
    devices_per_chip: int
    max_chips_per_host: int
    multihost_chips_per_host: int
    hbm_gib_per_chip: int
    bf16_tflops_per_chip: float
    runtime_version: str
    pci_device_ids: tuple[str, ...]
    max_size: int
    single_host_sizes: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    processes_per_chip: int = 1


GENERATIONS: dict[str, TpuGeneration] = {
    "v2": TpuGeneration(
        "v2",
        "v2",
        "tensorcores",
        cores_per_chip=2,
        devices_per_chip=2,
        max_chips_per_host=4,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=16,
        bf16_tflops_per_chip=45.0,
        runtime_version="tpu-ubuntu2204-base",
        pci_device_ids=("0x0027",),
        max_size=512,
        sizes=(8, 32, 128, 256, 512),
    ),
    "v3": TpuGeneration(
        "v3",
        "v3",
        "tensorcores",
        cores_per_chip=2,
        devices_per_chip=2,
        max_chips_per_host=4,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=32,
        bf16_tflops_per_chip=123.0,
        runtime_version="tpu-ubuntu2204-base",
        pci_device_ids=("0x0027",),
        max_size=2048,
        sizes=(8, 32, 64, 128, 256, 512, 1024, 2048),
    ),
    "v4": TpuGeneration(
        "v4",
        "v4",
        "tensorcores",
        cores_per_chip=2,
        devices_per_chip=1,
        max_chips_per_host=4,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=32,
        bf16_tflops_per_chip=275.0,
        runtime_version="tpu-ubuntu2204-base",
        pci_device_ids=("0x005e",),
        max_size=8192,
    ),
    "v5e": TpuGeneration(
        "v5e",
        "v5litepod",
        "chips",
        cores_per_chip=1,
        devices_per_chip=1,
        max_chips_per_host=8,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=16,
        bf16_tflops_per_chip=197.0,
        runtime_version="v2-alpha-tpuv5-lite",
        pci_device_ids=("0x0063",),
        max_size=256,
        single_host_sizes=(1, 4, 8),
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
    ),
    "v5p": TpuGeneration(
        "v5p",
        "v5p",
        "tensorcores",
        cores_per_chip=2,
        devices_per_chip=1,
        max_chips_per_host=4,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=95,
        bf16_tflops_per_chip=459.0,
        runtime_version="v2-alpha-tpuv5",
        pci_device_ids=("0x0062",),
        max_size=12288,
    ),
    "v6e": TpuGeneration(
        "v6e",
        "v6e",
        "chips",
        cores_per_chip=1,
        devices_per_chip=1,
        max_chips_per_host=8,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=32,
        bf16_tflops_per_chip=918.0,
        runtime_version="v2-alpha-tpuv6e",
        pci_device_ids=("0x006f",),
        max_size=256,
        single_host_sizes=(1, 4, 8),
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
    ),
    # TPU7x (Ironwood): 4 chips per VM, 2 TensorCores per chip, 192 GiB HBM and 2307 bf16
    # TFLOP/s per chip (https://cloud.google.com/tpu/docs/tpu7x). Served through GKE and
    # Compute Engine only, not the Cloud TPU API: no TPU-API runtime version.
    # Devices: the two TensorCores are two chiplets and 7x has no megacore (JAX's
    # jax.experimental.pallas.tpu.ChipVersion: TPU_7X, 2 physical TensorCores per chip,
    # supports_megacore False), so the runtime shows two devices per chip; torch_xla gives the
    # chiplet its own process-bounds axis on version 7 (TPU_PROCESS_BOUNDS gets ",2",
    # pytorch/xla#9586 "Set environment variables for tpu7x"): one process per chiplet.
    "tpu7x": TpuGeneration(
        "tpu7x",
        "tpu7x",
        "tensorcores",
        cores_per_chip=2,
        devices_per_chip=2,
        processes_per_chip=2,
        max_chips_per_host=4,
        multihost_chips_per_host=4,
        hbm_gib_per_chip=192,
        bf16_tflops_per_chip=2307.0,
        runtime_version="",
        pci_device_ids=("0x0076",),
        max_size=18432,
    ),
}

# Prefixes people write -> generation. ``v5litepod`` is what gcloud and the API use for v5e.
ALIASES: dict[str, str] = {
    "v2": "v2",
    "v3": "v3",
    "v4": "v4",
    "v5p": "v5p",
    "v6e": "v6e",
    "v5litepod": "v5e",
    "v5e": "v5e",
    "v5lite": "v5e",
    "v5lite_pod": "v5e",
    "v6": "v6e",
    "trillium": "v6e",
    "tpu7x": "tpu7x",
    "7x": "tpu7x",  # "tpu7x-8": the type pattern reads an optional "tpu" prefix first
    "v7": "tpu7x",
    "ironwood": "tpu7x",
}

# PCI device ids (vendor 0x1ae0) that torch_xla counts as TPU chips: one table in core
# (aios.devices.pci), shared with ``--cloud ssh``'s host probe (gVNIC, 0x0042, has the same vendor).
TPU_PCI_VENDOR = GOOGLE_PCI_VENDOR
PCI_DEVICE_IDS: dict[str, str] = TPU_PCI_DEVICE_IDS

_TYPE_RE = re.compile(r"^\s*(?:tpu-?)?([a-z0-9_]+?)-(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class TpuTopology:
    """Everything aios needs to know about one accelerator type.

    ``processes_per_host`` is what ``torch_xla.launch`` starts on each host (one per chip);
    ``devices`` is the number of XLA devices (replicas) over the slice.
    """

    accelerator_type: str  # canonical, as gcloud writes it: v4-16, v5litepod-8, v6e-4
    generation: str  # v2, v3, v4, v5e, v5p, v6e
    size: int  # the number in the type string
    chips: int
    tensorcores: int
    hosts: int
    chips_per_host: int
    devices_per_host: int
    devices: int
    hbm_gib_per_chip: int
    bf16_tflops_per_chip: float
    runtime_version: str
    processes_per_chip: int = 1

    @property
    def processes_per_host(self) -> int:
        """Processes ``torch_xla.launch`` runs on each host: one per chip (per chiplet on TPU7x)."""
        return self.chips_per_host * self.processes_per_chip

    @property
    def world_size(self) -> int:
        """Processes over the slice."""
        return self.chips * self.processes_per_chip

    def host_layouts(self) -> list[tuple[int, int]]:
        """The ``(hosts, chips per host)`` layouts this slice comes in, the planned one first.

        v5e and v6e 2x4 slices (8 chips) are one 8-chip VM (``ct5lp-hightpu-8t``,
        ``ct6e-standard-8t``) or two 4-chip VMs (``ct5lp-hightpu-4t``, ``ct6e-standard-4t``):
        https://cloud.google.com/tpu/docs/v6e#configurations lists 2x4 as "8 chips, 1 or 2 VMs"
        (and xpk builds 2x4 pools from 4-chip machines). A GKE node pool is one or the other.
        """
        out = [(self.hosts, self.chips_per_host)]
        gen = GENERATIONS[self.generation]
        if self.hosts == 1 and self.chips > gen.multihost_chips_per_host and gen.single_host_sizes:
            cph = gen.multihost_chips_per_host
            if self.chips % cph == 0:
                out.append((self.chips // cph, cph))
        return out

    def with_hosts(self, hosts: int) -> TpuTopology:
        """The same slice laid out on ``hosts`` VMs (one of :meth:`host_layouts`)."""
        for h, cph in self.host_layouts():
            if h == hosts:
                gen_devices = GENERATIONS[self.generation].devices_per_chip
                return replace(
                    self,
                    hosts=h,
                    chips_per_host=cph,
                    devices_per_host=cph * gen_devices,
                )
        raise ValueError(f"{self.accelerator_type} does not come on {hosts} hosts")

    @property
    def hbm_gib_total(self) -> int:
        return self.hbm_gib_per_chip * self.chips

    @property
    def peak_bf16_tflops(self) -> float:
        """Peak dense bf16 TFLOP/s of the whole slice."""
        return round(self.bf16_tflops_per_chip * self.chips, 1)

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def kind(self) -> str:
        return f"TPU {self.generation} chip"

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = asdict(self)
        d.update(
            processes_per_host=self.processes_per_host,
            world_size=self.world_size,
            hbm_gib_total=self.hbm_gib_total,
            peak_bf16_tflops=self.peak_bf16_tflops,
            multi_host=self.multi_host,
        )
        return d


def _bad(text: str, why: str) -> ConfigError:
    gens = ", ".join(f"{g.type_prefix}-N" for g in GENERATIONS.values())
    return ConfigError(
        f"invalid TPU accelerator type {text!r}: {why}",
        f"write it as gcloud does, e.g. v4-8, v4-16, v5litepod-8, v5p-8, v6e-4 (forms: {gens})",
    )


def parse_accelerator_type(text: str) -> TpuTopology:
    """Parse a Cloud TPU accelerator type (``v4-16``, ``v5litepod-8``, ``v6e-4``, ...).

    Accepts the gcloud spellings plus the aliases in :data:`ALIASES` (``v5e-8`` is
    ``v5litepod-8``), in any case. Raises :class:`aios.errors.ConfigError` for a malformed
    string, an unknown generation, or a size the generation does not offer.
    """
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty")
    m = _TYPE_RE.match(text)
    if not m:
        raise _bad(text, "expected <generation>-<number>")
    prefix, num = m.group(1).lower(), int(m.group(2))
    gen_name = ALIASES.get(prefix)
    if gen_name is None:
        raise _bad(text, f"unknown TPU generation {prefix!r}")
    gen = GENERATIONS[gen_name]
    if num < 1:
        raise _bad(text, "the size must be at least 1")
    if num > gen.max_size:
        raise _bad(text, f"{gen.name} slices go up to {gen.type_prefix}-{gen.max_size}")
    if gen.sizes and num not in gen.sizes:
        offered = ", ".join(f"{gen.type_prefix}-{s}" for s in gen.sizes)
        raise _bad(text, f"{gen.name} is offered as {offered}")

    if gen.counts == "tensorcores":
        if num % gen.cores_per_chip:
            raise _bad(
                text,
                f"{gen.name} sizes count TensorCores ({gen.cores_per_chip} per chip), so they are even",
            )
        chips = num // gen.cores_per_chip
        per_host_cores = gen.max_chips_per_host * gen.cores_per_chip
        if chips > gen.max_chips_per_host and num % per_host_cores:
            raise _bad(
                text,
                f"multi-host {gen.name} slices come in multiples of {per_host_cores} "
                f"TensorCores ({gen.max_chips_per_host} chips per host)",
            )
        if chips < gen.max_chips_per_host:
            raise _bad(text, f"the smallest {gen.name} slice is {gen.type_prefix}-{per_host_cores}")
    else:
        chips = num

    if chips <= gen.max_chips_per_host and (
        not gen.single_host_sizes or chips in gen.single_host_sizes
    ):
        hosts, chips_per_host = 1, chips
    else:
        cph = gen.multihost_chips_per_host
        if chips % cph:
            raise _bad(text, f"multi-host {gen.name} slices come in multiples of {cph} chips")
        hosts, chips_per_host = chips // cph, cph

    return TpuTopology(
        accelerator_type=f"{gen.type_prefix}-{num}",
        generation=gen.name,
        size=num,
        chips=chips,
        tensorcores=chips * gen.cores_per_chip,
        hosts=hosts,
        chips_per_host=chips_per_host,
        devices_per_host=chips_per_host * gen.devices_per_chip,
        devices=chips * gen.devices_per_chip,
        hbm_gib_per_chip=gen.hbm_gib_per_chip,
        bf16_tflops_per_chip=gen.bf16_tflops_per_chip,
        runtime_version=gen.runtime_version,
        processes_per_chip=gen.processes_per_chip,
    )


def known_types() -> list[str]:
    """Common accelerator types (for help texts and catalogs)."""
    out: list[str] = []
    for gen in GENERATIONS.values():
        sizes = gen.sizes or (8, 16, 32, 64, 128, 256)
        out.extend(f"{gen.type_prefix}-{s}" for s in sizes)
    return out
