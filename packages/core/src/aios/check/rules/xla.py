"""``AIOS4xx``: torch_xla / torch-neuronx APIs, and what XLA devices cannot run (fused
optimizers, device generators, inductor, removed bf16 switches); ``AIOS5xx``: device-only
packages."""

from __future__ import annotations

import ast

from aios.check.callgraph import Context
from aios.check.findings import BACKENDS, NOT_CUDA, NOT_XLA, XLA_ONLY_BREAKS
from aios.check.library import DEVICE_PACKAGES, XLA_REPLACEMENTS, XLA_RUNTIME_START
from aios.check.names import _is_cuda_string, _str
from aios.check.rules.base import CheckRule, Example

NOT_NEURON = ("cpu", "cuda", "xla", "tpu")


class XlaImports(CheckRule):
    """torch_xla and Neuron's XLA stack imported by the script."""

    codes = ("AIOS401",)
    nodes = (ast.Import, ast.ImportFrom)
    wrong = (
        Example("import torch_xla.core.xla_model as xm\n", "AIOS401", 1, "rt.device"),
        Example("import torch_neuronx\n", "AIOS401", 1, "aios-run --backend neuron"),
    )
    right = ("try:\n    import torch_xla\nexcept ImportError:\n    torch_xla = None\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, (ast.Import, ast.ImportFrom))
        for mod in imported(node):
            top = mod.split(".")[0]
            if top == "torch_xla":
                ctx.add(
                    node,
                    "AIOS401",
                    f"imports {mod}: torch_xla runs only on --backend xla; the aios runtime "
                    "(rt.device, rt.setup, rt.step) covers it, `aios-run --backend xla` needs no "
                    "torch_xla in the script",
                    NOT_XLA,
                )
            elif top in ("torch_neuronx", "neuronx_distributed", "libneuronxla"):
                ctx.add(
                    node,
                    "AIOS401",
                    f"imports {mod}: Neuron's XLA stack only (Trn1); `aios-run --backend neuron` "
                    "runs the script as written (tensor parallel: strategy=tp or mesh.tp=N)",
                    NOT_NEURON,
                )


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (none for a relative import)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [node.module or ""] if not node.level else []


class DevicePackages(CheckRule):
    """A device-only package (flash_attn, bitsandbytes, apex, triton, deepspeed, ...), named once
    per file at its first import; Triton kernel modules by their name."""

    codes = ("AIOS501",)
    nodes = (ast.Import, ast.ImportFrom)
    wrong = (
        Example(
            "import flash_attn\nfrom flash_attn import f\n",
            "AIOS501",
            1,
            "scaled_dot_product_attention",
        ),
        Example("import triton_kernels\n", "AIOS501", 1, "torch.compile"),
    )
    right = ("try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, (ast.Import, ast.ImportFrom))
        for mod in imported(node):
            top = mod.split(".")[0]
            if top in ("torch_xla", "torch_neuronx", "neuronx_distributed", "libneuronxla"):
                continue
            if "triton" in top and top != "triton":
                ctx.add(
                    node,
                    "AIOS501",
                    f"imports {top}, Triton GPU kernels (by its name): Triton builds for NVIDIA "
                    "and AMD GPUs only; keep a plain-torch path (torch.compile generates kernels "
                    "for each backend)",
                    NOT_CUDA,
                )
            elif top in DEVICE_PACKAGES and top not in ctx.packages_named:
                # one finding per cause: the package, at its first import in the file
                ctx.packages_named.add(top)
                repl, backends = DEVICE_PACKAGES[top]
                ctx.add(
                    node,
                    "AIOS501",
                    f"imports {top}, a device-only package: use {repl}; or import it in a "
                    "try/except ImportError with a portable fallback",
                    backends,
                )


class XlaCalls(CheckRule):
    """torch_xla / torch-neuronx / neuronx-distributed calls, with the aios form of each; the
    XLA runtime started at import time (before xmp.spawn's workers exist)."""

    codes = ("AIOS402", "AIOS403", "AIOS404", "AIOS405", "AIOS406", "AIOS407", "AIOS408",
             "AIOS409")  # fmt: skip
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch_xla.core.xla_model as xm\ndev = xm.xla_device()\n",
            "AIOS402",
            2,
            "rt.device",
        ),  # fmt: skip
        Example(
            "import torch_xla.core.xla_model as xm\ndef f():\n    xm.mark_step()\n",
            "AIOS404",
            3,
            "rt.step(opt)",
        ),
        Example(
            "import torch_xla.distributed.xla_multiprocessing as xmp\nxmp.spawn(f)\n",
            "AIOS403",
            2,
            "aios-run --backend xla --nprocs N",
        ),
    )
    right = ("x = rt.device\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        q = ctx.q
        if not q.startswith(("torch_xla", "torch_neuronx", "neuronx_distributed")):
            return
        name = q.split(".")[-1]
        if ctx.module_level and name in XLA_RUNTIME_START and q.startswith("torch_xla"):
            ctx.add(
                node,
                "AIOS402",
                f"{q}() at import time starts the XLA runtime in the parent process: xmp.spawn "
                'then fails with "Runtime is already initialized"; call it inside the '
                "training function, or use rt.device after aios.init()",
                BACKENDS,
            )
        elif q.startswith("torch_xla") and name in XLA_REPLACEMENTS:
            code, repl = XLA_REPLACEMENTS[name]
            ctx.add(node, code, f"{q}(): use {repl}", BACKENDS if code == "AIOS403" else NOT_XLA)
        elif q.startswith("neuronx_distributed"):
            ctx.add(
                node,
                "AIOS409",
                f"{q}(): neuronx-distributed is Trn1's legacy stack; use strategy=tp / mesh.tp=N "
                "(every native device) or strategy=nxd on --backend neuron",
                NOT_NEURON,
            )
        elif q.startswith("torch_neuronx"):
            ctx.add(
                node,
                "AIOS409",
                f"{q}(): torch-neuronx only; for training, `aios-run --backend neuron` runs the "
                'script as written (torch.compile(backend="neuron") on TorchNeuron)',
                NOT_NEURON,
            )
        else:
            ctx.add(
                node,
                "AIOS409",
                f"{q}(): torch_xla only; the aios runtime covers placement, stepping and "
                "collectives on every backend (rt.device, rt.step, rt.all_reduce)",
                NOT_XLA,
            )


class XlaCannotRun(CheckRule):
    """What XLA devices cannot run: fused optimizer kernels, device generators; the removed
    XLA_USE_BF16 / XLA_DOWNCAST_BF16 switches."""

    codes = ("AIOS410", "AIOS411", "AIOS412")
    nodes = (ast.Call, ast.Constant)
    wrong = (
        Example(
            "import torch\nopt = torch.optim.AdamW(p, fused=True)\n", "AIOS410", 2, "drop it"
        ),  # fmt: skip
        Example(
            "import torch\ng = torch.Generator(device='xla')\n",
            "AIOS411",
            2,
            "CPU torch.Generator()",
        ),  # fmt: skip
        Example("import os\nos.environ['XLA_USE_BF16'] = '1'\n", "AIOS412", 2, "bf16-true"),
    )
    right = ("import torch\ng = torch.Generator()\nopt = torch.optim.AdamW(p)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if node.value in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
                ctx.add(
                    node,
                    "AIOS412",
                    f"{node.value} was removed from torch_xla/torch-neuronx: use "
                    "precision=bf16-true (aios-run --precision bf16-true)",
                    BACKENDS,
                )
            return
        assert isinstance(node, ast.Call)
        q, last = ctx.q, ctx.last
        if any(
            k.arg == "fused" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        ):
            ctx.add(
                node,
                "AIOS410",
                f"{ctx.dotted or last}(fused=True): fused optimizer kernels do not exist for XLA "
                "devices; drop it (the cuda backend picks fused kernels itself: "
                "cuda.fused_optimizer=true)",
                XLA_ONLY_BREAKS,
                fix="drop-fused",
            )
        if q == "torch.Generator" or last == "Generator" and q.startswith("torch"):
            dev = next((k.value for k in node.keywords if k.arg == "device"), None)
            dev = dev if dev is not None else (node.args[0] if node.args else None)
            if dev is not None and _str(dev) != "cpu":
                ctx.add(
                    node,
                    "AIOS411",
                    "torch.Generator on a device: XLA devices have none; use a CPU "
                    "torch.Generator() (data order from the CPU is the same on every backend)",
                    NOT_CUDA if _is_cuda_string(dev) else XLA_ONLY_BREAKS,
                )


class Compile(CheckRule):
    """torch.compile with inductor (its default) or another CUDA/CPU backend: XLA, TPU and
    Trainium need their own; ``@torch.compile`` too."""

    codes = ("AIOS413",)
    nodes = (ast.Call, ast.FunctionDef, ast.AsyncFunctionDef)
    wrong = (
        Example("import torch\nm = torch.compile(m)\n", "AIOS413", 2, "openxla"),
        Example(
            "import torch\n@torch.compile\ndef f(x):\n    return x\n", "AIOS413", 2, "openxla"
        ),  # fmt: skip
        Example(
            "import os, torch\nm = torch.compile(m, backend=os.environ.get('B', 'inductor'))\n",
            "AIOS413",
            2,
            "rt.backend",
        ),
    )
    right = ("import torch\nm = torch.compile(m, backend=choose(rt.backend))\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if not isinstance(d, ast.Call) and ctx.qual(d) == "torch.compile":
                    self.judge(ctx, d, {})
        elif isinstance(node, ast.Call) and ctx.q == "torch.compile":
            self.judge(ctx, node, {k.arg: k.value for k in node.keywords if k.arg})

    @staticmethod
    def judge(ctx: Context, node: ast.AST, kw: dict[str, ast.expr]) -> None:
        chosen = ctx.resolve(kw.get("backend"))
        if (
            isinstance(chosen, ast.Call)
            and ctx.call_qual(chosen) in ("os.environ.get", "os.getenv")
            and len(chosen.args) == 2
        ):
            chosen = chosen.args[1]  # backend=os.environ.get("COMPILE_BACKEND", "inductor")
        backend = _str(chosen)
        if backend is None and "backend" not in kw:
            ctx.add(
                node,
                "AIOS413",
                "torch.compile() with its default backend (inductor) cannot compile torch_xla "
                "tensors: under --backend xla pass backend='openxla' (e.g. backend='openxla' if "
                "rt.backend == 'xla' else 'inductor')",
                ("xla",),
            )
        elif backend in ("inductor", "cudagraphs", "tensorrt", "torch_tensorrt"):
            ctx.add(
                node,
                "AIOS413",
                f"torch.compile(backend={backend!r}) compiles for CUDA/CPU kernels: XLA, TPU "
                "and Trainium need their own backend ('openxla', 'tpu', 'neuron'); choose it "
                "by rt.backend",
                ("xla", "tpu", "neuron"),
            )
