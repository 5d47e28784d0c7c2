"""``AIOS3xx``: CUDA AMP, GradScaler and fp16; ``AIOS110``/``AIOS204``: torch.accelerator and
Lightning's own device counting (what a device-generic API still assumes)."""

from __future__ import annotations

import ast

from aios.check.callgraph import Context
from aios.check.findings import BACKENDS, NO_FP16, NOT_CUDA
from aios.check.names import _dotted, _int, _is_cuda_string, _last, _str
from aios.check.rules.base import CheckRule, Example

FP16_HINT = "TPUs and Trainium have no fp16 training"


class CudaAutocast(CheckRule):
    """CUDA autocast (``torch.autocast("cuda")``, ``torch.cuda.amp.autocast``): off, with a
    warning, elsewhere; autocast applied only when the device is CUDA: fp32 elsewhere, silently."""

    codes = ("AIOS301", "AIOS304")
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\nwith torch.autocast('cuda'):\n    pass\n", "AIOS301", 2, "rt.autocast()"
        ),  # fmt: skip
        Example(  # a helper whose device defaults to CUDA
            "import torch\ndef amp(on, device='cuda'):\n    return torch.amp.autocast(device, enabled=on)\n",
            "AIOS301",
            3,
            "rt.autocast()",
        ),
        Example(
            "import torch\ndev = 'cuda'\nwith torch.autocast(device_type=dev):\n    pass\n",
            "AIOS304",
            3,
            "rt.autocast()",
            "warning",
        ),
    )
    right = (
        "import torch\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n    pass\n",
        # the caller in this file passes the device: the default is not what runs
        "import torch\ndef amp(on, device='cuda'):\n    return torch.autocast(device, enabled=on)\n"
        "ctx = amp(True, device=rt.device.type)\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q = ctx.q
        if q not in ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast"):
            return
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dev = kw.get("device_type", node.args[0] if node.args else None)
        default = ctx.param_default(dev)  # def autocast(enabled, device="cuda")
        if q == "torch.cuda.amp.autocast" or _is_cuda_string(dev) or _is_cuda_string(default):
            how = f" (the helper's device defaults to {_str(default)!r})" if default else ""
            ctx.add(
                node,
                "AIOS301",
                f"CUDA autocast{how} (off, with a warning, on every other device): use "
                "`with rt.autocast():` and precision=bf16-mixed (fp16-mixed on cuda)",
                NOT_CUDA,
            )
            return
        value = ctx.resolve(dev)
        derived = value is not dev and _is_cuda_string(value)
        if ctx.cuda_guard or derived:
            how = (
                f"device_type is {ast.unparse(value)!r}"  # type: ignore[arg-type]
                if derived
                else "autocast only when the device is CUDA"
            )
            ctx.add(
                node,
                "AIOS304",
                f"{how}: on other devices the script trains in fp32 where it asked for "
                "bf16/fp16, without a word; use `with rt.autocast():` and precision=bf16-mixed",
                NOT_CUDA,
                level="warning",
                guardable=False,
            )


class GradScalerNote(CheckRule):
    """A CUDA GradScaler is a note, named once where it is made (not at scale/step/update):
    off CUDA it disables itself with a warning and its methods pass through."""

    codes = ("AIOS302",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
            "AIOS302",
            2,
            "rt.backward(loss)",
            "note",
        ),  # fmt: skip
    )
    right = ("scaler.scale(loss).backward()\nscaler.step(opt)\n",)

    def check(self, ctx: Context, node: ast.AST) -> None:
        if ctx.q.endswith("GradScaler"):
            ctx.add(
                node,
                "AIOS302",
                f"{ctx.q}: loss scaling for fp16 on CUDA; elsewhere it disables itself with a "
                "warning (nothing breaks); rt.backward(loss) + rt.step(opt) scale when "
                "precision=fp16-mixed and need none under bf16-mixed",
                level="note",
            )


class Fp16(CheckRule):
    """fp16 the script picks itself: ``.half()``, ``torch.float16`` (not inside the user's own
    fp16 choice, nor in a table of dtype names)."""

    codes = ("AIOS303",)
    nodes = (ast.Call, ast.Attribute)
    wrong = (
        Example("model = model.half()\n", "AIOS303", 1, "precision=bf16-true"),
        Example("import torch\nx = x.to(torch.float16)\n", "AIOS303", 2, "precision=bf16-mixed"),
    )
    right = (
        "import torch\nif args.fp16:\n    x = x.to(torch.float16)\n",
        "from copy import deepcopy\nckpt = {'model': deepcopy(model).half()}\n",  # a saved copy
        "import torch\ndtype = torch.float16 if args.fp16 else torch.float32\n",
        "import torch\nDT = {'float16': torch.float16, 'bfloat16': torch.bfloat16}\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        if ctx.fp16_guard:
            return
        if isinstance(node, ast.Call):
            if ctx.last == "half" and not node.args and isinstance(node.func, ast.Attribute):
                copy = node.func.value
                if isinstance(copy, ast.Call) and _last(copy.func) == "deepcopy":
                    return  # deepcopy(ema).half() for a checkpoint: the model trains as it was
                if not ctx.q:
                    ctx.add(
                        node,
                        "AIOS303",
                        ".half() casts to fp16, which TPUs and Trainium cannot train in: use "
                        "precision=bf16-true (or bf16-mixed); rt.setup(model) converts the module",
                        NO_FP16,
                    )
            return
        assert isinstance(node, ast.Attribute)
        if ctx.qual(node) not in ("torch.float16", "torch.half"):
            return
        parent = ctx.parents.get(id(node))
        if isinstance(parent, ast.Dict) and any(
            v is node and _str(k) is not None
            for k, v in zip(parent.keys, parent.values, strict=True)
        ):
            return  # {"float16": torch.float16, ...}: a table of names; the choice is elsewhere
        ctx.add(
            node,
            "AIOS303",
            f"{_dotted(node)}: {FP16_HINT}; use precision=bf16-mixed "
            "(aios-run --precision bf16-mixed) and rt.autocast()",
            NO_FP16,
        )


class Lightning(CheckRule):
    """Lightning / Fabric pinned to one device kind or to fp16, or counting the devices itself
    (``devices="auto"``: the GPUs, 1 on a CPU; under aios-run Lightning checks devices x
    num_nodes against WORLD_SIZE and raises where they differ)."""

    codes = ("AIOS204", "AIOS101", "AIOS303")
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import lightning as L\nf = L.Fabric(devices='auto')\n",
            "AIOS204",
            2,
            "LOCAL_WORLD_SIZE",
        ),  # fmt: skip
        Example(
            "import lightning as L\nt = L.Trainer(accelerator='gpu', devices=2)\n",
            "AIOS101",
            2,
            'accelerator="auto"',
        ),  # fmt: skip
        Example(
            "import lightning as L\nt = L.Trainer(devices=2, precision='16-mixed')\n",
            "AIOS303",
            2,
            "bf16-mixed",
        ),  # fmt: skip
    )
    right = (
        "import os\nimport lightning as L\n"
        "t = L.Trainer(devices=int(os.environ['LOCAL_WORLD_SIZE']))\n",
        "import lightning as L\nt = L.Trainer(**settings)\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        q, last = ctx.q, ctx.last
        if not (q.startswith(("lightning", "pytorch_lightning")) and last in ("Fabric", "Trainer")):
            return
        self.devices(ctx, node, last)
        for k in node.keywords:
            v = _str(k.value)
            if k.arg == "accelerator" and v in ("cuda", "gpu", "tpu", "mps"):
                ctx.add(
                    node,
                    "AIOS101",
                    f'{last}(accelerator="{v}") pins one device kind: use accelerator="auto", '
                    "or the aios runtime (rt.device, rt.setup)",
                    NOT_CUDA if v in ("cuda", "gpu") else BACKENDS,
                )
            elif k.arg == "precision" and (
                v in ("16-mixed", "16", "16-true")
                or isinstance(k.value, ast.Constant)
                and k.value.value == 16
            ):
                ctx.add(
                    node,
                    "AIOS303",
                    f'{last}(precision={v or 16!r}): {FP16_HINT}; use precision="bf16-mixed"',
                    NO_FP16,
                )

    @staticmethod
    def devices(ctx: Context, node: ast.Call, last: str) -> None:
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if any(k.arg is None for k in node.keywords) or node.args:
            return  # **settings or positional: the devices are not spelled here
        if _str(kw.get("accelerator")) in ("cuda", "gpu", "tpu", "mps"):
            return  # named for that (AIOS101), not twice
        dev = kw.get("devices")
        if dev is None or _str(dev) in ("auto", "-1") or _int(dev) == -1:
            ctx.add(
                node,
                "AIOS204",
                f'{last}(devices="auto") counts the devices itself (the GPUs, 1 on a CPU): under '
                "aios-run --nprocs N Lightning checks devices x num_nodes against WORLD_SIZE and "
                'raises where they differ; pass devices=int(os.environ["LOCAL_WORLD_SIZE"]) (the '
                "processes aios-run started on this node)",
                NOT_CUDA,
                when="raises under aios-run --nprocs N on cpu, xla, tpu, neuron",
            )


class AcceleratorApi(CheckRule):
    """torch.accelerator where it assumes a native device: ``is_available()`` picking the
    device (False under torch_xla), ``current_accelerator().type`` without a test (None on CPU),
    ``device_count()`` as a divisor or process count (0 on CPU and under torch_xla)."""

    codes = ("AIOS110",)
    nodes = (ast.Call,)
    wrong = (
        Example(
            "import torch\nuse = torch.accelerator.is_available()\n", "AIOS110", 2, "rt.device"
        ),
        Example(
            "import torch\nt = torch.accelerator.current_accelerator().type\n",
            "AIOS110",
            2,
            "rt.device",
        ),  # fmt: skip
        Example(
            "import torch\nn = 64 // torch.accelerator.device_count()\n",
            "AIOS110",
            2,
            "rt.world_size",
        ),  # fmt: skip
    )
    right = (
        "import torch\nif torch.accelerator.is_available():\n    torch.accelerator.synchronize()\n",
    )

    def check(self, ctx: Context, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if not ctx.q.startswith("torch.accelerator."):
            return
        name = ctx.q.rsplit(".", 1)[-1]
        parent = ctx.parents.get(id(node))
        if name == "is_available" and ctx.picks_device(node):
            ctx.add(
                node,
                "AIOS110",
                "torch.accelerator.is_available() is False under torch_xla (an XLA device is "
                "not a torch.accelerator): on --backend xla the script silently trains on "
                "the host CPU; use rt.device",
                ("xla",),
            )
        elif (
            name == "current_accelerator"
            and isinstance(parent, ast.Attribute)
            and not ctx.accel_guard
        ):
            ctx.add(
                node,
                "AIOS110",
                f"torch.accelerator.current_accelerator().{parent.attr} without a test: it "
                "is None on CPU and under torch_xla (AttributeError); use rt.device",
                ("cpu", "xla"),
            )
        elif name == "device_count" and not (ctx.accel_guard or ctx.cuda_guard):
            if self.sizes_or_divides(ctx, node, parent):
                ctx.add(
                    node,
                    "AIOS110",
                    "torch.accelerator.device_count() is 0 on CPU and under torch_xla: as a "
                    "divisor or a process count it fails there; rt.world_size counts the "
                    "processes, rt.local_rank picks this one's device",
                    ("cpu", "xla"),
                )

    @staticmethod
    def sizes_or_divides(ctx: Context, node: ast.Call, use: ast.AST | None) -> bool:
        sizes = isinstance(use, ast.keyword) and use.arg in ("nprocs", "world_size")
        sizes |= (  # per_node = torch.accelerator.device_count(); spawn(nprocs=per_node)
            isinstance(use, ast.Assign)
            and len(use.targets) == 1
            and isinstance(use.targets[0], ast.Name)
            and use.targets[0].id in ctx.process_counts
        )
        return sizes or (
            isinstance(use, ast.BinOp)
            and isinstance(use.op, (ast.Mod, ast.FloorDiv, ast.Div))
            and use.right is node
        )
