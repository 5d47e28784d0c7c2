"""``AIOS2xx``: process groups, wrappers and launchers named for one device, the launcher's
world read or overwritten, libraries' own launchers and device defaults."""

from __future__ import annotations

import ast
import os

from aios.check.callgraph import Context
from aios.check.findings import BACKENDS, NOT_CUDA, NOT_XLA, SHARDED
from aios.check.library import (
    ENV_RANKS,
    LAUNCHER_ENV,
    LIBRARY_CALLS,
    OWN_PARALLELISM,
    OWN_PARALLELISM_PACKAGES,
    PG_DEVICE_BACKENDS,
    RT_DEVICE,
)
from aios.check.names import (
    _dotted,
    _int,
    _is_cuda_string,
    _is_none,
    _last,
    _reads_launcher_env,
    _str,
    guarded_call,
)
from aios.check.rules.base import CheckRule, Example


def pg_breaks(name: str) -> tuple[str, ...]:
    """Where a process-group backend named ``name`` fails."""
    return {"nccl": NOT_CUDA, "xla": NOT_XLA, "tpu": ("cpu", "cuda", "xla", "neuron")}.get(
        name, ("cpu", "cuda", "xla", "tpu")
    )


class ProcessGroupBackend(CheckRule):
    """A process-group backend named for one device: in ``init_process_group``, or assigned."""

    codes = ("AIOS201",)
    nodes = (ast.Call, ast.Assign, ast.AnnAssign)
    wrong = (
        Example(
            "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
            "AIOS201",
            2,
            "init_process_group() without a backend",
        ),
        Example("backend = 'nccl'\n", "AIOS201", 1, "aios.init()"),
        Example(  # the helper's own default
            "import torch.distributed as dist\ndef init(backend='nccl'):\n"
            "    dist.init_process_group(backend)\n",
            "AIOS201",
            3,
            "init_process_group() without a backend",
        ),
    )
    right = (
        "import torch.distributed as dist\ndist.init_process_group()\n",
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            if value is not None and _str(value) in PG_DEVICE_BACKENDS:
                ctx.add(
                    value,
                    "AIOS201",
                    f"process-group backend '{_str(value)}' names one device: aios.init() joins "
                    "the process group with the backend's own (gloo, nccl, xla, tpu, neuron); or "
                    "call init_process_group() without a backend",
                    pg_breaks(_str(value) or ""),
                )
            return
        assert isinstance(node, ast.Call)
        q = ctx.q
        if ctx.last != "init_process_group" or not (q.startswith("torch.distributed") or not q):
            return
        arg = node.args[0] if node.args else None
        kw = next((k for k in node.keywords if k.arg == "backend"), None)
        chosen = arg if arg is not None else kw.value if kw else None
        chosen = ctx.param_default(chosen) or chosen  # def init(backend="nccl")
        if isinstance(chosen, ast.IfExp) and ctx.cuda_test(chosen.test) == 0:
            # "gloo" if args.device == "cpu" else "nccl": nccl on xla, tpu and neuron too
            chosen = next(
                (b for b in (chosen.body, chosen.orelse) if _str(b) in PG_DEVICE_BACKENDS),
                chosen,
            )
        val = _str(chosen)
        if val is not None and (val.split(":")[-1] in PG_DEVICE_BACKENDS or "nccl" in val):
            ctx.add(
                node,
                "AIOS201",
                f'init_process_group("{val}") names one device\'s backend: aios.init() joins '
                "the process group with the selected backend's own (gloo, nccl, xla, tpu, "
                "neuron); or call init_process_group() without a backend",
                pg_breaks(val.split(":")[-1] if "nccl" not in val else "nccl"),
                fix="drop-backend",
            )


class DDPWrap(CheckRule):
    """DistributedDataParallel only where the script found CUDA (each rank trains alone
    elsewhere), directly or through a helper of the project; DDP with CUDA device ids."""

    codes = ("AIOS208", "AIOS202")
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "if torch.cuda.is_available():\n    model = DDP(model)\n",
            "AIOS208",
            4,
            "rt.setup(model)",
        ),
        Example("model = DDP(model, device_ids=[local_rank])\n", "AIOS202", 1, "rt.setup(model)"),
        Example(
            "import torch.distributed as dist\nif device_type == 'cuda':\n"
            "    dist.init_process_group()\n",
            "AIOS208",
            3,
            "aios.init()",
        ),
    )
    right = (
        "model = DDP(model)\n",
        "import torch, torch.distributed as dist\nif torch.cuda.is_available():\n"
        "    dist.init_process_group('nccl')\nelse:\n    dist.init_process_group('gloo')\n",
    )

    @staticmethod
    def joins_elsewhere(ctx: Context, node: ast.Call) -> bool:
        """The CUDA test ``node`` sits under has another branch that joins the group too."""
        child: ast.AST = node
        parent = ctx.parents.get(id(node))
        while parent is not None:
            if isinstance(parent, ast.If) and ctx.cuda_test(parent.test):
                other = parent.orelse if any(child is st for st in parent.body) else parent.body
                return any(
                    isinstance(sub, ast.Call) and _last(sub.func) == "init_process_group"
                    for st in other
                    for sub in ast.walk(st)
                )
            child, parent = parent, ctx.parents.get(id(parent))
        return False

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q, last = ctx.q, ctx.last
        if (
            last == "init_process_group"
            and (q.startswith("torch.distributed") or not q)
            and ctx.cuda_guard
            and not self.joins_elsewhere(ctx, node)
        ):
            # if ddp and device_type == "cuda": init_process_group(...): the ranks never join
            ctx.add(
                node,
                "AIOS208",
                "the process group is joined only where the script found CUDA: on other devices "
                "the ranks never join, so each trains alone (or the first collective raises); "
                "aios.init() joins on every backend",
                NOT_CUDA,
                guardable=False,
            )
        ddp = q.endswith(("DistributedDataParallel", "parallel.DDP")) or last == "DDP"
        if ddp and ctx.cuda_guard:
            ctx.add(
                node,
                "AIOS208",
                f"{last}(...) only where the script found CUDA: on other devices it never wraps "
                "the model, so each rank trains its own copy, unsynchronized, without a word; "
                "rt.setup(model) wraps on every backend",
                NOT_CUDA,
                guardable=False,
            )
        ids = [k.value for k in node.keywords if k.arg in ("device_ids", "output_device")]
        if ddp and ids:
            # device_ids=[device] if device.type == "cuda" else None: only CUDA gets ids
            only_cuda = all(
                isinstance(v, ast.IfExp)
                and (
                    ctx.cuda_test(v.test) == 1
                    and _is_none(v.orelse)
                    or ctx.cuda_test(v.test) == -1
                    and _is_none(v.body)
                )
                for v in ids
            )
            ctx.cuda_guard += only_cuda
            ctx.add(
                node,
                "AIOS202",
                f"{last}(..., device_ids=...): device ids are CUDA's; rt.setup(model) wraps "
                "for the selected backend and strategy (strategy=ddp|fsdp|tp)",
                NOT_CUDA,
            )
            ctx.cuda_guard -= only_cuda


class DeviceIds(CheckRule):
    """Device indices handed to collectives and FSDP1: ``dist.barrier(device_ids=[...])`` is a
    note (gloo ignores them, torch 2.13); ``FSDP(model, device_id=local_rank)`` an error."""

    codes = ("AIOS202",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch.distributed as dist\ndist.barrier(device_ids=[local_rank])\n",
            "AIOS202",
            2,
            "rt.barrier()",
            "note",
        ),
        Example("m = FSDP(model, device_id=local_rank)\n", "AIOS202", 1, "rt.setup(model)"),
        Example("m = FSDP(model, device_id=get_local_rank())\n", "AIOS202", 1, "rt.setup"),
        Example("device_id = 0\nm = FSDP(model, device_id=device_id)\n", "AIOS202", 2, "rt.setup"),
        Example(
            "from functools import partial\nwrap = partial(FSDP, device_id=local_rank)\n",
            "AIOS202",
            2,
            "rt.setup",
        ),
    )
    right = ("import torch.distributed as dist\ndist.barrier()\n", "m = FSDP(model)\n")

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q, last = ctx.q, ctx.last
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if q.startswith("torch.distributed") and last in ("barrier", "monitored_barrier"):
            if "device_ids" in kw:
                ctx.add(
                    node,
                    "AIOS202",
                    f"{last}(device_ids=...): device ids are CUDA's (they pick the GPU of NCCL's "
                    "barrier; other backends ignore them, nothing breaks); rt.barrier()",
                    level="note",
                )
        if q.endswith("FullyShardedDataParallel") or last == "FSDP":
            dev = kw.get("device_id")  # local_rank, args.gpu, get_local_rank()
            # device_id = 0 (then torch.cuda.current_device() under a CUDA test): an index too
            values = ctx.values.get(dev.id, []) if isinstance(dev, ast.Name) else []
            if dev is not None and (
                isinstance(dev, (ast.Name, ast.Attribute, ast.Call))
                and ctx.rankish(dev)
                or _int(dev) is not None
                or any(_int(v) is not None for v in values)
            ):
                ctx.add(
                    node,
                    "AIOS202",
                    f"FSDP(..., device_id={ast.unparse(dev)}): an int device id is a CUDA index; "
                    "rt.setup(model) with strategy=fsdp shards for the selected backend",
                    NOT_CUDA,
                )


class LibraryCalls(CheckRule):
    """A call into a training library, judged by what it does (``LIBRARY_CALLS``)."""

    codes = ("AIOS203", "AIOS204", "AIOS108")
    nodes = (ast.Call,)
    wrong = (
        Example(
            "from detectron2.engine import launch\nlaunch(main, 8)\n", "AIOS203", 2, "main(args)"
        ),
        Example(
            "from detectron2.config import get_cfg\ncfg = get_cfg()\n",
            "AIOS204",
            2,
            "cfg.MODEL.DEVICE = str(rt.device)",
        ),
    )
    right = ("from mylib import launch\nlaunch(main, 8)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        spec = LIBRARY_CALLS.get(ctx.q)
        if spec is None:
            return
        if spec.code == "AIOS204" and ctx.q.startswith("detectron2") and ctx.project.config_device:
            return  # the script (or its config) sets MODEL.DEVICE
        ctx.add(node, spec.code, spec.message, spec.backends, level=spec.level)


class HelperDDP(CheckRule):
    """A helper of the project that wraps the model in DDP, called only where CUDA was found."""

    codes = ("AIOS208",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel\n"
            "def wrap(m):\n    return DistributedDataParallel(m)\n"
            "if torch.cuda.is_available():\n    model = wrap(model)\n",
            "AIOS208",
            6,
            "rt.setup(model)",
        ),
    )
    right = ("def wrap(m):\n    return DistributedDataParallel(m)\nmodel = wrap(model)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        helper = ctx.callee(node)
        if helper is not None and helper.wraps_ddp and ctx.cuda_guard:
            ctx.add(
                node,
                "AIOS208",
                f"{_dotted(node.func)}() wraps the model in DDP ({os.path.basename(helper.path)}:"
                f"{helper.wraps_ddp}) only where the script found CUDA: on other devices each "
                "rank trains its own copy, unsynchronized, without a word; rt.setup(model) wraps "
                "on every backend",
                NOT_CUDA,
                guardable=False,
            )


class ArgparseDefaults(CheckRule):
    """Options whose defaults tie the script to CUDA or to torch.distributed.launch: ``--device
    cuda``, a required ``--local_rank``, ``--world-size 1``, ``--dist-backend nccl``."""

    codes = ("AIOS101", "AIOS211", "AIOS209", "AIOS201")
    nodes = (ast.Call,)
    wrong = (
        Example("p.add_argument('--device', default='cuda')\n", "AIOS101", 1, "rt.device"),
        Example(
            "p.add_argument('--local_rank', type=int, required=True)\n",
            "AIOS211",
            1,
            "rt.local_rank",
        ),  # fmt: skip
        Example(
            "p.add_argument('--world-size', default=1, type=int)\n", "AIOS209", 1, "rt.world_size"
        ),  # fmt: skip
        Example("p.add_argument('--dist-backend', default='nccl')\n", "AIOS201", 1, "aios.init()"),
        Example(  # torch.distributed.launch passed --local_rank; aios-run passes none
            "import torch.distributed as dist\np.add_argument('--local_rank', type=int, default=-1)\n"
            "a = p.parse_args()\nif a.local_rank != -1:\n    dist.init_process_group()\n",
            "AIOS209",
            2,
            "rt.local_rank",
        ),
        Example(
            "p.add_argument('--launcher', choices=['none', 'pytorch'], default='none')\n",
            "AIOS209",
            1,
            "--launcher pytorch",
        ),  # fmt: skip
    )
    right = (
        "p.add_argument('--local_rank', type=int, default=-1)\n",
        # LOCAL_RANK from the environment fills it under a launcher
        "import os, torch.distributed as dist\np.add_argument('--local_rank', type=int, default=-1)\n"
        "a = p.parse_args()\na.local_rank = int(os.environ.get('LOCAL_RANK', a.local_rank))\n"
        "if a.local_rank != -1:\n    dist.init_process_group()\n",
        "p.add_argument('--launcher', choices=['none', 'pytorch'], default='pytorch')\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if ctx.last != "add_argument":
            return
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        default = kw.get("default")
        opts = " ".join(_str(a) or "" for a in node.args)
        if default is not None and _is_cuda_string(default):
            ctx.add(
                default,
                "AIOS101",
                f"{opts or 'an option'} defaults to {_str(default)!r}: run unchanged, the "
                f"script asks for CUDA; {RT_DEVICE}",
                NOT_CUDA,
            )
        elif self.local_rank_required(ctx, node, opts, kw):
            pass
        elif self.joins_only_with_local_rank(ctx, opts, default):
            ctx.add(
                node,
                "AIOS209",
                f"{opts} defaults to -1 and the process group is joined only when it is set: "
                "torch.distributed.launch passed it, but aios-run (like torchrun) sets "
                "LOCAL_RANK in the environment and passes no argument, so no rank joins (and "
                "code reading RANK expects a group); use rt.local_rank",
                BACKENDS,
                ("ddp", *SHARDED),
                when="copies never join under aios-run --nprocs N",
            )
        elif (
            any(o.strip("-").replace("_", "-") == "world-size" for o in opts.split())
            and isinstance(default, (ast.Constant, ast.UnaryOp))
            and isinstance(_int(default), int)
            and not ctx.project.env_world  # its helper reads the launcher's WORLD_SIZE
        ):
            ctx.add(
                default,
                "AIOS209",
                f"{opts} defaults to {_int(default)}: run as aios-run starts it, each rank "
                "believes it is alone and trains its own copy (the copies never join); "
                "use rt.world_size (and rt.rank)",
                BACKENDS,
                ("ddp", *SHARDED),
                when="copies never join under aios-run --nprocs N",
            )
        elif _str(default) == "none" and any(o.strip("-") == "launcher" for o in opts.split()):
            ctx.add(
                default,  # type: ignore[arg-type]
                "AIOS209",
                f"{opts} defaults to 'none': run as aios-run starts it, the framework joins no "
                "process group and each rank trains its own copy (the copies never join); pass "
                "--launcher pytorch (it reads the RANK and WORLD_SIZE aios-run sets)",
                BACKENDS,
                ("ddp", *SHARDED),
                when="copies never join under aios-run --nprocs N",
            )
        elif default is not None and _str(default) in PG_DEVICE_BACKENDS and "backend" in opts:
            ctx.add(
                default,
                "AIOS201",
                f"{opts} defaults to {_str(default)!r}, which names one device's "
                "process-group backend: aios.init() joins the process group with the selected "
                "backend's own (gloo, nccl, xla, tpu, neuron)",
                pg_breaks(_str(default) or ""),
            )

    @staticmethod
    def joins_only_with_local_rank(ctx: Context, opts: str, default: ast.expr | None) -> bool:
        """``--local_rank`` defaulting to -1 where ``init_process_group`` runs only under ``if
        opt.local_rank != -1:`` and nothing reads LOCAL_RANK from the environment."""
        if _int(default) != -1 or not any(
            o.strip("-").replace("-", "_") == "local_rank" for o in opts.split()
        ):
            return False
        tree = ctx.tree
        if any(_str(n) == "LOCAL_RANK" for n in ast.walk(tree)):
            return False  # the launcher's LOCAL_RANK fills it

        def set_test(test: ast.AST) -> bool:
            return (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and _last(test.left) == "local_rank"
                and isinstance(test.ops[0], ast.NotEq)
                and _int(test.comparators[0]) == -1
            )

        return guarded_call(tree, set_test, "init_process_group")

    @staticmethod
    def local_rank_required(
        ctx: Context, node: ast.Call, opts: str, kw: dict[str, ast.expr]
    ) -> bool:
        """``--local_rank`` that argparse requires: torch.distributed.launch passed it; aios-run
        (like torchrun) sets LOCAL_RANK in the environment and passes no argument."""
        required = kw.get("required")
        if not (
            any(o.strip("-").replace("_", "-") == "local-rank" for o in opts.split())
            and isinstance(required, ast.Constant)
            and required.value is True
        ):
            return False
        ctx.add(
            node,
            "AIOS211",
            f"{opts} is required: torch.distributed.launch passed it, but aios-run (like "
            "torchrun) sets LOCAL_RANK in the environment and passes no argument, so "
            "argparse stops the script; drop required=True and use rt.local_rank",
            BACKENDS,
        )
        return True


class OwnSpawn(CheckRule):
    """``torch.multiprocessing.spawn``: the script starts its own processes."""

    codes = ("AIOS203",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)\n",
            "AIOS203",
            2,
            "call the worker once",
        ),
    )
    right = ("main(0)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if ctx.q in ("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"):
            ctx.add(
                node,
                "AIOS203",
                f"{_dotted(node.func)}() starts its own processes: under aios-run --nprocs N "
                "each rank would start N more; call the worker once (aios-run starts one "
                "process per rank; rt.rank, rt.local_rank, rt.device)",
                BACKENDS,
            )


class OwnParallelism(CheckRule):
    """The script's own mesh, FSDP or tensor-parallel plan: a note with the aios form."""

    codes = ("AIOS207",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "from torch.distributed.fsdp import fully_shard\nfully_shard(model)\n",
            "AIOS207",
            2,
            "rt.setup(model)",
            "note",
        ),
        Example(
            "from torchrec.distributed.model_parallel import DistributedModelParallel\n"
            "m = DistributedModelParallel(module=model, device=device)\n",
            "AIOS207",
            2,
            "rt.setup(model)",
            "note",
        ),
    )
    right = ("model = rt.setup(model)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        q = ctx.q
        own = q.rsplit(".", 1)[-1] if q.startswith(OWN_PARALLELISM_PACKAGES) else ""
        if own in OWN_PARALLELISM:
            ctx.add(node, "AIOS207", f"{own}() {OWN_PARALLELISM[own]}", level="note")


class LauncherEnv(CheckRule):
    """The launcher's world from the environment: a read is a note (aios-run sets it); a write
    overwrites what aios-run set for the rank (an error), unless it writes the launcher's own
    value back."""

    codes = ("AIOS206", "AIOS210")
    nodes = (ast.Subscript, ast.Assign, ast.Call)
    wrong = (
        Example("import os\nr = int(os.environ['RANK'])\n", "AIOS206", 2, "rt.rank", "note"),
        Example(
            "import os\nos.environ['WORLD_SIZE'] = str(comm.size)\n", "AIOS210", 2, "rt.world_size"
        ),  # fmt: skip
    )
    right = (
        "import os\nos.environ['OMP_NUM_THREADS'] = '1'\n",
        "import os\nos.environ['MASTER_PORT'] = os.environ.get('MASTER_PORT', '29500')\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        if isinstance(node, ast.Subscript):
            if not isinstance(node.ctx, ast.Store):
                self.read(ctx, node, ctx.qual(node.value) == "os.environ", node.slice)
        elif isinstance(node, ast.Assign):
            self.write(ctx, node)
        elif isinstance(node, ast.Call) and ctx.q in ("os.environ.get", "os.getenv"):
            if node.args:
                self.read(ctx, node, True, node.args[0])

    @staticmethod
    def read(ctx: Context, node: ast.AST, environ: bool, key: ast.AST | None) -> None:
        name = _str(key)
        if name in ENV_RANKS and environ:
            ctx.add(
                node,
                "AIOS206",
                f"reads {name} from the environment: aios-run sets it, so this works; the aios "
                f"form is {ENV_RANKS[name]} (the same under every launcher and backend)",
                level="note",
            )

    @staticmethod
    def write(ctx: Context, node: ast.Assign) -> None:
        for t in node.targets:
            if not (isinstance(t, ast.Subscript) and ctx.qual(t.value) == "os.environ"):
                continue
            name = _str(t.slice)
            if name not in LAUNCHER_ENV:
                continue
            value = node.value
            names = {
                _dotted(sub)
                for sub in ast.walk(value)
                if isinstance(sub, (ast.Name, ast.Attribute)) and _dotted(sub)
            }
            if _reads_launcher_env(value) or names & ctx.env_sourced():
                continue  # the launcher's own value, written back
            if name in ("MASTER_ADDR", "MASTER_PORT"):
                what = (
                    "the ranks may meet at different addresses (each node its own) or a port "
                    "another job holds, and never join"
                )
            else:
                what = (
                    "every process may claim the same rank or a world of its own: N "
                    "unsynchronised copies of one rank, or a rendezvous that never completes"
                )
            ctx.add(
                t,
                "AIOS210",
                f'writes os.environ["{name}"] ({ast.unparse(value)[:60]}), overwriting what '
                f"aios-run set for this rank: {what}; delete the line (aios-run sets RANK, "
                "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and use rt.rank / "
                "rt.world_size",
                BACKENDS,
                ("ddp", *SHARDED),
                when="overwrites the launcher's world under aios-run --nprocs N",
                guardable=False,
            )
