"""``aios devices --backend cuda``: the :class:`aios.types.DeviceReport` for NVIDIA GPUs, from NVML
(see :mod:`aios_backend_cuda.nvml`), without importing torch.

AMD GPUs (ROCm's ``/dev/kfd``, ``/sys/class/kfd``) are recognised and reported as such, never
counted as CUDA devices.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aios.types import DeviceInfo, DeviceReport

from aios_backend_cuda import nvml, probe

KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


def amd_gpus() -> list[DeviceInfo]:
    """AMD GPUs from the amdkfd topology in sysfs (nodes with SIMDs are GPUs; CPUs have none)."""
    out: list[DeviceInfo] = []
    root = Path(KFD_TOPOLOGY)
    if not root.is_dir():
        return out
    for node in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        try:
            props = dict(
                line.split(None, 1)
                for line in (node / "properties").read_text().splitlines()
                if " " in line
            )
        except OSError:
            continue
        if int(props.get("simd_count", "0").strip() or 0) == 0:
            continue
        gfx = props.get("gfx_target_version", "").strip()
        try:
            name = (node / "name").read_text().strip() or "AMD GPU"
        except OSError:
            name = "AMD GPU"
        mem = 0
        for bank in (
            (node / "mem_banks").glob("*/properties") if (node / "mem_banks").is_dir() else []
        ):
            for line in bank.read_text().splitlines():
                if line.startswith("size_in_bytes"):
                    mem += int(line.split()[1])
        out.append(
            DeviceInfo(
                len(out), name, mem or None, {"gfx_target_version": gfx, "kfd_node": node.name}
            )
        )
    return out


def matrix(labels: list[str], rows: list[list[str]]) -> list[list[str]]:
    """A printable matrix with a header row and a label column (like ``nvidia-smi topo -m``)."""
    return [["", *labels], *[[labels[i], *row] for i, row in enumerate(rows)]]


def interconnect(inv: nvml.GpuInventory) -> str:
    n = len(inv.gpus)
    if n < 2:
        return "single GPU"
    pairs = [inv.links[a][b] for a in range(n) for b in range(n) if a != b]
    nv = [p for p in pairs if p.startswith("NV")]
    if len(nv) == len(pairs):
        kinds = sorted(set(nv))
        return f"NVLink between all pairs ({'/'.join(kinds)})"
    if nv:
        return f"NVLink between {len(nv) // 2} of {len(pairs) // 2} pairs, PCIe for the rest"
    return "PCIe only (" + "/".join(sorted(set(pairs))) + ")"


def discover(config: object) -> DeviceReport:
    """``BackendSpec.discover`` of the cuda backend (the config is not read)."""
    return report()


def report(environ: dict[str, str] | None = None) -> DeviceReport:
    inv, why = nvml.try_inventory(environ)
    if inv is None:
        amd = amd_gpus()
        if amd or probe.amd_gpu_present():
            return DeviceReport(
                backend="cuda",
                kind="AMD GPU (ROCm)",
                available=False,
                devices=amd,
                reason="AMD GPU(s) with ROCm found, not NVIDIA CUDA GPUs: the cuda backend targets "
                "NVIDIA GPUs; ROCm is not supported by aios yet",
                topology={"vendor": "AMD", "driver": "amdkfd"},
            )
        avail = probe.probe()
        n = probe.nvidia_driver_gpus()
        devices = [DeviceInfo(i, "NVIDIA GPU (NVML unavailable)") for i in range(n or 0)]
        return DeviceReport(
            backend="cuda",
            kind="NVIDIA GPU",
            available=bool(avail),
            devices=devices,
            reason=avail.reason or why,
            notes=[f"NVML: {why}"] if n else [],
        )
    avail = probe.probe()
    devices = [
        DeviceInfo(
            g.index,
            g.name,
            g.memory_total,
            {
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "compute_capability": g.cc,
                "memory_free": g.memory_free,
                "nvml_index": g.nvml_index,
                "bf16": g.bf16,
            },
        )
        for g in inv.gpus
    ]
    labels = [f"GPU{g.index}" for g in inv.gpus]
    topo: dict[str, Any] = {
        "driver": inv.driver_version,
        "cuda_driver": inv.cuda_version,
        "interconnect": interconnect(inv),
        "p2p": "all pairs"
        if inv.p2p_all_pairs
        else ("n/a" if len(inv.gpus) < 2 else "not between all pairs"),
        "models": len(inv.models),
    }
    if len(inv.gpus) > 1:
        topo["links"] = matrix(labels, inv.links)
        topo["p2p_matrix"] = matrix(labels, inv.p2p)
    notes = list(inv.notes)
    if len(inv.gpus) > 1:
        notes.append(
            "links: X self, NV# bonded NVLinks, PIX/PXB PCIe switches, PHB host bridge, NODE "
            "within a NUMA node, SYS across NUMA nodes"
        )
    if inv.source != "nvml":
        notes.append(f"answers recorded in {os.path.basename(inv.source)} ({nvml.RECORDING_ENV})")
    reason = avail.reason
    if not inv.gpus:
        reason = avail.reason or "no visible NVIDIA GPU"
    return DeviceReport(
        backend="cuda",
        kind="NVIDIA GPU",
        available=bool(avail),
        devices=devices,
        topology=topo,
        notes=notes,
        reason=reason,
    )
