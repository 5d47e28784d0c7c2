"""TorchTPU (``torch_tpu``): runtime choice, pre-flight checks and launch plans. Pure Python.

TorchTPU is the native TPU runtime for PyTorch (device ``tpu``, process-group backend ``tpu``,
``torch.compile(backend="tpu")``); PyTorch/XLA (``torch_xla``) is being replaced by it. Backend
names map one-to-one to runtimes:

* ``--backend tpu``: TorchTPU through core's native strategies (``ddp``, ``fsdp``, ``tp``,
  ``hsdp``) and :class:`aios_backend_xla.tpu_accelerator.TpuAccelerator`;
* ``--backend xla``: torch_xla, unchanged for users on it;
* ``xla.runtime`` (``auto`` | ``torch_tpu`` | ``torch_xla``) says which one ``--backend auto``
  may pick: ``auto`` prefers TorchTPU when it is installed (the ``tpu`` backend has the higher
  priority); naming a runtime switches the other backend off, and asking for a backend that
  contradicts ``xla.runtime`` is a one-line error.

Nothing here imports torch, torch_tpu or libtpu: ``import torch_tpu`` without libtpu exits the
process and a plain ``import torch`` autoloads TorchTPU (a ``torch.backends`` entry point, 3-4
s). What is installed is read from package metadata and ``importlib.util.find_spec``.

The launch environment follows ``torch.tpu.distributed.set_tpu_launch_env`` (its module
docstring and source, torch_tpu 0.2.0), computed here for every host of the slice so that
``--dry-run`` shows it and cloud-gcp can run each host's command on that host:

* single host: ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` = ``localhost:<base_port + i>`` per local
  rank, ``TORCH_TPU_TOPOLOGY`` from the chips per host (``2,2,1`` for 4 chips);
* multi-host: addresses ``<host>:<base_port + i>`` over every host (the same list on all),
  ``NNODES``, ``NODE_RANK`` (the worker id), ``MASTER_ADDR`` (worker 0), ``MASTER_PORT``,
  ``TPU_WORKER_HOSTNAMES``, ``TORCH_TPU_TOPOLOGY`` (the host-local topology, as TorchTPU
  detects it); on GKE the pods' ``JOB_COMPLETION_INDEX`` gives the node rank at start-up;
* multislice (``xla.num_slices > 1``): the same ``MEGASCALE_COORDINATOR_ADDRESS`` (slice 0,
  worker 0, with a port), ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_PORT`` on every host, and
  ``MEGASCALE_SLICE_ID`` per slice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aios.errors import BackendUnavailable, ConfigError, LaunchError
from aios.launcher.contract import NNODES_ENV, NODE_RANK_ENV
from aios.launcher.plan import BACKEND_ENV, THREADS_ENV, plans_here, rank_threads
from aios.plugins import versions as V
from aios.types import Host, HostPlan, LaunchPlan, LaunchRequest

from aios_backend_xla.launch import _hosts_for, no_tpu_error, target_topology
from aios_backend_xla.settings import settings_of
from aios_backend_xla.topology import TpuTopology

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig

    from aios_backend_xla.discovery import TpuFacts

TPU_BACKEND = "tpu"
XLA_BACKEND = "xla"
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
SKIP_MDS_ENV = "TPU_SKIP_MDS_QUERY"
TIER2_ENV = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TIER3_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
LAUNCHER_MODULE = "aios_backend_xla.tpu_launcher"
INSTALL = "pip install torch==2.13.0 torch_tpu==0.2.0 (from the public registry; it brings libtpu>=0.0.50)"

# TORCH_TPU_TOPOLOGY per chip count on one host, by generation (TorchTPU 0.2.0's own tables).
_V4_LIKE = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}
_V5E_LIKE = {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"}
HOST_TOPOLOGY: dict[str, dict[int, str]] = {
    "v4": _V4_LIKE,
    "v5p": _V4_LIKE,
    "v5e": _V5E_LIKE,
    "v6e": _V5E_LIKE,
}


# ------------------------------------------------------------------------------ what is installed


def _spec(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def torch_tpu_installed() -> bool:
    """TorchTPU is installed (found, not imported)."""
    return _spec("torch_tpu")


def torch_xla_installed() -> bool:
    return _spec("torch_xla")


def runtime_setting(config: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """``xla.runtime`` from ``config``, else ``AIOS_XLA__RUNTIME`` (no config: ``aios devices``)."""
    env = os.environ if environ is None else environ
    sec = getattr(config, "xla", None) if config is not None else None
    value = getattr(sec, "runtime", None) if sec is not None else None
    return value or env.get("AIOS_XLA__RUNTIME", "").strip() or "auto"


def check_backend_runtime(backend: str, config: Any = None) -> None:
    """A backend that contradicts ``xla.runtime`` is a one-line error."""
    rt = runtime_setting(config)
    if backend == TPU_BACKEND and rt == "torch_xla":
        raise ConfigError(
            "--backend tpu runs TorchTPU, but xla.runtime=torch_xla is set",
            "use --backend xla for torch_xla, or set xla.runtime=auto (or torch_tpu)",
        )
    if backend == XLA_BACKEND and rt == "torch_tpu":
        raise ConfigError(
            "--backend xla runs torch_xla, but xla.runtime=torch_tpu is set",
            "use --backend tpu for TorchTPU, or set xla.runtime=auto (or torch_xla)",
        )


def preflight(
    host: str | None = None, versions: Mapping[str, str | None] | None = None, config: Any = None
) -> Any:
    """Everything TorchTPU needs, checked without importing it: the package, libtpu (``import
    torch_tpu`` without it exits the process) and the version set (torch in 2.11-2.15, libtpu >=
    0.0.50). Returns the matched :class:`aios.plugins.versions.VersionSet`; raises a one-line
    :class:`~aios.errors.AiosError` (exit 2) naming the problem and the fix."""
    given = dict(versions or {})
    rt = runtime_setting(config)
    if not (given.get("torch_tpu") if "torch_tpu" in given else torch_tpu_installed()):
        why = (
            "xla.runtime=torch_tpu is set but torch_tpu is not installed"
            if rt == "torch_tpu"
            else "torch_tpu (TorchTPU) is not installed"
        )
        raise BackendUnavailable(why, f"{INSTALL}; or use torch_xla with --backend xla")
    if not (given.get("libtpu") if "libtpu" in given else _spec("libtpu")):
        raise BackendUnavailable(
            "libtpu is not installed: importing torch_tpu would exit the process",
            "pip install 'libtpu>=0.0.50' (torch_tpu's dependency)",
        )
    return V.require("torch_tpu", host=host, versions=versions)


# ------------------------------------------------------------------------------ the launch env


def host_topology(topo: TpuTopology, nprocs: int | None = None) -> str:
    """``TORCH_TPU_TOPOLOGY`` for ``nprocs`` chips (default: the chips per host) of ``topo``."""
    n = nprocs or topo.chips_per_host
    table = HOST_TOPOLOGY.get(topo.generation)
    if table is None:
        raise ConfigError(
            f"TorchTPU does not drive TPU {topo.generation} ({topo.accelerator_type})",
            "use v4, v5e, v5p or v6e with --backend tpu, or torch_xla with --backend xla",
        )
    if n not in table:
        raise LaunchError(
            f"TorchTPU has no topology for {n} chips on a TPU {topo.generation} host",
            f"use --nprocs auto or one of {', '.join(str(k) for k in table)}",
        )
    return table[n]


def launch_env(
    hosts: list[str],
    node_rank: int,
    nproc_per_node: int,
    topology: str,
    master_port: int,
    base_port: int = 8070,
) -> dict[str, str]:
    """The TorchTPU launch environment of host ``node_rank`` (see the module docstring)."""
    if len(hosts) <= 1:
        return {
            "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(
                f"localhost:{base_port + i}" for i in range(nproc_per_node)
            ),
            "TORCH_TPU_TOPOLOGY": topology,
        }
    return {
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(
            f"{h}:{base_port + i}" for h in hosts for i in range(nproc_per_node)
        ),
        "NNODES": str(len(hosts)),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(master_port),
        "TORCH_TPU_TOPOLOGY": topology,
        "TPU_WORKER_HOSTNAMES": ",".join(hosts),
        "TPU_WORKER_ID": str(node_rank),
    }


def megascale_env(slice_id: int, num_slices: int, coordinator: str, port: int) -> dict[str, str]:
    """The ``MEGASCALE_*`` settings of one host of a multislice job (the same on every task
    except the slice id)."""
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator}:{port}",
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
        "MEGASCALE_PORT": str(port),
    }


def cache_env(config: Any, local: bool) -> dict[str, str]:
    """TorchTPU's persistent compilation caches (on by default)."""
    d = settings_of(config).tpu_compile_cache_dir
    if not d:
        return {}
    if local and d.startswith("~"):
        d = os.path.expanduser(d)
    d = d.rstrip("/")
    return {TIER2_ENV: f"{d}/tier2", TIER3_ENV: f"{d}/tier3"}


# ------------------------------------------------------------------------------ the plan


def _slice_hosts(
    topo: TpuTopology, request: LaunchRequest, facts: TpuFacts | None, num_slices: int
) -> tuple[list[Host], list[str]]:
    if num_slices == 1:
        return _hosts_for(topo, request, facts)
    total = topo.hosts * num_slices
    given = request.hosts or [Host()]
    if len(given) > 1:
        if len(given) != total:
            raise LaunchError(
                f"{num_slices} slices of {topo.accelerator_type} have {total} hosts but {len(given)} were given",
                f"pass all {total} workers (slice by slice), or fix xla.num_slices",
            )
        return [Host(h.address, h.internal_address, i) for i, h in enumerate(given)], []
    note = (
        f"{num_slices} slices x {topo.hosts} host(s) of {topo.accelerator_type}: run each host's command on that host "
        "(aios launch --cloud gcp does this); host names below are placeholders"
    )
    return [
        Host(f"tpu-slice{s}-worker-{w}", None, s * topo.hosts + w)
        for s in range(num_slices)
        for w in range(topo.hosts)
    ], [note]


def torch_tpu_plan(
    config: AiosConfig,
    request: LaunchRequest,
    topo: TpuTopology,
    facts: TpuFacts | None = None,
    python: str | None = None,
) -> LaunchPlan:
    """One TorchTPU process per chip on every host of the slice (or slices)."""
    python = getattr(request, "python", None) or python or sys.executable
    s = settings_of(config)
    hosts, notes = _slice_hosts(topo, request, facts, s.num_slices)
    per_host = topo.chips_per_host
    if config.nprocs == "auto":
        nprocs = per_host
    else:
        nprocs = int(config.nprocs)
        if len(hosts) > 1 and nprocs != per_host:
            raise LaunchError(
                f"--nprocs {nprocs} does not fit {topo.accelerator_type}: TorchTPU runs one "
                f"process per chip ({per_host} per host) on multi-host slices",
                f"use --nprocs auto or --nprocs {per_host}",
            )
    topology = host_topology(topo, nprocs)
    per_slice = topo.hosts
    world = len(hosts) * nprocs
    local = len(hosts) == 1 and hosts[0].address in ("localhost", "127.0.0.1", "::1")
    caches = cache_env(config, local)
    plans: list[HostPlan] = []
    for i, host in enumerate(hosts):
        slice_id, in_slice = divmod(i, per_slice)
        names = [h.internal_address or h.address for h in hosts]
        slice_names = names[slice_id * per_slice : (slice_id + 1) * per_slice]
        master = "localhost" if len(hosts) == 1 else names[0]
        env = {
            BACKEND_ENV: TPU_BACKEND,
            AUTOLOAD_ENV: "1",
            NODE_RANK_ENV: str(i),
            NNODES_ENV: str(len(hosts)),
        }
        env.update(
            launch_env(slice_names, in_slice, nprocs, topology, config.master_port, s.tpu_base_port)
        )
        if s.num_slices > 1:
            # ranks span every slice: the rendezvous is over all hosts
            env.update(
                NNODES=str(len(hosts)),
                NODE_RANK=str(i),
                MASTER_ADDR=master,
                MASTER_PORT=str(config.master_port),
            )
            env.update(megascale_env(slice_id, s.num_slices, names[0], s.megascale_port))
        env.update(caches)
        if THREADS_ENV not in os.environ and plans_here(request):
            # the host CPUs this run may use, shared among its processes (a user's value wins)
            env[THREADS_ENV] = str(rank_threads(nprocs))
        cmd = [python, "-m", LAUNCHER_MODULE, "--nprocs", str(nprocs)]
        cmd += ["-m", request.script] if request.module else [request.script]
        cmd += list(request.args)
        ranks = [
            {
                "RANK": str(i * nprocs + lr),
                "LOCAL_RANK": str(lr),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nprocs),
                "GROUP_RANK": str(i),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(config.master_port),
            }
            for lr in range(nprocs)
        ]
        plans.append(HostPlan(host=host, nprocs=nprocs, env=env, command=cmd, ranks=ranks))
    notes.insert(
        0,
        (
            f"{topo.accelerator_type} on TorchTPU: TPU {topo.generation}, {topo.chips} chips on {topo.hosts} host(s)"
            f"{f' x {s.num_slices} slices' if s.num_slices > 1 else ''}, one process per chip "
            f"({nprocs}/host, spawned), "
            f"process group 'tpu', TORCH_TPU_TOPOLOGY={topology}"
        ),
    )
    notes.append(
        "every host checks its versions (torch_tpu / torch / libtpu) before its workers start"
    )
    if caches:
        notes.append(
            f"TorchTPU compilation caches: {caches[TIER2_ENV]}, {caches[TIER3_ENV]} "
            "(xla.tpu_compile_cache_dir='' to disable)"
        )
    if s.num_slices > 1:
        notes.append(
            f"multislice: MEGASCALE_COORDINATOR_ADDRESS={names[0]}:{s.megascale_port} on every host"
        )
    return LaunchPlan(
        backend=TPU_BACKEND, launcher="torch_tpu", world_size=world, hosts=plans, notes=notes
    )


def tpu_launch_plan(
    config: AiosConfig,
    request: LaunchRequest,
    facts: TpuFacts | None = None,
    python: str | None = None,
) -> LaunchPlan:
    """``aios-run --backend tpu``'s plan. Off a TPU with ``xla.accelerator`` set, the plan is
    built for that slice (dry-run, cloud launches); running it here is refused by the launcher."""
    check_backend_runtime(TPU_BACKEND, config)
    topo = target_topology(config, request, facts)
    if topo is None:
        if facts is not None and facts.present:
            raise LaunchError(
                f"a TPU is attached ({facts.pci_chips} chips on the PCI bus) but its accelerator type is unknown",
                "set xla.accelerator=<type> (e.g. v6e-8)",
            )
        err = no_tpu_error(facts)
        raise BackendUnavailable(
            err.message.replace("backend 'xla'", "backend 'tpu'"),
            "run on a Cloud TPU VM, or plan for one with xla.accelerator=<type> (e.g. v6e-8) and --dry-run",
        )
    if facts is not None and facts.present:  # training here: the runtime must be usable
        preflight(config=config)
    return torch_tpu_plan(config, request, topo, facts, python)
