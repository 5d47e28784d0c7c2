"""What Trainium cannot run, as ``aios check`` rules: contributed through the ``aios_check_rules``
hook, so ``aios check`` names them beside core's rules, and the launch plan for ``--backend
neuron`` turns the findings that break on neuron into plan notes (``--dry-run`` shows them).

What core's rules already name is not repeated here (device-only packages, fp16, fused
optimizers, device generators, torch.cuda calls, the launcher's world overwritten, the removed
XLA_USE_BF16 switch): the plan reads core's and these together.
"""

from __future__ import annotations

import ast

from aios.check import CheckRule, Example
from aios.check.callgraph import Context
from aios.check.names import _dotted

ON_NEURON = ("neuron",)
XLA_RUNTIME_ONLY = "AIOS423"  # torch.compile: breaks only under torch-neuronx's XLA runtime


class Float64(CheckRule):
    """float64 (``torch.float64``, ``torch.double``, ``.double()``): NeuronCores have none, so
    it runs there in lower precision or on the host (a warning: the same math on the CPU, as in a
    metric, is fine; the reading cannot tell where the tensor lives)."""

    codes = ("AIOS421",)
    nodes = (ast.Attribute, ast.Call)
    wrong = (
        Example(
            "import torch\nx = torch.ones(2, dtype=torch.float64)\n",
            "AIOS421",
            2,
            "keep float64 math on the CPU",
            "warning",
        ),
        Example("y = x.double()\n", "AIOS421", 1, "keep fp32", "warning"),
    )
    right = ("import torch\nx = torch.ones(2, dtype=torch.float32)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "double" and not node.args:
                ctx.add(
                    node,
                    "AIOS421",
                    ".double() casts to float64, which NeuronCores do not have: keep fp32 (or "
                    ".to(torch.bfloat16)) on the device, keep float64 math on the CPU",
                    ON_NEURON,
                    level="warning",
                )
        elif ctx.qual(node) in ("torch.float64", "torch.double"):
            ctx.add(
                node,
                "AIOS421",
                f"uses {_dotted(node)}: NeuronCores have no float64; keep float64 math on the "
                "CPU (or fp32 on the device)",
                ON_NEURON,
                level="warning",
            )


class ComplexDtypes(CheckRule):
    """Complex dtypes (rotary embeddings through ``torch.view_as_complex``): not on Neuron."""

    codes = ("AIOS422",)
    nodes = (ast.Attribute,)
    wrong = (
        Example(
            "import torch\nz = torch.view_as_complex(x)\n",
            "AIOS422",
            2,
            "real-valued rotary embeddings",
        ),
    )
    right = ("import torch\nz = torch.view_as_real(x)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        q = ctx.qual(node)
        if q in ("torch.complex64", "torch.complex128", "torch.view_as_complex"):
            ctx.add(
                node,
                "AIOS422",
                f"uses {_dotted(node)}: complex dtypes are not supported on Neuron; use "
                "real-valued rotary embeddings (cos/sin tables)",
                ON_NEURON,
            )


class CompileOnXlaRuntime(CheckRule):
    """``torch.compile`` under torch-neuronx's XLA runtime (Trn1): not supported there (XLA
    compiles the graph already); TorchNeuron (native) compiles with ``backend="neuron"``."""

    codes = (XLA_RUNTIME_ONLY,)
    nodes = (ast.Call,)
    wrong = (Example("import torch\nm = torch.compile(m)\n", XLA_RUNTIME_ONLY, 2, "remove it"),)
    right = ("import torch\nm = torch.compile(m, backend='neuron')\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if ctx.q != "torch.compile":
            return
        backend = next((k.value for k in node.keywords if k.arg == "backend"), None)
        if isinstance(backend, ast.Constant) and backend.value == "neuron":
            return
        ctx.add(
            node,
            XLA_RUNTIME_ONLY,
            "torch.compile(...) is not supported by torch-neuronx on the XLA runtime (XLA "
            'compiles the graph already): remove it there; on TorchNeuron use backend="neuron"',
            ON_NEURON,
        )


NEURON_RULES: tuple[type[CheckRule], ...] = (Float64, ComplexDtypes, CompileOnXlaRuntime)
