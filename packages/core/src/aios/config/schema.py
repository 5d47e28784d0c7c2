"""One validated config schema.

Precedence, lowest to highest:

1. defaults in the schema below;
2. the YAML file (``--config FILE`` or ``AIOS_CONFIG=FILE``);
3. ``AIOS_*`` environment variables (``AIOS_BACKEND=xla``, nested with a double underscore:
   ``AIOS_CHECKPOINT__DIR=gs://b/ckpt``, ``AIOS_XLA__SPMD=true``);
4. ``key=value`` overrides on the command line (``precision=bf16-mixed checkpoint.every=50``);
5. explicit flags (``--backend``, ``--nprocs``, ``--precision`` ...).

Plugins contribute sections through :func:`aios.plugins.hookspecs.aios_config_sections`. Any error is
one line naming the key, the bad value and the valid choices.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from aios.config.redact import SECRET_WORDS as SECRET_WORDS  # re-exported: the public names stay
from aios.config.redact import is_secret as is_secret
from aios.config.redact import redact as redact
from aios.config.redact import redact_argv as redact_argv
from aios.config.redact import redact_url as redact_url
from aios.errors import ConfigError
from aios.launcher.contract import CONTROL_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from aios.plugins.registry import Registry

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"]
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-true")
PRECISION_ALIASES = {
    "32": "fp32",
    "32-true": "fp32",
    "bf16": "bf16-mixed",
    "16-mixed": "fp16-mixed",
    "fp16": "fp16-mixed",
}

# Variables with the AIOS_ prefix that are not config keys.
CONTROL_ENV = {
    "AIOS_CONFIG",
    "AIOS_HOME",
    "AIOS_PLUGINS",
    "AIOS_DISABLE_PLUGINS",
    "AIOS_STRICT_PLUGINS",
    "AIOS_DEBUG",
    "AIOS_NO_COLOR",
    "AIOS_PLUGIN_TIMEOUT",
    # aios-cloud's limits for remote steps (aios_cloud.head)
    "AIOS_REACH_TIMEOUT",
    "AIOS_COMMAND_TIMEOUT",
    "AIOS_SETUP_TIMEOUT",
}
# AIOS_CI_*: the project's own CI runner (scripts/ci.py: AIOS_CI_LANES, AIOS_CI_HATCH), which the
# tests it runs inherit
CONTROL_PREFIXES = (CONTROL_PREFIX, "AIOS_INTERNAL_", "AIOS_TEST_", "AIOS_CI_")


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
        from aios.checkpoint.policy import parse_duration

        return parse_duration(v)

    @field_validator("max_overhead", mode="before")
    @classmethod
    def _fraction(cls, v: Any) -> Any:
        from aios.checkpoint.policy import parse_fraction

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

_MODEL_CACHE: dict[tuple, type[AiosConfigBase]] = {}


def _registry() -> Registry:
    """The process's plugin registry: the default where a caller gives none (the config layer
    sits above the registry; the registry never imports the config)."""
    from aios.plugins.registry import get_registry

    return get_registry()


def build_model(
    sections: dict[str, tuple[str, type]] | None = None, registry: Registry | None = None
) -> type[AiosConfigBase]:
    """The config class with the sections of ``registry``'s plugins (the process's registry
    when none is given) added, or exactly ``sections`` when given."""
    if sections is None:
        sections = (registry if registry is not None else _registry()).config_sections
    key = tuple(sorted((k, id(v[1])) for k, v in sections.items()))
    if key not in _MODEL_CACHE:
        fields: dict[str, Any] = {name: (model, model()) for name, (_, model) in sections.items()}
        _MODEL_CACHE[key] = create_model("AiosConfig", __base__=AiosConfigBase, **fields)
    return _MODEL_CACHE[key]


# ------------------------------------------------------------------------------ parsing


_EXP_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


class _Loader(yaml.SafeLoader):
    """YAML without the YAML 1.1 surprises: no dates/timestamps (``2024-06-01`` stays a string),
    no sexagesimal numbers (``10:20:30`` stays a string, not 37230), no leading-zero octal
    (``010`` is not 8); ``1e-3`` is a float."""


_Loader.yaml_implicit_resolvers = {
    k: [
        (tag, rx)
        for tag, rx in v
        if tag
        not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


#: budgets of every YAML text aios parses (config files, ``key=value`` values, ``AIOS_*``):
#: a config is a few hundred nodes; these stop alias bombs, deep nesting and recursive aliases
#: in milliseconds instead of minutes of CPU and gigabytes of memory
YAML_MAX_BYTES = 1 << 20
YAML_MAX_DEPTH = 32
YAML_MAX_NODES = 100_000
#: digits of an integer (int() of a huge literal is slow and Python refuses > 4300 digits)
YAML_MAX_INT_DIGITS = 30


class YamlBudgetError(ValueError):
    """YAML text beyond a parsing budget (size, nesting, alias expansion, integer length)."""


def _check_budget(text: str) -> None:
    """Walk the YAML event stream (iterative: no recursion) and then the composed node graph,
    counting every node an alias expands to: refuse before anything is built."""
    if len(text) > YAML_MAX_BYTES:
        raise YamlBudgetError(f"is {len(text)} bytes (at most {YAML_MAX_BYTES})")
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > YAML_MAX_DEPTH:
                raise YamlBudgetError(f"nests deeper than {YAML_MAX_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    root = yaml.compose(text, Loader=_Loader)
    stack: list[tuple[Any, int]] = [(root, 0)] if root is not None else []
    count = 0
    while stack:
        node, level = stack.pop()
        count += 1
        if count > YAML_MAX_NODES:
            raise YamlBudgetError(f"expands (through aliases) to more than {YAML_MAX_NODES} values")
        if level > YAML_MAX_DEPTH:
            raise YamlBudgetError(f"nests deeper than {YAML_MAX_DEPTH} levels (a recursive alias?)")
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:int":
                digits = sum(c.isdigit() for c in node.value)
                if digits > YAML_MAX_INT_DIGITS:
                    raise YamlBudgetError(
                        f"holds an integer of {digits} digits (at most {YAML_MAX_INT_DIGITS})"
                    )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, level + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend(((k, level + 1), (v, level + 1)))


def _yaml_load(text: str) -> Any:
    _check_budget(text)
    return yaml.load(text, Loader=_Loader)


def _parse_scalar(text: str) -> Any:
    """``key=value`` values are YAML scalars: ``true``, ``3``, ``1e-3``, ``null``, ``[a, b]``."""
    try:
        value = _yaml_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    except YamlBudgetError as exc:
        raise ConfigError(
            f"the value ({len(text)} characters) {exc}",
            "give a plain value (number, string, list)",
        ) from None
    if isinstance(value, str) and _EXP_FLOAT.match(value):
        return float(value)
    return value


def _set_path(d: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    cur = d
    for part in path[:-1]:
        nxt = cur.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"{origin}: '{'.'.join(path)}' goes inside '{part}', which is not a section"
            )
        cur = nxt
    cur[path[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override '{item}' is not key=value", "write it as e.g. precision=bf16-mixed"
            )
        key, _, value = item.partition("=")
        try:
            parsed = _parse_scalar(value)
        except ConfigError as exc:
            raise ConfigError(f"override '{key.strip()}': {exc.message}", exc.fix) from None
        _set_path(out, key.strip().split("."), parsed, f"override {item!r}")
    return out


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ) if environ is None else environ
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith("AIOS_") or name in CONTROL_ENV or name.startswith(CONTROL_PREFIXES):
            continue
        path = [p.lower() for p in name[len("AIOS_") :].split("__") if p]
        if path:
            try:
                parsed = _parse_scalar(value)
            except ConfigError as exc:
                raise ConfigError(f"env {name}: {exc.message}", exc.fix) from None
            _set_path(out, path, parsed, f"env {name}")
    return out


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(f"config file '{p}' {what}", "pass an existing YAML file to --config")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file '{p}' is not UTF-8 text (bad byte at offset {exc.start})",
            "save it as UTF-8",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file '{p}' cannot be read: {exc.strerror or exc}",
            "check its permissions, or pass another file to --config",
        ) from None
    try:
        data = _yaml_load(text) or {}
    except YamlBudgetError as exc:
        raise ConfigError(f"config file '{p}' {exc}", "write a plain config file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(
            f"config file '{p}' is not valid YAML{where}", "fix the YAML syntax"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{p}' must hold a mapping of keys, not {type(data).__name__}",
            "write key: value lines",
        )
    return data


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys of the section at ``loc``."""
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", {})
        if isinstance(part, int) or part not in fields:
            break
        cur = fields[part].annotation
    return list(getattr(cur, "model_fields", {}))


def _choices(model: type[BaseModel], loc: tuple) -> list[str]:
    from typing import get_args, get_origin

    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return sorted(getattr(cur, "model_fields", {}) or [])
        cur = fields[part].annotation
    out: list[str] = []

    def walk(t: Any) -> None:
        if get_origin(t) is Literal:
            out.extend(str(a) for a in get_args(t))
        for a in get_args(t):
            if get_origin(a) is Literal or get_args(a):
                walk(a)

    walk(cur)
    return out


def _format_error(
    err: ValidationError, model: type[BaseModel], merged: dict[str, Any], origins: dict[str, str]
) -> ConfigError:
    e = err.errors()[0]
    loc = _field_loc(model, tuple(e["loc"]))
    dotted = ".".join(str(p) for p in loc)
    value = e.get("input")
    if not loc:  # a model-level check (e.g. node_rank below nnodes): name the keys it involves
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        keys = [k for k in origins if k in msg.split()]
        src = "; ".join(f"{k} from {origins[k]}" for k in keys)
        return ConfigError(
            f"invalid config: {msg}" + (f" ({src})" if src else ""), "fix one of those values"
        )
    where = ""
    for i in range(len(loc), 0, -1):  # the most specific source that set this key (or its section)
        where = origins.get(".".join(str(p) for p in loc[:i]), "")
        if where:
            break
    where = f" (from {where})" if where else " (default)"
    if e["type"] == "extra_forbidden":
        known = ", ".join(_keys(model, loc[:-1]))
        hint = ""
        from aios.plugins import install_hints

        inst = (
            install_hints.hint("backend", str(loc[0])) or install_hints.hint("cloud", str(loc[0]))
            if len(loc) == 1
            else None
        )
        if inst:
            hint = f"; the '{loc[0]}' section needs its plugin: {inst}"
        return ConfigError(
            f"unknown config key '{dotted}'{where}", f"valid keys here: {known}{hint}"
        )
    choices = _choices(model, loc) if e["type"] in ("literal_error", "enum") else []
    shown = _show(value)
    if choices:
        return ConfigError(
            f"invalid value {shown} for '{dotted}'{where}", f"choose one of: {', '.join(choices)}"
        )
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    desc = _description(model, loc)
    fix = f"set '{dotted}' to a valid value" + (f" ({desc})" if desc else "")
    return ConfigError(f"invalid value {shown} for '{dotted}'{where}: {msg}", fix)


_TAG = re.compile(r"^(int|str|float|bool|none|list|dict|[a-z-]+\[.*\])$")


def _field_loc(model: type[BaseModel], loc: tuple) -> tuple:
    """``loc`` without pydantic's union-member tags (``int``, ``literal['auto']``): a part is
    kept when it is a field of the section at that point (``strategy``, ``int_key``), a list
    index, or a key that is not a tag."""
    out: list[Any] = []
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if fields is not None and isinstance(part, str):
            out.append(part)
            cur = _model_of(fields[part].annotation) if part in fields else None
            continue
        if isinstance(part, int) or not _TAG.match(str(part)):
            out.append(part)
    return tuple(out)


def _model_of(t: Any) -> Any:
    from typing import get_args

    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for a in get_args(t):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _description(model: type[BaseModel], loc: tuple) -> str:
    cur: Any = model
    info = None
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return ""
        info = fields[part]
        cur = _model_of(info.annotation)
    return (info.description or "") if info is not None else ""


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def resolve(
    config_file: str | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    sections: dict[str, tuple[str, type]] | None = None,
    check_backend: bool = True,
    registry: Registry | None = None,
) -> AiosConfigBase:
    """Build the validated config from every source in precedence order. Plugin sections,
    backend and strategy names are checked against ``registry`` (the process's registry when
    none is given)."""
    environ = dict(os.environ) if environ is None else environ
    model = build_model(sections, registry)
    origins: dict[str, str] = {}
    layers: list[tuple[str, dict[str, Any]]] = []
    config_file = config_file or environ.get("AIOS_CONFIG")
    if config_file:
        layers.append((f"config file {config_file}", load_yaml(config_file)))
    layers.append(("environment", env_overrides(environ)))
    layers.append(("override", parse_overrides(overrides or [])))
    layers.append(("flag", {k: v for k, v in (flags or {}).items() if v is not None}))
    merged: dict[str, Any] = {}
    for origin, layer in layers:
        for dotted in _flatten(layer):
            origins[dotted] = origin
        merged = deep_merge(merged, layer)
    try:
        cfg = model.model_validate(merged)
    except ValidationError as err:
        raise _format_error(err, model, merged, origins) from None
    if check_backend and cfg.backend != "auto":
        from aios.errors import AiosError
        from aios.plugins import install_hints

        reg = registry if registry is not None else _registry()
        if cfg.backend not in reg.backends and install_hints.hint("backend", cfg.backend) is None:
            where = origins.get("backend", "default")
            if (
                f"backend:{cfg.backend}" in reg.conflicted
                or f"backend:{cfg.backend}" in reg.rejected
            ):
                try:  # the registry names the plugins: claimed by two, or rejected
                    reg.backend(cfg.backend)
                except AiosError as exc:
                    exc.message = f"{exc.message} (backend from {where})"
                    raise
            known = ", ".join(["auto", *sorted(reg.backends)])
            note = reg._failed_note()
            raise ConfigError(
                f"invalid value {cfg.backend!r} for 'backend' (from {where}){note}",
                f"choose one of: {known}",
            )
    if check_backend and cfg.strategy != "auto":
        reg = registry if registry is not None else _registry()
        if cfg.strategy not in reg.strategies:
            known = ", ".join(["auto", *sorted(reg.strategies)])
            raise ConfigError(
                f"invalid value {cfg.strategy!r} for 'strategy' (from {origins.get('strategy', 'default')})",
                f"choose one of: {known}",
            )
    return cfg


def _flatten(d: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "."))
    return out


def to_json(cfg: AiosConfigBase) -> str:
    """Serialise for passing to worker processes (AIOS_RUN_CONFIG)."""
    return cfg.model_dump_json()


def from_json(text: str) -> AiosConfigBase:
    model = build_model()
    return model.model_validate_json(text)
