"""Issue 30: aios keeps what the script asked for. A script's own ``DistributedSampler(shuffle=True)``
with ``set_epoch`` gives a different order each epoch, the orders it gives under torchrun; a
validation sampler's ``drop_last`` stays (no padding duplicate); a script's own seed (``--seed``
before ``aios.init()``) is kept: seeds 0 and 5 give different first draws under aios-run, the
draws of the script without aios. A ``seed`` set in aios's config replaces it and says so once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "sampler_orders.py"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__TENSORBOARD": "false",
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "OMP_NUM_THREADS": "1",
            **extra,
        }
    )
    return env


def _read(out: Path, nprocs: int) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(nprocs)]


def _aios_run(tmp: Path, nprocs: int, seed: int, *args: str) -> tuple[str, list[dict[str, Any]]]:
    from aios.testing.strategy_contract import free_port

    out = tmp / f"aios-{nprocs}-{seed}-{len(args)}"
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", str(nprocs), f"master_port={free_port()}", *args]
        + [str(SCRIPT), str(out), str(seed)],
        capture_output=True,
        text=True,
        env=_env(tmp),
        cwd=tmp,
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout + r.stderr, _read(out, nprocs)


def _torchrun(tmp: Path, nprocs: int, seed: int) -> list[dict[str, Any]]:
    from aios.testing.strategy_contract import free_port

    out = tmp / f"torchrun-{nprocs}-{seed}"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nprocs}"]
    cmd += [f"--master-port={free_port()}", str(SCRIPT), str(out), str(seed)]
    if nprocs == 1:
        cmd = [*python(), str(SCRIPT), str(out), str(seed)]
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(tmp, NO_AIOS="1"), cwd=tmp, timeout=300
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return _read(out, nprocs)


def test_the_scripts_distributed_sampler_keeps_its_shuffle_epochs_and_drop_last(
    tmp_path: Path,
) -> None:
    _, got = _aios_run(tmp_path, 2, 5)
    want = _torchrun(tmp_path, 2, 5)
    for rank in range(2):
        orders = got[rank]["orders"]
        assert len({tuple(o) for o in orders}) == 3, orders  # a new order every epoch
        assert orders != [sorted(o) for o in orders]  # shuffled
        assert orders == want[rank]["orders"], (rank, orders, want[rank]["orders"])
        assert got[rank]["val"] == want[rank]["val"]
    for epoch in range(3):  # the ranks split each epoch: every sample once
        both = got[0]["orders"][epoch] + got[1]["orders"][epoch]
        assert sorted(both) == list(range(40))
    val = got[0]["val"] + got[1]["val"]
    assert len(val) == 16 and len(set(val)) == 16  # drop_last: no padding duplicate


def test_the_scripts_seed_is_kept_and_a_config_seed_replaces_it_in_one_line(
    tmp_path: Path,
) -> None:
    text0, seed0 = _aios_run(tmp_path, 1, 0)
    text5, seed5 = _aios_run(tmp_path, 1, 5)
    assert seed0[0]["first_draw"] != seed5[0]["first_draw"]
    assert seed0[0]["first_draw"] == _torchrun(tmp_path, 1, 0)[0]["first_draw"]
    assert seed5[0]["first_draw"] == _torchrun(tmp_path, 1, 5)[0]["first_draw"]
    assert "replaces the seed" not in text0 + text5
    # the config's seed asked for explicitly: it wins, and one line says so
    text, forced = _aios_run(tmp_path, 1, 5, "seed=0")
    assert forced[0]["first_draw"] == seed0[0]["first_draw"]
    lines = [ln for ln in text.splitlines() if "replaces the seed the script set" in ln]
    assert len(lines) == 1 and "seed=0 (config)" in lines[0] and "manual_seed(5)" in lines[0]


OWN = Path(__file__).parent / "scripts" / "own_samplers.py"


def _own(tmp: Path, nprocs: int, *args: str, env: dict[str, str] | None = None):
    from aios.testing.strategy_contract import free_port

    out = tmp / f"own-{nprocs}"
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", str(nprocs), f"master_port={free_port()}", *args, str(OWN), str(out)],
        capture_output=True,
        text=True,
        env=_env(tmp, **(env or {})),
        cwd=tmp,
        timeout=300,
    )
    got = [json.loads(p.read_text()) for p in sorted(tmp.glob(f"own-{nprocs}.rank*.json"))]
    return r, got


TRAIN_IDS = sorted(list(range(0, 40, 5)) + list(range(1, 40, 5)) + list(range(2, 40, 5)))


@pytest.mark.parametrize("nprocs", [1, 2])
def test_the_scripts_own_samplers_keep_their_subset_and_weights(
    tmp_path: Path, nprocs: int
) -> None:
    """A train split by ``SubsetRandomSampler`` trains on that subset only, each sample once an
    epoch over the ranks, in a new order each epoch; a ``WeightedRandomSampler`` never draws a
    sample of weight 0 and draws its ``num_samples`` over the ranks. Before, aios replaced any
    sampler but a ``DistributedSampler`` or ``RandomSampler`` with a plain split of the whole
    dataset: the held-out samples were trained on, with one process too."""
    r, got = _own(tmp_path, nprocs)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert len(got) == nprocs
    for epoch in range(2):
        seen = [i for g in got for i in g["epochs"][epoch]]
        assert sorted(seen) == TRAIN_IDS, (epoch, sorted(seen))
    assert [g["epochs"][0] for g in got] != [g["epochs"][1] for g in got]  # a new order
    drawn = [i for g in got for i in g["weighted"]]
    assert len(drawn) == 16 and not [i for i in drawn if i % 4 == 0], drawn


def test_a_sampler_that_splits_by_rank_itself_is_refused_in_one_line(tmp_path: Path) -> None:
    r, got = _own(tmp_path, 2, env={"RANKED": "1"})
    assert r.returncode == 2, r.stderr[-3000:]
    assert "the DataLoader's sampler Ranked splits the data over ranks itself" in r.stderr
    assert "Traceback" not in r.stderr and not got
