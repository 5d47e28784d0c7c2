"""The walk over one file: scopes, the guards a line sits under (CUDA, accelerator, fp16, rank,
no launcher), and each node handed to the rules that declared its type, in their order."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from aios.check.callgraph import Context
from aios.check.findings import Finding
from aios.check.names import (
    _dotted,
    _guarded_by_import_error,
    _imports,
    _last,
    _launcher_test,
    _local_names,
)
from aios.check.reading import _Func, _Project
from aios.check.rules.base import CheckRule

# tests and queries named without a call are no use of CUDA (``cuda_ok = torch.cuda.is_available``)
CUDA_TESTS = ("is_available", "is_bf16_supported", "is_initialized", "device_count")


class Checker(Context):
    """Walks a file once and lets every rule look at the nodes it declared."""

    def __init__(
        self,
        path: str,
        source: str,
        tree: ast.Module,
        rules: Sequence[CheckRule],
        project: _Project | None = None,
        module: str = "",
        package: str | None = None,
    ) -> None:
        super().__init__(path, source, tree, project, module, package)
        self.rules = list(rules)
        self.by_type: dict[type[ast.AST], list[CheckRule]] = {}
        for rule in self.rules:
            for kind in rule.nodes:
                self.by_type.setdefault(kind, []).append(rule)

    def dispatch(self, node: ast.AST) -> None:
        for rule in self.by_type.get(type(node), ()):
            rule.check(self, node)

    def run(self) -> list[Finding]:
        self.prepass()
        self.summarise()
        self.visit_body(self.tree.body)
        for rule in self.rules:
            rule.finish(self)
        # on a line, what breaks before notes: aios-run's hint names a traceback line's first finding
        return sorted(
            self.findings.values(), key=lambda f: (f.line, f.level == "note", f.col, f.code)
        )

    def visit_body(self, body: list[ast.stmt]) -> None:
        # ``if not torch.cuda.is_available(): return None`` ends the function elsewhere: the
        # lines after it run only with CUDA (dead code elsewhere, like an ``if`` body)
        # ``if rank != 0: return`` likewise: the lines after it run on rank 0 only
        exits = rank_exits = 0
        for stmt in body:
            self.visit(stmt)
            if (
                isinstance(stmt, ast.If)
                and not stmt.orelse
                and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
            ):
                if self.cuda_test(stmt.test) == -1:
                    exits += 1
                    self.cuda_guard += 1
                elif self.is_rank_exit(stmt.test):
                    rank_exits += 1
                    self.guard_depth += 1
        self.cuda_guard -= exits
        self.guard_depth -= rank_exits

    def visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.dispatch(node)  # decorators (``@torch.compile``)
        for d in node.decorator_list:
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

    def visit_class(self, node: ast.ClassDef) -> None:
        for b in [*node.bases, *node.decorator_list]:
            self.visit(b)
        self.class_stack.append(node.name)
        outer = self.module_level
        self.module_level = False
        self.visit_body(node.body)
        self.module_level = outer
        self.class_stack.pop()

    def visit_if(self, node: ast.If) -> None:
        self.visit(node.test)
        launcher = _launcher_test(node.test)
        if launcher:  # code that runs only without a launcher never runs under aios-run
            self.no_launcher += launcher == -1
            self.visit_body(node.body)
            self.no_launcher += (launcher == 1) - (launcher == -1)
            self.visit_body(node.orelse)
            self.no_launcher -= launcher == 1
            return
        guard = self.is_rank_guard(node.test)
        cuda = self.cuda_test(node.test)
        accel = self.accel_test(node.test)
        self.dispatch(node)  # a GPU gate
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

    def visit_ifexp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        cuda = self.cuda_test(node.test)
        accel = self.accel_test(node.test)
        fp16 = self.fp16_choice(node.test)  # torch.float16 if args.fp16 else torch.float32
        self.accel_guard += accel
        self.cuda_guard += cuda == 1
        self.fp16_guard += fp16
        self.visit(node.body)
        self.fp16_guard -= fp16
        self.cuda_guard += (cuda == -1) - (cuda == 1)
        self.visit(node.orelse)
        self.cuda_guard -= cuda == -1
        self.accel_guard -= accel

    def visit_try(self, node: ast.Try) -> None:
        guarded = _guarded_by_import_error(node.handlers)
        for stmt in node.body:
            if guarded and isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue  # an optional import with its fallback
            self.visit(stmt)
        for h in node.handlers:
            self.visit_body(h.body)
        self.visit_body(node.orelse)
        self.visit_body(node.finalbody)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.visit_function(node)
        elif isinstance(node, ast.Lambda):
            self.scopes.append(dict.fromkeys(_local_names(node)))
            self.visit(node.body)
            self.scopes.pop()
        elif isinstance(node, ast.ClassDef):
            self.visit_class(node)
        elif isinstance(node, ast.If):
            self.visit_if(node)
        elif isinstance(node, ast.IfExp):
            self.visit_ifexp(node)
        elif isinstance(node, ast.Try):
            self.visit_try(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.dispatch(node)
        else:
            self.visit_other(node)

    def cuda_reference(self, node: ast.Name | ast.Attribute) -> bool:
        """A ``torch.cuda`` function named, not called here (``torch.cuda.synchronize if ...
        else ...``, ``ctx = torch.cuda.amp.autocast``): it is called through another name."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Call) and parent.func is node:
            return False
        if isinstance(parent, ast.Attribute) or not isinstance(
            parent, (ast.IfExp, ast.Assign, ast.AnnAssign, ast.keyword, ast.Call, ast.Return)
        ):
            return False
        q = self.qual(node) or ""
        name = q.rpartition(".")[2]
        return q.startswith("torch.cuda.") and name[:1].islower() and name not in CUDA_TESTS

    def dispatch_as_call(
        self, at: ast.expr, func: ast.expr, args: list[ast.expr], keywords: list[ast.keyword]
    ) -> None:
        """Let the rules see ``func(*args, **keywords)`` at ``at``'s place."""
        call = ast.copy_location(ast.Call(func=func, args=args, keywords=keywords), at)
        call.end_lineno, call.end_col_offset = at.end_lineno, at.end_col_offset
        self.parents[id(call)] = self.parents.get(id(at), at)
        self.q = self.call_qual(call)
        self.last = _last(func)
        self.dotted = _dotted(func) or ""
        self.dispatch(call)

    def visit_other(self, node: ast.AST) -> None:
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
            self.q = self.call_qual(node)
            self.last = _last(node.func)
            self.dotted = _dotted(node.func) or ""
        self.dispatch(node)
        if isinstance(node, ast.Call) and self.q == "functools.partial" and node.args:
            # partial(FSDP, device_id=local_rank): the arguments bound now are the call's
            self.dispatch_as_call(node, node.args[0], node.args[1:], node.keywords)
        elif isinstance(node, (ast.Name, ast.Attribute)) and self.cuda_reference(node):
            # sync = torch.cuda.synchronize if cuda else noop: the function is called later
            self.dispatch_as_call(node, node, [], [])
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Attribute) and child is node.value and _dotted(node):
                continue  # a.b.c is one name: checked once, as a whole
            self.visit(child)
