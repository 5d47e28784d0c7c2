"""Launch plans for NVIDIA GPUs, and the NCCL/EFA presets for multi-node runs.

Public API (no torch import anywhere here):

* :func:`cuda_launch_plan` builds the :class:`aios.types.LaunchPlan` for a set of hosts: one
  process per visible GPU (through :func:`aios.launcher.plan.elastic_plan`, i.e. ``torch.distributed.run``)
  and the NCCL environment of the chosen preset. ``aios-run --backend cuda`` uses it on this host;
  the cloud packages call it for hosts they provision with ``request.accelerator`` set to the
  instance type (``p4d.24xlarge``, ``p5.48xlarge``), which fixes the GPU count and the preset
  without looking at the local machine.
* :func:`nccl_env` returns the variables of one preset; :data:`PRESETS` lists them.
* :data:`INSTANCE_GPUS` maps AWS GPU instance types to their GPU count and model.

Presets never override a variable already set in the environment of ``aios-run`` (an explicit
``NCCL_SOCKET_IFNAME=ens5`` wins); the plan's notes say which ones were kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from aios.devices.efa import EFA_BASE_ENV, EFA_RDMA_ENV, efa_family, efa_interfaces
from aios.errors import ConfigError, LaunchError
from aios.launcher.plan import elastic_plan, resolve_nprocs

from aios_backend_cuda import nvml, probe

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig
    from aios.types import LaunchPlan, LaunchRequest

# AWS GPU instances: type -> (GPUs, model). Used when planning for hosts that are not this one.
INSTANCE_GPUS: dict[str, tuple[int, str]] = {
    "p5.48xlarge": (8, "H100 80GB SXM"),
    "p5e.48xlarge": (8, "H200 141GB SXM"),
    "p5en.48xlarge": (8, "H200 141GB SXM"),
    "p6-b200.48xlarge": (8, "B200 179GB SXM"),
    "p6-b300.48xlarge": (8, "B300 268GB SXM"),
    "p4d.24xlarge": (8, "A100 40GB SXM"),
    "p4de.24xlarge": (8, "A100 80GB SXM"),
    "p3.2xlarge": (1, "V100 16GB"),
    "p3.8xlarge": (4, "V100 16GB"),
    "p3.16xlarge": (8, "V100 16GB"),
    "p3dn.24xlarge": (8, "V100 32GB"),
    "g5.xlarge": (1, "A10G"),
    "g5.2xlarge": (1, "A10G"),
    "g5.12xlarge": (4, "A10G"),
    "g5.24xlarge": (4, "A10G"),
    "g5.48xlarge": (8, "A10G"),
    "g6.xlarge": (1, "L4"),
    "g6.12xlarge": (4, "L4"),
    "g6.48xlarge": (8, "L4"),
    "g6e.12xlarge": (4, "L40S"),
    "g6e.48xlarge": (8, "L40S"),
    "g4dn.xlarge": (1, "T4"),
    "g4dn.12xlarge": (4, "T4"),
    "g4dn.metal": (8, "T4"),
}

# EFA (Elastic Fabric Adapter): NCCL reaches it through the aws-ofi-nccl plugin over libfabric.
# What an instance type's EFA can do (RDMA read or not, interfaces) is aios.devices.efa's table, the one
# place those facts live; the presets add NCCL's side.
_EFA = {
    **EFA_BASE_ENV,  # FI_PROVIDER=efa, FI_EFA_FORK_SAFE=1
    "NCCL_SOCKET_IFNAME": "^lo,docker",  # bootstrap over the real ENA interface, not lo/docker
}
# Only where the EFA device has RDMA read (Nitro v4+: p4d, p5, p6, trn1, trn2): with
# FI_EFA_USE_DEVICE_RDMA=1 libfabric aborts on a device without it (g4dn, g5, p3dn).
_EFA_RDMA = {
    **_EFA,
    **EFA_RDMA_ENV,  # GPUDirect RDMA: the NIC reads GPU memory directly
    "NCCL_NET_GDR_LEVEL": "PHB",  # allow GPUDirect when GPU and NIC share a PCIe host bridge
}

PRESETS: dict[str, dict[str, str]] = {
    "none": {},
    # EFA whose RDMA read is not known (g4dn/g5/p3dn, or EFA devices found on this host):
    # libfabric uses the device's RDMA only where it has it (FI_EFA_USE_DEVICE_RDMA unset).
    "efa": dict(_EFA),
    # EFA with RDMA read (Nitro v4+ types without a preset of their own).
    "efa-rdma": dict(_EFA_RDMA),
    # p4d.24xlarge / p4de: 8x A100 on NVSwitch, 4x 100 Gbps EFA. The EFA devices show up as
    # rdmap* verbs devices; NCCL_IB_HCA names them for NCCL builds that probe verbs devices.
    "p4d": {**_EFA_RDMA, "NCCL_IB_HCA": "rdmap"},
    # p5.48xlarge / p5e / p5en: 8x H100/H200 on NVSwitch, 32x 100 Gbps EFA (3200 Gbps).
    "p5": {**_EFA_RDMA, "NCCL_IB_HCA": "rdmap"},
    # InfiniBand clusters (Mellanox ConnectX): NCCL's own IB transport.
    "ib": {"NCCL_IB_HCA": "mlx5", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_SOCKET_IFNAME": "^lo,docker"},
}

INFINIBAND_SYSFS = "/sys/class/infiniband"


def preset_for_instance(instance_type: str | None) -> str | None:
    """The preset an AWS instance type calls for, from :mod:`aios.devices.efa`'s table: ``p4d``/``p5``
    for those families, ``efa-rdma`` for other EFA types with RDMA read, ``efa`` for EFA types
    without it (g4dn, g5, p3dn), ``none`` for a listed family's size without EFA; None when the
    table does not list the family."""
    fam = efa_family(instance_type)
    if fam is None:
        return None
    if efa_interfaces(instance_type) == 0:
        return "none"
    if fam.family in ("p4d", "p4de"):
        return "p4d"
    if fam.family in ("p5", "p5e", "p5en", "p6-b200", "p6-b300"):
        return "p5"  # EFA devices as rdmap* verbs devices, as on p5
    return "efa-rdma" if fam.rdma_read else "efa"


def _local_fabric() -> str | None:
    """``efa`` when EFA devices (rdmap*) are present, ``ib`` for mlx5 HCAs, else None. Only for
    a plan for this machine (no instance type): it says nothing about another host."""
    p = Path(INFINIBAND_SYSFS)
    if not p.is_dir():
        return None
    names = [d.name for d in p.iterdir()]
    if any(n.startswith("rdmap") or n.startswith("efa") for n in names):
        return "efa"
    if any(n.startswith("mlx5") for n in names):
        return "ib"
    return None


def choose_preset(preset: str, instance_type: str | None, nnodes: int) -> tuple[str, str]:
    """Resolve ``cuda.nccl_preset`` (``auto`` included) to a preset name and the reason."""
    if preset != "auto":
        if preset not in PRESETS:
            raise ConfigError(
                f"unknown NCCL preset {preset!r}", f"choose one of: auto, {', '.join(PRESETS)}"
            )
        return preset, "cuda.nccl_preset"
    if nnodes <= 1:  # a single node, even a p5, launches without EFA interfaces
        return "none", "single node: NVLink/PCIe only, no network preset needed"
    by_type = preset_for_instance(instance_type)
    if by_type == "none":
        return "none", f"{instance_type} has no EFA interface; NCCL uses TCP sockets"
    if by_type:
        fam = efa_family(instance_type)
        rdma = "with" if fam is not None and fam.rdma_read else "without"
        return by_type, f"instance type {instance_type}: EFA {rdma} RDMA read"
    if instance_type:  # the hosts are of this type, not this machine: its devices say nothing
        return "none", (
            f"{instance_type} is not in aios's EFA table (aios.devices.efa); NCCL uses TCP sockets. "
            "Set cuda.nccl_preset=efa if its hosts have EFA"
        )
    fabric = _local_fabric()
    if fabric:
        return fabric, f"{fabric.upper()} devices under {INFINIBAND_SYSFS}"
    return "none", "no EFA or InfiniBand devices found; NCCL uses TCP sockets"


def nccl_env(
    config: AiosConfig,
    instance_type: str | None = None,
    nnodes: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The NCCL/libfabric environment for a run and notes explaining it.

    Order: preset, then explicit ``cuda.*`` keys (``nccl_socket_ifname``, ``nccl_ib_hca``,
    ``nccl_debug``), and a variable already present in ``environ`` is never overridden.
    """
    environ = os.environ if environ is None else environ
    cuda = config.section("cuda")
    preset_name = cuda.nccl_preset if cuda is not None else "auto"
    name, why = choose_preset(
        preset_name, instance_type, nnodes if nnodes is not None else config.nnodes
    )
    env = dict(PRESETS[name])
    if cuda is not None:
        if cuda.nccl_socket_ifname:
            env["NCCL_SOCKET_IFNAME"] = cuda.nccl_socket_ifname
        if cuda.nccl_ib_hca:
            env["NCCL_IB_HCA"] = cuda.nccl_ib_hca
        if cuda.nccl_debug:
            env["NCCL_DEBUG"] = cuda.nccl_debug
    notes = [f"NCCL preset: {name} ({why})"]
    kept = sorted(k for k in env if k in environ and environ[k] != env[k])
    for k in kept:
        env.pop(k)
    if kept:
        notes.append("kept from your environment: " + ", ".join(f"{k}={environ[k]}" for k in kept))
    return env, notes


def local_gpu_count() -> tuple[int, list[str]]:
    """Visible GPUs on this host (NVML; the driver's /proc entries as a fallback)."""
    inv, why = nvml.try_inventory()
    if inv is not None:
        return len(inv.gpus), []
    n = probe.nvidia_driver_gpus()
    if n:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        if vis is not None:
            n = len([e for e in vis.split(",") if e.strip()])
        return n, [f"NVML unavailable ({why}); GPU count from {probe.PROC_NVIDIA_GPUS}"]
    return 0, [f"no GPU found here ({why})"]


def cuda_launch_plan(
    config: AiosConfig,
    request: LaunchRequest,
    gpus_per_host: int | None = None,
    python: str | None = None,
    environ: Mapping[str, str] | None = None,
    backend: str = "cuda",
) -> LaunchPlan:
    """The launch plan for NVIDIA GPU hosts.

    :param config: the resolved config (``nprocs``, ``nnodes``, ``cuda.nccl_preset`` ...).
    :param request: script, args and hosts; ``request.accelerator`` may name an AWS instance
        type (``p5.48xlarge``): its GPU count and NCCL preset are then used instead of this
        machine's.
    :param gpus_per_host: GPUs on each host when the caller knows it (overrides both).
    :param python: the interpreter on the hosts (default: this one).
    :param environ: the environment whose explicit NCCL settings win over presets; default:
        this process's environment when planning for this machine, none when planning for
        hosts of ``request.accelerator`` (this machine's exports do not reach them: set
        ``cuda.nccl_socket_ifname`` etc. instead).
    :return: one host plan per host, ``nprocs`` = one process per GPU unless ``--nprocs`` says
        otherwise, with the preset's NCCL environment.
    """
    notes: list[str] = []
    if gpus_per_host is None and request.accelerator:
        known = INSTANCE_GPUS.get(request.accelerator)
        if known is None and preset_for_instance(request.accelerator) in (None, "none"):
            raise LaunchError(
                f"unknown GPU instance type {request.accelerator!r} for the cuda backend",
                f"use one of: {', '.join(sorted(INSTANCE_GPUS))}, or pass the GPU count",
            )
        if known:
            gpus_per_host = known[0]
            notes.append(f"{request.accelerator}: {known[0]}x {known[1]} per host")
    if gpus_per_host is None:
        gpus_per_host, more = local_gpu_count()
        notes += more
        if gpus_per_host == 0 and config.nprocs == "auto":
            raise LaunchError(
                "no visible NVIDIA GPU to launch on",
                "check `aios devices --backend cuda` and CUDA_VISIBLE_DEVICES",
            )
    nprocs = resolve_nprocs(config, gpus_per_host)
    nnodes = max(config.nnodes, len(request.hosts))
    if environ is None and request.accelerator:
        environ = {}
    env, more = nccl_env(config, request.accelerator, nnodes, environ)
    notes += more
    env.setdefault(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
    )  # a dead peer fails the step instead of hanging
    # OMP_NUM_THREADS: elastic_plan's, from the CPUs this host lets the run use
    strategy = getattr(config, "strategy", "auto")
    if strategy == "deepspeed":
        notes.append(
            "strategy deepspeed: ranks start through torch.distributed.run; DeepSpeed joins the NCCL group aios creates"
        )
    return elastic_plan(backend, config, request, nprocs, env=env, python=python, notes=notes)
