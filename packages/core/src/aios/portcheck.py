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
from collections.abc import Iterable, Iterator
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

    def where(self) -> str:
        if self.strategies:
            return "hangs or diverges under strategy=" + "|".join(self.strategies)
        if set(self.backends) == set(BACKENDS):
            return "breaks on every backend"
        return "breaks on " + ", ".join(self.backends)

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
        "rt.world_size for process counts, torch.accelerator.device_count() for devices",
        "rename",
    ),
    "is_available": (
        "AIOS106",
        "rt.device (on a TPU or Trainium this test is False and the script trains on the CPU)",
        "",
    ),
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
SEED_CALLS = {
    "torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "random.seed",
    "numpy.random.seed", "lightning.seed_everything", "lightning.fabric.seed_everything",
    "transformers.set_seed", "accelerate.utils.set_seed",
}  # fmt: skip
PG_DEVICE_BACKENDS = {"nccl", "xla", "tpu", "neuron", "hccl", "ucc"}
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


def _imports(body: Iterable[ast.stmt]) -> Iterator[tuple[str, str, ast.stmt]]:
    """``(local name, qualified name, statement)`` for the imports directly in ``body`` and in
    its if/try blocks (not in nested functions)."""
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
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for sub in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, sub, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


# ------------------------------------------------------------------ the checker


@dataclass
class _Func:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    key: str = ""
    kinds: dict[str, int] = field(default_factory=dict)  # forward|collective|save -> first line
    calls: list[tuple[str, int]] = field(default_factory=list)  # callee key, line


class _Checker:
    def __init__(self, path: str, source: str, tree: ast.Module) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.tree = tree
        self.findings: dict[tuple[int, str], Finding] = {}
        self.scopes: list[dict[str, str | None]] = [
            {name: qual for name, qual, _ in _imports(tree.body)}
        ]
        self.models: set[str] = set()  # dotted names bound to modules (``model``, ``self.model``)
        self.rank_names: set[str] = set()  # names / ``self.x`` holding a rank
        self.rt_names: set[str] = set()  # names bound to aios.init()
        self.scalers: set[str] = set()  # names bound to a GradScaler
        self.local_modules: set[str] = set()  # nn.Module subclasses defined here
        self.funcs: dict[str, _Func] = {}  # "name" or "Class.name"
        self.guard_depth = 0
        self.func_stack: list[_Func] = []
        self.local_names: dict[int, set[str]] = {}  # id(function) -> its parameters and locals
        self.builds: dict[int, list[int]] = {}  # id(scope) -> lines that build a model there
        self.call_guards: dict[str, list[bool]] = {}  # function key -> guarded at each call site
        self.saves: list[tuple[ast.Call, bool, str | None]] = []  # torch.save, guarded, in function
        self.statement_calls: set[int] = set()  # calls that are a whole line's only statement
        self.class_stack: list[str] = []
        self.module_level = True

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
    ) -> None:
        key = (getattr(node, "lineno", 0), code)
        if key not in self.findings:
            self.findings[key] = Finding(
                self.path, key[0], self.col(node), code, message, backends, strategies, fix
            )

    # ---- pre-pass: models, ranks, aios runtimes, functions
    def rankish(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (
                "rank" in sub.id.lower() or sub.id in self.rank_names
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
            if last in self.local_modules or last in ("from_pretrained", "from_config"):
                return True
            if q.startswith("torch.nn.") and q.rsplit(".", 1)[-1][:1].isupper():
                return not q.startswith(("torch.nn.functional", "torch.nn.utils"))
            if q.endswith(("DistributedDataParallel", "FullyShardedDataParallel", ".fully_shard")):
                return True
            if q in ("torch.compile",) or last in ("setup_module", "unwrap", "to", "cuda"):
                return any(self.is_model_expr(a) for a in node.args[:1]) or (
                    last in ("to", "cuda") and self.is_model_expr(node.func)
                )
            return False
        if isinstance(node, ast.Attribute) and node.attr in ("to", "cuda", "module", "_orig_mod"):
            return self.is_model_expr(node.value)
        d = _dotted(node)
        return d is not None and (d in self.models or bool(MODEL_NAME.match(d.split(".")[-1])))

    def prepass(self) -> None:
        assigns: list[ast.Assign | ast.AnnAssign] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ClassDef) and any(
                _last(b) in ("Module", "LightningModule") for b in node.bases
            ):
                self.local_modules.add(node.name)
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
        return sorted(self.findings.values(), key=lambda f: (f.line, f.col, f.code))

    def visit_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.visit(stmt)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                self.visit(d)
            key = f"{self.class_stack[-1]}.{node.name}" if self.class_stack else node.name
            outer_level, outer_guard = self.module_level, self.guard_depth
            self.module_level = False
            self.guard_depth = 0
            scope: dict[str, str | None] = dict.fromkeys(self.locals_of(node))
            scope.update({n: q for n, q, _ in _imports(node.body)})
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
            guard = self.is_rank_guard(node.test)
            self.guard_depth += guard
            self.visit_body(node.body)
            self.guard_depth -= guard
            self.visit_body(node.orelse)
            return
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
            elif top in DEVICE_PACKAGES:
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
        if q in ("torch.float16", "torch.half"):
            self.add(
                node,
                "AIOS303",
                f"{_dotted(node)}: TPUs and Trainium have no fp16 training; use precision=bf16-mixed "
                "(aios-run --precision bf16-mixed) and rt.autocast()",
                NO_FP16,
            )

    def check_assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        value = node.value
        if _is_cuda_string(value):
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
            elif name in CUDA_CALLS:
                code, repl, fix = CUDA_CALLS[name]
                # written as torch.cuda.x (the rename is safe); a guard needs a line of its own
                ok = dotted == q and (fix != "guard" or id(node) in self.statement_calls)
                self.add(node, code, f"{q}(): {repl}", NOT_CUDA, fix=fix if ok else "")
            elif name in MEMORY_CALLS:
                self.add(
                    node,
                    "AIOS108",
                    f"{q}(): the run record has each rank's device memory (aios devices names "
                    f"the device); elsewhere {ACCEL_MEMORY.get(name, 'aios devices --json')}",
                    NOT_CUDA,
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
            val = _str(arg) if arg is not None else _str(kw.value) if kw else None
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
        if q.endswith(("DistributedDataParallel", "parallel.DDP")) or last == "DDP":
            if any(k.arg in ("device_ids", "output_device") for k in node.keywords):
                self.add(
                    node,
                    "AIOS202",
                    f"{last}(..., device_ids=...): device ids are CUDA's; rt.setup(model) wraps "
                    "for the selected backend and strategy (strategy=ddp|fsdp|tp)",
                    NOT_CUDA,
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
            self.add(
                node,
                "AIOS302",
                f"{q}: loss scaling is fp16-on-CUDA only; rt.backward(loss) + rt.step(opt) "
                "scale when precision=fp16-mixed, and need none under bf16-mixed",
                NOT_CUDA,
            )
        if isinstance(node.func, ast.Attribute) and _dotted(node.func.value) in self.scalers:
            scaler_use = {
                "scale": "rt.backward(loss)",
                "step": "rt.step(opt)",
                "update": "nothing (rt.step(opt) updates the scale)",
                "unscale_": "rt.clip_gradients(model, opt, max_norm) or config grad_clip=",
            }.get(last)
            if scaler_use:
                self.add(node, "AIOS302", f"GradScaler.{last}(): use {scaler_use}", NOT_CUDA)
        if last == "half" and not node.args and isinstance(node.func, ast.Attribute):
            if not q:
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
            if any(_is_cuda_string(a) for a in args):
                self.add(node, "AIOS101", f"device 'cuda...': {RT_DEVICE}", NOT_CUDA)
            elif any(
                isinstance(a, (ast.Name, ast.Attribute)) and self.rankish(a)
                for a in (node.args[:1] if last == "to" else [])
                + [k.value for k in node.keywords if k.arg == "device"]
            ):
                self.add(
                    node,
                    "AIOS101",
                    f"a rank as the device ({_dotted(node.args[0] if node.args else node)}) "
                    f"means a CUDA device index: {RT_DEVICE}",
                    NOT_CUDA,
                )
        # Lightning / Fabric pinned to one device
        if q.startswith(("lightning", "pytorch_lightning")) and last in ("Fabric", "Trainer"):
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
        # one rank only
        self.note_call(node, q)
        if self.guard_depth:
            self.check_guarded_call(node, q)
        if q in SEED_CALLS or (
            last == "seed_everything"
            and _dotted(node.func.value if isinstance(node.func, ast.Attribute) else node.func)
            in self.rt_names
        ):
            self.check_seed(node)

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
            return _last(test.func) in MAIN_FLAGS and not test.args
        return isinstance(test, (ast.Name, ast.Attribute)) and _last(test) in MAIN_FLAGS

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
        if last == "state_dict" and base is not None and self.is_model_expr(base):
            return "save", f"{base_d or 'model'}.state_dict()"
        if self.is_model_expr(node.func) and not (
            isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda", "module")
        ):
            return "forward", f"{_dotted(node.func) or 'model'}(...)"
        if last in ("generate", "forward") and base is not None and self.is_model_expr(base):
            return "forward", f"{base_d}.{last}(...)"
        return None

    def callee(self, node: ast.Call) -> _Func | None:
        d = _dotted(node.func)
        if d is None:
            return None
        if d.startswith("self.") and d.count(".") == 1 and self.class_stack:
            return self.funcs.get(f"{self.class_stack[-1]}.{d[5:]}")
        return self.funcs.get(d)

    def summarise(self) -> None:
        """What each function of this file does (forward, collective, save), transitively."""
        for cls, fn in self._functions(self.tree.body, None):
            key = f"{cls}.{fn.name}" if cls else fn.name
            self.funcs[key] = _Func(fn, cls, key)
        for key, f in self.funcs.items():
            self.class_stack = [f.cls] if f.cls else []
            self.scopes.append(dict.fromkeys(self.locals_of(f.node)))
            for sub in ast.walk(f.node):
                if isinstance(sub, ast.Call):
                    eff = self.effect(sub, self.call_qual(sub))
                    if eff:
                        f.kinds.setdefault(eff[0], sub.lineno)
                    d = _dotted(sub.func) or ""
                    if d.startswith("self.") and f.cls:
                        f.calls.append((f"{f.cls}.{d[5:]}", sub.lineno))
                    elif d in self.funcs and d != key:
                        f.calls.append((d, sub.lineno))
            self.scopes.pop()
        self.class_stack = []
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
                f"({os.path.basename(self.path)}:{f.kinds[kind]}): {msg}",
                BACKENDS,
                strategies,
            )

    def check_seed(self, node: ast.Call) -> None:
        if not any(self.rankish(a) for a in [*node.args, *(k.value for k in node.keywords)]):
            return
        scope = self.func_stack[-1].node if self.func_stack else self.tree
        builds = self.builds.get(id(scope))
        if builds is None:
            builds = self.builds[id(scope)] = sorted(
                n.lineno
                for n in ast.walk(scope)
                if isinstance(n, (ast.Assign, ast.AnnAssign))
                and isinstance(n.value, ast.Call)
                and any(
                    self.is_model_expr(t)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                )
            )
        later = [line for line in builds if line > node.lineno]
        if later:
            self.add(
                node,
                "AIOS604",
                f"a per-rank seed before the model is built (line {later[0]}): under a "
                "sharded strategy each rank initialises its shard from a different RNG and the "
                "weights disagree; seed every rank alike (config seed=N, or rt.seed_everything(seed)) "
                "before building the model; aios shards the data order by rank itself",
                BACKENDS,
                SHARDED,
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
    return [f for f in findings if backend in f.backends]


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
