"""``aios check``: what ties a training script to one accelerator, found statically.

Reads the script's AST (never imports or runs it; no torch), resolves what each name refers to
through the script's imports (``import torch_xla.core.xla_model as xm``, ``from torch.cuda.amp
import GradScaler``; a parameter or local of the same name shadows an import), and reports each
line that breaks on some backend, or hangs or diverges under a sharded strategy, with the aios
form that replaces it. :func:`fix_source` applies the rewrites that are safe (LibCST, imported
only there, keeps the user's formatting).

Codes, by family: ``AIOS1xx`` NVIDIA-only calls and device strings, ``AIOS2xx`` process groups and
wrappers named for one device, ``AIOS3xx`` precision (CUDA AMP, fp16), ``AIOS4xx`` torch_xla /
torch-neuronx APIs and what XLA cannot run, ``AIOS5xx`` device-only packages, ``AIOS6xx`` patterns
that hang or diverge under ``strategy=fsdp|tp|hsdp`` or write one file from every rank.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

BACKENDS = ("cpu", "cuda", "xla", "tpu", "neuron")
NOT_CUDA = ("cpu", "xla", "tpu", "neuron")
NO_FP16 = ("xla", "tpu", "neuron")
NOT_XLA = (
    "cpu",
    "cuda",
    "tpu",
    "neuron",
)  # torch_xla APIs: only --backend xla (and Trn1's XLA runtime)
XLA_ONLY_BREAKS = ("xla", "neuron")  # what XLA devices cannot run (fused AdamW, device Generator)
SHARDED = ("fsdp", "tp", "hsdp")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based, in characters
    code: str
    message: str
    backends: tuple[str, ...]  # where the line breaks
    strategies: tuple[str, ...] = ()  # non-empty: breaks under these strategies, on any backend
    fix: str = ""  # a safe rewrite ``--fix`` applies ("" = none)
    # error: breaks there; warning: runs there but not as the script asked (precision, a
    # wasted option); note: nothing breaks (code a CUDA guard makes dead elsewhere, the aios form
    # of the script's own rank/mesh plumbing)
    level: str = "error"
    when: str = ""  # what happens, where ``strategies`` alone says too little

    def where(self) -> str:
        if self.level == "note":
            return "note"
        if self.when:
            return self.when
        if self.strategies:
            return "hangs or diverges under strategy=" + "|".join(self.strategies)
        verb = "breaks" if self.level == "error" else "silently differs"
        if set(self.backends) == set(BACKENDS):
            return f"{verb} on every backend"
        return f"{verb} on " + ", ".join(self.backends)

    def __str__(self) -> str:
        fix = " [--fix]" if self.fix else ""
        return (
            f"{self.path}:{self.line}:{self.col} {self.code} {self.message} ({self.where()}){fix}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "backends": list(self.backends),
            "strategies": list(self.strategies),
            "level": self.level,
            "fixable": bool(self.fix),
        }


class CheckError(Exception):
    """The input cannot be checked (unreadable, not Python): one line."""


# ------------------------------------------------------------------ what names mean

RT_DEVICE = "use rt.device (aios.init() picks each rank's device for the backend aios-run selects)"
CUDA_CALLS: dict[str, tuple[str, str, str]] = {
    # name -> (code, replacement, fix kind)
    "set_device": ("AIOS103", "remove it: aios-run gives each rank its device; use rt.device", ""),
    "current_device": ("AIOS103", RT_DEVICE, ""),
    "device": ("AIOS103", RT_DEVICE, ""),
    "synchronize": (
        "AIOS104",
        "torch.accelerator.synchronize() when torch.accelerator.is_available() (every native "
        "device); rt.step(opt) already cuts the XLA graph",
        "guard",
    ),
    "empty_cache": (
        "AIOS104",
        "torch.accelerator.empty_cache() when torch.accelerator.is_available()",
        "guard",
    ),
    "device_count": (
        "AIOS105",
        "rt.world_size for process counts (torch.accelerator.device_count() is 0 on CPU and "
        "under torch_xla, so it cannot divide a rank)",
        "rename",
    ),
    "is_available": ("AIOS106", "rt.device", ""),
    "manual_seed": (
        "AIOS107",
        "rt.seed_everything(seed) or config seed=N (every device's RNG)",
        "",
    ),
    "manual_seed_all": ("AIOS107", "rt.seed_everything(seed) or config seed=N", ""),
    "is_bf16_supported": (
        "AIOS106",
        "precision=bf16-mixed (aios refuses bf16 where the device has none, in one line)",
        "",
    ),
}
MEMORY_CALLS = {
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "memory_stats", "mem_get_info", "get_device_name",
    "get_device_properties", "get_device_capability",
}  # fmt: skip
# torch.cuda calls that do nothing (no error) without CUDA
NOOP_ELSEWHERE = {"empty_cache", "manual_seed", "manual_seed_all"}
# torch.cuda statistics that return 0 (or {}) without CUDA rather than raise
ZERO_ELSEWHERE = {
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats",
}  # fmt: skip
ACCEL_MEMORY = {
    n: f"torch.accelerator.{n}() when torch.accelerator.is_available()"
    for n in (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats", "memory_stats", "get_device_capability",
    )
}  # fmt: skip
ACCEL_MEMORY["mem_get_info"] = "torch.accelerator.get_memory_info() when available"

XLA_REPLACEMENTS: dict[str, tuple[str, str]] = {
    # last name -> (code, replacement)
    "xla_device": ("AIOS406", "rt.device"),
    "device": ("AIOS406", "rt.device"),
    "mark_step": ("AIOS404", "rt.step(opt) (reduces, steps and cuts the graph once per step)"),
    "sync": ("AIOS404", "rt.step(opt) (reduces, steps and cuts the graph once per step)"),
    "optimizer_step": ("AIOS404", "rt.step(opt)"),
    "reduce_gradients": ("AIOS404", "rt.step(opt)"),
    "spawn": (
        "AIOS403",
        "`aios-run --backend xla --nprocs N` (it starts the processes; call the function once)",
    ),
    "launch": (
        "AIOS403",
        "`aios-run --backend xla --nprocs N` (it starts the processes; call the function once)",
    ),
    "MpDeviceLoader": ("AIOS405", "rt.setup(loader) (shards by rank, background device transfer)"),
    "ParallelLoader": ("AIOS405", "rt.setup(loader) (shards by rank, background device transfer)"),
    "get_ordinal": ("AIOS407", "rt.rank"),
    "global_ordinal": ("AIOS407", "rt.rank"),
    "get_local_ordinal": ("AIOS407", "rt.local_rank"),
    "local_ordinal": ("AIOS407", "rt.local_rank"),
    "xrt_world_size": ("AIOS407", "rt.world_size"),
    "world_size": ("AIOS407", "rt.world_size"),
    "is_master_ordinal": ("AIOS407", "rt.is_main"),
    "master_print": ("AIOS408", "rt.print(...)"),
    "rendezvous": ("AIOS408", "rt.barrier()"),
    "all_reduce": ("AIOS408", "rt.all_reduce(x)"),
    "mesh_reduce": ("AIOS408", "rt.all_reduce(x)"),
    "all_gather": ("AIOS408", "rt.all_gather(t)"),
    "save": ("AIOS408", "rt.save() (every rank calls it; aios writes from the right ranks)"),
    "wait_device_ops": ("AIOS404", "rt.step(opt); nothing to wait for elsewhere"),
    "get_rng_state": ("AIOS407", "rt.rng_state() (checkpoints carry every rank's RNG)"),
    "set_rng_state": ("AIOS407", "rt.set_rng_state(state)"),
    "metrics_report": ("AIOS409", "the run record's diagnostics (compile counts per step)"),
}
# calls that start the XLA runtime: at module level they run before xmp.spawn's workers exist
XLA_RUNTIME_START = {
    "xla_device", "device", "get_ordinal", "global_ordinal", "get_local_ordinal", "local_ordinal",
    "xrt_world_size", "world_size", "is_master_ordinal", "devices", "xla_device_hw",
    "global_runtime_device_count", "addressable_device_count", "local_process_count",
}  # fmt: skip
DEVICE_PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "flash_attn": ("torch.nn.functional.scaled_dot_product_attention (every backend)", NOT_CUDA),
    "xformers": ("torch.nn.functional.scaled_dot_product_attention", NOT_CUDA),
    "bitsandbytes": ("torch.optim.AdamW (8-bit optimizers are CUDA kernels)", NOT_CUDA),
    "apex": (
        "torch.optim.AdamW and precision=bf16-mixed|fp16-mixed; rt.setup(model) for DDP",
        NOT_CUDA,
    ),
    "transformer_engine": ("precision=bf16-mixed (FP8 kernels are NVIDIA-only)", NOT_CUDA),
    "triton": ("torch.compile (generates kernels for each backend)", NOT_CUDA),
    "liger_kernel": ("plain torch ops (Triton kernels are GPU-only)", NOT_CUDA),
    "mamba_ssm": ("a plain-torch implementation (CUDA kernels)", NOT_CUDA),
    "cupy": ("torch tensor ops", NOT_CUDA),
    "pynvml": ("rt.summary() / the run record (device memory), aios devices", NOT_CUDA),
    "deepspeed": (
        "strategy=deepspeed (cuda, cpu) or strategy=fsdp (every native device)",
        ("xla", "tpu", "neuron"),
    ),
}
RANK_ATTRS = {
    "rank",
    "local_rank",
    "global_rank",
    "process_index",
    "local_process_index",
    "node_rank",
    "gpu_id",  # the DDP tutorial's rank-as-GPU (`if self.gpu_id == 0:`)
}
RANK_CALLS = {
    "get_rank", "get_ordinal", "global_ordinal", "get_local_ordinal", "local_ordinal",
    "get_global_rank", "get_node_local_rank",
}  # fmt: skip
MAIN_FLAGS = {
    "master_process", "is_master", "is_main", "is_main_process", "is_global_zero",
    "is_rank_zero", "is_master_process", "main_process", "is_local_main_process",
    "is_local_main", "is_master_ordinal", "is_rank0", "rank0", "is_first_rank",
}  # fmt: skip
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
    "all_to_all_single", "monitored_barrier",
}  # fmt: skip
RT_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "broadcast", "gather_object"}
RT_SAVES = {"save", "load", "resume"}
PG_DEVICE_BACKENDS = {"nccl", "xla", "tpu", "neuron", "hccl", "ucc"}
ENV_RANKS = {
    "RANK": "rt.rank", "WORLD_SIZE": "rt.world_size", "LOCAL_RANK": "rt.local_rank",
    "NODE_RANK": "rt.node_rank",
}  # fmt: skip
DEVICE_TOOLS = {"nvidia-smi", "nvcc", "nvidia-settings", "dcgmi", "nvtop", "rocm-smi"}
SHELL_CALLS = {
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput", "os.system",
    "os.popen",
}  # fmt: skip
FP16_NAMES = ("fp16", "float16", "16", "16-mixed", "half")
EXITS = {"sys.exit", "exit", "quit", "os._exit", "os.abort"}
OWN_PARALLELISM = {
    "init_device_mesh": "builds its own device mesh: aios builds one for the selected backend "
    "and strategy (rt.mesh; mesh.tp=N for tensor parallel), or keep this one and hand rt.setup "
    "the model it parallelizes",
    "fully_shard": "shards the model itself: keep it and pass the sharded model to "
    "rt.setup(model) (aios keeps a model the script already parallelized), or leave sharding "
    "to strategy=fsdp",
    "FullyShardedDataParallel": "wraps the model in FSDP1: pass the model to rt.setup(model) with "
    "strategy=fsdp (FSDP2 on every native device)",
    "parallelize_module": "applies its own tensor-parallel plan: keep it on rt.mesh['tp'] and pass "
    "the model to rt.setup(model), or give the plan as tp_plan with strategy=tp",
}
# What aios-run sets for every rank: a script that writes one of these overwrites it.
LAUNCHER_ENV = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",
}  # fmt: skip
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
# ``device: cuda`` / ``device = "cuda:0"`` / ``"accelerator": "gpu"`` in a config the script loads
CONFIG_DEVICE = re.compile(
    r"""^\s*["']?(device|device_type|accelerator)["']?\s*[:=]\s*["']?(cuda(:\d+)?|gpu)["']?\s*,?"""
    r"""\s*(#.*)?$"""
)


@dataclass(frozen=True)
class LibraryCall:
    """What a widely used training library's helper does when the script runs under aios-run:
    kept as data beside the rules, so a call into a library is judged by what it does."""

    code: str
    level: str
    backends: tuple[str, ...]
    message: str
    source: str  # where the behaviour is documented (or the code that does it)


_D2_LAUNCH = LibraryCall(
    "AIOS203",
    "error",
    BACKENDS,
    "detectron2's launch(main, num_gpus, ...) starts num_gpus processes per machine itself "
    "(torch.multiprocessing): under aios-run --nprocs N each rank would start more, and with "
    "num_gpus=1 it runs main in-process with its own world; call main(args) once (aios-run starts "
    "one process per rank: rt.rank, rt.world_size)",
    "https://detectron2.readthedocs.io/en/latest/modules/engine.html#detectron2.engine.launch",
)
_TUNE_MEMORY = LibraryCall(
    "AIOS108",
    "error",
    NOT_CUDA,
    "torchtune's get_memory_stats(device) reads torch.cuda memory counters and raises ValueError "
    "for a CPU device: the run record has each rank's device memory; call it only when "
    'rt.backend == "cuda"',
    "https://pytorch.org/torchtune/stable/generated/torchtune.training.get_memory_stats.html",
)
LIBRARY_CALLS: dict[str, LibraryCall] = {
    "detectron2.engine.launch": _D2_LAUNCH,
    "detectron2.engine.launch.launch": _D2_LAUNCH,
    "detectron2.engine.defaults.launch": _D2_LAUNCH,
    "accelerate.notebook_launcher": LibraryCall(
        "AIOS203",
        "error",
        BACKENDS,
        "accelerate's notebook_launcher(fn, num_processes=...) starts its own processes: under "
        "aios-run each rank would start more; call fn() once",
        "https://huggingface.co/docs/accelerate/package_reference/launchers",
    ),
    "torch.distributed.launcher.api.elastic_launch": LibraryCall(
        "AIOS203",
        "error",
        BACKENDS,
        "elastic_launch(config, fn) starts its own worker processes: under aios-run each rank "
        "would start more; call fn() once",
        "https://pytorch.org/docs/stable/elastic/customization.html",
    ),
    "detectron2.config.get_cfg": LibraryCall(
        "AIOS204",
        "error",
        NOT_CUDA,
        'detectron2\'s get_cfg() defaults MODEL.DEVICE to "cuda" and the script never sets it: '
        "elsewhere the model is built on CUDA and fails; set cfg.MODEL.DEVICE = str(rt.device)",
        "https://detectron2.readthedocs.io/en/latest/modules/config.html#yaml-config-references",
    ),
    "litgpt.utils.parse_devices": LibraryCall(
        "AIOS204",
        "error",
        NOT_CUDA,
        'litgpt\'s parse_devices("auto") is torch.cuda.device_count() or 1: elsewhere one device, '
        "whatever aios-run --nprocs N started, so Fabric's world disagrees with the launcher's; "
        "pass devices=rt.world_size // rt.num_nodes (or let aios-run size the run)",
        "https://github.com/Lightning-AI/litgpt/blob/main/litgpt/utils.py (parse_devices)",
    ),
    "torchtune.training.get_memory_stats": _TUNE_MEMORY,
    "torchtune.training.memory.get_memory_stats": _TUNE_MEMORY,
    "torchtune.utils.get_memory_stats": _TUNE_MEMORY,
}


VERB_NAMES = re.compile(
    r"^(get|load|save|write|read|build|create|make|init|wrap|unwrap|setup|prepare|print|log|"
    r"export|copy|sync|update|train|evaluate|eval|test|configure|compile)_"
)
MODEL_NAME = re.compile(r"^(.*_)?(model|net)$")
CUDA_STR = re.compile(r"^cuda(:\d+)?$")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _last(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _int(node: ast.AST | None) -> int | None:
    """An int literal (``-1`` too)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _is_cuda_string(node: ast.AST | None) -> bool:
    s = _str(node)
    if s is not None:
        return bool(CUDA_STR.match(s))
    if isinstance(node, ast.JoinedStr) and node.values:
        head = _str(node.values[0])
        return head is not None and (head == "cuda" or head.startswith("cuda:"))
    if isinstance(node, ast.IfExp):
        return _is_cuda_string(node.body) or _is_cuda_string(node.orelse)
    return False


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_ema(value: ast.AST) -> bool:
    """``EMAModel(...)``, also as ``EMAModel(...) if args.use_ema else None``."""
    if isinstance(value, ast.IfExp):
        return _is_ema(value.body) or _is_ema(value.orelse)
    return isinstance(value, ast.Call) and "EMA" in _last(value.func).upper()


def _guarded_by_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        if h.type is None:
            return True
        names = [_last(e) for e in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
        if {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names):
            return True
    return False


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Parameters and names assigned in ``fn`` (not in nested functions): they shadow imports."""
    a = fn.args
    names = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    names |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
    if isinstance(fn, ast.Lambda):
        return names
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _relative_base(node: ast.ImportFrom, package: str) -> str | None:
    """The absolute module ``from .x import y`` names inside ``package``: ``package.x``; ``""``
    for the script's own folder (``from .. import utils`` in ``gd``); None above it."""
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    if node.module:
        base.append(node.module)
    return ".".join(base)


def _imports(
    body: Iterable[ast.stmt], package: str | None = None
) -> Iterator[tuple[str, str, ast.stmt]]:
    """``(local name, qualified name, statement)`` for the imports directly in ``body`` and in
    its if/try blocks (not in nested functions). ``package``: the dotted package of a module of
    the script's own project, so ``from . import x`` names ``package.x``."""
    todo = list(body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    yield a.asname, a.name, node
                else:
                    top = a.name.split(".")[0]
                    yield top, top, node
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    yield a.asname or a.name, f"{node.module}.{a.name}", node
        elif isinstance(node, ast.ImportFrom) and node.level and package is not None:
            base = _relative_base(node, package)
            for a in node.names:
                if base is not None and a.name != "*":
                    yield a.asname or a.name, f"{base}.{a.name}" if base else a.name, node
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for sub in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, sub, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _launcher_test(test: ast.AST) -> int:
    """1: ``"RANK" in os.environ`` (true under a launcher: aios-run sets RANK, WORLD_SIZE,
    LOCAL_RANK for every rank); -1: ``"RANK" not in os.environ`` (true only without one); 0:
    neither. Code that runs only without a launcher never runs under aios-run.

        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # 1
        if "LOCAL_RANK" not in os.environ:                        # -1
    """
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -_launcher_test(test.operand)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        signs = {_launcher_test(v) for v in test.values}
        return 1 if 1 in signs and -1 not in signs else 0
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        name = _str(test.left)
        env = _dotted(test.comparators[0]) or ""
        if name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and env.endswith("environ"):
            if isinstance(test.ops[0], ast.In):
                return 1
            if isinstance(test.ops[0], ast.NotIn):
                return -1
    return 0


def _reads_launcher_env(node: ast.AST) -> bool:
    """``os.environ["RANK"]``, ``os.getenv("WORLD_SIZE")``, or a loop over names that include
    them (``for v in ("LOCAL_RANK", "SLURM_LOCALID"): ... os.environ[v]``)."""
    names = environ = False
    for sub in ast.walk(node):
        if _str(sub) in LAUNCHER_ENV:
            names = True
        d = _dotted(sub) if isinstance(sub, (ast.Attribute, ast.Name)) else None
        if d and (d.endswith("environ") or d.endswith("getenv")):
            environ = True
    return names and environ


# ------------------------------------------------------------------ the checker


@dataclass
class _Func:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    key: str = ""
    kinds: dict[str, int] = field(default_factory=dict)  # forward|collective|save -> first line
    calls: list[tuple[str, int]] = field(default_factory=list)  # callee key, line
    path: str = ""  # the file it is defined in
    rank_test: bool = False  # returns a rank test (``return args.rank == 0``)
    wraps_ddp: int = 0  # the line where it wraps a model in DistributedDataParallel
    env_launcher: bool = False  # reads RANK / WORLD_SIZE / LOCAL_RANK from the environment


@dataclass
class _Project:
    """What the modules of one script's project tell each other: their functions (by qualified
    name, ``util.misc.save_model``) and whether any reads the launcher's world from the
    environment."""

    funcs: dict[str, _Func] = field(default_factory=dict)
    env_world: bool = False  # some module reads WORLD_SIZE (or RANK) from the environment
    config_device: bool = False  # a loaded config sets the device (detectron2's MODEL.DEVICE too)


class _Checker:
    def __init__(
        self,
        path: str,
        source: str,
        tree: ast.Module,
        project: _Project | None = None,
        module: str = "",
        package: str | None = None,
    ) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.tree = tree
        self.project = project or _Project()
        self.module = module  # dotted name inside the project ("util.misc"); "" for the script
        self.package = package
        self.findings: dict[tuple[int, str], Finding] = {}
        self.scopes: list[dict[str, str | None]] = [
            {name: qual for name, qual, _ in _imports(tree.body, package)}
        ]
        self.no_launcher = 0  # inside a branch that runs only without a launcher's RANK
        self.choice_values: set[int] = set()  # nodes of a device choice named at its test
        self._env_sourced: set[str] | None = None  # names holding the launcher's own values
        self._calls: list[ast.Call] | None = None  # every call in the file, for caller_values
        self.packages_named: set[str] = set()  # device-only packages already named (AIOS501)
        self.models: set[str] = set()  # dotted names bound to modules (``model``, ``self.model``)
        self.rank_names: set[str] = set()  # names / ``self.x`` holding a rank
        self.rt_names: set[str] = set()  # names bound to aios.init()
        self.scalers: set[str] = set()  # names bound to a GradScaler
        self.local_modules: set[str] = set()  # nn.Module subclasses defined here
        self.funcs: dict[str, _Func] = {}  # "name" or "Class.name"
        self.guard_depth = 0
        self.func_stack: list[_Func] = []
        self.local_names: dict[int, set[str]] = {}  # id(function) -> its parameters and locals
        self.call_guards: dict[str, list[bool]] = {}  # function key -> guarded at each call site
        self.saves: list[tuple[ast.Call, bool, str | None]] = []  # torch.save, guarded, in function
        self.statement_calls: set[int] = set()  # calls that are a whole line's only statement
        self.class_stack: list[str] = []
        self.module_level = True
        self.cuda_guard = 0  # inside a branch that runs only with CUDA
        self.accel_guard = 0  # inside a branch that runs only with a torch.accelerator device
        self.fp16_guard = 0  # inside a branch that runs only when the user asked for fp16
        self.parents: dict[int, ast.AST] = {}
        self.device_choices: dict[int, str] = {}  # id(is_available call) -> what it chooses
        self.values: dict[str, list[ast.expr]] = {}  # simple name -> values assigned to it
        self.arg_defaults: dict[str, ast.expr] = {}  # argparse dest -> its default
        self.forward_methods: set[str] = set()  # methods of modules here that call self(...)
        self.process_counts: set[str] = set()  # names passed as nprocs=

    def locals_of(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
        names = self.local_names.get(id(fn))
        if names is None:
            names = self.local_names[id(fn)] = _local_names(fn)
        return names

    # ---- names
    def qual(self, node: ast.AST) -> str | None:
        d = _dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        for scope in reversed(self.scopes):
            if head in scope:
                q = scope[head]
                if q is None:
                    return None
                return f"{q}.{rest}" if rest else q
        return None

    def call_qual(self, call: ast.Call) -> str:
        return self.qual(call.func) or ""

    def col(self, node: ast.AST) -> int:
        lineno, offset = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
        line = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""
        return len(line.encode()[:offset].decode(errors="replace")) + 1

    def add(
        self,
        node: ast.AST,
        code: str,
        message: str,
        backends: tuple[str, ...] = BACKENDS,
        strategies: tuple[str, ...] = (),
        fix: str = "",
        level: str = "error",
        when: str = "",
        guardable: bool = True,
    ) -> None:
        if (
            guardable
            and self.cuda_guard
            and level != "note"
            and not strategies
            and backends
            and "cuda" not in backends
        ):
            # the script's own guard: nothing breaks elsewhere, the line just never runs there
            message = (
                f"{message}; the script runs this only with CUDA, so elsewhere it is dead code "
                "(nothing breaks)"
            )
            level, backends, fix = "note", (), ""
        if self.no_launcher:
            return  # never runs under aios-run (it sets RANK for every rank)
        if level == "note":
            backends = ()
        key = (getattr(node, "lineno", 0), code)
        if key not in self.findings:
            self.findings[key] = Finding(
                self.path,
                key[0],
                self.col(node),
                code,
                message,
                backends,
                strategies,
                fix,
                level,
                when,
            )

    # ---- pre-pass: models, ranks, aios runtimes, functions
    def rankish(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (
                "rank" in sub.id.lower() or sub.id in self.rank_names or sub.id == "gpu_id"
            ):
                return True
            if isinstance(sub, ast.Attribute) and (
                sub.attr in RANK_ATTRS or _dotted(sub) in self.rank_names
            ):
                return True
            if isinstance(sub, ast.Call) and _last(sub.func) in RANK_CALLS:
                return True
            s = _str(sub)
            if s in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
                return True
        return False

    def is_model_expr(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            q = self.call_qual(node)
            last = _last(node.func)
            if last in self.local_modules:
                return True
            if last in ("from_pretrained", "from_config"):
                # AutoTokenizer.from_pretrained(...) is no module: its save_pretrained on rank 0
                # is no checkpoint (nor are processors', configs' and schedulers')
                owner = _last(node.func.value) if isinstance(node.func, ast.Attribute) else ""
                return not re.search(
                    r"Tokenizer|Processor|Config|FeatureExtractor|Scheduler", owner
                )
            if q.startswith("torch.nn.") and q.rsplit(".", 1)[-1][:1].isupper():
                return not q.startswith(("torch.nn.functional", "torch.nn.utils"))
            if q.endswith(("DistributedDataParallel", "FullyShardedDataParallel", ".fully_shard")):
                return True
            if last.endswith("Pipeline") and any(
                self.is_model_expr(k.value) for k in node.keywords
            ):
                return True  # DDPMPipeline(unet=unet): runs the model when called
            if q in ("torch.compile",) or last in (
                "setup_module", "unwrap", "unwrap_model", "to", "cuda",
            ):  # fmt: skip
                return any(self.is_model_expr(a) for a in node.args[:1]) or (
                    last in ("to", "cuda") and self.is_model_expr(node.func)
                )
            return False
        if isinstance(node, ast.Attribute) and node.attr in ("to", "cuda", "module", "_orig_mod"):
            return self.is_model_expr(node.value)
        if isinstance(node, ast.IfExp):
            # raw = model.module if ddp else model; target = ema.module if ema else model
            return self.is_model_expr(node.body) or self.is_model_expr(node.orelse)
        d = _dotted(node)
        if d is not None and d in self.values and any(_is_ema(v) for v in self.values[d]):
            return False  # ema_model = EMAModel(...): a full copy every rank holds, no module
        return d is not None and (d in self.models or bool(MODEL_NAME.match(d.split(".")[-1])))

    def cuda_available_calls(self, test: ast.AST) -> list[ast.Call]:
        return [
            sub
            for sub in ast.walk(test)
            if isinstance(sub, ast.Call)
            and self.call_qual(sub) in ("torch.cuda.is_available", "torch.cuda.is_bf16_supported")
        ]

    def note_device_choice(self, node: ast.IfExp | ast.If) -> None:
        """``torch.cuda.is_available()`` that chooses a value (a device, a dtype): what it picks
        without CUDA. One that only guards CUDA-only lines is no finding (they are notes)."""
        calls = self.cuda_available_calls(node.test)
        if not calls:
            return
        what = ""
        if isinstance(node, ast.IfExp):
            picked, other = _str(node.orelse), _str(node.body)
            if picked is not None and other is not None:
                what = f"chooses {other!r} only with CUDA: on cpu, xla, tpu, neuron the script gets {picked!r}"
                if picked in ("float16", "fp16", "16-mixed"):
                    what += " (TPUs and Trainium have no fp16 training; use precision=bf16-mixed)"
                else:
                    what += "; use rt.device (aios.init() picks each rank's device for the backend)"
            elif _is_cuda_string(node.body) or _is_cuda_string(node.orelse):
                what = "chooses the CUDA device only with CUDA: on a TPU or Trainium it is False "
                what += "and the script trains on the CPU; use rt.device"
        elif self.returns_cuda_else_cpu(node):
            what = "returns the CUDA device only with CUDA and the CPU otherwise: on a TPU or "
            what += "Trainium the script trains on the host CPU; use rt.device"
        else:
            for stmt in node.body:
                v = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
                if v is not None and (
                    _is_cuda_string(v)
                    or isinstance(v, ast.Call)
                    and any(_is_cuda_string(a) for a in v.args)
                ):
                    what = "chooses the CUDA device only with CUDA: on a TPU or Trainium it is "
                    what += "False and the script trains on the CPU; use rt.device"
                    break
        if what:
            self.device_choices.setdefault(id(calls[0]), what)

    def returns_cuda_else_cpu(self, node: ast.If) -> bool:
        """A device helper: ``if torch.cuda.is_available(): return torch.device("cuda")`` then
        ``return torch.device("cpu")`` (in its else or right after it)."""

        def returns(stmts: list[ast.stmt], pick: Callable[[ast.AST], bool]) -> bool:
            for st in stmts:
                if isinstance(st, ast.Return) and st.value is not None:
                    v = st.value
                    if pick(v) or (isinstance(v, ast.Call) and v.args and pick(v.args[0])):
                        return True
            return False

        if not returns(node.body, _is_cuda_string):
            return False
        for st in node.body:  # the choice is named once, at its test: not again as a note
            if isinstance(st, ast.Return) and st.value is not None:
                self.choice_values.update(id(sub) for sub in ast.walk(st.value))
        fallback = list(node.orelse)
        parent = self.parents.get(id(node))
        body = getattr(parent, "body", None)
        if isinstance(body, list) and node in body:
            fallback += body[body.index(node) + 1 : body.index(node) + 2]
        return returns(fallback, lambda v: _str(v) == "cpu")

    def cuda_test(self, test: ast.AST) -> int:
        """1: true only with CUDA; -1: false only with CUDA... (its else runs only with CUDA);
        0: neither."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return -self.cuda_test(test.operand)
        if isinstance(test, ast.BoolOp):
            signs = [self.cuda_test(v) for v in test.values]
            if isinstance(test.op, ast.And):
                return 1 if 1 in signs else 0
            return -1 if -1 in signs else 0
        if isinstance(test, ast.Call):
            if (
                isinstance(test.func, ast.Attribute)
                and test.func.attr == "startswith"
                and test.args
                and _str(test.args[0]) == "cuda"
            ):
                return 1  # args.device.startswith("cuda")
            return int(
                self.call_qual(test) in ("torch.cuda.is_available", "torch.cuda.device_count")
            )
        if isinstance(test, (ast.Name, ast.Attribute)):
            return int(_last(test) in ("use_cuda", "is_cuda", "cuda"))
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            sides = (test.left, test.comparators[0])
            if not any(_str(x) == "cuda" for x in sides):
                return 0
            op = test.ops[0]
            if isinstance(op, (ast.Eq, ast.In, ast.Is)):
                return 1
            if isinstance(op, (ast.NotEq, ast.NotIn, ast.IsNot)):
                return -1
        return 0

    def fp16_choice(self, test: ast.AST) -> bool:
        """``if args.mixed_precision == "fp16":``: the user's own choice of fp16 (not when the
        option defaults to fp16: then the script picks it unasked)."""

        def by_default(sub: ast.Compare) -> bool:
            return any(
                isinstance(x, ast.Attribute) and _str(self.arg_defaults.get(x.attr)) in FP16_NAMES
                for x in (sub.left, *sub.comparators)
            )

        if isinstance(test, (ast.Name, ast.Attribute)):
            # if args.use_fp16: / if self.use_fp16: (an option the user turns on)
            name = _last(test)
            default = self.arg_defaults.get(name)
            if ("fp16" in name or "half" in name) and not (
                isinstance(default, ast.Constant) and default.value is True
            ):
                return True
        return any(
            isinstance(sub, ast.Compare)
            and isinstance(sub.ops[0], (ast.Eq, ast.In))
            and any(_str(x) in FP16_NAMES for x in (sub.left, *sub.comparators))
            and not by_default(sub)
            for sub in ast.walk(test)
        )

    def accel_test(self, test: ast.AST) -> bool:
        for sub in ast.walk(test):
            if isinstance(sub, (ast.Name, ast.Attribute)) and "accel" in _last(sub).lower():
                if self.qual(sub) != "torch.accelerator":
                    return True
            if (
                isinstance(sub, ast.Call)
                and self.call_qual(sub) == "torch.accelerator.is_available"
            ):
                return True
        return False

    def caller_values(self, f: _Func, param: str) -> list[tuple[ast.Call, ast.expr]]:
        """What the callers in this file pass for ``f``'s parameter ``param`` (the argument, and
        what a name given there was assigned: ``n = torch.cuda.device_count(); f(n)``)."""
        a = f.node.args
        params = [p.arg for p in [*a.posonlyargs, *a.args]]
        if param not in params and param not in {p.arg for p in a.kwonlyargs}:
            return []
        if self._calls is None:
            self._calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        out: list[tuple[ast.Call, ast.expr]] = []
        for call in self._calls:
            if self.funcs.get(_dotted(call.func) or "") is not f:
                continue
            offset = 1 if f.cls and params and params[0] in ("self", "cls") else 0
            i = params.index(param) - offset if param in params else -1
            given = [k.value for k in call.keywords if k.arg == param]
            if 0 <= i < len(call.args):
                given.append(call.args[i])
            for v in given:
                out.append((call, v))
                if isinstance(v, ast.Name):
                    out.extend((call, w) for w in self.values.get(v.id, []))
        return out

    def check_gpu_gate(self, node: ast.If, cuda: int) -> None:
        """``if not <enough GPUs>: sys.exit()``: the script ends before training elsewhere."""
        test = node.test
        names = {
            self.qual(sub) or _dotted(sub) or ""
            for sub in ast.walk(test)
            if isinstance(sub, (ast.Name, ast.Attribute))
        }
        accel = {"torch.accelerator.device_count", "torch.accelerator.is_available"} & names
        gpu = cuda != 0 or any(
            "gpu" in n.lower().split(".")[-1] or n.startswith("torch.cuda.") for n in names
        )
        via: list[ast.Call] = []  # calls that hand the gate a CUDA count
        if not gpu and self.func_stack:
            # def check_sizes(batch, world_size): if world_size < 1: raise ...; called with
            # world_size = torch.cuda.device_count(): the caller's value makes it a GPU gate
            via = [
                call
                for n in names
                for call, value in self.caller_values(self.func_stack[-1], n)
                if any(
                    isinstance(sub, ast.Call) and self.call_qual(sub).startswith("torch.cuda.")
                    for sub in ast.walk(value)
                )
            ]
            gpu = bool(via)
        if not (gpu or accel):
            return
        negative = (
            cuda == -1
            or isinstance(test, ast.UnaryOp)
            and isinstance(test.op, ast.Not)
            or isinstance(test, ast.Compare)
            and isinstance(test.ops[0], (ast.Lt, ast.LtE, ast.Eq))
        )
        branch = node.body if negative else node.orelse
        for stmt in branch:
            if isinstance(stmt, ast.Raise) or (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and (self.call_qual(stmt.value) or _dotted(stmt.value.func)) in EXITS
            ):
                sites: list[ast.AST] = list(via) or [node]  # via a parameter: at the call
                for at in sites:
                    how = f" ({os.path.basename(self.path)}:{node.lineno})" if via else ""
                    self.add(
                        at,
                        "AIOS118",
                        f"exits when it finds no GPU (or too few){how}: elsewhere the script ends "
                        "before training; drop the gate (aios-run --nprocs N gives each rank a "
                        "device of the selected backend) or test rt.world_size",
                        NOT_CUDA if gpu else ("cpu", "xla"),
                        guardable=False,
                    )
                return

    def prepass(self) -> None:
        assigns: list[ast.Assign | ast.AnnAssign] = []
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        self.values.setdefault(t.id, []).append(node.value)
            if isinstance(node, (ast.IfExp, ast.If)):
                self.note_device_choice(node)
            if isinstance(node, ast.ClassDef) and any(
                _last(b) in ("Module", "LightningModule") for b in node.bases
            ):
                self.local_modules.add(node.name)
                for fn in node.body:  # def sample(self, idx): ... self(idx) ...: a forward
                    if isinstance(fn, ast.FunctionDef) and fn.name != "forward":
                        if any(
                            isinstance(c, ast.Call) and _dotted(c.func) in ("self", "self.forward")
                            for c in ast.walk(fn)
                        ):
                            self.forward_methods.add(fn.name)
            if isinstance(node, ast.Call):
                for k in node.keywords:
                    if k.arg == "nprocs" and isinstance(k.value, ast.Name):
                        self.process_counts.add(k.value.id)
                if _last(node.func) == "add_argument":
                    default = next((k.value for k in node.keywords if k.arg == "default"), None)
                    dest = next((_str(k.value) for k in node.keywords if k.arg == "dest"), None)
                    longs = [_str(a) or "" for a in node.args if (_str(a) or "").startswith("--")]
                    dest = dest or (longs[0][2:].replace("-", "_") if longs else None)
                    if dest and default is not None:
                        self.arg_defaults[dest] = default
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                assigns.append(node)
        for _ in range(2):  # twice: an assignment may use a name bound further down
            for node in assigns:
                if node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                for t in targets:
                    d = _dotted(t)
                    if d is not None:
                        if self.is_model_expr(value):
                            self.models.add(d)
                        if self.rankish(value) and not isinstance(
                            value, ast.Call | ast.Dict | ast.JoinedStr
                        ):
                            self.rank_names.add(d)
                        elif isinstance(value, ast.Call) and (
                            _last(value.func) in RANK_CALLS
                            or (_last(value.func) == "int" and self.rankish(value))
                        ):
                            self.rank_names.add(d)
                        if isinstance(value, ast.Call):
                            q = self.call_qual(value)
                            if q == "aios.init":
                                self.rt_names.add(d)
                            if q.endswith("GradScaler"):
                                self.scalers.add(d)
                    elif isinstance(t, ast.Tuple) and isinstance(value, ast.Call):
                        # model, opt, loader = rt.setup(model, opt, loader)
                        if _last(value.func) == "setup":
                            for tgt, arg in zip(t.elts, value.args, strict=False):
                                td = _dotted(tgt)
                                if td and self.is_model_expr(arg):
                                    self.models.add(td)

    # ---- visiting
    def run(self) -> list[Finding]:
        self.prepass()
        self.summarise()
        self.visit_body(self.tree.body)
        self.check_every_rank_saves()
        # on a line, what breaks before notes: aios-run's hint names a traceback line's first finding
        return sorted(
            self.findings.values(), key=lambda f: (f.line, f.level == "note", f.col, f.code)
        )

    def visit_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.visit(stmt)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if not isinstance(d, ast.Call) and self.qual(d) == "torch.compile":
                    self.check_compile(d, {})
                self.visit(d)
            key = f"{self.class_stack[-1]}.{node.name}" if self.class_stack else node.name
            outer_level, outer_guard = self.module_level, self.guard_depth
            self.module_level = False
            self.guard_depth = 0
            scope: dict[str, str | None] = dict.fromkeys(self.locals_of(node))
            scope.update({n: q for n, q, _ in _imports(node.body, self.package)})
            self.scopes.append(scope)
            self.func_stack.append(self.funcs.get(key) or _Func(node, None, key))
            self.visit_body(node.body)
            self.func_stack.pop()
            self.scopes.pop()
            self.module_level, self.guard_depth = outer_level, outer_guard
            return
        if isinstance(node, ast.Lambda):
            self.scopes.append(dict.fromkeys(_local_names(node)))
            self.visit(node.body)
            self.scopes.pop()
            return
        if isinstance(node, ast.ClassDef):
            for b in [*node.bases, *node.decorator_list]:
                self.visit(b)
            self.class_stack.append(node.name)
            outer = self.module_level
            self.module_level = False
            self.visit_body(node.body)
            self.module_level = outer
            self.class_stack.pop()
            return
        if isinstance(node, ast.If):
            self.visit(node.test)
            launcher = _launcher_test(node.test)
            if launcher:
                self.no_launcher += launcher == -1
                self.visit_body(node.body)
                self.no_launcher += (launcher == 1) - (launcher == -1)
                self.visit_body(node.orelse)
                self.no_launcher -= launcher == 1
                return
            guard = self.is_rank_guard(node.test)
            cuda = self.cuda_test(node.test)
            accel = self.accel_test(node.test)
            self.check_gpu_gate(node, cuda)
            fp16 = self.fp16_choice(node.test)
            self.fp16_guard += fp16
            self.guard_depth += guard
            self.cuda_guard += cuda == 1
            self.accel_guard += accel
            self.visit_body(node.body)
            self.guard_depth -= guard
            self.cuda_guard += (cuda == -1) - (cuda == 1)
            self.visit_body(node.orelse)
            self.cuda_guard -= cuda == -1
            self.accel_guard -= accel
            self.fp16_guard -= fp16
            return
        if isinstance(node, ast.Assert) and (
            self.cuda_test(node.test) == 1
            or any(
                isinstance(sub, ast.Call)
                and self.call_qual(sub) in ("torch.cuda.device_count", "torch.cuda.is_available")
                for sub in ast.walk(node.test)
            )
        ):
            self.add(
                node,
                "AIOS118",
                "asserts a GPU: elsewhere the script stops before training; drop it (aios-run "
                "gives each rank a device of the selected backend: rt.device)",
                NOT_CUDA,
                guardable=False,
            )
        if isinstance(node, ast.IfExp):
            self.visit(node.test)
            cuda = self.cuda_test(node.test)
            accel = self.accel_test(node.test)
            self.accel_guard += accel
            self.cuda_guard += cuda == 1
            self.visit(node.body)
            self.cuda_guard += (cuda == -1) - (cuda == 1)
            self.visit(node.orelse)
            self.cuda_guard -= cuda == -1
            self.accel_guard -= accel
            return
        if isinstance(node, ast.Dict) and not self.accel_guard:
            for k, v in zip(node.keys, node.values, strict=True):
                if _str(k) == "pin_memory" and isinstance(v, ast.Constant) and v.value is True:
                    self.add(
                        v,
                        "AIOS112",
                        "'pin_memory': True for a DataLoader pins host memory for copies to an "
                        "accelerator: on CPU and under torch_xla torch warns and pins nothing "
                        "(nothing breaks); pin only when rt.backend == 'cuda'",
                        level="note",
                    )
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Store):
            self.check_env_read(node, self.qual(node.value) == "os.environ", node.slice)
        if isinstance(node, ast.Assign):
            self.check_env_write(node)
        if isinstance(node, ast.Try):
            guarded = _guarded_by_import_error(node.handlers)
            for stmt in node.body:
                if guarded and isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    continue
                self.visit(stmt)
            for h in node.handlers:
                self.visit_body(h.body)
            self.visit_body(node.orelse)
            self.visit_body(node.finalbody)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.check_import(node)
            return
        if isinstance(node, ast.Compare):
            # ``"cuda" in device``, ``x.dtype == torch.float16``: a test, not a tie
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    self.visit(sub)
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            line = self.lines[node.lineno - 1] if node.lineno <= len(self.lines) else ""
            if not line.encode()[: node.col_offset].strip() and ";" not in line:
                self.statement_calls.add(id(node.value))
        if isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            self.check_assign(node)
        elif isinstance(node, ast.Constant) and node.value in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
            self.add(
                node,
                "AIOS412",
                f"{node.value} was removed from torch_xla/torch-neuronx: use precision=bf16-true "
                "(aios-run --precision bf16-true)",
                BACKENDS,
            )
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Attribute) and child is node.value and _dotted(node):
                continue  # a.b.c is one name: checked once, as a whole
            self.visit(child)

    # ---- rules
    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        mods = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if not node.level
            else []
        )
        for mod in mods:
            top = mod.split(".")[0]
            if top == "torch_xla":
                self.add(
                    node,
                    "AIOS401",
                    f"imports {mod}: torch_xla runs only on --backend xla; the aios runtime "
                    "(rt.device, rt.setup, rt.step) covers it, `aios-run --backend xla` needs no "
                    "torch_xla in the script",
                    NOT_XLA,
                )
            elif top in ("torch_neuronx", "neuronx_distributed", "libneuronxla"):
                self.add(
                    node,
                    "AIOS401",
                    f"imports {mod}: Neuron's XLA stack only (Trn1); `aios-run --backend neuron` "
                    "runs the script as written (tensor parallel: strategy=tp or mesh.tp=N)",
                    ("cpu", "cuda", "xla", "tpu"),
                )
            elif "triton" in top and top != "triton":
                self.add(
                    node,
                    "AIOS501",
                    f"imports {top}, Triton GPU kernels (by its name): Triton builds for NVIDIA and "
                    "AMD GPUs only; keep a plain-torch path (torch.compile generates kernels for "
                    "each backend)",
                    NOT_CUDA,
                )
            elif top in DEVICE_PACKAGES and top not in self.packages_named:
                # one finding per cause: the package, at its first import in the file
                self.packages_named.add(top)
                repl, backends = DEVICE_PACKAGES[top]
                self.add(
                    node,
                    "AIOS501",
                    f"imports {top}, a device-only package: use {repl}; or import it in a "
                    "try/except ImportError with a portable fallback",
                    backends,
                )

    def check_attribute(self, node: ast.Attribute) -> None:
        q = self.qual(node)
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Dict) and any(
            v is node and _str(k) is not None
            for k, v in zip(parent.keys, parent.values, strict=True)
        ):
            return  # {"float16": torch.float16, ...}: a table of names; the choice is elsewhere
        if q in ("torch.float16", "torch.half") and not self.fp16_guard:
            self.add(
                node,
                "AIOS303",
                f"{_dotted(node)}: TPUs and Trainium have no fp16 training; use precision=bf16-mixed "
                "(aios-run --precision bf16-mixed) and rt.autocast()",
                NO_FP16,
            )

    def check_assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        value = node.value
        if _is_cuda_string(value) and not (
            isinstance(value, ast.IfExp) and self.cuda_test(value.test)
        ):  # ``"cuda" if <CUDA test> else "cpu"``: a choice, named at its test (AIOS106)
            self.add(value, "AIOS101", f"device string 'cuda...': {RT_DEVICE}", NOT_CUDA)  # type: ignore[arg-type]
        if _str(value) in PG_DEVICE_BACKENDS:
            self.add(
                value,  # type: ignore[arg-type]
                "AIOS201",
                f"process-group backend '{_str(value)}' names one device: aios.init() joins the "
                "process group with the backend's own (gloo, nccl, xla, tpu, neuron); or call "
                "init_process_group() without a backend",
                self.pg_breaks(_str(value) or ""),
            )

    @staticmethod
    def pg_breaks(name: str) -> tuple[str, ...]:
        return {"nccl": NOT_CUDA, "xla": NOT_XLA, "tpu": ("cpu", "cuda", "xla", "neuron")}.get(
            name, ("cpu", "cuda", "xla", "tpu")
        )

    def check_call(self, node: ast.Call) -> None:
        q = self.call_qual(node)
        last = _last(node.func)
        dotted = _dotted(node.func) or ""
        # torch.cuda.*
        if q.startswith("torch.cuda."):
            name = q.split(".")[-1]
            if q.startswith(("torch.cuda.amp.", "torch.cuda.amp")):
                pass  # AMP below
            elif name in ("is_available", "is_bf16_supported"):
                # a test that only guards CUDA-only lines is fine; one that picks a device or a
                # dtype is not (the lines it guards are notes)
                what = self.device_choices.get(id(node))
                if what:
                    self.add(node, "AIOS106", f"{q}() {what}", NOT_CUDA, guardable=False)
                elif name == "is_bf16_supported":
                    self.add(node, "AIOS106", f"{q}(): {CUDA_CALLS[name][1]}", NOT_CUDA)
            elif name in CUDA_CALLS:
                code, repl, fix = CUDA_CALLS[name]
                # written as torch.cuda.x (the rename is safe only where the count is printed:
                # torch.accelerator.device_count() is 0 on CPU and XLA); a guard needs a line
                # of its own
                ok = dotted == q and (
                    fix == ""
                    or fix == "guard"
                    and id(node) in self.statement_calls
                    or fix == "rename"
                    and self.only_shown(node)
                )
                if name in NOOP_ELSEWHERE:
                    # runs everywhere, doing nothing without CUDA: nothing breaks
                    self.add(
                        node,
                        code,
                        f"{q}() does nothing without CUDA: {repl}",
                        fix=fix if ok else "",
                        level="note",
                    )
                else:
                    self.add(node, code, f"{q}(): {repl}", NOT_CUDA, fix=fix if ok else "")
            elif name in MEMORY_CALLS:
                zero = name in ZERO_ELSEWHERE
                self.add(
                    node,
                    "AIOS108",
                    f"{q}(){' is 0 without CUDA' if zero else ''}: the run record has each "
                    "rank's device memory (aios devices names the device); elsewhere "
                    f"{ACCEL_MEMORY.get(name, 'aios devices --json')}",
                    NOT_CUDA,
                    level="warning" if zero else "error",
                )
            else:
                self.add(
                    node,
                    "AIOS109",
                    f"{q}(): NVIDIA-only; torch.accelerator / torch.Stream / torch.Event are "
                    'device-generic, or guard it with `if rt.backend == "cuda"`',
                    NOT_CUDA,
                )
        # .cuda()
        if last == "cuda" and isinstance(node.func, ast.Attribute) and not q.startswith("torch"):
            self.add(
                node,
                "AIOS102",
                ".cuda(): use .to(rt.device) (aios.init() picks each rank's device for the "
                "backend aios-run selects)",
                NOT_CUDA,
            )
        # process groups
        if last == "init_process_group" and (q.startswith("torch.distributed") or not q):
            arg = node.args[0] if node.args else None
            kw = next((k for k in node.keywords if k.arg == "backend"), None)
            chosen = arg if arg is not None else kw.value if kw else None
            if isinstance(chosen, ast.IfExp) and self.cuda_test(chosen.test) == 0:
                # "gloo" if args.device == "cpu" else "nccl": nccl on xla, tpu and neuron too
                chosen = next(
                    (b for b in (chosen.body, chosen.orelse) if _str(b) in PG_DEVICE_BACKENDS),
                    chosen,
                )
            val = _str(chosen)
            if (
                val is not None
                and val.split(":")[-1] in PG_DEVICE_BACKENDS
                or (val and "nccl" in val)
            ):
                self.add(
                    node,
                    "AIOS201",
                    f'init_process_group("{val}") names one device\'s backend: aios.init() joins '
                    "the process group with the selected backend's own (gloo, nccl, xla, tpu, "
                    "neuron); or call init_process_group() without a backend",
                    self.pg_breaks(val.split(":")[-1] if "nccl" not in val else "nccl"),
                    fix="drop-backend",
                )
        if (q.endswith(("DistributedDataParallel", "parallel.DDP")) or last == "DDP") and (
            self.cuda_guard
        ):
            self.add(
                node,
                "AIOS208",
                f"{last}(...) only where the script found CUDA: on other devices it never wraps "
                "the model, so each rank trains its own copy, unsynchronized, without a word; "
                "rt.setup(model) wraps on every backend",
                NOT_CUDA,
                guardable=False,
            )
        if q.endswith(("DistributedDataParallel", "parallel.DDP")) or last == "DDP":
            ids = [k.value for k in node.keywords if k.arg in ("device_ids", "output_device")]
            if ids:
                # device_ids=[device] if device.type == "cuda" else None: only CUDA gets ids
                only_cuda = all(
                    isinstance(v, ast.IfExp)
                    and (
                        self.cuda_test(v.test) == 1
                        and _is_none(v.orelse)
                        or self.cuda_test(v.test) == -1
                        and _is_none(v.body)
                    )
                    for v in ids
                )
                self.cuda_guard += only_cuda
                self.add(
                    node,
                    "AIOS202",
                    f"{last}(..., device_ids=...): device ids are CUDA's; rt.setup(model) wraps "
                    "for the selected backend and strategy (strategy=ddp|fsdp|tp)",
                    NOT_CUDA,
                )
                self.cuda_guard -= only_cuda
        self.check_device_ids(node, q, last)
        self.check_library_call(node, q)
        helper = self.callee(node)
        if helper is not None and helper.wraps_ddp and self.cuda_guard:
            self.add(
                node,
                "AIOS208",
                f"{_dotted(node.func)}() wraps the model in DDP ({os.path.basename(helper.path)}:"
                f"{helper.wraps_ddp}) only where the script found CUDA: on other devices each rank "
                "trains its own copy, unsynchronized, without a word; rt.setup(model) wraps on "
                "every backend",
                NOT_CUDA,
                guardable=False,
            )
        # AMP and precision
        if q in ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast"):
            dev = node.args[0] if node.args else None
            kw = next((k for k in node.keywords if k.arg == "device_type"), None)
            dev = kw.value if kw else dev
            if q == "torch.cuda.amp.autocast" or _is_cuda_string(dev):
                self.add(
                    node,
                    "AIOS301",
                    "CUDA autocast (off, with a warning, on every other device): use "
                    "`with rt.autocast():` and precision=bf16-mixed (fp16-mixed on cuda)",
                    NOT_CUDA,
                )
        if q.endswith("GradScaler"):
            self.check_grad_scaler(node, q)
        if last == "half" and not node.args and isinstance(node.func, ast.Attribute):
            if not q and not self.fp16_guard:
                self.add(
                    node,
                    "AIOS303",
                    ".half() casts to fp16, which TPUs and Trainium cannot train in: use "
                    "precision=bf16-true (or bf16-mixed); rt.setup(model) converts the module",
                    NO_FP16,
                )
        # device strings
        if _last(node.func) not in ("Generator", "autocast") and not q.endswith("GradScaler"):
            positional = q in ("torch.device", "torch.set_default_device") or last in ("to",)
            args = [a for a in node.args if positional] + [
                k.value for k in node.keywords if k.arg in ("device", "map_location", "device_type")
            ]
            if any(_is_cuda_string(a) for a in args) and id(node) not in self.choice_values:
                self.add(node, "AIOS101", f"device 'cuda...': {RT_DEVICE}", NOT_CUDA)
            elif self.check_device_passed_in(node):
                pass
            else:
                ranks = [
                    a
                    for a in (node.args[:1] if last == "to" else [])
                    + [k.value for k in node.keywords if k.arg == "device"]
                    if isinstance(a, (ast.Name, ast.Attribute)) and self.rankish(a)
                ]
                if ranks:
                    self.add(
                        node,
                        "AIOS101",
                        f"a rank as the device ({ast.unparse(ranks[0])}) means a CUDA device "
                        f"index: {RT_DEVICE}",
                        NOT_CUDA,
                    )
        # Lightning / Fabric pinned to one device
        if q.startswith(("lightning", "pytorch_lightning")) and last in ("Fabric", "Trainer"):
            self.check_lightning_devices(node, last)
            for k in node.keywords:
                v = _str(k.value)
                if k.arg == "accelerator" and v in ("cuda", "gpu", "tpu", "mps"):
                    self.add(
                        node,
                        "AIOS101",
                        f'{last}(accelerator="{v}") pins one device kind: use accelerator="auto", '
                        "or the aios runtime (rt.device, rt.setup)",
                        NOT_CUDA if v in ("cuda", "gpu") else BACKENDS,
                    )
                elif k.arg == "precision" and (
                    v in ("16-mixed", "16", "16-true")
                    or isinstance(k.value, ast.Constant)
                    and k.value.value == 16
                ):
                    self.add(
                        node,
                        "AIOS303",
                        f"{last}(precision={v or 16!r}): TPUs and Trainium have no fp16 training; "
                        'use precision="bf16-mixed"',
                        NO_FP16,
                    )
        # XLA / Neuron APIs
        if q.startswith(("torch_xla", "torch_neuronx", "neuronx_distributed")):
            self.check_xla_call(node, q)
        # fused optimizers, device generators
        if any(
            k.arg == "fused" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        ):
            self.add(
                node,
                "AIOS410",
                f"{dotted or last}(fused=True): fused optimizer kernels do not exist for XLA "
                "devices; drop it (the cuda backend picks fused kernels itself: "
                "cuda.fused_optimizer=true)",
                XLA_ONLY_BREAKS,
                fix="drop-fused",
            )
        if q == "torch.Generator" or last == "Generator" and q.startswith("torch"):
            dev = next((k.value for k in node.keywords if k.arg == "device"), None)
            dev = dev if dev is not None else (node.args[0] if node.args else None)
            if dev is not None and _str(dev) != "cpu":
                self.add(
                    node,
                    "AIOS411",
                    "torch.Generator on a device: XLA devices have none; use a CPU "
                    "torch.Generator() (data order from the CPU is the same on every backend)",
                    NOT_CUDA if _is_cuda_string(dev) else XLA_ONLY_BREAKS,
                )
        self.check_habits(node, q, last)
        # one rank only
        self.note_call(node, q)
        if self.guard_depth:
            self.check_guarded_call(node, q)

    def check_device_ids(self, node: ast.Call, q: str, last: str) -> None:
        """Device indices handed to collectives and FSDP1.

        Note: ``dist.barrier(device_ids=[local_rank])`` (the ids pick a CUDA device for NCCL's
        barrier; gloo ignores them, torch 2.13); error: ``FSDP(model, device_id=local_rank)``
        (an int is a CUDA index). Right: ``rt.barrier()``, ``rt.setup(model)``."""
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if q.startswith("torch.distributed") and last in ("barrier", "monitored_barrier"):
            if "device_ids" in kw:
                self.add(
                    node,
                    "AIOS202",
                    f"{last}(device_ids=...): device ids are CUDA's (they pick the GPU of NCCL's "
                    "barrier; other backends ignore them, nothing breaks); rt.barrier()",
                    level="note",
                )
        if q.endswith("FullyShardedDataParallel") or last == "FSDP":
            dev = kw.get("device_id")
            if isinstance(dev, (ast.Name, ast.Attribute)) and self.rankish(dev):
                self.add(
                    node,
                    "AIOS202",
                    f"FSDP(..., device_id={ast.unparse(dev)}): an int device id is a CUDA index; "
                    "rt.setup(model) with strategy=fsdp shards for the selected backend",
                    NOT_CUDA,
                )

    def check_lightning_devices(self, node: ast.Call, last: str) -> None:
        """Lightning counts the devices itself when ``devices`` is ``"auto"`` (its default) or -1:
        the node's GPUs, 1 on a CPU. Under a launcher (aios-run sets RANK, WORLD_SIZE,
        LOCAL_RANK) Lightning checks devices x num_nodes against WORLD_SIZE and raises where
        they differ: on CPU, XLA, TPU, Trainium with --nprocs N > the count.

        Wrong: ``Trainer(accelerator="auto")``, ``Fabric(devices="auto")``.
        Right: ``Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]))``; one pinned to
        ``accelerator="gpu"`` is named for that (AIOS101), not twice."""
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if any(k.arg is None for k in node.keywords) or node.args:
            return  # **settings or positional: the devices are not spelled here
        accel = _str(kw.get("accelerator"))
        if accel in ("cuda", "gpu", "tpu", "mps"):
            return
        dev = kw.get("devices")
        auto = dev is None or _str(dev) in ("auto", "-1") or _int(dev) == -1
        if auto:
            self.add(
                node,
                "AIOS204",
                f'{last}(devices="auto") counts the devices itself (the GPUs, 1 on a CPU): under '
                "aios-run --nprocs N Lightning checks devices x num_nodes against WORLD_SIZE and "
                'raises where they differ; pass devices=int(os.environ["LOCAL_WORLD_SIZE"]) (the '
                "processes aios-run started on this node)",
                NOT_CUDA,
                when="raises under aios-run --nprocs N on cpu, xla, tpu, neuron",
            )

    def check_library_call(self, node: ast.Call, q: str) -> None:
        """A call into a training library, judged by what it does (LIBRARY_CALLS)."""
        spec = LIBRARY_CALLS.get(q)
        if spec is None:
            return
        if spec.code == "AIOS204" and q.startswith("detectron2") and self.project.config_device:
            return  # the script (or its config) sets MODEL.DEVICE
        self.add(node, spec.code, spec.message, spec.backends, level=spec.level)

    def check_grad_scaler(self, node: ast.Call, q: str) -> None:
        """A CUDA GradScaler is a note, named once where it is made (not at scale/step/update):
        off CUDA it disables itself with a warning and its methods pass through.

        Note: ``scaler = torch.cuda.amp.GradScaler()``, ``torch.amp.GradScaler("cuda")``.
        No finding: ``scaler.scale(loss).backward()``, ``scaler.step(opt)``."""
        self.add(
            node,
            "AIOS302",
            f"{q}: loss scaling for fp16 on CUDA; elsewhere it disables itself with a warning "
            "(nothing breaks); rt.backward(loss) + rt.step(opt) scale when precision=fp16-mixed "
            "and need none under bf16-mixed",
            level="note",
        )

    def only_shown(self, node: ast.AST) -> bool:
        """``node`` only feeds a printed or logged text (an f-string, print/log arguments)."""
        child, parent = node, self.parents.get(id(node))
        while parent is not None and not isinstance(parent, ast.stmt):
            if isinstance(parent, ast.JoinedStr):
                return True
            if isinstance(parent, ast.Call) and child is not parent.func:
                return _last(parent.func) in ("print", "info", "debug", "warning", "log", "write")
            if not isinstance(parent, ast.FormattedValue):
                return False
            child, parent = parent, self.parents.get(id(parent))
        return False

    def picks_device(self, node: ast.AST) -> bool:
        """A test whose value is kept or picks a device (``use_accel = ... is_available()``,
        ``x if <test> else y``, ``if <test>: device = ...``), not one that guards a sync."""
        child, parent = node, self.parents.get(id(node))
        while parent is not None and not isinstance(parent, ast.stmt):
            if isinstance(parent, ast.IfExp) and child is parent.test:
                return True
            child, parent = parent, self.parents.get(id(parent))
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)):
            return True
        if isinstance(parent, ast.If) and child is parent.test:
            return any(
                isinstance(stmt, (ast.Assign, ast.AnnAssign))
                and any(
                    "device" in (_dotted(t) or "").lower() or "accel" in (_dotted(t) or "")
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                )
                for stmt in parent.body
            )
        return False

    def resolve(self, node: ast.AST | None) -> ast.AST | None:
        """A name's value where the script assigns it once (module constants, locals)."""
        if isinstance(node, ast.Name):
            vals = self.values.get(node.id, [])
            if len(vals) == 1:
                return vals[0]
        return node

    def env_sourced(self) -> set[str]:
        """Names assigned from the launcher's own environment (``rank = int(os.environ["RANK"])``,
        ``args.local_rank, args.rank, args.world_size = world_info_from_env()``)."""
        if self._env_sourced is not None:
            return self._env_sourced
        out: set[str] = set()
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            sourced = _reads_launcher_env(value) if not isinstance(value, ast.Call) else False
            if isinstance(value, ast.Call):
                f = self.callee(value)
                sourced = (f is not None and f.env_launcher) or any(
                    _reads_launcher_env(a) for a in value.args
                )
            if sourced:
                for t in node.targets:
                    for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                        d = _dotted(e)
                        if d:
                            out.add(d)
        self._env_sourced = out
        return out

    def check_env_write(self, node: ast.Assign) -> None:
        """``os.environ["RANK"] = str(comm.rank)``: the script overwrites what aios-run set.

        Wrong: ``os.environ["WORLD_SIZE"] = str(MPI.COMM_WORLD.size)`` (1 under aios-run: each
        process believes it is alone), ``os.environ["MASTER_PORT"] = "29500"``.
        Right: nothing (aios-run sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
        the same value read back from the environment is no finding."""
        for t in node.targets:
            if not (isinstance(t, ast.Subscript) and self.qual(t.value) == "os.environ"):
                continue
            name = _str(t.slice)
            if name not in LAUNCHER_ENV:
                continue
            value = node.value
            names = {
                _dotted(sub)
                for sub in ast.walk(value)
                if isinstance(sub, (ast.Name, ast.Attribute)) and _dotted(sub)
            }
            if _reads_launcher_env(value) or names & self.env_sourced():
                continue  # the launcher's own value, written back
            if name in ("MASTER_ADDR", "MASTER_PORT"):
                what = (
                    "the ranks may meet at different addresses (each node its own) or a port "
                    "another job holds, and never join"
                )
            else:
                what = (
                    "every process may claim the same rank or a world of its own: N "
                    "unsynchronised copies of one rank, or a rendezvous that never completes"
                )
            self.add(
                t,
                "AIOS210",
                f'writes os.environ["{name}"] ({ast.unparse(value)[:60]}), overwriting what '
                f"aios-run set for this rank: {what}; delete the line (aios-run sets RANK, "
                "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and use rt.rank / "
                "rt.world_size",
                BACKENDS,
                ("ddp", *SHARDED),
                when="overwrites the launcher's world under aios-run --nprocs N",
                guardable=False,
            )

    def check_env_read(self, node: ast.AST, environ: bool, key: ast.AST | None) -> None:
        name = _str(key)
        if name in ENV_RANKS and environ:
            self.add(
                node,
                "AIOS206",
                f"reads {name} from the environment: aios-run sets it, so this works; the aios "
                f"form is {ENV_RANKS[name]} (the same under every launcher and backend)",
                level="note",
            )

    def check_habits(self, node: ast.Call, q: str, last: str) -> None:
        """What public training scripts habitually write that ties them to CUDA or to their own
        launcher: argparse defaults, torch.accelerator, spawn, loads, pinning, autocast guarded
        to CUDA, compile backends, device tools, FP8 ops, per-rank downloads, own meshes."""
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if last == "add_argument":
            default = kw.get("default")
            opts = " ".join(_str(a) or "" for a in node.args)
            if _is_cuda_string(default):
                self.add(
                    default,  # type: ignore[arg-type]
                    "AIOS101",
                    f"{opts or 'an option'} defaults to {_str(default)!r}: run unchanged, the "
                    f"script asks for CUDA; {RT_DEVICE}",
                    NOT_CUDA,
                )
            elif self.check_local_rank_required(node, opts, kw):
                pass
            elif (
                any(o.strip("-").replace("_", "-") == "world-size" for o in opts.split())
                and isinstance(default, (ast.Constant, ast.UnaryOp))
                and isinstance(_int(default), int)
                and not self.project.env_world  # its helper reads the launcher's WORLD_SIZE
            ):
                self.add(
                    default,
                    "AIOS209",
                    f"{opts} defaults to {_int(default)}: run as aios-run starts it, each rank "
                    "believes it is alone and trains its own copy (the copies never join); "
                    "use rt.world_size (and rt.rank)",
                    BACKENDS,
                    ("ddp", *SHARDED),
                    when="copies never join under aios-run --nprocs N",
                )
            elif _str(default) in PG_DEVICE_BACKENDS and "backend" in opts:
                self.add(
                    default,  # type: ignore[arg-type]
                    "AIOS201",
                    f"{opts} defaults to {_str(default)!r}, which names one device's "
                    "process-group backend: aios.init() joins the process group with the selected "
                    "backend's own (gloo, nccl, xla, tpu, neuron)",
                    self.pg_breaks(_str(default) or ""),
                )
        if q.startswith("torch.accelerator."):
            name = q.rsplit(".", 1)[-1]
            parent = self.parents.get(id(node))
            if name == "is_available" and self.picks_device(node):
                self.add(
                    node,
                    "AIOS110",
                    "torch.accelerator.is_available() is False under torch_xla (an XLA device is "
                    "not a torch.accelerator): on --backend xla the script silently trains on "
                    "the host CPU; use rt.device",
                    ("xla",),
                )
            elif (
                name == "current_accelerator"
                and isinstance(parent, ast.Attribute)
                and not self.accel_guard
            ):
                self.add(
                    node,
                    "AIOS110",
                    f"torch.accelerator.current_accelerator().{parent.attr} without a test: it "
                    "is None on CPU and under torch_xla (AttributeError); use rt.device",
                    ("cpu", "xla"),
                )
            elif name == "device_count" and not (self.accel_guard or self.cuda_guard):
                use = self.parents.get(id(node))
                sizes = isinstance(use, ast.keyword) and use.arg in ("nprocs", "world_size")
                sizes |= (  # per_node = torch.accelerator.device_count(); spawn(nprocs=per_node)
                    isinstance(use, ast.Assign)
                    and len(use.targets) == 1
                    and isinstance(use.targets[0], ast.Name)
                    and use.targets[0].id in self.process_counts
                )
                if sizes or (
                    isinstance(use, ast.BinOp)
                    and isinstance(use.op, (ast.Mod, ast.FloorDiv, ast.Div))
                    and use.right is node
                ):
                    self.add(
                        node,
                        "AIOS110",
                        "torch.accelerator.device_count() is 0 on CPU and under torch_xla: as a "
                        "divisor or a process count it fails there; rt.world_size counts the "
                        "processes, rt.local_rank picks this one's device",
                        ("cpu", "xla"),
                    )
        if q in ("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"):
            self.add(
                node,
                "AIOS203",
                f"{_dotted(node.func)}() starts its own processes: under aios-run --nprocs N "
                "each rank would start N more; call the worker once (aios-run starts one "
                "process per rank; rt.rank, rt.local_rank, rt.device)",
                BACKENDS,
            )
        if (
            q == "torch.load"
            and "map_location" not in kw
            and len(node.args) < 2
            and all(k.arg is not None for k in node.keywords)  # **kwargs may carry it
        ):
            self.add(
                node,
                "AIOS113",
                "torch.load() without map_location puts each tensor back on the device it was "
                "saved from: a checkpoint written on a GPU fails to load on cpu, xla, tpu, "
                "neuron; map_location='cpu' (or rt.load / rt.resume, which place it)",
                NOT_CUDA,
            )
        pin = kw.get("pin_memory")
        if isinstance(pin, ast.Constant) and pin.value is True and not self.accel_guard:
            if q.startswith("torch.") and not q.startswith("torch.utils"):
                self.add(
                    pin,
                    "AIOS112",
                    f"{q}(pin_memory=True) needs a CUDA (or other torch.accelerator) device: on "
                    "CPU and under torch_xla it raises (no pinned memory allocator); pin only "
                    "when rt.backend == 'cuda'",
                    ("cpu", "xla"),
                )
            else:
                self.add(
                    pin,
                    "AIOS112",
                    "pin_memory=True pins host memory for copies to an accelerator: on CPU and "
                    "under torch_xla torch warns and pins nothing (nothing breaks); "
                    "rt.setup(loader) keeps the loader's setting, so pin only when "
                    "rt.backend == 'cuda'",
                    level="note",
                )
        if q in ("torch.autocast", "torch.amp.autocast") and not _is_cuda_string(
            kw.get("device_type", node.args[0] if node.args else None)
        ):
            dev = kw.get("device_type", node.args[0] if node.args else None)
            value = self.resolve(dev)
            derived = value is not dev and _is_cuda_string(value)
            if self.cuda_guard or derived:
                how = (
                    f"device_type is {ast.unparse(value)!r}"  # type: ignore[arg-type]
                    if derived
                    else "autocast only when the device is CUDA"
                )
                self.add(
                    node,
                    "AIOS304",
                    f"{how}: on other devices the script trains in fp32 where it asked for "
                    "bf16/fp16, without a word; use `with rt.autocast():` and precision=bf16-mixed",
                    NOT_CUDA,
                    level="warning",
                    guardable=False,
                )
        if q == "torch.compile":
            self.check_compile(node, kw)
        self.check_more_habits(node, q, kw)

    def check_device_passed_in(self, node: ast.Call) -> bool:
        """A CUDA device a caller hands a function of the script, which places tensors with it
        (the caller's value, followed into the function).

        Wrong: ``def train(model, device): model.to(device)`` called as ``train(m, "cuda")``.
        Right: ``train(m, rt.device)``."""
        f = self.callee(node)
        if f is None or f.path != self.path:
            return False
        a = f.node.args
        params = [p.arg for p in [*a.posonlyargs, *a.args]]
        if f.cls and params and params[0] in ("self", "cls"):
            params = params[1:]
        given = dict(zip(params, node.args, strict=False))
        given.update({k.arg: k.value for k in node.keywords if k.arg})
        for name, value in given.items():
            if not _is_cuda_string(value) or name not in self.device_params(f):
                continue
            self.add(
                value,
                "AIOS101",
                f"device {_str(value) or ast.unparse(value)!r} passed to {f.key}() as {name}, "
                f"which places tensors with it: {RT_DEVICE}",
                NOT_CUDA,
            )
            return True
        return False

    def device_params(self, f: _Func) -> set[str]:
        """Parameters ``f`` uses as a device: ``.to(p)``, ``device=p``, ``torch.device(p)``."""
        out: set[str] = set()
        for sub in ast.walk(f.node):
            if not isinstance(sub, ast.Call):
                continue
            used = [k.value for k in sub.keywords if k.arg in ("device", "map_location")]
            if _last(sub.func) == "to" or self.call_qual(sub) == "torch.device":
                used += sub.args[:1]
            out |= {u.id for u in used if isinstance(u, ast.Name)}
        return out

    def check_local_rank_required(self, node: ast.Call, opts: str, kw: dict[str, ast.expr]) -> bool:
        """``--local_rank`` that argparse requires: torch.distributed.launch passed it; aios-run
        (like torchrun) sets LOCAL_RANK in the environment and passes no argument.

        Wrong: ``add_argument("--local_rank", type=int, required=True)``.
        Right: ``add_argument("--local_rank", type=int, default=-1)``; ``rt.local_rank``."""
        required = kw.get("required")
        if not (
            any(o.strip("-").replace("_", "-") == "local-rank" for o in opts.split())
            and isinstance(required, ast.Constant)
            and required.value is True
        ):
            return False
        self.add(
            node,
            "AIOS211",
            f"{opts} is required: torch.distributed.launch passed it, but aios-run (like "
            "torchrun) sets LOCAL_RANK in the environment and passes no argument, so "
            "argparse stops the script; drop required=True and use rt.local_rank",
            BACKENDS,
        )
        return True

    def check_compile(self, node: ast.AST, kw: dict[str, ast.expr]) -> None:
        chosen = self.resolve(kw.get("backend"))
        if (
            isinstance(chosen, ast.Call)
            and self.call_qual(chosen) in ("os.environ.get", "os.getenv")
            and len(chosen.args) == 2
        ):
            chosen = chosen.args[1]  # backend=os.environ.get("COMPILE_BACKEND", "inductor")
        backend = _str(chosen)
        if backend is None and "backend" not in kw:
            self.add(
                node,
                "AIOS413",
                "torch.compile() with its default backend (inductor) cannot compile torch_xla "
                "tensors: under --backend xla pass backend='openxla' (e.g. backend='openxla' if "
                "rt.backend == 'xla' else 'inductor')",
                ("xla",),
            )
        elif backend in ("inductor", "cudagraphs", "tensorrt", "torch_tensorrt"):
            self.add(
                node,
                "AIOS413",
                f"torch.compile(backend={backend!r}) compiles for CUDA/CPU kernels: XLA, TPU "
                "and Trainium need their own backend ('openxla', 'tpu', 'neuron'); choose it "
                "by rt.backend",
                ("xla", "tpu", "neuron"),
            )

    def check_more_habits(self, node: ast.Call, q: str, kw: dict[str, ast.expr]) -> None:
        if q in SHELL_CALLS or q.startswith("subprocess."):
            for sub in ast.walk(node):
                text = _str(sub)
                if text and text.split(" ")[0] in DEVICE_TOOLS:
                    self.add(
                        node,
                        "AIOS117",
                        f"runs {text.split(' ')[0]}, an NVIDIA tool: it is missing elsewhere "
                        "(FileNotFoundError); `aios devices` or the run record describe every "
                        "backend's devices",
                        NOT_CUDA,
                    )
                    break
        if q in ("torch._scaled_mm", "torch._scaled_grouped_mm"):
            self.add(
                node,
                "AIOS115",
                f"{q}() is an FP8 matmul with kernels for CUDA (and a slow reference on CPU): "
                "XLA, TPU and Trainium stacks have none; keep a bf16 path (precision=bf16-mixed) "
                "for them",
                ("xla", "tpu", "neuron"),
            )
        if q.endswith("get_kernel") and q.split(".")[0] in ("kernels", "huggingface_hub"):
            self.add(
                node,
                "AIOS502",
                f"{_dotted(node.func)}() loads a prebuilt kernel from the Hub (built for CUDA): "
                "use torch.nn.functional.scaled_dot_product_attention / plain torch ops elsewhere",
                NOT_CUDA,
            )
        dl = kw.get("download")
        if isinstance(dl, ast.Constant) and dl.value is True and not self.guard_depth:
            self.add(
                node,
                "AIOS606",
                "download=True on every rank: under aios-run --nprocs N each rank downloads into "
                "the same folder at once and may read a half-written file; download under "
                "`if rt.is_local_main:` then rt.barrier(), or before the run",
                BACKENDS,
                ("ddp", *SHARDED),
                when="races under aios-run --nprocs N",
            )
        own = q.rsplit(".", 1)[-1] if q.startswith("torch.distributed") else ""
        if own in OWN_PARALLELISM:
            self.add(node, "AIOS207", f"{own}() {OWN_PARALLELISM[own]}", level="note")
        if q in ("os.environ.get", "os.getenv") and node.args:
            self.check_env_read(node, True, node.args[0])

    def check_xla_call(self, node: ast.Call, q: str) -> None:
        name = q.split(".")[-1]
        if self.module_level and name in XLA_RUNTIME_START and q.startswith("torch_xla"):
            self.add(
                node,
                "AIOS402",
                f"{q}() at import time starts the XLA runtime in the parent process: xmp.spawn "
                'then fails with "Runtime is already initialized"; call it inside the '
                "training function, or use rt.device after aios.init()",
                BACKENDS,
            )
            return
        if q.startswith("torch_xla") and name in XLA_REPLACEMENTS:
            code, repl = XLA_REPLACEMENTS[name]
            breaks = BACKENDS if code == "AIOS403" else NOT_XLA
            self.add(node, code, f"{q}(): use {repl}", breaks)
        elif q.startswith("neuronx_distributed"):
            self.add(
                node,
                "AIOS409",
                f"{q}(): neuronx-distributed is Trn1's legacy stack; use strategy=tp / mesh.tp=N "
                "(every native device) or strategy=nxd on --backend neuron",
                ("cpu", "cuda", "xla", "tpu"),
            )
        elif q.startswith("torch_neuronx"):
            self.add(
                node,
                "AIOS409",
                f"{q}(): torch-neuronx only; for training, `aios-run --backend neuron` runs the "
                'script as written (torch.compile(backend="neuron") on TorchNeuron)',
                ("cpu", "cuda", "xla", "tpu"),
            )
        else:
            self.add(
                node,
                "AIOS409",
                f"{q}(): torch_xla only; the aios runtime covers placement, stepping and "
                "collectives on every backend (rt.device, rt.step, rt.all_reduce)",
                NOT_XLA,
            )

    # ---- sharded strategies
    def is_rank_guard(self, test: ast.AST) -> bool:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self.is_rank_guard(v) for v in test.values)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, right = test.left, test.comparators[0]
            zero = [s for s in (left, right) if isinstance(s, ast.Constant) and s.value == 0]
            other = right if zero and zero[0] is left else left
            if zero and isinstance(test.ops[0], (ast.Eq, ast.Is)) and self.rankish(other):
                return True
            return False
        if isinstance(test, ast.Call):
            f = self.callee(test)
            if f is not None and f.rank_test:
                return True  # is_master(args): a function of the project returning a rank test
            return _last(test.func).lstrip("_") in MAIN_FLAGS and not test.args
        return isinstance(test, (ast.Name, ast.Attribute)) and _last(test).lstrip("_") in MAIN_FLAGS

    def effect(self, node: ast.Call, q: str) -> tuple[str, str] | None:
        """``(kind, what)`` when ``node`` is a forward, a collective or a save."""
        last = _last(node.func)
        base = node.func.value if isinstance(node.func, ast.Attribute) else None
        base_d = _dotted(base) if base is not None else None
        if q.startswith("torch.distributed.") and last in COLLECTIVES:
            return "collective", f"{q.removeprefix('torch.distributed.')}()"
        if q.startswith("torch_xla") and last in ("rendezvous", "all_reduce", "mesh_reduce"):
            return "collective", f"{last}()"
        if base_d in self.rt_names and last in RT_COLLECTIVES:
            return "collective", f"rt.{last}()"
        if base_d in self.rt_names and last in RT_SAVES:
            return "save", f"rt.{last}()"
        if q == "torch_xla.core.xla_model.save":  # a rendezvous of every ordinal inside
            return "save", f"{_dotted(node.func)}()"
        if (
            last in ("state_dict", "save_pretrained")
            and base is not None
            and self.is_model_expr(base)
        ):
            return "save", f"{base_d or 'model'}.{last}()"
        if self.is_model_expr(node.func) and self.is_forward_call(node):
            return "forward", f"{_dotted(node.func) or 'model'}(...)"
        if (
            (last in ("generate", "forward") or last in self.forward_methods)
            and base is not None
            and self.is_model_expr(base)
        ):
            return "forward", f"{base_d}.{last}(...)"
        return None

    def is_forward_call(self, node: ast.Call) -> bool:
        """``model(x)``, ``self.net(x)``: not ``save_model(...)``, ``accelerator.unwrap_model(m)``
        (names that match ``*_model`` but are functions)."""
        func = node.func
        d = _dotted(func)
        if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda", "module"):
            return False
        if d in self.models:
            return True
        name = _last(func)
        if VERB_NAMES.match(name) or d in self.funcs or self.qual(func) is not None:
            return False
        if isinstance(func, ast.Attribute):
            # obj.some_model(...) is a method unless obj is self (self.model(x))
            return isinstance(func.value, ast.Name) and func.value.id == "self"
        return True

    def callee(self, node: ast.Call) -> _Func | None:
        """The function of this file, or of a module of the script's project, ``node`` calls."""
        d = _dotted(node.func)
        if d is None:
            return None
        if d.startswith("self.") and d.count(".") == 1 and self.class_stack:
            return self.funcs.get(f"{self.class_stack[-1]}.{d[5:]}")
        f = self.funcs.get(d)
        if f is None and self.project.funcs:
            q = self.qual(node.func)
            f = self.project.funcs.get(q) if q else None
        return f

    def summarise(self) -> None:
        """What each function of this file does (forward, collective, save), transitively."""
        for cls, fn in self._functions(self.tree.body, None):
            key = f"{cls}.{fn.name}" if cls else fn.name
            self.funcs[key] = _Func(fn, cls, key, path=self.path)
        for key, f in self.funcs.items():
            self.class_stack = [f.cls] if f.cls else []
            self.scopes.append(dict.fromkeys(self.locals_of(f.node)))
            reads_weights = writes_file = 0
            env_names = environ = False
            for sub in ast.walk(f.node):
                if isinstance(sub, ast.Constant):
                    env_names = env_names or sub.value in LAUNCHER_ENV
                elif isinstance(sub, ast.Attribute):
                    environ = environ or sub.attr in ("environ", "getenv")
                if isinstance(sub, ast.Call):
                    q = self.call_qual(sub)
                    eff = self.effect(sub, q)
                    if eff:
                        f.kinds.setdefault(eff[0], sub.lineno)
                    func = sub.func
                    if not f.wraps_ddp and (
                        q.endswith(("DistributedDataParallel", "parallel.DDP"))
                        or _last(func) == "DDP"
                    ):
                        f.wraps_ddp = sub.lineno
                    if (
                        isinstance(func, ast.Attribute)
                        and func.attr in ("named_parameters", "parameters")
                        and self.is_model_expr(func.value)
                    ):
                        reads_weights = reads_weights or sub.lineno
                    mode = _str(sub.args[1]) if len(sub.args) > 1 else None
                    mode = mode or next(
                        (_str(k.value) for k in sub.keywords if k.arg == "mode"), None
                    )
                    if _last(func) == "open" and mode and ("w" in mode or "a" in mode):
                        writes_file = sub.lineno
                    d = _dotted(sub.func) or ""
                    if d.startswith("self.") and f.cls:
                        f.calls.append((f"{f.cls}.{d[5:]}", sub.lineno))
                    elif d in self.funcs and d != key:
                        f.calls.append((d, sub.lineno))
            if reads_weights and writes_file:
                # a file written from the model's parameters (llm.c's write_model): a checkpoint
                f.kinds.setdefault("save", reads_weights)
            f.env_launcher = env_names and environ  # os.environ["RANK"], os.getenv("WORLD_SIZE")
            self.scopes.pop()
        self.class_stack = []
        if self.module:  # a module of the script's project: its functions, for the callers
            for key, f in self.funcs.items():
                if f.cls is None:
                    self.project.funcs[f"{self.module}.{key}"] = f
        changed = True
        while changed:  # def is_master(args): return is_global_master(args) (which tests rank)
            changed = False
            for f in self.funcs.values():
                body = [
                    st for st in f.node.body if not (isinstance(st, ast.Expr) and _str(st.value))
                ]
                if f.rank_test or len(body) != 1 or not isinstance(body[0], ast.Return):
                    continue
                value = body[0].value
                tests = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
                if value is not None and all(
                    t is not None and self.is_rank_guard(t) for t in tests
                ):
                    f.rank_test = changed = True
        changed = True
        while changed:
            changed = False
            for f in self.funcs.values():
                for callee, line in f.calls:
                    g = self.funcs.get(callee)
                    for kind in g.kinds if g else ():
                        if kind not in f.kinds:
                            f.kinds[kind] = line
                            changed = True

    @staticmethod
    def _functions(
        body: list[ast.stmt], cls: str | None
    ) -> Iterator[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield cls, node
            elif isinstance(node, ast.ClassDef):
                yield from _Checker._functions(node.body, node.name)

    MESSAGES = {
        "forward": (
            "AIOS601",
            "a forward on one rank only: under a sharded strategy every rank must run it (each "
            "forward all-gathers the weights), so the others never join and it hangs; run it "
            "on every rank and print with rt.print() / log with rt.log()",
        ),
        "collective": (
            "AIOS602",
            "a collective on one rank only: the other ranks never join it and it hangs; call it "
            "on every rank (rt.barrier(), rt.all_reduce(x) outside the rank test)",
        ),
        "save": (
            "AIOS603",
            "a checkpoint on one rank only: under a sharded strategy that rank holds only its "
            "shard, and gathering the rest (full_tensor(), a full state dict) is collective and "
            "hangs; call rt.save() on every rank (aios gathers or writes shards, atomically)",
        ),
    }

    def check_guarded_call(self, node: ast.Call, q: str) -> None:
        eff = self.effect(node, q)
        if eff:
            code, msg = self.MESSAGES[eff[0]]
            strategies = SHARDED if eff[0] != "collective" else ("ddp", *SHARDED)
            self.add(node, code, f"{eff[1]} inside a rank test: {msg}", BACKENDS, strategies)
            return
        f = self.callee(node)
        if f is not None and f.kinds:
            kind = next(k for k in ("forward", "collective", "save") if k in f.kinds)
            code, msg = self.MESSAGES[kind]
            strategies = SHARDED if kind != "collective" else ("ddp", *SHARDED)
            self.add(
                node,
                code,
                f"{_dotted(node.func)}() inside a rank test reaches a {kind} "
                f"({os.path.basename(f.path or self.path)}:{f.kinds[kind]}): {msg}",
                BACKENDS,
                strategies,
            )

    def note_call(self, node: ast.Call, q: str) -> None:
        """Record, for :meth:`check_every_rank_saves`, whether each call of a function of this
        file and each torch.save happens under a rank test."""
        f = self.callee(node)
        if f is not None:
            self.call_guards.setdefault(f.key, []).append(bool(self.guard_depth))
        if q == "torch.save":
            fn = self.func_stack[-1].key if self.func_stack else None
            self.saves.append((node, bool(self.guard_depth), fn))

    def check_every_rank_saves(self) -> None:
        """torch.save reached without a rank test: every rank writes the same file."""
        for node, guarded, fn in self.saves:
            if guarded:
                continue
            if fn is not None:
                sites = self.call_guards.get(fn, [])
                if not sites or all(sites):
                    continue  # called only under a rank test (or not from this file)
            self.add(
                node,
                "AIOS605",
                "torch.save() on every rank: under aios-run --nprocs N each rank writes the same "
                "file at once; rt.save() writes once, atomically, and rt.resume() finds it",
                BACKENDS,
                ("ddp", *SHARDED),
            )


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Findings for ``source``; raises :class:`CheckError` when it is not Python."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise CheckError(f"{path}:{exc.lineno or 0}: syntax error: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise CheckError(f"{path}: not Python source: {exc}") from None
    return _Checker(path, source, tree).run()


def read_source(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckError(f"{path}: cannot read: {reason}") from None


def check_file(path: str) -> list[Finding]:
    return check_source(read_source(path), path)


MAX_PROJECT_FILES = 40  # modules followed from one script (and configs read)


def _module_file(root: str, dotted: str) -> str | None:
    """``root/a/b.py`` or ``root/a/b/__init__.py`` for ``a.b``, if it exists."""
    base = os.path.join(root, *dotted.split("."))
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(cand):
            return cand
    return None


def _local_imports(tree: ast.Module, package: str | None) -> Iterator[str]:
    """Dotted names a module imports, absolute or relative (``from . import x`` in ``gd``:
    ``gd.x``), each also as its parent (``from util.misc import f``: ``util.misc``, ``util``).
    Imports inside functions count too (a helper imported where it is used)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module if not node.level else _relative_base(node, package or "")
            if base is None:
                continue
            if base:
                yield base
            for a in node.names:
                if a.name != "*":
                    yield f"{base}.{a.name}" if base else a.name


@dataclass
class _Module:
    path: str
    name: str  # dotted, from the script's folder ("" for the script)
    package: str | None
    source: str
    tree: ast.Module


def _path_value(node: ast.AST, script: str) -> str | None:
    """The folder a ``sys.path`` entry names, where it is spelled from ``__file__`` and literals:
    ``os.path.join(os.path.dirname(__file__), "..")``, ``str(Path(__file__).parent / "src")``."""
    if isinstance(node, ast.Name) and node.id == "__file__":
        return script
    text = _str(node)
    if text is not None:
        return os.path.join(os.path.dirname(script) or ".", text)
    if isinstance(node, ast.Call):
        name = _dotted(node.func) or ""
        args = [_path_value(a, script) for a in node.args]
        if None in args:
            return None
        parts = [a for a in args if a is not None]
        if name.endswith(("dirname",)) and len(parts) == 1:
            return os.path.dirname(parts[0])
        if name.endswith(("abspath", "realpath", "normpath", "Path", "str", "resolve")):
            return parts[0] if len(parts) == 1 else None
        if name.endswith("join") and parts:
            return os.path.join(*parts)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "resolve" and not parts:
            return _path_value(node.func.value, script)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_value(node.value, script)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _path_value(node.left, script), _str(node.right)
        return os.path.join(left, right) if left is not None and right is not None else None
    return None


def _sys_path_roots(tree: ast.Module, script: str) -> list[str]:
    """Folders the script adds to ``sys.path`` (``sys.path.insert(0, ...)``, ``append``)."""
    roots = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and (_dotted(node.func) or "") in ("sys.path.insert", "sys.path.append")
            and node.args
        ):
            folder = _path_value(node.args[-1], script)
            if folder is not None and os.path.isdir(folder):
                roots.append(os.path.normpath(folder))
    return roots


def _project_modules(path: str, source: str, tree: ast.Module) -> list[_Module]:
    """The script and the modules of its own project it imports (same folder, packages under
    it, folders it adds to ``sys.path``), breadth first, at most MAX_PROJECT_FILES. Third-party
    imports are not files here."""
    root = os.path.dirname(path) or "."  # relative stays relative: paths print as given
    roots = [root, *_sys_path_roots(tree, path)]
    mods = [_Module(path, "", "", source, tree)]
    seen = {os.path.abspath(path)}
    i = 0
    while i < len(mods) and len(mods) < MAX_PROJECT_FILES:
        mod = mods[i]
        i += 1
        for dotted in _local_imports(mod.tree, mod.package):
            found = next((f for r in roots if (f := _module_file(r, dotted))), None)
            if found is None or os.path.abspath(found) in seen:
                continue
            seen.add(os.path.abspath(found))
            found = os.path.normpath(found)
            try:
                text = read_source(found)
                sub = ast.parse(text, filename=found)
            except (CheckError, SyntaxError, ValueError):
                continue  # not ours to judge: the script's import fails there anyway
            package = dotted if found.endswith("__init__.py") else dotted.rpartition(".")[0]
            mods.append(_Module(found, dotted, package, text, sub))
            if len(mods) >= MAX_PROJECT_FILES:
                break
    return mods


def _config_files(root: str, modules: list[_Module]) -> list[str]:
    """YAML/JSON/TOML files under the script's folder whose name a module of the project spells
    out (``--config configs/train.yaml``, ``os.path.join(here, "configs", "train.yaml")``)."""
    names = set()
    for mod in modules:
        for node in ast.walk(mod.tree):
            text = _str(node)
            if text and text.endswith(CONFIG_SUFFIXES) and len(text) < 300:
                names.add(os.path.basename(text))
    if not names:
        return []
    out: list[str] = []
    skip = {".git", "__pycache__", "node_modules", ".venv", "venv", "site-packages"}
    for visited, (dirpath, dirs, files) in enumerate(os.walk(root)):
        if visited >= 500:  # a script in a big folder (a home directory): look no further
            break
        depth = os.path.relpath(dirpath, root).count(os.sep)
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith(".") and depth < 3)
        out.extend(os.path.join(dirpath, f) for f in sorted(files) if f in names)
        if len(out) >= MAX_PROJECT_FILES:
            break
    return out


def check_config(path: str) -> list[Finding]:
    """A config the script loads that asks for a CUDA device (``device: cuda``): the recipe's
    device comes from there, so the line to change is there.

    Wrong: ``device: cuda`` / ``device = "cuda:0"`` / ``"accelerator": "gpu"``.
    Right: ``device: cpu`` where the script maps it through rt.device; no device key."""
    try:
        text = read_source(path)
    except CheckError:
        return []
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = CONFIG_DEVICE.match(line)
        if m:
            out.append(
                Finding(
                    path,
                    i,
                    line.index(m.group(1)) + 1,
                    "AIOS101",
                    f"the script loads this config and its {m.group(1)} is {m.group(2)!r}: run "
                    "unchanged it asks for CUDA; set the device from rt.device (aios.init() picks "
                    "each rank's device for the backend aios-run selects)",
                    NOT_CUDA,
                )
            )
    return out


def check_project(path: str) -> list[Finding]:
    """Findings for the script at ``path`` and for what it brings in of its own project: the
    modules it imports from its folder (followed with what they define: a rank-0 save wrapper, a
    device helper, DDP inside a helper, rank tests), and the configs it loads that name a device.
    Each finding carries the path of the file it is in."""
    source = read_source(path)
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise CheckError(f"{path}:{exc.lineno or 0}: syntax error: {exc.msg}") from None
    except ValueError as exc:
        raise CheckError(f"{path}: not Python source: {exc}") from None
    modules = _project_modules(path, source, tree)
    root = os.path.dirname(path) or "."
    configs = _config_files(root, modules)
    config_found = [f for c in configs for f in check_config(c)]
    project = _Project()
    for mod in modules:
        world = environ = False
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Constant):
                world = world or node.value in ("WORLD_SIZE", "RANK")
            elif isinstance(node, ast.Attribute):
                environ = environ or node.attr in ("environ", "getenv")
                if node.attr == "DEVICE" and isinstance(node.ctx, ast.Store):
                    project.config_device = True  # cfg.MODEL.DEVICE = ...
        project.env_world |= world and environ  # os.environ["WORLD_SIZE"] read somewhere
    for c in configs:
        if re.search(r"^\s*DEVICE\s*:", read_source(c), re.M):
            project.config_device = True
    found: list[Finding] = []
    for mod in reversed(modules):  # helpers first: their functions are known to the callers
        checker = _Checker(mod.path, mod.source, mod.tree, project, mod.name, mod.package)
        found.extend(checker.run())
    return found + config_found


def expand(paths: Iterable[str]) -> list[str]:
    """Files to check: each file given, and the ``*.py`` files under each directory given."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
        else:
            out.append(p)
    return out


def for_backend(findings: Iterable[Finding], backend: str | None) -> list[Finding]:
    if backend is None:
        return list(findings)
    # what breaks (or silently differs) there; notes break nothing anywhere
    return [f for f in findings if backend in f.backends and f.level != "note"]


# ------------------------------------------------------------------ safe rewrites


def fix_source(source: str, findings: Iterable[Finding]) -> str:
    """``source`` with the safe rewrites of ``findings`` applied (formatting kept)."""
    todo = {(f.line, f.col): f.fix for f in findings if f.fix}
    if not todo:
        return source
    try:
        import libcst as cst
        from libcst.metadata import PositionProvider
    except ImportError:
        raise CheckError(
            "--fix needs LibCST, which is not installed: pip install 'libcst>=1.0' "
            "(an aios-core dependency)"
        ) from None

    class Fix(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def _kind(self, node: cst.CSTNode) -> str:
            """The rewrite due at ``node``'s start (line, 1-based column), if any."""
            p = self.get_metadata(PositionProvider, node, None)
            return todo.get((p.start.line, p.start.column + 1), "") if p else ""

        def leave_SimpleStatementLine(  # noqa: N802 - LibCST's visitor names
            self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
        ) -> cst.BaseStatement:
            if len(original.body) != 1 or not isinstance(original.body[0], cst.Expr):
                return updated
            call = original.body[0].value
            if not isinstance(call, cst.Call) or self._kind(call) != "guard":
                return updated
            new_call = cst.ensure_type(updated.body[0], cst.Expr).value
            assert isinstance(new_call, cst.Call)
            func = cst.ensure_type(new_call.func, cst.Attribute)
            body = updated.with_changes(
                body=[cst.Expr(new_call.with_changes(func=_accelerator(func.attr.value)))],
                leading_lines=[],
            )
            test = cst.parse_expression("torch.accelerator.is_available()")
            return cst.If(
                test=test, body=cst.IndentedBlock(body=[body]), leading_lines=original.leading_lines
            )

        def leave_Call(  # noqa: N802
            self, original: cst.Call, updated: cst.Call
        ) -> cst.BaseExpression:
            kind = self._kind(original)
            if kind == "rename":
                func = cst.ensure_type(updated.func, cst.Attribute)
                return updated.with_changes(func=_accelerator(func.attr.value))
            if kind == "drop-backend":
                args = [
                    a
                    for i, a in enumerate(updated.args)
                    if not (
                        (a.keyword is None and i == 0 and isinstance(a.value, cst.SimpleString))
                        or (a.keyword is not None and a.keyword.value == "backend")
                    )
                ]
                return updated.with_changes(args=_tidy(args))
            if kind == "drop-fused":
                args = [a for a in updated.args if not (a.keyword and a.keyword.value == "fused")]
                return updated.with_changes(args=_tidy(args))
            return updated

    def _accelerator(name: str) -> cst.Attribute:
        return cst.Attribute(
            value=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("accelerator")),
            attr=cst.Name(name),
        )

    def _tidy(args: list[cst.Arg]) -> list[cst.Arg]:
        if args and not isinstance(args[-1].comma, cst.MaybeSentinel):
            last = args[-1]
            # keep a trailing comma only where the call spans lines (the user's style)
            ws = getattr(last.comma, "whitespace_after", None)
            if not (isinstance(ws, cst.ParenthesizedWhitespace)):
                args[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return args

    try:
        module = cst.metadata.MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        raise CheckError(f"LibCST cannot parse it to rewrite ({exc.message})") from None
    return module.visit(Fix()).code
