"""The settings models: every core section and :class:`AiosConfigBase`, with their defaults,
bounds and descriptions.

Nothing here reads a source or the plugin registry: :mod:`aios.config.schema` builds the model
with the plugins' sections and resolves the sources into it. The plugin hook specs and the
launch plan name these types, so this module sits below the registry (no import circle, type-only
ones included).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aios.checkpoint.policy import parse_duration, parse_fraction
from aios.config.redact import redact

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"]
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-true")
PRECISION_ALIASES = {
    "32": "fp32",
    "32-true": "fp32",
    "bf16": "bf16-mixed",
    "16-mixed": "fp16-mixed",
    "fp16": "fp16-mixed",
}

# Bounds that keep values usable downstream: torch seeds are 64-bit, a launch plan lists every
# local process (nprocs=10**12 would exhaust memory in --dry-run).
MAX_SEED = 2**63 - 1
MAX_NPROCS = 4096
MAX_NNODES = 65536


class Section(BaseModel):
    """Base for config sections: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class CheckpointSettings(Section):
    dir: str | None = Field(
        None, description="local path or fsspec URL (gs://, s3://); None disables checkpoints"
    )
    every: int = Field(
        0, ge=0, description="save every N optimizer steps (0: only at the end and on preemption)"
    )
    keep: int = Field(3, ge=1, description="complete checkpoints kept; older ones are deleted")
    resume: bool = Field(True, description="resume from the newest complete checkpoint in dir")
    grace_seconds: float = Field(
        25.0,
        gt=0,
        description="seconds between SIGTERM and the kill (capped by the platform's own grace, "
        "e.g. 15 on GKE Spot): the emergency checkpoint is written when it fits in them",
    )
    max_lost: float | None = Field(
        1800.0,
        description="bound on the training an unannounced kill can lose (seconds or a duration: "
        "30m, 10s; off/0: none): aios picks the periodic interval from the measured save cost "
        "and step time; checkpoint.every, when set, fixes the interval instead",
    )
    max_overhead: float = Field(
        0.03,
        description="largest share of training time the periodic saves of max_lost may block "
        "(0.03 or 3%); when max_lost needs more, max_lost wins and aios says so once",
    )
    async_save: bool = Field(
        True,
        description="sharded (dcp) checkpoints: write in the background while training continues",
    )
    async_writer: Literal["auto", "process", "thread"] = Field(
        "auto",
        description="how a background dcp save is written: by DCP's checkpoint process (one per "
        "training process; the least step slow-down), or by a thread of the training process; "
        "auto: the process on cpu and cuda, the thread on other devices",
    )
    reshard: bool = Field(
        True,
        description="resume a checkpoint written at another shape (world size, mesh, strategy, "
        "backend: sharded checkpoints reshard through DCP, full ones load everywhere); false: "
        "refuse any difference",
    )

    @field_validator("max_lost", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return parse_duration(v)

    @field_validator("max_overhead", mode="before")
    @classmethod
    def _fraction(cls, v: Any) -> Any:
        return parse_fraction(v)


class LoggingSettings(Section):
    run_dir: str = Field("runs", description="parent of per-run record directories")
    level: Literal["debug", "info", "warning", "error"] = "info"
    every: int = Field(10, ge=1, description="log metrics every N steps")
    progress: bool = Field(True, description="progress bar on rank 0 when attached to a terminal")
    tensorboard: bool = Field(
        True, description="write TensorBoard event files when tensorboard is installed"
    )
    wandb: bool = Field(False, description="log to Weights & Biases (key from WANDB_API_KEY only)")
    wandb_project: str | None = None


class LaunchSettings(Section):
    max_restarts: int = Field(0, ge=0)
    rdzv_backend: Literal["c10d", "static"] = "c10d"
    rdzv_id: str = "aios"
    monitor_interval: float = Field(0.5, gt=0)
    log_prefix: bool = Field(True, description="prefix each worker line with [rank N]")
    warm_start: bool = Field(
        True,
        description="fork the ranks from a process that already imported torch and aios where "
        "that is safe (no thread, no CUDA/XLA runtime in it); false: every rank a fresh python",
    )


class WatchdogSettings(Section):
    """The hang watchdog of ``aios-run`` (see :mod:`aios.resilience.watchdog`)."""

    enabled: bool = Field(
        True, description="watch the ranks' progress and name a hang (off: on-demand dumps only)"
    )
    timeout: float | Literal["auto"] = Field(
        "auto",
        description="seconds without progress on any rank (after the first step) that make a "
        "hang; auto: max(min_timeout, factor x the slowest recent step)",
    )
    min_timeout: float = Field(600.0, gt=0, description="floor of the auto timeout (seconds)")
    factor: float = Field(
        10.0, ge=2, description="auto timeout: this many times the slowest recent step"
    )
    first_step: float = Field(
        1800.0,
        gt=0,
        description="allowance until the first step (compilation, loading, rendezvous), seconds",
    )
    action: Literal["stop", "restart", "dump"] = Field(
        "stop",
        description="after the dump: stop (exit 124), restart (under --max-restarts), or dump "
        "only and keep waiting",
    )
    dump_wait: float = Field(
        10.0, gt=0, description="seconds to wait for each rank's stack dump before calling it stuck"
    )
    interval: float = Field(1.0, gt=0, description="seconds between progress polls")

    @field_validator("timeout")
    @classmethod
    def _positive_timeout(cls, v: Any) -> Any:
        if v != "auto" and not v > 0:
            raise ValueError("must be a positive number of seconds (or auto)")
        return v


class FtSettings(Section):
    """Per-step fault tolerance with torchft replica groups (see :mod:`aios.ft`)."""

    replica_groups: int = Field(
        1,
        ge=1,
        description="replica groups (nprocs must divide by it); above 1, a lost group is "
        "restarted and heals from a live one while the others keep training (aios-core[ft])",
    )
    heartbeat_timeout_ms: int = Field(
        5000, ge=10, description="lighthouse: a group silent this long leaves the quorum"
    )
    join_timeout_ms: int = Field(
        60000, ge=0, description="lighthouse: how long a quorum waits for missing groups"
    )
    quorum_tick_ms: int = Field(100, ge=1, description="lighthouse: quorum check interval")
    timeout: float = Field(
        60.0,
        gt=0,
        description="seconds for a cross-group all-reduce, commit vote or heal; a group behind "
        "another for twice this is hung: stopped and restarted",
    )
    max_restarts: int = Field(
        3, ge=0, description="restarts of each lost group before the run fails"
    )
    log: str | None = Field(
        None, description="torchft's own log level (RUST_LOG), e.g. info; default: warnings only"
    )


class FsdpSettings(Section):
    """``strategy: fsdp`` / ``hsdp`` (FSDP2, ``torch.distributed.fsdp.fully_shard``)."""

    wrap: list[str] = Field(
        default_factory=list,
        description="module class names sharded as one unit each (e.g. [Block]); empty: every direct "
        "child holding parameters, then the root",
    )
    reshard_after_forward: bool = Field(
        True,
        description="free gathered parameters after forward (ZeRO-3); false keeps them until backward (ZeRO-2 like)",
    )
    cpu_offload: bool = Field(
        False,
        description="keep sharded parameters, gradients and optimizer state on the CPU (CPUOffloadPolicy)",
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each wrapped block's activations in backward"
    )
    compile: bool = Field(False, description="torch.compile each wrapped block")
    reduce_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="gradient reduce dtype; auto: float32 under mixed precision"
    )


class MeshSettings(Section):
    """The device mesh of the native sharded strategies (``fsdp``, ``tp``, ``hsdp``)."""

    dp: int | Literal["auto"] = Field(
        "auto", description="data-parallel (shard) size; auto: world size / tp / replicate"
    )
    tp: int = Field(
        1, ge=1, description="tensor-parallel size (strategy tp, or fsdp with tp > 1: 2-D)"
    )
    replicate: int | Literal["auto"] = Field(
        "auto", description="hsdp: replica groups; auto: one per node"
    )
    tp_plan: str | None = Field(
        None,
        description="'module:attribute' naming a tensor-parallel plan (dict of module path to "
        "ParallelStyle, or a callable(model, mesh) returning one)",
    )

    @field_validator("dp", "replicate")
    @classmethod
    def _at_least_one(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("a mesh dimension is at least 1 (or auto)")
        return v


class AiosConfigBase(Section):
    backend: str = Field(
        "auto", description="auto | cpu | cuda | tpu | xla | neuron | <plugin backend>"
    )
    precision: Precision = "fp32"
    strategy: str = Field(
        "auto",
        description="auto (the backend's default) | a registered strategy: ddp, fsdp, tp, hsdp, "
        "deepspeed, spmd, ... (see `aios plugins`)",
    )
    nprocs: int | Literal["auto"] = Field(
        "auto",
        description=f"processes per node (1 to {MAX_NPROCS}); auto: one per device (1 on CPU)",
    )
    nnodes: int = Field(1, ge=1, le=MAX_NNODES)
    node_rank: int = Field(0, ge=0, description="this node's rank: 0 to nnodes - 1")
    master_addr: str = "127.0.0.1"
    master_port: int = Field(29500, ge=1, le=65535)
    seed: int | None = Field(
        0, ge=0, le=MAX_SEED, description="RNG seed (0 to 2**63 - 1); None: not seeded"
    )
    deterministic: bool = False
    grad_accum: int = Field(
        1, ge=1, description="micro-batches per optimizer step on each data-parallel rank"
    )
    global_batch: int | None = Field(
        None,
        ge=1,
        description="samples per optimizer step over all ranks; with micro_batch, grad_accum "
        "is derived once the world size is known (global_batch / (micro_batch x data ranks))",
    )
    micro_batch: int | None = Field(
        None, ge=1, description="samples per micro-step on one rank (with global_batch)"
    )
    grad_clip: float | None = Field(
        None, gt=0, description="clip the global gradient norm to this value"
    )
    checkpoint: CheckpointSettings = CheckpointSettings()
    logging: LoggingSettings = LoggingSettings()
    launch: LaunchSettings = LaunchSettings()
    watchdog: WatchdogSettings = WatchdogSettings()
    fsdp: FsdpSettings = FsdpSettings()
    mesh: MeshSettings = MeshSettings()
    ft: FtSettings = FtSettings()

    @field_validator("precision", mode="before")
    @classmethod
    def _alias_precision(cls, v: Any) -> Any:
        return PRECISION_ALIASES.get(str(v), v) if v is not None else v

    @field_validator("nprocs")
    @classmethod
    def _positive_nprocs(cls, v: Any) -> Any:
        if isinstance(v, int) and not 1 <= v <= MAX_NPROCS:
            raise ValueError(f"must be 1 to {MAX_NPROCS} (or auto)")
        return v

    @model_validator(mode="after")
    def _node_rank_below_nnodes(self) -> AiosConfigBase:
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"node_rank {self.node_rank} must be below nnodes {self.nnodes} (ranks are 0 to nnodes - 1)"
            )
        return self

    def section(self, name: str) -> Any:
        """A plugin section, or None when its plugin is not installed."""
        return getattr(self, name, None)

    def redacted_dict(self) -> dict[str, Any]:
        return redact(self.model_dump(mode="json"))


# Kept for type hints; the real class adds plugin sections (see build_model()).
AiosConfig = AiosConfigBase
