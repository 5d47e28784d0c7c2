"""The native sharded strategies on CPU over real gloo: examples/gpt.py under FSDP2 on 2 and 4
processes reaches the DDP loss (and HSDP on a 2 x 2 mesh), parameters are DTensor shards (about
1/N of each weight per rank), a dp=2 x tp=2 mesh trains on 4 processes, and bad strategy choices
are one-line errors."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from aios.testing import launch

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
SMALL = [
    "--steps",
    "40",
    "--n-embd",
    "32",
    "--batch-size",
    "8",
    "--block-size",
    "32",
    "--lr",
    "1e-2",
    "--warmup",
    "5",
    "--eval-every",
    "40",
    "--eval-batches",
    "2",
]
DONE = re.compile(
    r"done 40 steps \(40 this run\) in [0-9.]+s: [0-9.]+ steps/s, [0-9,]+ tokens/s; train "
    r"loss ([0-9.]+), val loss ([0-9.]+)"
)


def _run(tmp: Path, *args: str, timeout: int = 500) -> subprocess.CompletedProcess[str]:
    from aios.testing.strategy_contract import free_port

    env = launch.run_env(tmp, GPT_SAMPLE="0")
    return launch.aios_run([f"master_port={free_port()}", *args], cwd=tmp, env=env, timeout=timeout)


def _gpt(tmp: Path, nprocs: int, *overrides: str) -> tuple[float, float]:
    r = _run(tmp, "--nprocs", str(nprocs), "checkpoint.dir=null", *overrides, str(EXAMPLE), *SMALL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = DONE.search(r.stdout)
    assert m, r.stdout[-2000:]
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("nprocs", [2, 4])
def test_gpt_fsdp_matches_ddp(tmp_path, nprocs):
    ddp = _gpt(tmp_path, nprocs, "strategy=ddp")
    fsdp = _gpt(tmp_path, nprocs, "strategy=fsdp", "fsdp.wrap=[Block]")
    # same data order, same initialisation, same math: FSDP2 differs from DDP only by
    # floating-point reduction order
    assert abs(fsdp[0] - ddp[0]) < 0.02 and abs(fsdp[1] - ddp[1]) < 0.02, (ddp, fsdp)
    if nprocs == 4:  # HSDP: 2 replicas x 2 shards (a 2-D mesh), same global batch
        hsdp = _gpt(tmp_path, nprocs, "strategy=hsdp", "mesh.replicate=2", "fsdp.wrap=[Block]")
        assert abs(hsdp[0] - ddp[0]) < 0.02 and abs(hsdp[1] - ddp[1]) < 0.02, (ddp, hsdp)


def test_gpt_dp2_tp2_mesh_trains_on_4_processes(tmp_path):
    train, val = _gpt(
        tmp_path,
        4,
        "strategy=fsdp",
        "fsdp.wrap=[Block]",
        "mesh.tp=2",
        "mesh.tp_plan=__main__:tp_plan",
    )
    ddp = _gpt(tmp_path, 2, "strategy=ddp")  # dp=2: the same global batch per step
    assert abs(val - ddp[1]) < 0.05, (val, ddp)


SHARDS = r"""
import torch, aios
from torch.distributed.tensor import DTensor
rt = aios.init()
torch.manual_seed(0)
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))
model = torch.nn.Sequential(*[Block() for _ in range(3)], torch.nn.Linear(64, 16))
full = {n: p.numel() for n, p in model.named_parameters()}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = rt.setup(model, opt)
params = dict(model.named_parameters())
assert all(isinstance(p, DTensor) for p in params.values()), [
    n for n, p in params.items() if not isinstance(p, DTensor)
]
assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in params.values()}
local = {n: p.to_local().numel() for n, p in params.items()}
fractions = {n: local[n] / full[n] for n in full}
x = torch.randn(16, 64)
for _ in range(3):
    loss = model(x).pow(2).mean()
    rt.backward(loss)
    rt.step(opt)
sd = rt.strategy.module_state_dict(model)
if rt.is_main:
    assert {k: tuple(v.shape) for k, v in sd.items()} == {n: tuple(params[n].shape) for n in params}
rt.print("fractions", min(fractions.values()), max(fractions.values()), sum(local.values()), sum(full.values()))
"""


@pytest.mark.parametrize("nprocs", [2, 4])
def test_parameters_are_dtensor_shards_of_about_one_nth(tmp_path, nprocs):
    (tmp_path / "shards.py").write_text(SHARDS)
    r = _run(tmp_path, "--nprocs", str(nprocs), "strategy=fsdp", "shards.py")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lo, hi, mine, total = re.search(
        r"fractions ([0-9.e-]+) ([0-9.e-]+) (\d+) (\d+)", r.stdout
    ).groups()
    # every weight and bias is split over the ranks on dim 0: rank 0 holds ceil(n/N) rows
    assert abs(float(lo) - 1 / nprocs) < 0.01 and abs(float(hi) - 1 / nprocs) < 0.01
    assert abs(int(mine) / int(total) - 1 / nprocs) < 0.01


def test_bogus_strategy_names_strategy_and_lists_the_choices(tmp_path):
    r = _run(tmp_path, "strategy=bogus", "--dry-run", str(EXAMPLE))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert (
        "invalid value 'bogus' for 'strategy'" in line
        and "choose one of: auto, ddp, deepspeed, fsdp, hsdp, nxd, spmd, tp" in line
    )


@pytest.mark.parametrize("strategy", ["spmd", "nxd"])
def test_other_backends_strategies_on_cpu_are_errors_not_ddp(tmp_path, strategy):
    r = _run(tmp_path, "--backend", "cpu", f"strategy={strategy}", "--dry-run", str(EXAMPLE))
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert (
        f"strategy '{strategy}' is not available on the cpu backend" in line
        and "strategies on cpu: auto, ddp, deepspeed, fsdp, hsdp, tp" in line
    )
