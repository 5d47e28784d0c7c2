"""Pure readings of one AST node: dotted names, literals, import tables, launcher tests."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator

from aios.check.library import CUDA_STR, LAUNCHER_ENV


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


def guarded_call(scope: ast.AST, test: Callable[[ast.expr], bool], name: str) -> bool:
    """Whether ``scope`` has an ``if`` whose condition ``test`` accepts and whose body calls
    a function named ``name`` (``if local_rank != -1: init_process_group(...)``)."""
    return any(
        isinstance(n, ast.If)
        and test(n.test)
        and any(
            isinstance(c, ast.Call) and _last(c.func) == name for st in n.body for c in ast.walk(st)
        )
        for n in ast.walk(scope)
    )


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


# what aios-run (like torchrun) sets for every rank: a test of one of them is true under it
LAUNCHER_SETS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _launcher_test(test: ast.AST) -> int:
    """1: ``"RANK" in os.environ`` (true under a launcher: aios-run sets RANK, WORLD_SIZE,
    LOCAL_RANK for every rank); -1: ``"RANK" not in os.environ`` (true only without one); 0:
    neither. Code that runs only without a launcher never runs under aios-run.

        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # 1
        if "LOCAL_RANK" not in os.environ:                        # -1
        if "MASTER_PORT" not in os.environ:                       # -1 (aios-run sets it)
    """
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -_launcher_test(test.operand)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        signs = {_launcher_test(v) for v in test.values}
        return 1 if 1 in signs and -1 not in signs else 0
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        name = _str(test.left)
        env = _dotted(test.comparators[0]) or ""
        if name in LAUNCHER_SETS and env.endswith("environ"):
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
