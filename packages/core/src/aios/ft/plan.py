"""What ``ft.replica_groups`` needs before any rank starts; one line each when it is missing.

This module imports neither torch nor torchft (``aios-run --dry-run`` and the checks stay light).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from aios.errors import ConfigError

#: the backends whose process groups torchft 0.2.0 provides: gloo (CPU) and NCCL (CUDA)
#: (torchft.process_group: ProcessGroupGloo, ProcessGroupNCCL). XLA/TPU and Neuron have none.
SUPPORTED_BACKENDS = ("cpu", "cuda")
#: the strategies a replica group runs inside itself. A heal copies each rank's own shards from
#: the same rank of a live group (aios.checkpoint.own): no collective, at the same shape.
#: DeepSpeed is not among them: its engine owns the gradients' reduction and the optimizer step,
#: which the groups' all-reduce and commit vote must come between
GROUP_STRATEGIES = ("auto", "ddp", "fsdp", "hsdp", "tp")
INSTALL = "pip install -e './packages/core[ft]' (from the aios checkout)"


def torchft_installed() -> bool:
    return importlib.util.find_spec("torchft") is not None


def check(cfg: Any, backend: str, nprocs: int) -> int:
    """The number of replica groups (1: off). Raises :class:`ConfigError` for a setting that
    cannot run: torchft not installed, a backend it does not cover, nprocs not divisible."""
    groups = int(cfg.ft.replica_groups)
    if groups <= 1:
        return 1
    if not torchft_installed():
        raise ConfigError(
            f"ft.replica_groups={groups} needs torchft, which is not installed",
            f"install the extra: {INSTALL}",
        )
    if backend not in SUPPORTED_BACKENDS:
        raise ConfigError(
            f"ft.replica_groups is not supported on backend '{backend}': torchft has process "
            f"groups for {' and '.join(SUPPORTED_BACKENDS)} only",
            "drop ft.replica_groups (checkpoints and restarts still recover the run)",
        )
    if cfg.strategy not in GROUP_STRATEGIES:
        raise ConfigError(
            f"ft.replica_groups with strategy={cfg.strategy} is not supported: replica groups "
            f"run {', '.join(GROUP_STRATEGIES[1:])} inside each group",
            f"use strategy={' or '.join(GROUP_STRATEGIES)} with ft.replica_groups, or drop "
            "ft.replica_groups",
        )
    nnodes = int(cfg.nnodes)
    if groups % nnodes:
        raise ConfigError(
            f"ft.replica_groups={groups} over nnodes={nnodes}: each replica group runs on one "
            "host, and every host runs as many",
            f"use ft.replica_groups={nnodes * max(1, groups // nnodes)} (a multiple of nnodes)",
        )
    if nprocs % groups:
        raise ConfigError(
            f"nprocs={nprocs} is not divisible by ft.replica_groups={groups}",
            f"use nprocs={groups * max(1, nprocs // groups)} or ft.replica_groups that divides "
            f"{nprocs}",
        )
    return groups


def rust_log(cfg: Any, environ: dict[str, str]) -> str:
    """torchft's Rust side logs per-step INFO lines (RUST_LOG): off (warnings only) unless the
    user set RUST_LOG or ``ft.log``."""
    if cfg.ft.log:
        return str(cfg.ft.log)
    return environ.get("RUST_LOG") or "warn"
