"""Bring your own parallelism (real aios-run and torchrun subprocesses, gloo):

* pytorch/examples' FSDP + TP 2-D example (examples/fsdp_tp, the README's worked case) with its
  plans applied by the script itself on ``rt.mesh["tp"]`` gives the losses of the original under
  torchrun, exactly (4 processes: dp=2 x tp=2; tests/test_readme.py runs the tp_plan form);
* a model the script sharded with ``fully_shard`` on its own mesh is kept as it is: it trains,
  saves (DCP) and resumes to the parameters of an uninterrupted run;
* with no strategy flag (``auto``) such a model is adopted: fsdp takes it, one line says so, it
  trains and saves sharded;
* strategy ddp asked for explicitly with such a model: one line naming what cannot be combined,
  exit 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN

torch = pytest.importorskip("torch")

SCRIPTS = Path(__file__).parent / "scripts"
TP2D = Path(__file__).resolve().parents[3] / "examples" / "fsdp_tp"  # the README's worked case


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def _run(tmp: Path, cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=_env(tmp), capture_output=True, text=True, timeout=400, cwd=cwd)


def _losses(text: str) -> list[str]:
    return re.findall(r"loss \d+ (-?\d+\.\d+)", text)


@pytest.fixture(scope="module")
def torchrun_losses(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from aios.testing import find_free_port

    tmp = tmp_path_factory.mktemp("torchrun")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-port",
        str(find_free_port()),
        "original.py",
        "2",
    ]
    p = _run(tmp, cmd, TP2D)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = _losses(p.stdout)
    assert len(losses) == 5 and len(set(losses)) == 5, p.stdout
    return losses


def test_fsdp_tp_example_with_its_own_plan_on_rt_mesh_gives_the_losses_of_torchrun(
    tmp_path: Path, free_port, torchrun_losses: list[str]
) -> None:
    """The script applies its plans itself on rt.mesh["tp"] (the README's test runs the tp_plan
    form as printed)."""
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        "4",
        "--master-port",
        str(free_port()),
        "strategy=fsdp",
        "mesh.tp=2",
        "train.py",
        "--own-plan",
    ]
    p = _run(tmp_path, cmd, TP2D)
    assert p.returncode == 0, p.stdout + p.stderr
    assert _losses(p.stdout) == torchrun_losses


def _own(tmp: Path, port: int, ckpt: Path, out: Path, steps: int, strategy: str | None = "fsdp"):
    cmd = [
        *AIOS_RUN,
        "--nprocs",
        "2",
        "--master-port",
        str(port),
        *([f"strategy={strategy}"] if strategy else []),
        f"checkpoint.dir={ckpt}",
        str(SCRIPTS / "own_fully_shard.py"),
        str(out),
        str(steps),
    ]
    return _run(tmp, cmd, tmp)


def test_own_fully_shard_model_trains_saves_and_resumes(tmp_path: Path, free_port) -> None:
    ref, got = tmp_path / "ref.pt", tmp_path / "got.pt"
    p = _own(tmp_path, free_port(), tmp_path / "ck-ref", ref, 6)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _own(tmp_path, free_port(), tmp_path / "ck", got, 3)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _own(tmp_path, free_port(), tmp_path / "ck", got, 6)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "at step 3" in p.stdout + p.stderr
    a, b = torch.load(ref), torch.load(got)
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ddp_with_a_sharded_model_says_what_it_cannot_combine(tmp_path: Path, free_port) -> None:
    p = _own(tmp_path, free_port(), tmp_path / "ck", tmp_path / "x.pt", 2, strategy="ddp")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "already sharded the model with fully_shard" in out and "strategy=fsdp" in out
    assert "Traceback" not in out and "DTensor" not in out.split("fully_shard")[0]


def test_own_fully_shard_model_is_adopted_without_a_strategy_flag(
    tmp_path: Path, free_port
) -> None:
    ckpt, out = tmp_path / "ck", tmp_path / "got.pt"
    p = _own(tmp_path, free_port(), ckpt, out, 2, strategy=None)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    said = [ln for ln in text.splitlines() if "parallelized its model itself" in ln]
    assert len(said) == 1 and "strategy auto took fsdp instead of ddp" in said[0], text
    assert "Traceback" not in text and torch.load(out)
    assert "at step 2" not in text  # a fresh run
    saved = {p.name for p in ckpt.rglob("*") if p.is_file()}
    assert any(n.endswith(".distcp") for n in saved), saved  # sharded (DCP), not one full file


@pytest.mark.parametrize(("kind", "nprocs"), [("2d", 4), ("tp", 2)])
def test_a_model_parallelized_on_the_scripts_own_mesh_reads_the_data_its_mesh_implies(
    tmp_path: Path, free_port, kind: str, nprocs: int
) -> None:
    """Tensor-parallel peers compute on one batch: a script that made its own mesh (dims named
    its own way) gets aios's data split from that mesh, with no strategy flag. ``2d``: each
    ``replicas`` group reads half of the epoch, both ranks of a group the same half, every
    sample once; ``tp`` over every rank: all ranks read the whole epoch alike."""
    out = tmp_path / "seen.json"
    cmd = [
        *AIOS_RUN, "--nprocs", str(nprocs), "--master-port", str(free_port()),
        str(SCRIPTS / "own_mesh_data.py"), kind, str(out),
    ]  # fmt: skip
    p = _run(tmp_path, cmd, tmp_path)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    said = [ln for ln in text.splitlines() if "parallelized its model itself" in ln]
    assert len(said) == 1, text
    rows = json.loads(out.read_text())["rows"]
    by_group: dict[int, list[list[int]]] = {}
    for row in rows:
        group = row["coord"][0] if kind == "2d" else 0
        by_group.setdefault(group, []).append(row["seen"])
        assert all(abs(v) < 1e6 for v in row["losses"]) and row["losses"], row
    for seen in by_group.values():
        assert all(s == seen[0] for s in seen), by_group  # one batch per tensor-parallel group
    firsts = [sorted(seen[0]) for seen in by_group.values()]
    everything = sorted(i for f in firsts for i in f)
    assert everything == list(range(16)), firsts  # every sample once over the data groups
    assert len(by_group) == (2 if kind == "2d" else 1)
