"""Launch plans for the ``xla`` backend. Pure Python: building a plan never imports torch.

* **TPU VM, one host**: ``python -m aios_backend_xla.launcher --nprocs <chips> SCRIPT ARGS``
  with ``PJRT_DEVICE=TPU`` set explicitly; the launcher calls ``torch_xla.launch``, which starts
  one process per chip, so the user's script runs unchanged.
* **TPU pod slice**: the same command on every host (the cloud-gcp package runs each
  :class:`~aios.types.HostPlan` on its host), with the host's worker id and the master address
  (worker 0's internal IP) in its env.
* **SPMD** (``strategy: spmd``): one process per host that sees every local device.
* **XLA:CPU** (only with the opt-in ``xla.allow_cpu`` / ``AIOS_XLA__ALLOW_CPU=1``): one process,
  ``PJRT_DEVICE=CPU`` (``CPU_NUM_DEVICES`` from ``xla.cpu_devices`` for SPMD tests).

A persistent compilation cache (``XLA_PERSISTENT_CACHE_PATH``) is configured by default on TPU.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from aios.errors import BackendUnavailable, LaunchError
from aios.launcher.contract import NNODES_ENV, NODE_RANK_ENV
from aios.launcher.plan import BACKEND_ENV, THREADS_ENV, plans_here, rank_threads, script_command
from aios.types import Host, HostPlan, LaunchPlan, LaunchRequest

from aios_backend_xla.discovery import TpuFacts
from aios_backend_xla.settings import ALLOW_CPU_ENV, cpu_opt_in, settings_of
from aios_backend_xla.topology import TpuTopology, parse_accelerator_type

if TYPE_CHECKING:  # pragma: no cover
    from aios.config.settings import AiosConfig

LAUNCHER_MODULE = "aios_backend_xla.launcher"
OPT_IN_HINT = (
    "run on a Cloud TPU VM (pip install -e './packages/core[xla]' ./packages/backend-xla "
    "(from the aios checkout)), or to test on XLA:CPU opt in with "
    f"xla.allow_cpu=true (env {ALLOW_CPU_ENV}=1)"
)


def no_tpu_error(facts: TpuFacts | None = None) -> BackendUnavailable:
    why = (
        "no TPU was found (no Google TPU PCI device under /sys/bus/pci/devices, no "
        "accelerator-type in the GCE metadata, no TPU_ACCELERATOR_TYPE)"
    )
    if facts is not None and facts.problems:
        why += f"; {facts.problems[0]}"
    return BackendUnavailable(f"backend 'xla': {why}", OPT_IN_HINT)


def target_topology(
    config: AiosConfig, request: LaunchRequest | None, facts: TpuFacts | None
) -> TpuTopology | None:
    """The slice to plan for: ``xla.accelerator``, else the request's, else the discovered one."""
    s = settings_of(config)
    text = s.accelerator or (request.accelerator if request else None)
    if text:
        return parse_accelerator_type(text)
    if facts is not None and facts.accelerator_type:
        return parse_accelerator_type(facts.accelerator_type)
    return None


#: what every torch_xla process of a plan imports (aios.init's strategy), imported once by
#: aios-run's zygote ahead of them (``LaunchPlan.preload``): importing them creates no thread and
#: no PJRT client (created at the first use of a device), and reads only variables that are
#: equal in zygote and process or read when the client is created (aios.launcher.warm)
RANK_MODULES = [
    "torch_xla",
    "torch_xla.core.xla_model",
    "torch_xla.runtime",
    "torch_xla.debug.metrics",
    "torch_xla.distributed.xla_backend",
    "torch_xla.distributed.spmd",
]
#: the variables of the plans' env their processes read only when used (``LaunchPlan.runtime_env``):
#: torch_xla 2.9 reads these when its runtime client is created (the first use of a device:
#: torch_xla.runtime, torch_xla._internal.pjrt, the C++ PJRT client), not on import; its import
#: only checks whether PJRT_DEVICE is set (and sets a default when not, an edit a forked process
#: repeats). Those the import reads (XLA_FLAGS, LIBTPU_INIT_ARGS, TPU_LIBRARY_PATH, PT_XLA_DEBUG,
#: XLA_REGISTER_INSTALLED_PLUGINS; on a TPU VM TPU_WORKER_ID and the TPU_*_BOUNDS through its
#: metadata) are not here: equal in zygote and process, or the process starts fresh. The opt-in
#: is an aios setting, read when aios.init resolves the config.
RANK_RUNTIME_ENV = [
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "TPU_VISIBLE_CHIPS",
    ALLOW_CPU_ENV,
]
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")
#: torch_xla workers never load TorchTPU: with both installed, ``import torch`` would autoload it
#: (a torch.backends entry point) and claim the PrivateUse1 device and the TPU next to torch_xla.
NO_TORCH_TPU = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def _cache_dir(config: AiosConfig, hosts: list[Host] | None = None) -> str | None:
    """The cache directory for the plan's env. A ``~`` never reaches a process unexpanded
    (torch_xla's C++ side would create a directory literally named ``~``): for a plan run on
    this machine it is expanded here; for remote hosts (``aios launch``) it stays ``~/...``,
    which the cloud layer's env file and :meth:`aios.types.HostPlan.shell` turn into
    ``"$HOME/..."`` on each host (homes differ per host), and the launcher/strategy expand any
    ``~`` left at start-up."""
    s = settings_of(config)
    if not s.compile_cache or not s.compile_cache_dir:
        return None
    d = s.compile_cache_dir
    if d.startswith("~") and (
        not hosts or (len(hosts) == 1 and hosts[0].address in LOCAL_ADDRESSES)
    ):
        d = os.path.expanduser(d)
    return d


def _hosts_for(
    topo: TpuTopology, request: LaunchRequest, facts: TpuFacts | None
) -> tuple[list[Host], list[str]]:
    notes: list[str] = []
    given = request.hosts or [Host()]
    if len(given) > 1:
        if len(given) != topo.hosts:
            raise LaunchError(
                f"{topo.accelerator_type} has {topo.hosts} hosts but {len(given)} were given",
                f"pass all {topo.hosts} workers of the slice, or fix xla.accelerator",
            )
        return [Host(h.address, h.internal_address, i) for i, h in enumerate(given)], notes
    if topo.hosts == 1:
        return list(given), notes
    if facts is not None and len(facts.worker_addresses) == topo.hosts:
        notes.append("hosts from the GCE metadata worker-network-endpoints")
        return [Host(ip, ip, i) for i, ip in enumerate(facts.worker_addresses)], notes
    notes.append(
        f"{topo.accelerator_type} spans {topo.hosts} hosts: run each host's command on that host "
        "(aios launch --cloud gcp does this); host names below are placeholders"
    )
    return [Host(f"tpu-worker-{i}", None, i) for i in range(topo.hosts)], notes


def tpu_plan(
    config: AiosConfig,
    request: LaunchRequest,
    topo: TpuTopology,
    facts: TpuFacts | None = None,
    python: str | None = None,
) -> LaunchPlan:
    python = getattr(request, "python", None) or python or sys.executable
    hosts, notes = _hosts_for(topo, request, facts)
    spmd = config.strategy == "spmd"
    per_host = topo.processes_per_host
    if spmd:
        nprocs = 1
    elif config.nprocs == "auto":
        nprocs = per_host
    elif int(config.nprocs) == 1:
        nprocs = 1
        notes.append("one process using one chip (torch_xla.launch debug_single_process)")
    elif int(config.nprocs) != per_host:
        raise LaunchError(
            f"--nprocs {config.nprocs} does not fit {topo.accelerator_type}: torch_xla.launch "
            f"runs one process per {'chiplet' if topo.processes_per_chip > 1 else 'chip'} "
            f"({per_host} per host) or one",
            f"use --nprocs auto, --nprocs {per_host} or --nprocs 1",
        )
    else:
        nprocs = per_host
    world = len(hosts) * nprocs
    master = hosts[0].internal_address or hosts[0].address
    if len(hosts) == 1:
        master = "localhost"
    cache = _cache_dir(config, hosts)
    plans: list[HostPlan] = []
    for i, host in enumerate(hosts):
        env = {
            BACKEND_ENV: "xla",
            "PJRT_DEVICE": "TPU",
            NODE_RANK_ENV: str(i),
            NNODES_ENV: str(len(hosts)),
            **NO_TORCH_TPU,
        }
        if len(hosts) > 1:
            env.update(
                TPU_WORKER_ID=str(i), MASTER_ADDR=master, MASTER_PORT=str(config.master_port)
            )
        if cache:
            env["XLA_PERSISTENT_CACHE_PATH"] = cache
        if THREADS_ENV not in os.environ and plans_here(request):
            # the host CPUs this run may use, shared among its processes (a user's value wins)
            env[THREADS_ENV] = str(rank_threads(nprocs))
        if spmd or nprocs == 1 and per_host == 1:
            cmd = script_command(request, python)
        else:
            cmd = [python, "-m", LAUNCHER_MODULE, "--nprocs", str(nprocs)]
            cmd += ["-m", request.script] if request.module else [request.script]
            cmd += list(request.args)
        ranks = []
        for local in range(nprocs):
            ranks.append(
                {
                    "RANK": str(i * nprocs + local),
                    "LOCAL_RANK": str(local),
                    "WORLD_SIZE": str(world),
                    "PJRT_LOCAL_PROCESS_RANK": str(local),
                    "PJRT_LOCAL_PROCESS_COUNT": str(nprocs),
                    "TPU_VISIBLE_CHIPS": str(local)
                    if nprocs > 1
                    else ",".join(str(c) for c in range(per_host)),
                }
            )
        plans.append(HostPlan(host=host, nprocs=nprocs, env=env, command=cmd, ranks=ranks))
    notes.insert(
        0,
        (
            f"{topo.accelerator_type}: TPU {topo.generation}, {topo.chips} chips ({topo.tensorcores} TensorCores) "
            f"on {topo.hosts} host(s), {topo.chips_per_host} chips/host, {topo.hbm_gib_per_chip} GiB HBM/chip, "
            f"peak {topo.peak_bf16_tflops:g} bf16 TFLOP/s, runtime {topo.runtime_version}"
        ),
    )
    if cache:
        notes.append(f"persistent compilation cache: {cache} (xla.compile_cache=false to disable)")
    return LaunchPlan(
        backend="xla",
        launcher="direct" if spmd or nprocs == 1 and per_host == 1 else "xla",
        world_size=world,
        hosts=plans,
        notes=notes,
        preload=list(RANK_MODULES),
        runtime_env=list(RANK_RUNTIME_ENV),
    )


def cpu_plan(config: AiosConfig, request: LaunchRequest, python: str | None = None) -> LaunchPlan:
    """XLA:CPU: a single process with PJRT_DEVICE=CPU (only reachable with the opt-in)."""
    python = getattr(request, "python", None) or python or sys.executable
    s = settings_of(config)
    if config.nprocs not in ("auto", 1) or config.nnodes > 1 or len(request.hosts) > 1:
        raise LaunchError(
            "XLA:CPU runs one process (multi-process XLA collectives do not work on CPU)",
            "use --nprocs 1; for data parallelism on CPU devices use strategy=spmd with xla.cpu_devices=N",
        )
    env = {BACKEND_ENV: "xla", "PJRT_DEVICE": "CPU", ALLOW_CPU_ENV: "1", **NO_TORCH_TPU}
    devices = s.cpu_devices or (4 if config.strategy == "spmd" else None)
    if devices:
        env["CPU_NUM_DEVICES"] = str(devices)
    host = HostPlan(
        host=request.hosts[0] if request.hosts else Host(),
        nprocs=1,
        env=env,
        command=script_command(request, python),
        ranks=[{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}],
    )
    notes = ["XLA:CPU (opt-in for testing): one process, PJRT_DEVICE=CPU; no TPU is used"]
    return LaunchPlan(
        backend="xla",
        launcher="direct",
        world_size=1,
        hosts=[host],
        notes=notes,
        preload=list(RANK_MODULES),
        runtime_env=list(RANK_RUNTIME_ENV),
    )


def xla_launch_plan(
    config: AiosConfig,
    request: LaunchRequest,
    facts: TpuFacts | None = None,
    python: str | None = None,
    environ: dict[str, str] | None = None,
) -> LaunchPlan:
    """The plan for ``request``: TPU when a slice is named or found, else XLA:CPU with the opt-in,
    else :func:`no_tpu_error`."""
    env = dict(os.environ) if environ is None else environ
    topo = target_topology(config, request, facts)
    if topo is not None:
        return tpu_plan(config, request, topo, facts, python)
    if facts is not None and facts.present:
        raise LaunchError(
            f"a TPU is attached ({facts.pci_chips} chips on the PCI bus) but its accelerator type is unknown",
            "set xla.accelerator=<type> (e.g. v4-8), or check the metadata server (aios doctor --backend xla)",
        )
    if cpu_opt_in(config, env):
        return cpu_plan(config, request, python)
    raise no_tpu_error(facts)
