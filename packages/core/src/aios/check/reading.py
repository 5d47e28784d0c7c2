"""Name and value resolution for ``aios check``: what each name of a file refers to through its
imports and scopes, what the script assigns (models, ranks, aios runtimes, argparse defaults),
and which tests run only with CUDA, with an accelerator, or for fp16. The rules read a file
through this (:class:`aios.check.callgraph.Context`); they never walk scopes themselves."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from aios.check.findings import BACKENDS, Finding
from aios.check.library import FP16_NAMES, MODEL_NAME, RANK_ATTRS, RANK_CALLS
from aios.check.names import (
    _dotted,
    _imports,
    _int,
    _is_cuda_string,
    _is_ema,
    _last,
    _local_names,
    _str,
)


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
    # the project's world size is the launcher's: assigned (or passed as world_size=) from
    # WORLD_SIZE read in the environment, directly or through a function of the project
    env_world: bool = False
    config_device: bool = False  # a loaded config sets the device (detectron2's MODEL.DEVICE too)


class Reading:
    """One file's names and values, and the state of the walk (the guards the walker is
    inside); :meth:`add` records a finding once per line and code."""

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
        # the call the walker is at, for the rules: qualified name, last name, dotted as written
        self.q = self.last = self.dotted = ""
        self.callees: dict[tuple[int, str | None], _Func | None] = {}  # Context.callee's answers

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

    def named_cuda_calls(self, test: ast.AST) -> list[ast.Call]:
        """``torch.cuda.is_available()`` reached through a name the test reads, assigned once
        (``cuda = not cpu and torch.cuda.is_available()`` ... ``"cuda:0" if cuda else "cpu"``)."""
        out: list[ast.Call] = []
        for sub in ast.walk(test):
            vals = self.values.get(sub.id, []) if isinstance(sub, ast.Name) else []
            if len(vals) == 1:
                out += self.cuda_available_calls(vals[0])
        return out

    def note_device_choice(self, node: ast.IfExp | ast.If) -> None:
        """``torch.cuda.is_available()`` that chooses a value (a device, a dtype): what it picks
        without CUDA. One that only guards CUDA-only lines is no finding (they are notes)."""
        calls = self.cuda_available_calls(node.test) or self.named_cuda_calls(node.test)
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
        elif not node.orelse and self.moves_model_to_cuda(node.body):
            what = "moves the model to CUDA only with CUDA: on a TPU or Trainium it is False and "
            what += "the model stays on the host CPU; rt.setup(model) places it on rt.device"
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

    def moves_model_to_cuda(self, body: list[ast.stmt]) -> bool:
        """``model.to("cuda")`` / ``model.cuda()`` as a statement of ``body``."""
        for stmt in body:
            call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            to_cuda = call.func.attr == "cuda" or (
                call.func.attr == "to" and any(_is_cuda_string(a) for a in call.args[:1])
            )
            name = _dotted(call.func.value) or ""
            if to_cuda and MODEL_NAME.match(name.rpartition(".")[2]):
                return True
        return False

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
            # what the function returns after the test (``if mps: return "mps"`` between)
            fallback += body[body.index(node) + 1 :]
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
        if self.counts_gpus(test):
            return 1  # torch.cuda.device_count() > 1: 0 elsewhere, the branch never runs
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

    def counts_gpus(self, test: ast.AST) -> bool:
        """``torch.cuda.device_count() > N`` (N >= 0), ``>= N`` (N >= 1), ``!= 0``: true only
        with CUDA (the count is 0 elsewhere)."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            return False
        left, op, n = test.left, test.ops[0], _int(test.comparators[0])
        return (
            isinstance(left, ast.Call)
            and self.call_qual(left) == "torch.cuda.device_count"
            and n is not None
            and (
                isinstance(op, ast.Gt)
                and n >= 0
                or isinstance(op, ast.GtE)
                and n >= 1
                or isinstance(op, ast.NotEq)
                and n == 0
            )
        )

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

    def prepass(self) -> None:
        assigns: list[ast.Assign | ast.AnnAssign] = []
        choices: list[ast.IfExp | ast.If] = []  # read once every name's value is known
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        self.values.setdefault(t.id, []).append(node.value)
            if isinstance(node, (ast.IfExp, ast.If)):
                choices.append(node)
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
        for choice in choices:
            self.note_device_choice(choice)
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

    def param_default(self, node: ast.AST | None) -> ast.expr | None:
        """The default of the enclosing function's parameter ``node`` names (``def
        init(backend="nccl"): ... init_process_group(backend)``), when no caller in this file
        passes another value."""
        if not (isinstance(node, ast.Name) and self.func_stack):
            return None
        f = self.func_stack[-1]
        a = f.node.args
        positional = [*a.posonlyargs, *a.args]
        pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
        pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
        default = next((d for p, d in pairs if p.arg == node.id), None)
        if default is None or self.caller_values(f, node.id):
            return None
        return default

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
