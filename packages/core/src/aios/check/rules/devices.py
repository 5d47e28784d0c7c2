"""``AIOS1xx``: NVIDIA-only calls, device strings and GPU gates."""

from __future__ import annotations

import ast
import os

from aios.check.callgraph import Context
from aios.check.findings import NOT_CUDA
from aios.check.library import (
    ACCEL_MEMORY,
    CUDA_CALLS,
    CUDA_QUERIES,
    DEVICE_TOOLS,
    EXITS,
    GPU_LIST_NAMES,
    MEMORY_CALLS,
    NOOP_ELSEWHERE,
    RT_DEVICE,
    SHELL_CALLS,
    ZERO_ELSEWHERE,
)
from aios.check.names import _dotted, _int, _is_cuda_string, _last, _str
from aios.check.rules.base import CheckRule, Example


class CudaCalls(CheckRule):
    """``torch.cuda.*`` calls: what raises elsewhere (errors), what does nothing there (notes),
    statistics that read 0 (warnings). A device choice by ``is_available()`` is named at its test
    (once); a test that only guards CUDA-only lines is no finding."""

    codes = ("AIOS103", "AIOS104", "AIOS105", "AIOS106", "AIOS107", "AIOS108", "AIOS109")
    nodes = (ast.Call,)
    wrong = (
        Example("import torch\ntorch.cuda.set_device(0)\n", "AIOS103", 2, "rt.device"),
        Example("import torch\ntorch.cuda.synchronize()\n", "AIOS104", 2, "torch.accelerator"),
        Example("import torch\ntorch.cuda.manual_seed(1)\n", "AIOS107", 2, "seed", "note"),
        Example(
            "import torch\nd = 'cuda' if torch.cuda.is_available() else 'cpu'\n",
            "AIOS106",
            2,
            "rt.device",
        ),
        Example(
            "import torch\nprint(torch.cuda.max_memory_allocated())\n",
            "AIOS108",
            2,
            "run record",
            "warning",
        ),  # fmt: skip
        Example("import torch\ns = torch.cuda.Stream()\n", "AIOS109", 2, "torch.Stream"),
        Example(  # empty without CUDA: the lookup raises KeyError
            "import torch\nst = torch.cuda.memory_stats()\npeak = st['active_bytes.all.peak']\n",
            "AIOS108",
            2,
            "KeyError",
        ),
        Example(  # raises on a build without CUDA (AttributeError from torch._C)
            "import torch\ntorch.cuda.reset_max_memory_allocated()\n", "AIOS108", 2, "run record"
        ),
        Example(  # after the function's return when CUDA is absent: dead code elsewhere
            "import torch\ndef peak():\n    if not torch.cuda.is_available():\n"
            "        return None\n    return torch.cuda.max_memory_allocated()\n",
            "AIOS108",
            5,
            "run record",
            "note",
        ),
        Example("import torch\nworld = torch.cuda.device_count()\n", "AIOS105", 2, "rt.world_size"),
        Example(
            "import torch\nprint(torch.cuda.device_count())\n",
            "AIOS105",
            2,
            "rt.world_size",
            "note",
        ),  # fmt: skip
    )
    right = (
        "import torch\nif torch.cuda.is_available():\n    torch.backends.cuda.matmul.allow_tf32 = True\n",
        "import torch\nif torch.cuda.device_count() > 1:\n    model = DataParallel(model)\n",
        "import torch\nif cuda and torch.cuda.device_count() > 1:\n    model = DataParallel(model)\n",
        # 0 GPUs counts as one: workers per GPU, nothing divided by zero
        "import os, torch\nnd = torch.cuda.device_count()\nnw = min(8, os.cpu_count() // max(nd, 1))\n",
        # (a rank computed as rank % max(1, count) stays AIOS105: 0 GPUs make every rank 0)
        "import torch\nwith torch.cuda.amp.autocast():\n    pass\n",  # AMP: AIOS301's
        # is_initialized() answers False without CUDA: nothing raises
        "import torch\nif torch.cuda.is_available() and torch.cuda.is_initialized():\n    pass\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q = ctx.q
        if not q.startswith("torch.cuda.") or q.startswith("torch.cuda.amp"):
            return
        name = q.split(".")[-1]
        if name in ("is_available", "is_bf16_supported"):
            # a test that only guards CUDA-only lines is fine; one that picks a device or a
            # dtype is not (the lines it guards are notes)
            what = ctx.device_choices.get(id(node))
            if what:
                ctx.add(node, "AIOS106", f"{q}() {what}", NOT_CUDA, guardable=False)
            elif name == "is_bf16_supported":
                ctx.add(node, "AIOS106", f"{q}(): {CUDA_CALLS[name][1]}", NOT_CUDA)
        elif name in CUDA_QUERIES:
            return
        elif name in CUDA_CALLS:
            self.known(ctx, node, q, name)
        elif name in MEMORY_CALLS:
            zero = name in ZERO_ELSEWHERE
            if name == "memory_stats" and self.looked_up(ctx, node):
                ctx.add(
                    node,
                    "AIOS108",
                    f"{q}() is empty without CUDA, so looking a statistic up in it raises "
                    "KeyError: the run record has each rank's device memory; elsewhere "
                    f"{ACCEL_MEMORY.get(name, 'aios devices --json')}",
                    NOT_CUDA,
                )
                return
            ctx.add(
                node,
                "AIOS108",
                f"{q}(){' is 0 without CUDA' if zero else ''}: the run record has each "
                "rank's device memory (aios devices names the device); elsewhere "
                f"{ACCEL_MEMORY.get(name, 'aios devices --json')}",
                NOT_CUDA,
                level="warning" if zero else "error",
            )
        else:
            ctx.add(
                node,
                "AIOS109",
                f"{q}(): NVIDIA-only; torch.accelerator / torch.Stream / torch.Event are "
                'device-generic, or guard it with `if rt.backend == "cuda"`',
                NOT_CUDA,
            )

    @staticmethod
    def looked_up(ctx: Context, node: ast.Call) -> bool:
        """``torch.cuda.memory_stats()["active_bytes.all.peak"]``, directly or through the name
        it is assigned to."""
        up = ctx.parents.get(id(node))
        if isinstance(up, ast.Subscript) and up.value is node:
            return True
        if not (
            isinstance(up, ast.Assign)
            and len(up.targets) == 1
            and isinstance(up.targets[0], ast.Name)
        ):
            return False
        name = up.targets[0].id
        scope = ctx.func_stack[-1].node if ctx.func_stack else ctx.tree
        return any(
            isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == name
            for n in ast.walk(scope)
        )

    @staticmethod
    def harmless_count(ctx: Context, node: ast.Call) -> str:
        """How a ``torch.cuda.device_count()`` that breaks nothing elsewhere is used: only
        printed (0 is shown), or tested as ``if torch.cuda.device_count() > 1:`` (the branch is
        skipped); "" otherwise."""
        if ctx.only_shown(node):
            return "only shown"
        test = ctx.parents.get(id(node))
        holder = ctx.parents.get(id(test)) if test is not None else None
        whole = test
        while isinstance(holder, ast.BoolOp) and isinstance(holder.op, ast.And):
            whole, holder = holder, ctx.parents.get(id(holder))  # if cuda and count > 1:
        if (
            test is not None
            and isinstance(holder, (ast.If, ast.IfExp))
            and holder.test is whole
            and ctx.counts_gpus(test)
        ):
            return "a test"
        if CudaCalls.at_least_one(ctx, node):
            return "kept at least 1"
        return ""

    @staticmethod
    def at_least_one(ctx: Context, node: ast.Call) -> bool:
        """``nd = torch.cuda.device_count()`` used only as ``max(nd, 1)`` (workers per GPU):
        0 elsewhere counts as one; nothing divides by it."""

        def clamped(n: ast.AST) -> bool:
            up = ctx.parents.get(id(n))
            if not (
                isinstance(up, ast.Call)
                and _last(up.func) == "max"
                and any((_int(a) or 0) >= 1 for a in up.args)
            ):
                return False
            top: ast.AST = up  # rank % max(1, count): a rank computed from it is wrong elsewhere
            while isinstance(ctx.parents.get(id(top)), ast.expr):
                top = ctx.parents[id(top)]
            stmt = ctx.parents.get(id(top))
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            return not ctx.rankish(top) and not any(ctx.rankish(t) for t in targets)

        if clamped(node):
            return True
        stmt = ctx.parents.get(id(node))
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            return False
        name = stmt.targets[0].id
        scope = ctx.func_stack[-1].node if ctx.func_stack else ctx.tree
        uses = [
            n
            for n in ast.walk(scope)
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        ]
        return bool(uses) and all(clamped(n) for n in uses)

    @staticmethod
    def known(ctx: Context, node: ast.Call, q: str, name: str) -> None:
        code, repl, fix = CUDA_CALLS[name]
        # written as torch.cuda.x (the rename is safe only where the count is printed:
        # torch.accelerator.device_count() is 0 on CPU and XLA); a guard needs a line of its own
        ok = ctx.dotted == q and (
            fix == ""
            or fix == "guard"
            and id(node) in ctx.statement_calls
            or fix == "rename"
            and ctx.only_shown(node)
        )
        how = CudaCalls.harmless_count(ctx, node) if name == "device_count" else ""
        if how in ("a test", "kept at least 1"):
            return  # like is_available() guarding CUDA-only lines: the lines it guards are notes
        if how:
            # 0 without CUDA: shown as 0, or a branch skipped; nothing breaks
            ctx.add(
                node,
                code,
                f"{q}() is 0 without CUDA ({how} here, nothing breaks): {repl}",
                fix=fix if ok else "",
                level="note",
            )
        elif name in NOOP_ELSEWHERE:
            # runs everywhere, doing nothing without CUDA: nothing breaks
            ctx.add(
                node,
                code,
                f"{q}() does nothing without CUDA: {repl}",
                fix=fix if ok else "",
                level="note",
            )
        else:
            ctx.add(node, code, f"{q}(): {repl}", NOT_CUDA, fix=fix if ok else "")


class DotCuda(CheckRule):
    """``.cuda()`` on a tensor or module."""

    codes = ("AIOS102",)
    nodes = (ast.Call,)
    wrong = (Example("model = Net()\nmodel.cuda()\n", "AIOS102", 2, ".to(rt.device)"),)
    right = ("model = Net()\nmodel.to(rt.device)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if ctx.last == "cuda" and isinstance(node.func, ast.Attribute):
            if not ctx.q.startswith("torch"):
                ctx.add(
                    node,
                    "AIOS102",
                    ".cuda(): use .to(rt.device) (aios.init() picks each rank's device for the "
                    "backend aios-run selects)",
                    NOT_CUDA,
                )


def _gpu_item(node: ast.AST) -> bool:
    """``gpu_ids[0]``, ``opt.gpus[i]``: an item of a list of GPU indices."""
    if not isinstance(node, ast.Subscript):
        return False
    name = node.value.attr if isinstance(node.value, ast.Attribute) else _dotted(node.value)
    return name in GPU_LIST_NAMES


class DeviceStrings(CheckRule):
    """A CUDA device by string (``"cuda"``, ``f"cuda:{i}"``), a rank used as a device index, or
    a CUDA string a caller hands a function of the script that places tensors with it."""

    codes = ("AIOS101",)
    nodes = (ast.Call, ast.Assign, ast.AnnAssign)
    wrong = (
        Example("import torch\nx = torch.zeros(2, device='cuda')\n", "AIOS101", 2, "rt.device"),
        Example("device = 'cuda:0'\n", "AIOS101", 1, "rt.device"),
        Example("x = x.to(local_rank)\n", "AIOS101", 1, "rt.device"),
        Example("net.to(opt.gpu_ids[0])\n", "AIOS101", 1, "rt.device"),
        Example(
            "m = Auto.from_pretrained(n, device_map={'': acc.local_process_index})\n",
            "AIOS101",
            1,
            "rt.device",
        ),
        Example(
            "def train(m, device):\n    m.to(device)\n\ntrain(net, 'cuda')\n",
            "AIOS101",
            4,
            "rt.device",
        ),
    )
    right = (
        "x = x.to(rt.device)\n",
        "import torch\nd = 'cuda' if torch.cuda.is_available() else 'cpu'\n",  # AIOS106's
        "g = torch.Generator(device='cuda')\n",  # AIOS411's
        "net.to(devices[0])\n",  # a list of devices, not of indices
        # the choice is named where `cuda` is assigned (AIOS106)
        "import torch\ncuda = torch.cuda.is_available()\nd = torch.device('cuda:0' if cuda else 'cpu')\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            if (
                value is not None
                and _is_cuda_string(value)
                and not (isinstance(value, ast.IfExp) and ctx.cuda_test(value.test))
            ):  # ``"cuda" if <CUDA test> else "cpu"``: a choice, named at its test (AIOS106)
                ctx.add(value, "AIOS101", f"device string 'cuda...': {RT_DEVICE}", NOT_CUDA)
            return
        assert isinstance(node, ast.Call)
        q, last = ctx.q, ctx.last
        if last in ("Generator", "autocast") or q.endswith("GradScaler"):
            return
        positional = q in ("torch.device", "torch.set_default_device") or last in ("to",)
        args = [a for a in node.args if positional] + [
            k.value for k in node.keywords if k.arg in ("device", "map_location", "device_type")
        ]
        mapped = [  # device_map={"": accelerator.local_process_index}: a CUDA index
            v
            for k in node.keywords
            if k.arg == "device_map" and isinstance(k.value, ast.Dict)
            for v in k.value.values
            if isinstance(v, (ast.Name, ast.Attribute)) and ctx.rankish(v)
        ]
        args = [  # "cuda:0" if cuda else "cpu", cuda = torch.cuda.is_available(): named there
            a
            for a in args
            if not (
                isinstance(a, ast.IfExp)
                and not ctx.cuda_available_calls(a.test)
                and ctx.named_cuda_calls(a.test)
            )
        ]
        if any(_is_cuda_string(a) for a in args) and id(node) not in ctx.choice_values:
            ctx.add(node, "AIOS101", f"device 'cuda...': {RT_DEVICE}", NOT_CUDA)
        elif mapped:
            ctx.add(
                mapped[0],
                "AIOS101",
                f"device_map places the model on {ast.unparse(mapped[0])}, a rank, which as a "
                f"device is a CUDA index: device_map={{'': rt.device}}; {RT_DEVICE}",
                NOT_CUDA,
            )
        elif self.passed_in(ctx, node):
            pass
        else:
            ranks = [
                a
                for a in (node.args[:1] if last == "to" else [])
                + [k.value for k in node.keywords if k.arg == "device"]
                if isinstance(a, (ast.Name, ast.Attribute)) and ctx.rankish(a) or _gpu_item(a)
            ]
            if ranks:
                ctx.add(
                    node,
                    "AIOS101",
                    f"{'a rank as the device' if not _gpu_item(ranks[0]) else 'a GPU index'} "
                    f"({ast.unparse(ranks[0])}) means a CUDA device index: {RT_DEVICE}",
                    NOT_CUDA,
                )

    @staticmethod
    def passed_in(ctx: Context, node: ast.Call) -> bool:
        """A CUDA device a caller hands a function of the script, which places tensors with it
        (the caller's value, followed into the function)."""
        f = ctx.callee(node)
        if f is None or f.path != ctx.path:
            return False
        a = f.node.args
        params = [p.arg for p in [*a.posonlyargs, *a.args]]
        if f.cls and params and params[0] in ("self", "cls"):
            params = params[1:]
        given = dict(zip(params, node.args, strict=False))
        given.update({k.arg: k.value for k in node.keywords if k.arg})
        for name, value in given.items():
            if not _is_cuda_string(value) or name not in ctx.device_params(f):
                continue
            ctx.add(
                value,
                "AIOS101",
                f"device {_str(value) or ast.unparse(value)!r} passed to {f.key}() as {name}, "
                f"which places tensors with it: {RT_DEVICE}",
                NOT_CUDA,
            )
            return True
        return False


class GpuGate(CheckRule):
    """``assert torch.cuda.is_available()`` and ``if not <enough GPUs>: sys.exit()``: the script
    ends before training elsewhere (also through a function whose caller hands it a CUDA count)."""

    codes = ("AIOS118",)
    nodes = (ast.Assert, ast.If)
    wrong = (
        Example("import torch\nassert torch.cuda.is_available()\n", "AIOS118", 2, "rt.device"),
        Example(
            "import torch\nif device_type == 'cuda':\n    assert torch.cuda.is_available()\n",
            "AIOS118",
            3,
            "rt.device",
            "note",
        ),
        Example(
            "import sys, torch\nif torch.cuda.device_count() < 2:\n    sys.exit(1)\n",
            "AIOS118",
            2,
            "rt.world_size",
        ),
    )
    right = ("import torch\nif torch.cuda.is_available():\n    print('gpu')\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, ast.Assert):
            if ctx.cuda_test(node.test) == 1 or any(
                isinstance(sub, ast.Call)
                and ctx.call_qual(sub) in ("torch.cuda.device_count", "torch.cuda.is_available")
                for sub in ast.walk(node.test)
            ):
                ctx.add(
                    node,
                    "AIOS118",
                    "asserts a GPU: elsewhere the script stops before training; drop it (aios-run "
                    "gives each rank a device of the selected backend: rt.device)",
                    NOT_CUDA,
                )  # under the script's own CUDA test (``if device_type == "cuda":``): a note
        elif isinstance(node, ast.If):
            self.gate(ctx, node, ctx.cuda_test(node.test))

    @staticmethod
    def gpu_via_callers(ctx: Context, names: set[str]) -> list[ast.Call]:
        """def check_sizes(batch, world_size): if world_size < 1: raise ...; called with
        world_size = torch.cuda.device_count(): the caller's value makes it a GPU gate"""
        if not ctx.func_stack:
            return []
        return [
            call
            for n in names
            for call, value in ctx.caller_values(ctx.func_stack[-1], n)
            if any(
                isinstance(sub, ast.Call) and ctx.call_qual(sub).startswith("torch.cuda.")
                for sub in ast.walk(value)
            )
        ]

    def gate(self, ctx: Context, node: ast.If, cuda: int) -> None:
        test = node.test
        names = {
            ctx.qual(sub) or _dotted(sub) or ""
            for sub in ast.walk(test)
            if isinstance(sub, (ast.Name, ast.Attribute))
        }
        accel = {"torch.accelerator.device_count", "torch.accelerator.is_available"} & names
        gpu = cuda != 0 or any(
            "gpu" in n.lower().split(".")[-1] or n.startswith("torch.cuda.") for n in names
        )
        via: list[ast.Call] = []  # calls that hand the gate a CUDA count
        if not gpu:
            via = self.gpu_via_callers(ctx, names)
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
        for stmt in node.body if negative else node.orelse:
            if isinstance(stmt, ast.Raise) or (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and (ctx.call_qual(stmt.value) or _dotted(stmt.value.func)) in EXITS
            ):
                sites: list[ast.AST] = list(via) or [node]  # via a parameter: at the call
                for at in sites:
                    how = f" ({os.path.basename(ctx.path)}:{node.lineno})" if via else ""
                    ctx.add(
                        at,
                        "AIOS118",
                        f"exits when it finds no GPU (or too few){how}: elsewhere the script ends "
                        "before training; drop the gate (aios-run --nprocs N gives each rank a "
                        "device of the selected backend) or test rt.world_size",
                        NOT_CUDA if gpu else ("cpu", "xla"),
                        guardable=False,
                    )
                return


class TorchLoad(CheckRule):
    """``torch.load`` without ``map_location``."""

    codes = ("AIOS113",)
    nodes = (ast.Call,)
    wrong = (Example("import torch\nsd = torch.load('ckpt.pt')\n", "AIOS113", 2, "map_location"),)
    right = (
        "import torch\nsd = torch.load('ckpt.pt', map_location='cpu')\n",
        "import torch\nsd = torch.load(path, **kwargs)\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if (
            ctx.q == "torch.load"
            and not any(k.arg == "map_location" for k in node.keywords)
            and len(node.args) < 2
            and all(k.arg is not None for k in node.keywords)  # **kwargs may carry it
        ):
            ctx.add(
                node,
                "AIOS113",
                "torch.load() without map_location puts each tensor back on the device it was "
                "saved from: a checkpoint written on a GPU fails to load on cpu, xla, tpu, "
                "neuron; map_location='cpu' (or rt.load / rt.resume, which place it)",
                NOT_CUDA,
            )


class PinMemory(CheckRule):
    """``pin_memory=True``: a loader's is a note (torch warns and pins nothing off CUDA); a
    tensor's raises there (no pinned memory allocator)."""

    codes = ("AIOS112",)
    nodes = (ast.Call, ast.Dict)
    wrong = (
        Example("import torch\nx = torch.empty(4, pin_memory=True)\n", "AIOS112", 2, "rt.backend"),
        Example("dl = DataLoader(ds, pin_memory=True)\n", "AIOS112", 1, "rt.backend", "note"),
        Example("kw = {'pin_memory': True}\n", "AIOS112", 1, "rt.backend", "note"),
    )
    right = (
        "import torch\ndl = DataLoader(ds, pin_memory=torch.accelerator.is_available())\n",
        "import torch\nif torch.accelerator.is_available():\n    kw = {'pin_memory': True}\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        if ctx.accel_guard:
            return
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if _str(k) == "pin_memory" and isinstance(v, ast.Constant) and v.value is True:
                    ctx.add(
                        v,
                        "AIOS112",
                        "'pin_memory': True for a DataLoader pins host memory for copies to an "
                        "accelerator: on CPU and under torch_xla torch warns and pins nothing "
                        "(nothing breaks); pin only when rt.backend == 'cuda'",
                        level="note",
                    )
            return
        assert isinstance(node, ast.Call)
        pin = next((k.value for k in node.keywords if k.arg == "pin_memory"), None)
        if not (isinstance(pin, ast.Constant) and pin.value is True):
            return
        q = ctx.q
        if q.startswith("torch.") and not q.startswith("torch.utils"):
            ctx.add(
                pin,
                "AIOS112",
                f"{q}(pin_memory=True) needs a CUDA (or other torch.accelerator) device: on "
                "CPU and under torch_xla it raises (no pinned memory allocator); pin only "
                "when rt.backend == 'cuda'",
                ("cpu", "xla"),
            )
        else:
            ctx.add(
                pin,
                "AIOS112",
                "pin_memory=True pins host memory for copies to an accelerator: on CPU and "
                "under torch_xla torch warns and pins nothing (nothing breaks); "
                "rt.setup(loader) keeps the loader's setting, so pin only when "
                "rt.backend == 'cuda'",
                level="note",
            )


class DeviceTools(CheckRule):
    """NVIDIA tools run in a subprocess; FP8 matmuls; kernels loaded from the Hub."""

    codes = ("AIOS117", "AIOS115", "AIOS502")
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import subprocess\nsubprocess.run(['nvidia-smi'])\n", "AIOS117", 2, "aios devices"
        ),  # fmt: skip
        Example("import torch\ny = torch._scaled_mm(a, b)\n", "AIOS115", 2, "bf16"),
        Example(
            "from kernels import get_kernel\nk = get_kernel('x/y')\n",
            "AIOS502",
            2,
            "scaled_dot_product_attention",
        ),  # fmt: skip
    )
    right = ("import subprocess\nsubprocess.run(['ls'])\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q = ctx.q
        if q in SHELL_CALLS or q.startswith("subprocess."):
            for sub in ast.walk(node):
                text = _str(sub)
                if text and text.split(" ")[0] in DEVICE_TOOLS:
                    ctx.add(
                        node,
                        "AIOS117",
                        f"runs {text.split(' ')[0]}, an NVIDIA tool: it is missing elsewhere "
                        "(FileNotFoundError); `aios devices` or the run record describe every "
                        "backend's devices",
                        NOT_CUDA,
                    )
                    break
        if q in ("torch._scaled_mm", "torch._scaled_grouped_mm"):
            ctx.add(
                node,
                "AIOS115",
                f"{q}() is an FP8 matmul with kernels for CUDA (and a slow reference on CPU): "
                "XLA, TPU and Trainium stacks have none; keep a bf16 path (precision=bf16-mixed) "
                "for them",
                ("xla", "tpu", "neuron"),
            )
        if q.endswith("get_kernel") and q.split(".")[0] in ("kernels", "huggingface_hub"):
            ctx.add(
                node,
                "AIOS502",
                f"{_dotted(node.func)}() loads a prebuilt kernel from the Hub (built for CUDA): "
                "use torch.nn.functional.scaled_dot_product_attention / plain torch ops elsewhere",
                NOT_CUDA,
            )
