"""PCI ids of accelerators, shared by the backends' discovery and ``--cloud ssh``'s host probe.

Pure data, no imports: the cloud packages read it without loading a backend.

Google's PCI vendor id ``0x1ae0`` is on more than TPU chips: gVNIC (device ``0x0042``, "Google
Virtual NIC") is on every third-generation and later Compute Engine VM
(https://cloud.google.com/compute/docs/networking/using-gvnic), so a TPU chip is a device id in
:data:`TPU_PCI_DEVICE_IDS` under the vendor, never the vendor alone. The ids are those torch_xla
counts (``torch_xla/_internal/tpu.py``, ``_TPU_PCI_DEVICE_IDS``; ``0x0076`` added for TPU 7x in
pytorch/xla#9586).
"""

from __future__ import annotations

#: Google's PCI vendor id (TPU chips, gVNIC, ...).
GOOGLE_PCI_VENDOR = "0x1ae0"

#: TPU chip device ids under :data:`GOOGLE_PCI_VENDOR`, with the generation they name ("" when
#: torch_xla lists the id without a public name).
TPU_PCI_DEVICE_IDS: dict[str, str] = {
    "0x0027": "v2/v3",
    "0x005e": "v4",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0056": "",
    "0x0062": "v5p",
    "0x0076": "tpu7x",
}

#: Google's virtual NIC: same vendor, not an accelerator.
GVNIC_PCI_DEVICE = "0x0042"


def is_tpu_chip(vendor: str, device: str) -> bool:
    """Whether a PCI function (``vendor``/``device`` as sysfs writes them) is a TPU chip."""
    return vendor.strip().lower() == GOOGLE_PCI_VENDOR and device.strip().lower() in (
        TPU_PCI_DEVICE_IDS
    )


def tpu_count_shell(root: str = "/sys/bus/pci/devices") -> str:
    """A POSIX shell snippet that prints the number of TPU chips under ``root`` (for probes run
    over ssh): the same rule as :func:`is_tpu_chip`."""
    ids = "|".join(TPU_PCI_DEVICE_IDS)
    return (
        f"n=0; for d in {root}/*; do "
        f'[ "$(cat "$d/vendor" 2>/dev/null)" = {GOOGLE_PCI_VENDOR} ] || continue; '
        f'case "$(cat "$d/device" 2>/dev/null)" in {ids}) n=$((n+1));; esac; '
        'done; echo "$n"'
    )


__all__ = [
    "GOOGLE_PCI_VENDOR",
    "GVNIC_PCI_DEVICE",
    "TPU_PCI_DEVICE_IDS",
    "is_tpu_chip",
    "tpu_count_shell",
]
