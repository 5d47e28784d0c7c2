"""An `aios check` rule from outside the aios tree: CUDA graphs captured by the script
(``torch.cuda.graph(g)`` as a context, ``torch.cuda.make_graphed_callables``) exist only on
NVIDIA GPUs. Core names them as NVIDIA-only calls (AIOS109); this rule adds what to do instead.

See https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs (CUDA graphs are a CUDA feature).
"""

from __future__ import annotations

import ast

from aios.check import CheckRule, Example
from aios.check.callgraph import Context
from aios.plugins.hookspecs import hookimpl


class CudaGraphs(CheckRule):
    codes = ("XCG001",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\ng = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    y = f(x)\n",
            "XCG001",
            3,
            'mode="reduce-overhead"',
        ),
    )
    right = ("import torch\nf = torch.compile(f)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if ctx.q in ("torch.cuda.graph", "torch.cuda.make_graphed_callables"):
            ctx.add(
                node,
                "XCG001",
                f"{ctx.q}() captures a CUDA graph, which only NVIDIA GPUs replay: use "
                'torch.compile(f, mode="reduce-overhead") (it uses CUDA graphs where they exist)',
                ("cpu", "xla", "tpu", "neuron"),
            )


@hookimpl
def aios_check_rules() -> list[type[CheckRule]]:
    return [CudaGraphs]
