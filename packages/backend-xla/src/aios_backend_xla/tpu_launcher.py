"""``python -m aios_backend_xla.tpu_launcher [--nprocs N] [-m] SCRIPT [ARGS...]``

Runs an unchanged training script once per local TPU chip on TorchTPU, on one host of the
slice (aios's launch plan runs it on every host). Before any worker starts it checks, without
importing torch, torch_tpu or libtpu:

* the versions installed here against :mod:`aios.plugins.versions` (torch_tpu / torch / libtpu): a
  mismatch is one line naming this host, what is installed and what is expected (exit 2);
* libtpu is present (``import torch_tpu`` without it exits the process);
* off Google Cloud, ``TPU_SKIP_MDS_QUERY=1`` (libtpu would retry the metadata server ~30 s
  per key);
* the launch environment: the plan's, or on GKE (``TPU_WORKER_HOSTNAMES`` /
  ``JOB_COMPLETION_INDEX``, the same pod template for every host) this host's part of it.

Workers are fresh interpreters (``subprocess``: spawn semantics, never a fork of a process
that holds a TPU runtime), each with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE``/
``GROUP_RANK``/``MASTER_*`` and ``TORCH_DEVICE_BACKEND_AUTOLOAD=1`` so ``import torch`` loads
TorchTPU there. When one worker fails the others are stopped and its exit status is returned
(75, a preemption, passes through); SIGTERM/SIGINT are forwarded.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

from aios.errors import AiosError, LaunchError
from aios.launcher.contract import HOST_ENV, LOCAL_INDEX_ENV, NNODES_ENV, NODE_RANK_ENV

from aios_backend_xla.discovery import discover, on_gce
from aios_backend_xla.tpu import (
    AUTOLOAD_ENV,
    SKIP_MDS_ENV,
    TIER2_ENV,
    TIER3_ENV,
    launch_env,
    preflight,
)

GRACE_S = 10.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m aios_backend_xla.tpu_launcher", description=__doc__.split("\n\n")[1]
    )
    p.add_argument(
        "--nprocs", default="auto", help="processes on this host: auto (one per chip) or a count"
    )
    p.add_argument(
        "-m", dest="module", action="store_true", help="run SCRIPT as a module (python -m)"
    )
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def host_env(environ: Mapping[str, str], nprocs: int, hostname: str) -> dict[str, str]:
    """This host's launch environment: the plan's values, completed for GKE pods (one template
    for every host: node rank from ``JOB_COMPLETION_INDEX``, hosts from ``TPU_WORKER_HOSTNAMES``)
    and with ``TPU_SKIP_MDS_QUERY=1`` off Google Cloud. Never overwrites a value already set."""

    out: dict[str, str] = {}
    hosts = [h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    index = environ.get("JOB_COMPLETION_INDEX")
    if "TORCH_TPU_SLICEBUILDER_ADDRESSES" not in environ and (len(hosts) > 1 or index is not None):
        if not hosts:
            raise LaunchError(
                "JOB_COMPLETION_INDEX is set but TPU_WORKER_HOSTNAMES is not: the TorchTPU "
                "slice addresses cannot be built",
                "set TPU_WORKER_HOSTNAMES (GKE TPU node pools do) or launch through aios-run --backend tpu",
            )
        rank = int(environ.get("TPU_WORKER_ID") or index or 0)
        topology = environ.get("TORCH_TPU_TOPOLOGY", "")
        if not topology:
            raise LaunchError(
                "TORCH_TPU_TOPOLOGY is not set for a multi-host TorchTPU launch",
                "launch through aios-run --backend tpu (the plan sets it)",
            )
        base = int(environ.get("TORCH_TPU_BASE_PORT", "8070"))
        port = int(environ.get("MASTER_PORT", "29500"))
        out.update(
            {
                k: v
                for k, v in launch_env(hosts, rank, nprocs, topology, port, base).items()
                if k not in environ
            }
        )
        out.setdefault(NODE_RANK_ENV, str(rank))
        out.setdefault(NNODES_ENV, str(len(hosts)))
    if SKIP_MDS_ENV not in environ and not on_gce():
        out[SKIP_MDS_ENV] = "1"
    out[AUTOLOAD_ENV] = "1"
    return out


def rank_envs(environ: Mapping[str, str], nprocs: int) -> list[dict[str, str]]:
    node = int(environ.get(NODE_RANK_ENV, environ.get("NODE_RANK", "0")) or 0)
    nnodes = int(environ.get(NNODES_ENV, environ.get("NNODES", "1")) or 1)
    master = environ.get("MASTER_ADDR", "localhost")
    port = environ.get("MASTER_PORT", "29500")
    return [
        {
            "RANK": str(node * nprocs + lr),
            "LOCAL_RANK": str(lr),
            "WORLD_SIZE": str(nnodes * nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_RANK": str(node),
            "MASTER_ADDR": master,
            "MASTER_PORT": port,
            LOCAL_INDEX_ENV: str(lr),
        }
        for lr in range(nprocs)
    ]


def _expand_caches(env: dict[str, str]) -> None:
    for key in (TIER2_ENV, TIER3_ENV):
        if env.get(key):
            env[key] = os.path.expanduser(env[key])
            os.makedirs(env[key], exist_ok=True)


def prepare(
    ns: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[dict[str, str]]]:
    """Checks and environments; raises :class:`AiosError` (one line) before anything starts."""

    env = dict(os.environ if environ is None else environ)
    host = env.get(HOST_ENV) or socket.gethostname()
    preflight(host=host)
    if not (ns.nprocs == "auto" or ns.nprocs.isdigit() and int(ns.nprocs) >= 1):
        raise LaunchError(
            f"--nprocs {ns.nprocs} is not a process count",
            "use --nprocs auto or the number of local chips",
        )
    chips = discover(environ=env).pci_chips
    if ns.nprocs == "auto":
        if not chips:
            raise LaunchError(
                f"no TPU chips on this host ({host}): --nprocs auto has nothing to count",
                "run on a Cloud TPU VM (the plan's host), or pass --nprocs",
            )
        nprocs = chips
    else:
        nprocs = int(ns.nprocs)
        if chips and nprocs > chips:
            raise LaunchError(
                f"--nprocs {nprocs} asks for more processes than the {chips} TPU chips on {host}",
                f"use --nprocs {chips} or fewer",
            )
    if not ns.module and not os.path.isfile(ns.script):
        raise LaunchError(
            f"script '{ns.script}' does not exist", "pass the path of the training script"
        )
    env.update(host_env(env, nprocs, host))
    _expand_caches(env)
    head = [sys.executable, "-m", ns.script] if ns.module else [sys.executable, ns.script]
    per_rank = [{**env, **r} for r in rank_envs(env, nprocs)]
    return [*head, *ns.args], per_rank


def supervise(cmd: list[str], envs: list[dict[str, str]]) -> int:
    """Start one worker per env, wait; the first failure stops the others."""
    procs = [subprocess.Popen(cmd, env=e) for e in envs]

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                code = bad[0]
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + GRACE_S
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)
    return code


def main(argv: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    try:
        cmd, envs = prepare(ns)
    except AiosError as exc:
        print(f"aios-backend-xla tpu launcher: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    return supervise(cmd, envs)


if __name__ == "__main__":
    sys.exit(main())
