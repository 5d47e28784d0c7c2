"""Runs TorchTPU's real code on a machine without a TPU, in its own process.

TorchTPU finds chips with ``torch_tpu._internal.utils.hardware._scan_pci_tpus``: it lists
``/sys/bus/pci/devices``, keeps Google's vendor id 0x1ae0 with a TPU device id, and counts a chip
only when ``<dev>/iommu_group`` names a group present under ``/dev/vfio``. That module reads
both paths through its module-level ``pathlib``; this harness points those two paths (and only
those) at a fixture tree, so the real scanner, topology tables, device registration and launch
helper run unchanged on the fixture's chips. Nothing here runs a TPU op.

usage: python tt_harness.py SYSFS VFIO MODE [ARGS...]
  register                      import + register the tpu device; print facts as JSON
  launch_env NNODES|- NPROC|-   torch.tpu.distributed.set_tpu_launch_env; print the env as JSON
  step                          the example's training step on tpu under FakeTensorMode
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import types


def install(sysfs: str, vfio: str) -> None:
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # register explicitly, after the redirect
    import torch  # noqa: F401
    import torch_tpu
    from torch_tpu._internal.utils import hardware

    real = pathlib.Path
    maps = (("/sys/bus/pci/devices", sysfs), ("/dev/vfio", vfio))

    def path(p: object, *rest: str) -> pathlib.Path:
        s = str(p)
        for src, dst in maps:
            if s == src or s.startswith(src + "/"):
                s = dst + s[len(src) :]
        return real(s, *rest)

    hardware.pathlib = types.SimpleNamespace(Path=path)
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    torch_tpu._loader.load()


def register() -> dict:
    import torch
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return {
        "is_available": torch.accelerator.is_available(),
        "device_count": torch.accelerator.device_count(),
        "current": str(torch.accelerator.current_accelerator()),
        "privateuse1": torch._C._get_privateuse1_backend_name(),
        "pg_backends": [b for b in torch.distributed.Backend.backend_list if b.startswith("tpu")],
        "fused_adamw_kernel": bool(
            torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adamw_", "PrivateUse1")
        ),
        "fused_devices": list(_get_fused_kernels_supported_devices()),
        "has_torch_tpu": hasattr(torch, "tpu"),
        "compile_backends": sorted(
            b for b in torch._dynamo.list_backends(exclude_tags=()) if "tpu" in b
        ),
    }


def launch_env(nnodes: str, nproc: str) -> dict:
    import torch

    before = dict(os.environ)
    kwargs = {}
    if nnodes != "-":
        kwargs["nnodes"] = int(nnodes)
    if nproc != "-":
        kwargs["nproc_per_node"] = int(nproc)
    torch.tpu.distributed.set_tpu_launch_env(**kwargs)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def main() -> None:
    sysfs, vfio, mode, *args = sys.argv[1:]
    install(sysfs, vfio)
    if mode == "register":
        out = register()
    elif mode == "launch_env":
        out = launch_env(*args)
    elif mode == "step":
        sys.path.insert(0, os.path.dirname(__file__))
        from tt_step import run_step

        out = run_step(*args)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
