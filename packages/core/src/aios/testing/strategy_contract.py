"""A contract kit for strategies: subclass :class:`StrategyContract` in a test module to prove a
strategy on CPU with real processes over gloo.

    from aios.testing.strategy_contract import StrategyContract

    class TestMyStrategy(StrategyContract):
        strategy = "mine"            # the registered name
        overrides = ["mine.level=2"] # extra config for the runs
        nprocs = 2

Each test runs a small script under ``aios-run --nprocs N`` (a real process group; started with
:mod:`aios.testing.launch`, so forked from the test session's zygote and its ranks from aios-run's
own, as a user's run starts warm) and checks:
setup (parameters live on the strategy's device, the optimizer steps them), steps that lower the
loss and keep replicas in agreement, gradient accumulation equal to one large batch, clipping to
the configured global norm, a save/load round trip restoring parameters and optimizer state
exactly, and the collectives (``all_reduce``, ``all_gather``, ``broadcast_object``,
``any_rank``, ``gather_object``). And what the runtime and the checkpointing read from a
strategy (the members :class:`aios.strategies.base.Strategy` declares): ``data_rank`` and
``data_world`` as integers (properties, never methods) with every data rank read by
``world / data_world`` ranks; the batch arithmetic (``global_batch`` and ``micro_batch`` give
``grad_accum = global_batch / (micro_batch x data_world)``, through
:func:`aios.runtime.derive_grad_accum`); ``checkpoint_format`` naming a registered format that
is the one the checkpoint records; and a resume in a new process (``rt.resume()`` from
``checkpoint.dir``) that continues at the saved step with the saved parameters. A strategy whose
step semantics differ (no accumulation, say) overrides the corresponding test with the reason.

Non-CPU backends run it the same way: set ``backend`` (``xla`` on XLA:CPU with
``overrides = ["xla.allow_cpu=true"]`` and ``nprocs = 1``) and, for environment the backend
needs, ``env``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from aios.testing import launch

CONTRACT_SCRIPT = r"""
import json, os, sys, torch, aios
rt = aios.init()
torch.manual_seed(0)
out = {"rank": rt.rank, "world": rt.world_size}

def make():
    torch.manual_seed(0)
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)
        def forward(self, x):
            return x + self.b(torch.tanh(self.a(x)))
    return torch.nn.Sequential(torch.nn.Linear(4, 8), Block(), Block(), torch.nn.Linear(8, 1))

def tp_plan(model, mesh):  # for strategy=tp (mesh.tp_plan=__main__:tp_plan)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {f"{i}.{n}": (ColwiseParallel() if n == "a" else RowwiseParallel())
            for i in (1, 2) for n in ("a", "b")}

def data(n=32):
    # each data-parallel replica reads its shard; ranks of one replica (tp) read the same one
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(1, keepdim=True).sin()
    r, w = rt.strategy.data_rank, rt.strategy.data_world
    return x[r::w].to(rt.device), y[r::w].to(rt.device)

def full_params(model):
    sd = rt.strategy.module_state_dict(model)
    return {k: v.detach().float().cpu().reshape(-1)[:4].tolist() for k, v in sorted(sd.items())} if rt.is_main else None

model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, opt = rt.setup(model, opt)
x, y = data()
# what the runtime reads: data rank and world as ints (properties), the batch arithmetic, the format
from aios.checkpoint.formats.base import get_format
st = rt.strategy
out["data_rank"], out["data_world"] = st.data_rank, st.data_world
out["data_members_are_ints"] = type(st.data_rank) is int and type(st.data_world) is int
out["data_ranks"] = rt.gather_object(st.data_rank)
out["grad_accum"] = rt.config.grad_accum
out["checkpoint_format"] = st.checkpoint_format
out["format_resolves"] = (
    get_format(st.checkpoint_format, rt.checkpointer.formats).name == st.checkpoint_format
)
if os.environ.get("CONTRACT_RESUME"):
    out["resumed_step"] = rt.resume()
    out["resumed_params"] = full_params(model)
    if rt.is_main:
        print("CONTRACT " + json.dumps(out), flush=True)
    sys.exit(0)
out["device_ok"] = all(p.device.type == rt.device.type for p in model.parameters())
losses = []
for _ in range(8):
    with rt.accumulate(model), rt.autocast():
        loss = (model(x) - y).pow(2).mean()
    rt.backward(loss)
    rt.step(opt)
    losses.append(float(rt.all_reduce(loss.detach())))
out["losses"] = losses
out["grad_norm"] = None if rt.last_grad_norm is None else float(rt.last_grad_norm)
out["params_after"] = full_params(model)
# collectives
t = torch.tensor([float(rt.rank + 1)], device=rt.device)
out["sum"] = float(rt.all_reduce(t, "sum"))
out["gather"] = rt.all_gather(t).reshape(-1).tolist()
out["bcast"] = rt.strategy.broadcast_object({"from": rt.rank}, src=0)
out["any"] = rt.strategy.any_rank(rt.rank == rt.world_size - 1)
# save / load round trip
ck = os.environ["CONTRACT_CKPT"]
rt.save(ck)
before = full_params(model)
for _ in range(2):
    rt.backward((model(x) - y).pow(2).mean())
    rt.step(opt)
rt.load(ck)
out["momentum_restored"] = all(len(st) > 0 for st in opt.state.values()) and len(opt.state) > 0
after = full_params(model)  # collective under sharded strategies: every rank calls it
out["restored_equal"] = (after == before) if rt.is_main else None
rt.backward((model(x) - y).pow(2).mean())
rt.step(opt)
if rt.config.checkpoint.dir:  # the managed save a later run resumes from
    rt.save()
    out["saved_step"] = rt.global_step
    out["saved_params"] = full_params(model)
    if rt.is_main:  # what the committed checkpoint records, read back from its marker
        info = rt.checkpointer.store.latest(warn=False)
        out["recorded_format"] = info.meta.get("checkpoint_format") if info else None
if rt.is_main:
    print("CONTRACT " + json.dumps(out), flush=True)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StrategyContract:
    """Base class for a strategy's contract tests (pytest collects subclasses named ``Test*``)."""

    strategy: ClassVar[str] = "ddp"
    backend: ClassVar[str] = "cpu"
    nprocs: ClassVar[int] = 2
    overrides: ClassVar[list[str]] = []
    #: extra environment for the runs (e.g. a backend's opt-in for a CPU stand-in)
    env: ClassVar[dict[str, str]] = {}
    timeout: ClassVar[int] = 500
    #: tolerance of loss equality against the accumulation-free reference run
    rtol: ClassVar[float] = 1e-3

    _cache: ClassVar[dict[tuple[Any, ...], dict[str, Any]]] = {}

    def run_contract(
        self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """One run of the contract script (cached per configuration: the tests of a class share
        its runs). Unless ``extra`` sets ``checkpoint.dir``, the run has its own, whose path the
        result carries as ``ckpt_dir``: the managed save a later run can resume from."""
        key = (
            type(self).__name__,
            self.strategy,
            self.nprocs,
            tuple(self.overrides),
            extra,
            tuple(sorted((env or {}).items())),
        )
        if key in StrategyContract._cache:
            return StrategyContract._cache[key]
        work = Path(
            tempfile.mkdtemp(prefix="run-", dir=tmp_path)
        )  # one directory per run: runs never share a checkpoint path
        script = work / "contract.py"
        script.write_text(CONTRACT_SCRIPT)
        own_dir = not any(a.startswith("checkpoint.dir=") for a in extra)
        managed = work / "managed"
        run_env = launch.run_env(work, CONTRACT_CKPT=str(work / "ckpt" / "ckpt-0"))
        run_env.update({**self.env, **(env or {})})
        args = [
            "--backend",
            self.backend,
            "--nprocs",
            str(self.nprocs),
            f"master_port={free_port()}",
            f"strategy={self.strategy}",
            *self.overrides,
            *([f"checkpoint.dir={managed}"] if own_dir else []),
            *extra,
            str(script),
        ]
        r = launch.aios_run(args, cwd=work, env=run_env, timeout=self.timeout)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        line = next((ln for ln in r.stdout.splitlines() if "CONTRACT " in ln), None)
        assert line, r.stdout[-3000:]
        out = json.loads(line.split("CONTRACT ", 1)[1])
        out["ckpt_dir"] = str(managed) if own_dir else None
        StrategyContract._cache[key] = out
        return out

    def accumulating_run(self, tmp_path: Path) -> dict[str, Any]:
        """The run with two micro-steps per step, asked for the way users do: ``global_batch``
        and ``micro_batch``, from which the runtime derives ``grad_accum`` over the strategy's
        data world."""
        dw = self.run_contract(tmp_path)["data_world"]
        return self.run_contract(tmp_path, f"global_batch={2 * 2 * dw}", "micro_batch=2")

    # ------------------------------------------------------------------ the contract
    def test_setup_and_step(self, tmp_path: Path) -> None:
        out = self.run_contract(tmp_path)
        assert out["world"] == self.nprocs and out["device_ok"]
        assert out["losses"][-1] < out["losses"][0], out["losses"]

    def test_accumulate_equals_large_batch(self, tmp_path: Path) -> None:
        ref = self.run_contract(tmp_path)
        acc = self.accumulating_run(tmp_path)
        assert acc["grad_accum"] == 2, acc["grad_accum"]
        # two micro-steps on the same batch, loss divided by 2: the same update every 2 micro-steps
        ref_steps, acc_steps = ref["losses"][:4], acc["losses"][1::2]
        for a, b in zip(ref_steps, acc_steps, strict=False):
            assert abs(a - b) <= self.rtol * max(1.0, abs(a)), (ref_steps, acc_steps)

    def test_clip(self, tmp_path: Path) -> None:
        ref = self.run_contract(tmp_path, "grad_clip=1e-3")
        assert (
            ref["grad_norm"] is not None and ref["grad_norm"] > 1e-3
        )  # the unclipped norm is reported
        free = self.run_contract(tmp_path)
        # a tiny clip slows the descent compared to the unclipped run
        assert ref["losses"][-1] > free["losses"][-1]

    def test_save_load_round_trip(self, tmp_path: Path) -> None:
        out = self.run_contract(tmp_path)
        assert out["restored_equal"] is True and out["params_after"] and out["momentum_restored"]

    def test_collectives(self, tmp_path: Path) -> None:
        out = self.run_contract(tmp_path)
        n = self.nprocs
        assert out["sum"] == n * (n + 1) / 2
        assert out["gather"] == [float(i + 1) for i in range(n)]
        assert out["bcast"] == {"from": 0} and out["any"] is True

    # ------------------------------------------------------------------ what the runtime reads
    def test_data_rank_and_world(self, tmp_path: Path) -> None:
        """Integers (declared properties), the data world divides the world, and each data rank
        is read by the same number of ranks: every shard of the data is read, none twice."""
        out = self.run_contract(tmp_path)
        assert out["data_members_are_ints"], (out["data_rank"], out["data_world"])
        world, dw = out["world"], out["data_world"]
        assert 1 <= dw <= world and world % dw == 0
        ranks = out["data_ranks"]
        assert sorted(set(ranks)) == list(range(dw)), ranks
        assert all(ranks.count(r) == world // dw for r in range(dw)), ranks

    def test_global_batch_derives_grad_accum(self, tmp_path: Path) -> None:
        """``global_batch = micro_batch x grad_accum x data_world``: the runtime derives
        ``grad_accum`` from this strategy's data world."""
        out = self.accumulating_run(tmp_path)
        assert out["grad_accum"] == 2, (out["grad_accum"], out["data_world"])
        assert self.run_contract(tmp_path)["grad_accum"] == 1

    def test_checkpoint_format_is_registered_and_recorded(self, tmp_path: Path) -> None:
        out = self.run_contract(tmp_path)
        assert out["format_resolves"], out["checkpoint_format"]
        assert out["recorded_format"] == out["checkpoint_format"]

    def test_resume_in_a_new_process_continues_exactly(self, tmp_path: Path) -> None:
        """What a resume may change: nothing here (same world, strategy and format): a new
        process resumes at the saved step with the saved parameters."""
        first = self.run_contract(tmp_path)
        ck = first["ckpt_dir"]
        again = self.run_contract(tmp_path, f"checkpoint.dir={ck}", env={"CONTRACT_RESUME": "1"})
        assert first["saved_step"] > 0
        assert again["resumed_step"] == first["saved_step"]
        assert again["resumed_params"] == first["saved_params"]
