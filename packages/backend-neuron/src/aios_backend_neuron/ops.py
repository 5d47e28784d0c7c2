"""Static check of a training script for things known not to work on Trainium.

Reads the script's AST (never imports or runs it). Used by the launch plan (findings become
plan notes, shown by ``--dry-run``) and available to users as :func:`scan_script`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

CUDA_ONLY_MODULES = {
    "flash_attn": "FlashAttention kernels are CUDA-only; use "
    "torch.nn.functional.scaled_dot_product_attention or NKI kernels",
    "bitsandbytes": "bitsandbytes kernels are CUDA-only",
    "apex": "NVIDIA apex fused kernels are CUDA-only",
    "xformers": "xformers kernels are CUDA-only",
    "triton": "Triton kernels do not run on NeuronCores (use NKI)",
    "deepspeed": "DeepSpeed's CUDA kernels do not run on Neuron; use neuron.zero1 / NxD instead",
}


# torch.cuda names that break nothing without CUDA: they return False/0, do nothing, or (a
# GradScaler) disable themselves with a warning; not worth a plan note
HARMLESS_CUDA = {
    "torch.cuda.is_available",
    "torch.cuda.empty_cache",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.cuda.amp.GradScaler",
}
# what aios-run sets for every rank: a script writing one overwrites the launcher's world
LAUNCHER_ENV = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",
}  # fmt: skip


@dataclass(frozen=True)
class Finding:
    line: int
    what: str
    fix: str
    severity: str = "warn"  # warn | fail

    def __str__(self) -> str:
        return f"line {self.line}: {self.what} ({self.fix})"


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def scan_source(source: str, runtime: str = "xla") -> list[Finding]:
    """Findings for ``source``; ``runtime`` is ``xla`` or ``native`` (torch.compile differs)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [
            Finding(
                exc.lineno or 0, f"script does not parse: {exc.msg}", "fix the syntax error", "fail"
            )
        ]
    out: list[Finding] = []
    # a.b.c is one name: its inner a.b is not judged again (one finding per cause)
    inner = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
    }
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and id(node) in inner:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for n in names:
                top = n.split(".")[0]
                if top in CUDA_ONLY_MODULES:
                    out.append(Finding(line, f"imports {top}", CUDA_ONLY_MODULES[top]))
        elif isinstance(node, ast.Attribute):
            d = _dotted(node)
            if d in ("torch.float16", "torch.half"):
                out.append(
                    Finding(
                        line,
                        f"uses {d}",
                        "fp16 is not supported for training on Trainium; use bf16",
                    )
                )
            elif d in ("torch.float64", "torch.double"):
                out.append(
                    Finding(
                        line,
                        f"uses {d}",
                        "NeuronCores have no float64; keep float64 math on the CPU",
                    )
                )
            elif d in ("torch.complex64", "torch.complex128", "torch.view_as_complex"):
                out.append(
                    Finding(
                        line,
                        f"uses {d}",
                        "complex dtypes are not supported on Neuron; use real-valued rotary embeddings",
                    )
                )
            elif d.startswith("torch.cuda.") and d.count(".") >= 2 and d not in HARMLESS_CUDA:
                out.append(
                    Finding(
                        line,
                        f"calls {d}",
                        "CUDA-only API; use the aios runtime's device and helpers",
                    )
                )
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func)
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("half", "double")
                and not node.args
            ):
                what = "fp16" if node.func.attr == "half" else "float64"
                out.append(
                    Finding(
                        line,
                        f".{node.func.attr}() casts to {what}",
                        "not supported on Trainium; use .to(torch.bfloat16) or keep fp32",
                    )
                )
            for kw in node.keywords:
                if (
                    kw.arg == "fused"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is True
                ):
                    out.append(
                        Finding(
                            line,
                            f"{fn or 'call'}(fused=True)",
                            "fused optimizer kernels are CUDA-only; drop fused=True",
                        )
                    )
            if fn in ("torch.Generator",) and any(kw.arg == "device" for kw in node.keywords):
                out.append(
                    Finding(
                        line,
                        "torch.Generator(device=...)",
                        "a device generator fails on XLA devices; use a CPU generator and move tensors",
                    )
                )
            if fn == "torch.compile" and runtime == "xla":
                out.append(
                    Finding(
                        line,
                        "torch.compile(...)",
                        "not supported by torch-neuronx on XLA (the graph is compiled by XLA "
                        "already); remove it or use the native runtime",
                    )
                )
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript)
            and _dotted(t.value) == "os.environ"
            and isinstance(t.slice, ast.Constant)
            and t.slice.value in LAUNCHER_ENV
            for t in node.targets
        ):
            name = next(
                t.slice.value
                for t in node.targets
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
            )
            out.append(
                Finding(
                    line,
                    f"writes os.environ[{name!r}]",
                    "aios-run sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for "
                    "every rank; overwriting them leaves copies of one rank that never join",
                )
            )
        elif isinstance(node, ast.Constant) and node.value in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
            out.append(
                Finding(
                    line,
                    f"sets {node.value}",
                    "removed from torch-neuronx; use precision=bf16-true (with stochastic rounding)",
                    "fail",
                )
            )
    out.sort(key=lambda f: f.line)
    return out


def scan_script(path: str, runtime: str = "xla") -> list[Finding]:
    """Findings for the script at ``path`` (empty when it cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return scan_source(text, runtime)
