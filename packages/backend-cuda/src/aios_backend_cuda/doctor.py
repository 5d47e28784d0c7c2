"""``aios doctor --backend cuda``: driver vs torch CUDA version, NCCL, GPUs visible, P2P, bf16,
mixed models, DeepSpeed. torch is imported only when package metadata cannot answer."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING

from aios.types import CheckStatus, DoctorCheck

from aios_backend_cuda import nvml, probe
from aios_backend_cuda.discovery import interconnect

if TYPE_CHECKING:
    from aios.config.settings import AiosConfig


def _dist_version(*names: str) -> tuple[str, str] | None:
    for n in names:
        try:
            return n, importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _torch_cuda_version(build: probe.TorchBuild) -> str | None:
    if build.cuda_tag:
        return build.cuda_tag
    if (
        probe.torch_build().version != build.version
    ):  # a recorded host: don't ask this machine's torch
        return None
    try:
        import torch

        return torch.version.cuda
    except Exception:  # noqa: BLE001
        return None


def _parse(v: str) -> tuple[int, int]:
    major, _, minor = v.partition(".")
    return int(major), int(minor.split(".")[0] or "0")


B = "cuda"


def _no_nvml(backend: str | None, why: str) -> list[DoctorCheck]:
    """No usable NVML: an AMD GPU, no NVIDIA driver, or a driver NVML cannot reach."""
    b = B
    out: list[DoctorCheck] = []
    if probe.amd_gpu_present():
        out.append(
            DoctorCheck(
                "NVIDIA GPU",
                "fail" if backend == "cuda" else "warn",
                "this host has an AMD GPU (ROCm, /dev/kfd), not an NVIDIA one",
                "the cuda backend needs NVIDIA GPUs; ROCm is not supported by aios yet",
                backend=b,
            )
        )
        return out
    n = probe.nvidia_driver_gpus()
    if not n:
        status: CheckStatus = "fail" if backend == "cuda" else "warn"
        out.append(
            DoctorCheck(
                "NVIDIA driver",
                status,
                f"no NVIDIA GPU or driver found ({why})",
                "install the NVIDIA driver on a GPU machine, or use another backend",
                backend=b,
            )
        )
        return out
    out.append(
        DoctorCheck(
            "NVML",
            "warn",
            f"{n} GPU(s) in /proc/driver/nvidia but NVML is unusable: {why}",
            "install nvidia-ml-py and make libnvidia-ml.so reachable (container: --gpus all)",
            backend=b,
        )
    )
    return out


def _driver_and_gpus(inv: nvml.GpuInventory) -> list[DoctorCheck]:
    """The driver, the GPUs CUDA_VISIBLE_DEVICES leaves, its malformed entries."""
    b = B
    out: list[DoctorCheck] = []
    out.append(
        DoctorCheck(
            "NVIDIA driver",
            "pass",
            f"driver {inv.driver_version}, supports CUDA up to {inv.cuda_version}",
            backend=b,
        )
    )
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not inv.gpus:
        out.append(
            DoctorCheck(
                "GPUs visible",
                "fail",
                f"no GPU visible (CUDA_VISIBLE_DEVICES={vis!r} hides all {inv.hidden})",
                "unset CUDA_VISIBLE_DEVICES or list existing GPU indices/UUIDs",
                backend=b,
            )
        )
    else:
        models = ", ".join(f"{sum(1 for g in inv.gpus if g.name == m)}x {m}" for m in inv.models)
        extra = f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
        out.append(
            DoctorCheck("GPUs visible", "pass", f"{len(inv.gpus)}: {models}{extra}", backend=b)
        )
    for note in inv.notes:
        if note.startswith("CUDA_VISIBLE_DEVICES entry"):
            out.append(
                DoctorCheck(
                    "CUDA_VISIBLE_DEVICES",
                    "warn",
                    note,
                    "fix the list: indices 0..N-1 or GPU-<uuid> prefixes",
                    backend=b,
                )
            )
    return out


def _torch_build(build: probe.TorchBuild, inv: nvml.GpuInventory) -> list[DoctorCheck]:
    """torch's build: installed, CUDA, and its CUDA version against the driver's."""
    b = B
    out: list[DoctorCheck] = []
    if not build.installed:
        out.append(
            DoctorCheck(
                "torch CUDA build", "fail", "torch is not installed", probe.INSTALL_HINT, backend=b
            )
        )
    elif build.flavour != "cuda":
        out.append(
            DoctorCheck(
                "torch CUDA build",
                "fail",
                f"torch {build.version} is a {build.flavour.upper()} build, not CUDA",
                probe.INSTALL_HINT,
                backend=b,
            )
        )
    else:
        tv = _torch_cuda_version(build)
        if tv is None:
            out.append(
                DoctorCheck(
                    "torch CUDA build",
                    "warn",
                    f"torch {build.version}: cannot tell its CUDA version",
                    "run python -c 'import torch; print(torch.version.cuda)'",
                    backend=b,
                )
            )
        else:
            t, d = _parse(tv), _parse(inv.cuda_version)
            if d[0] < t[0]:
                out.append(
                    DoctorCheck(
                        "driver vs torch CUDA",
                        "fail",
                        f"torch {build.version} needs CUDA {tv}; driver {inv.driver_version} "
                        f"supports only CUDA {inv.cuda_version}",
                        f"upgrade the NVIDIA driver, or install torch built for CUDA {inv.cuda_version} or older",
                        backend=b,
                    )
                )
            elif d < t:
                out.append(
                    DoctorCheck(
                        "driver vs torch CUDA",
                        "warn",
                        f"torch built for CUDA {tv} on a driver for CUDA {inv.cuda_version}: "
                        "minor-version compatibility only (PTX JIT of newer kernels fails)",
                        "upgrade the NVIDIA driver to one that supports CUDA " + tv,
                        backend=b,
                    )
                )
            else:
                out.append(
                    DoctorCheck(
                        "driver vs torch CUDA",
                        "pass",
                        f"torch {build.version} (CUDA {tv}) on driver CUDA {inv.cuda_version}",
                        backend=b,
                    )
                )
    return out


def _nccl(build: probe.TorchBuild) -> list[DoctorCheck]:
    """NCCL from its wheel's metadata, else from this machine's torch."""
    b = B
    out: list[DoctorCheck] = []
    nccl = _dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
    if nccl:
        out.append(DoctorCheck("NCCL", "pass", f"{nccl[0]} {nccl[1]}", backend=b))
    elif build.flavour == "cuda" and probe.torch_build().version == build.version:
        try:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_nccl_available():
                out.append(
                    DoctorCheck(
                        "NCCL",
                        "pass",
                        "NCCL " + ".".join(map(str, torch.cuda.nccl.version())),
                        backend=b,
                    )
                )
            else:
                out.append(
                    DoctorCheck(
                        "NCCL",
                        "fail",
                        "this torch has no NCCL: multi-GPU training cannot run",
                        probe.INSTALL_HINT,
                        backend=b,
                    )
                )
        except Exception as exc:  # noqa: BLE001
            out.append(
                DoctorCheck(
                    "NCCL",
                    "warn",
                    f"could not query NCCL ({type(exc).__name__}: {exc})",
                    "check the torch install",
                    backend=b,
                )
            )
    return out


def _p2p(inv: nvml.GpuInventory) -> list[DoctorCheck]:
    """Peer-to-peer between every pair of GPUs."""
    b = B
    out: list[DoctorCheck] = []
    if len(inv.gpus) > 1:
        if inv.p2p_all_pairs:
            out.append(
                DoctorCheck(
                    "GPU peer-to-peer", "pass", f"all pairs; {interconnect(inv)}", backend=b
                )
            )
        else:
            bad = [
                f"{a}-{c}"
                for a in range(len(inv.gpus))
                for c in range(a + 1, len(inv.gpus))
                if inv.p2p[a][c] != "OK"
            ]
            out.append(
                DoctorCheck(
                    "GPU peer-to-peer",
                    "warn",
                    f"no P2P between GPUs {', '.join(bad)}; {interconnect(inv)}",
                    "all-reduce goes through host memory; expect slower multi-GPU scaling "
                    "(IOMMU/ACS settings or the board may disable P2P)",
                    backend=b,
                )
            )
    return out


def _bf16_and_models(inv: nvml.GpuInventory) -> list[DoctorCheck]:
    """bfloat16 on every GPU; one GPU model."""
    b = B
    out: list[DoctorCheck] = []
    lacking = [g for g in inv.gpus if not g.bf16]
    if inv.gpus:
        if lacking:
            names = ", ".join(
                f"cuda:{g.index} {g.name} (sm_{g.compute_capability[0]}{g.compute_capability[1]})"
                for g in lacking
            )
            out.append(
                DoctorCheck(
                    "bf16",
                    "warn",
                    f"no bfloat16 on {names}: bf16-mixed/bf16-true are refused",
                    "use precision=fp16-mixed on these GPUs",
                    backend=b,
                )
            )
        else:
            out.append(
                DoctorCheck(
                    "bf16",
                    "pass",
                    "every visible GPU has bfloat16 (compute capability 8.0+)",
                    backend=b,
                )
            )
    if len(inv.models) > 1:
        out.append(
            DoctorCheck(
                "GPU models",
                "warn",
                f"mixed models: {', '.join(inv.models)}",
                "ranks run at the slowest GPU's pace; pick one model with CUDA_VISIBLE_DEVICES",
                backend=b,
            )
        )
    return out


def _deepspeed(config: AiosConfig | None) -> list[DoctorCheck]:
    """DeepSpeed installed (a failure when the strategy asks for it)."""
    b = B
    out: list[DoctorCheck] = []
    want_ds = config is not None and config.strategy == "deepspeed"
    if importlib.util.find_spec("deepspeed") is not None:
        out.append(
            DoctorCheck(
                "DeepSpeed",
                "pass",
                f"deepspeed {importlib.metadata.version('deepspeed')}",
                backend=b,
            )
        )
    elif want_ds:
        out.append(
            DoctorCheck(
                "DeepSpeed",
                "fail",
                "strategy is deepspeed but deepspeed is not installed",
                "pip install -e './packages/core[deepspeed]' ./packages/backend-cuda (from the aios checkout)",
                backend=b,
            )
        )
    return out


def backend_doctor(config: AiosConfig | None, explicit: bool) -> list[DoctorCheck]:
    """``BackendSpec.doctor`` of the cuda backend: the checks of ``aios doctor --backend cuda``
    when ``explicit``, else those that apply to every installed backend."""
    return checks("cuda" if explicit else None, config)


def checks(backend: str | None, config: AiosConfig | None) -> list[DoctorCheck]:
    inv, why = nvml.try_inventory()
    if inv is None:
        return _no_nvml(backend, why)
    build = probe.torch_build()
    return [
        *_driver_and_gpus(inv),
        *_torch_build(build, inv),
        *_nccl(build),
        *_p2p(inv),
        *_bf16_and_models(inv),
        *_deepspeed(config),
    ]
