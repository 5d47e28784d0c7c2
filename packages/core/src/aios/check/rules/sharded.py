"""``AIOS6xx``: what hangs or diverges under ``strategy=fsdp|tp|hsdp`` (a forward, a collective
or a checkpoint on one rank only, also through the project's functions), and what every rank
writes at once (``torch.save``, ``download=True``)."""

from __future__ import annotations

import ast
import os

from aios.check.callgraph import Context
from aios.check.findings import BACKENDS, SHARDED
from aios.check.names import _dotted, _last, guarded_call
from aios.check.rules.base import CheckRule, Example

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


class RankGuarded(CheckRule):
    """A forward, a collective or a save inside a rank test, directly or through a function of
    the project that reaches one."""

    codes = ("AIOS601", "AIOS602", "AIOS603")
    nodes = (ast.Call,)
    wrong = (
        Example("if rank == 0:\n    out = model(x)\n", "AIOS601", 2, "every rank"),
        Example(
            "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n",
            "AIOS602",
            3,
            "rt.barrier()",
        ),
        Example(
            "def save(model):\n    return model.state_dict()\nif rank == 0:\n    save(net)\n",
            "AIOS603",
            4,
            "rt.save()",
        ),
        Example(  # Lightning's save_checkpoint holds a barrier: every rank must call it
            "if trainer.global_rank == 0:\n    trainer.save_checkpoint('last.ckpt')\n",
            "AIOS603",
            2,
            "rt.save()",
        ),
    )
    right = (
        "out = model(x)\nif rank == 0:\n    print(out)\n",
        "trainer.save_checkpoint('last.ckpt')\n",
        # rank 0 does a job while the others wait: each rank reaches one barrier
        "import torch.distributed as dist\nif rank not in (-1, 0):\n    dist.barrier()\n"
        "prepare()\nif rank == 0:\n    dist.barrier()\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if not ctx.guard_depth:
            return
        eff = ctx.effect(node, ctx.q)
        if eff and eff[0] == "collective" and self.paired(ctx, node):
            return
        if eff:
            code, msg = MESSAGES[eff[0]]
            strategies = SHARDED if eff[0] != "collective" else ("ddp", *SHARDED)
            ctx.add(node, code, f"{eff[1]} inside a rank test: {msg}", BACKENDS, strategies)
            return
        f = ctx.callee(node)
        if f is not None and f.kinds:
            kind = next(k for k in ("forward", "collective", "save") if k in f.kinds)
            code, msg = MESSAGES[kind]
            strategies = SHARDED if kind != "collective" else ("ddp", *SHARDED)
            ctx.add(
                node,
                code,
                f"{_dotted(node.func)}() inside a rank test reaches a {kind} "
                f"({os.path.basename(f.path or ctx.path)}:{f.kinds[kind]}): {msg}",
                BACKENDS,
                strategies,
            )

    @staticmethod
    def paired(ctx: Context, node: ast.Call) -> bool:
        """A barrier on rank 0 matched, in the same function, by one under a test true on every
        other rank (``if local_rank not in {-1, 0}: barrier()`` before the job, ``if local_rank
        == 0: barrier()`` after it): each rank reaches one barrier, nothing hangs."""
        if _last(node.func) != "barrier":
            return False

        def others(test: ast.AST) -> bool:
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                return any(others(v) for v in test.values)
            return ctx.is_rank_exit(test)

        scope = ctx.func_stack[-1].node if ctx.func_stack else ctx.tree
        return guarded_call(scope, others, "barrier")


class EveryRankSaves(CheckRule):
    """``torch.save`` reached without a rank test (directly, or in a function every call of
    which is outside one): every rank writes the same file at once."""

    codes = ("AIOS605",)
    nodes = (ast.Call,)
    wrong = (Example("import torch\ntorch.save(sd, 'ckpt.pt')\n", "AIOS605", 2, "rt.save()"),)
    right = (
        "import torch\ntorch.save(shard, f'model_rank{rank}.pt')\n",  # a file per rank
        "import torch\nif rank == 0:\n    torch.save(sd, 'ckpt.pt')\n",
        "import torch\ndef save(sd):\n    torch.save(sd, 'c.pt')\nif rank == 0:\n    save(sd)\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        """Record whether each call of a function of the file and each torch.save happens under
        a rank test."""
        assert isinstance(node, ast.Call)
        f = ctx.callee(node)
        if f is not None:
            ctx.call_guards.setdefault(f.key, []).append(bool(ctx.guard_depth))
        if ctx.q == "torch.save":
            path = node.args[1] if len(node.args) > 1 else None
            path = path or next((k.value for k in node.keywords if k.arg == "f"), None)
            if path is not None and ctx.rankish(path):
                return  # f"model_rank{rank}.pt": each rank writes a file of its own
            fn = ctx.func_stack[-1].key if ctx.func_stack else None
            ctx.saves.append((node, bool(ctx.guard_depth), fn))

    def finish(self, ctx: Context) -> None:
        for node, guarded, fn in ctx.saves:
            if guarded:
                continue
            if fn is not None:
                sites = ctx.call_guards.get(fn, [])
                if not sites or all(sites):
                    continue  # called only under a rank test (or not from this file)
            ctx.add(
                node,
                "AIOS605",
                "torch.save() on every rank: under aios-run --nprocs N each rank writes the same "
                "file at once; rt.save() writes once, atomically, and rt.resume() finds it",
                BACKENDS,
                ("ddp", *SHARDED),
            )


class DownloadEveryRank(CheckRule):
    """``download=True`` outside a rank test: every rank downloads into the same folder."""

    codes = ("AIOS606",)
    nodes = (ast.Call,)
    wrong = (Example("ds = MNIST('data', download=True)\n", "AIOS606", 1, "rt.is_local_main"),)
    right = ("if rank == 0:\n    ds = MNIST('data', download=True)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        dl = next((k.value for k in node.keywords if k.arg == "download"), None)
        if isinstance(dl, ast.Constant) and dl.value is True and not ctx.guard_depth:
            ctx.add(
                node,
                "AIOS606",
                "download=True on every rank: under aios-run --nprocs N each rank downloads "
                "into the same folder at once and may read a half-written file; download under "
                "`if rt.is_local_main:` then rt.barrier(), or before the run",
                BACKENDS,
                ("ddp", *SHARDED),
                when="races under aios-run --nprocs N",
            )
