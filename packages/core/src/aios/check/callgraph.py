"""The call graph of a script's project: what each function does (a forward, a collective, a
save), transitively and across the project's modules; which tests are rank tests; which names
hold the launcher's own values. :class:`Context` is what a rule reads a file through."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from aios.check.library import (
    COLLECTIVE_SAVES,
    COLLECTIVES,
    LAUNCHER_ENV,
    MAIN_FLAGS,
    RT_COLLECTIVES,
    RT_SAVES,
    VERB_NAMES,
)
from aios.check.names import _dotted, _int, _last, _reads_launcher_env, _str
from aios.check.reading import Reading, _Func


class Context(Reading):
    """A file as the rules read it: :class:`Reading` plus its functions' effects."""

    def is_rank_guard(self, test: ast.AST) -> bool:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self.is_rank_guard(v) for v in test.values)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, right = test.left, test.comparators[0]
            zero = [s for s in (left, right) if isinstance(s, ast.Constant) and s.value == 0]
            other = right if zero and zero[0] is left else left
            if zero and isinstance(test.ops[0], (ast.Eq, ast.Is)) and self.rankish(other):
                return True
            # RANK in {-1, 0}: rank 0, or -1 for a run without a launcher (one process)
            return isinstance(test.ops[0], ast.In) and _rank_zero_set(right) and self.rankish(left)
        if isinstance(test, ast.Call):
            f = self.callee(test)
            if f is not None and f.rank_test:
                return True  # is_master(args): a function of the project returning a rank test
            return _last(test.func).lstrip("_") in MAIN_FLAGS and not test.args
        return isinstance(test, (ast.Name, ast.Attribute)) and _last(test).lstrip("_") in MAIN_FLAGS

    def is_rank_exit(self, test: ast.AST) -> bool:
        """``if rank != 0: return`` / ``if not is_main_process(): return``: the lines after it
        run on rank 0 only, as if under ``if rank == 0:``."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_rank_guard(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if _int(right) == 0 and isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt)):
                return self.rankish(left)
            if _int(left) == 0 and isinstance(op, (ast.NotEq, ast.IsNot, ast.Lt)):
                return self.rankish(right)
            if isinstance(op, ast.NotIn) and _rank_zero_set(right):
                return self.rankish(left)  # local_rank not in {-1, 0}: every rank but 0
        return False

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
        owner = (base_d or "").rpartition(".")[2]
        if COLLECTIVE_SAVES.get(owner) == last:  # Lightning's: every rank must call it
            return "save", f"{base_d}.{last}() (collective in Lightning)"
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
        """The function of this file, or of a module of the script's project, ``node`` calls
        (asked by several rules for one call: kept per call while the walk is inside a class)."""
        key = (id(node), self.class_stack[-1] if self.class_stack else None)
        if key not in self.callees:
            self.callees[key] = self._callee(node)
        return self.callees[key]

    def _callee(self, node: ast.Call) -> _Func | None:
        d = _dotted(node.func)
        if d is None:
            return None
        if d.startswith("self.") and d.count(".") == 1 and self.class_stack:
            return self.funcs.get(f"{self.class_stack[-1]}.{d[5:]}")
        f = self.funcs.get(d)
        if f is None and d.count(".") == 1:
            # model.save_networks(epoch) where model = Pix2Pix(opt): a method of a class here
            obj, meth = d.split(".")
            for v in self.values.get(obj, []):
                if isinstance(v, ast.Call) and f"{_last(v.func)}.{meth}" in self.funcs:
                    return self.funcs[f"{_last(v.func)}.{meth}"]
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
                yield from Context._functions(node.body, node.name)

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


def _rank_zero_set(node: ast.AST) -> bool:
    """``{-1, 0}``, ``[-1, 0]``, ``(0,)``: rank 0, or no launcher at all (-1)."""
    if not isinstance(node, (ast.Set, ast.List, ast.Tuple)) or not node.elts:
        return False
    values = {_int(e) for e in node.elts}
    return 0 in values and values <= {-1, 0}
