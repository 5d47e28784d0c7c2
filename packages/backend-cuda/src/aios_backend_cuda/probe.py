"""Cheap facts about this host: is there an NVIDIA GPU, an AMD one, which torch build is installed.

Nothing here imports torch or creates a CUDA context. The torch build is read from the installed
distribution's version (``2.4.0+cu121``, ``2.4.0+rocm6.1``, ``2.4.0+cpu``; the default Linux
wheels on PyPI carry no suffix and are CUDA builds).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from aios.types import Availability

from aios_backend_cuda import nvml

INSTALL_HINT = (
    "pip install -e './packages/core[cuda]' ./packages/backend-cuda (from the aios checkout) (a "
    "CUDA build of torch: https://pytorch.org/get-started/locally/)"
)

# Roots the probes read; tests point them at a temporary tree.
PROC_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
KFD_PATHS = ("/dev/kfd", "/sys/class/kfd")


@dataclass(frozen=True)
class TorchBuild:
    """Which torch is installed, from package metadata only."""

    version: str | None  # None: not installed

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def local(self) -> str:
        return (self.version or "").partition("+")[2]

    @property
    def flavour(self) -> str:
        """``cuda``, ``rocm``, ``cpu``, ``xpu`` or ``none``."""
        if not self.installed:
            return "none"
        loc = self.local
        if loc.startswith("rocm"):
            return "rocm"
        if loc.startswith("cpu"):
            return "cpu"
        if loc.startswith("xpu"):
            return "xpu"
        return "cuda"  # +cuXYZ, or the PyPI default (CUDA on Linux x86_64/aarch64)

    @property
    def cuda_tag(self) -> str | None:
        """``12.1`` for ``+cu121``; None when the suffix does not say (PyPI wheels)."""
        loc = self.local
        if loc.startswith("cu") and loc[2:].isdigit() and len(loc) >= 5:
            digits = loc[2:]
            return f"{digits[:-1]}.{digits[-1]}"
        return None


def torch_build() -> TorchBuild:
    rec = os.environ.get(nvml.RECORDING_ENV)
    if rec:  # a recorded host may say which torch it ran (so a CPU-only CI can plan for it)
        try:
            host = nvml.RecordedNvmlSource.load(rec).host
            if "torch_version" in host:
                return TorchBuild(host["torch_version"])
        except (OSError, ValueError):
            pass
    try:
        return TorchBuild(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return TorchBuild(None)


def amd_gpu_present() -> bool:
    """The ROCm kernel driver (amdkfd) is loaded: an AMD GPU usable by ROCm is here."""
    return any(os.path.exists(p) for p in KFD_PATHS)


def nvidia_driver_gpus() -> int | None:
    """GPUs the NVIDIA kernel driver lists in /proc (no NVML needed); None if the driver is absent."""
    p = Path(PROC_NVIDIA_GPUS)
    if not p.is_dir():
        return None
    return sum(1 for _ in p.iterdir())


def backend_probe(config: object = None) -> Availability:
    """``BackendSpec.probe`` of the cuda backend (the config is not read)."""
    return probe()


def probe() -> Availability:
    """Can the cuda backend train here? Order: torch installed; the GPUs (NVML, else the driver's
    /proc entries, else nvidia-smi on PATH); CUDA_VISIBLE_DEVICES; AMD/ROCm named as such; torch
    build matches."""
    build = torch_build()
    inv, why = nvml.try_inventory()
    count: int | None
    if inv is not None:
        count = len(inv.gpus)
        if count == 0:
            if inv.hidden:
                return Availability(
                    False,
                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} "
                    f"hides all {inv.hidden} NVIDIA GPUs",
                )
            return Availability(False, "NVML reports no NVIDIA GPU")
    else:
        count = nvidia_driver_gpus()
        if count is None and shutil.which("nvidia-smi"):
            count = -1  # driver tools present, count unknown without NVML
        if not count:
            if amd_gpu_present() or build.flavour == "rocm":
                return Availability(
                    False,
                    "found an AMD GPU / ROCm (not NVIDIA CUDA): the cuda backend targets "
                    "NVIDIA GPUs; ROCm is not supported by aios yet",
                )
            return Availability(
                False,
                f"no NVIDIA GPU found ({why or 'NVML unavailable'}; no /proc/driver/nvidia/gpus, no nvidia-smi)",
            )
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return Availability(False, "CUDA_VISIBLE_DEVICES hides every GPU")
    if not build.installed:
        return Availability(False, "torch is not installed")
    if build.flavour == "rocm":
        return Availability(
            False,
            f"torch {build.version} is a ROCm (AMD) build; install a CUDA build of torch for NVIDIA GPUs",
        )
    if build.flavour != "cuda":
        return Availability(
            False,
            f"torch {build.version} is a {build.flavour.upper()}-only build; install a CUDA build of torch",
        )
    return Availability(True)
