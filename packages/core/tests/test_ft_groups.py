"""Issue 36: replica groups (``ft.replica_groups``) keep training when one is lost, and the lost
group heals from a live one. ``aios-run --nprocs 2 ft.replica_groups=2`` on CPU (gloo); group 1
is SIGKILLed between steps, and while group 0 is entering the cross-group all-reduce (the kill is
made deterministic by files the script waits on, never by sleeps). Asserted: group 0 never
restarts and commits steps with 1 group; group 1 restarts, heals (parameters bitwise equal to
group 0's from then on) and commits with 2 groups again; exit 0; every sample of the epoch is
trained in exactly one committed step's share (the committed-samples accounting)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")
pytest.importorskip("torchft", reason="torchft is not installed (the extra aios-core[ft])")

SCRIPT = Path(__file__).parent / "scripts" / "ft_loop.py"
N = 64


def _aios_run_args(
    tmp: Path, *args: str, env: dict[str, str] | None = None, nprocs: int = 2
) -> dict:
    """``aios-run --nprocs NPROCS ft.replica_groups=2 ARGS ft_loop.py``: Popen's arguments."""
    from aios.testing.strategy_contract import free_port

    full = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG"))}
    full.update(
        {
            "AIOS_LOGGING__TENSORBOARD": "false",
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "OMP_NUM_THREADS": "1",
            "FT_OUT": str(tmp),
            **(env or {}),
        }
    )
    return {
        "args": [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", str(nprocs), f"master_port={free_port()}", "ft.replica_groups=2"]
        + ["ft.heartbeat_timeout_ms=500", "ft.timeout=30", *args, str(SCRIPT)],
        "text": True,
        "env": full,
        "cwd": tmp,
    }


def aios_run(tmp: Path, *args: str, env: dict[str, str] | None = None, nprocs: int = 2):
    return subprocess.run(
        **_aios_run_args(tmp, *args, env=env, nprocs=nprocs), capture_output=True, timeout=600
    )


def _logs(tmp: Path) -> dict[str, list[dict]]:
    return {
        p.name: [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(tmp.glob("g*-r*.jsonl"))
    }


def _starts(tmp: Path) -> list[dict]:
    """What each group process said of its start (ft_loop.py): its threads, whether restarted."""
    return [json.loads(p.read_text()) for p in sorted(tmp.glob("start-g*-r*.json"))]


def _trained_once(
    survs: list[list[dict]], firsts: list[list[dict]], agains: list[list[dict]], per_group: int
) -> None:
    """Every sample of the epoch trained once: each committed step's shares of the
    participating groups' ranks (the survivor's, group 1's before its loss and after its
    restart)."""
    seen: list[int] = []
    share: dict[int, list[tuple[bool, dict]]] = {}
    for run in (*survs, *firsts, *agains):
        restarted = any(run is a for a in agains)
        for e in run:
            if e["ok"]:
                # a healing group's first step contributes no gradient: its batch is not counted
                share.setdefault(e["step"], []).append((restarted and e is run[0], e))
    last = max(share)
    tail: set[int] = set()
    for step, entries in sorted(share.items()):
        p = entries[0][1]["p"]
        counted = [e for healing, e in entries if not healing]
        assert len(counted) == p * per_group, (step, entries)
        for e in counted:
            (tail.update if step == last else seen.extend)(e["idx"])
    # once each; the epoch's short last step is padded from its start (as DistributedSampler)
    assert len(seen) == len(set(seen))
    assert set(seen) | tail == set(range(N)) and not tail <= set(seen)


def _assert_lost_and_healed(
    tmp: Path, r: subprocess.CompletedProcess, mode: str, per_group: int, tp: int = 1
):
    """The survivor never restarted and committed with one group, then two; group 1 was lost,
    restarted and healed (each of its ranks bitwise equal to the same rank of group 0 from its
    first committed step on); every sample trained once. ``tp``: the group's ranks come in
    blocks of ``tp`` that read the same batch (strategy=tp)."""
    assert r.returncode == 0, r.stderr[-3000:]
    logs = _logs(tmp)
    ranks = range(per_group)
    g0 = {k: [v for n, v in logs.items() if n.startswith(f"g0-r{k}-")] for k in ranks}
    g1 = {k: [v for n, v in logs.items() if n.startswith(f"g1-r{k}-")] for k in ranks}
    assert all(len(g0[k]) == 1 for k in ranks), "the surviving group never restarts"
    assert all(len(g1[k]) == 2 for k in ranks), "group 1 ran twice: before the kill and after"
    survs = [g0[k][0] for k in ranks]
    firsts, agains = [], []
    for k in ranks:
        first, again = sorted(g1[k], key=lambda v: v[0]["restarted"] if v else True)
        assert again[0]["restarted"] and (not first or not first[0]["restarted"])
        firsts.append(first)
        agains.append(again)
    # the one line per event
    assert "aios: replica group 1 lost at step" in r.stderr
    assert "1 of 2 groups training" in r.stderr
    assert "replica group 1 healed from a live group" in r.stderr
    assert "Quorum!" not in r.stderr  # torchft's per-step INFO lines are off
    # every process was forked from aios-run's zygote, the restarted group's too (its imports
    # were done before it was lost: the heal waits for no fresh interpreter)
    starts = _starts(tmp)
    assert len(starts) == 3 * per_group and any(s["restarted"] for s in starts)
    assert all(s["warm"] for s in starts), starts
    for k in ranks:
        surv, again = survs[k], agains[k]
        committed = [e for e in surv if e["ok"]]
        assert any(e["p"] == 1 for e in committed)
        assert committed[-1]["p"] == 2
        if mode == "allreduce":  # the step group 1 died in did not commit; its batch came again
            miss = [i for i, e in enumerate(surv) if not e["ok"]]
            assert miss and all(
                surv[i + 1]["ok"] and surv[i + 1]["idx"] == surv[i]["idx"] for i in miss
            )
        else:
            assert all(e["ok"] for e in surv)
        # healed: from its first committed step on, the rank's parameters (its shards) are
        # the same rank's of group 0, bitwise
        by_step = {e["step"]: e["params"] for e in committed}
        healed = [e for e in again if e["ok"]]
        assert healed and all(by_step[e["step"]] == e["params"] for e in healed)
    for k in ranks:  # the tp ranks of one data rank read the same batches
        lead = k - k % tp
        for runs in (survs, agains):
            assert [e["idx"] for e in runs[k]] == [e["idx"] for e in runs[lead]]
    data = [k for k in ranks if k % tp == 0]
    _trained_once(
        [survs[k] for k in data],
        [firsts[k] for k in data if firsts[k]],
        [agains[k] for k in data],
        len(data),
    )
    return survs[0]


@pytest.mark.parametrize("mode", ["between", "allreduce"])
def test_lost_group_survivor_keeps_training_and_heals(tmp_path: Path, mode: str) -> None:
    r = aios_run(tmp_path, env={"FT_KILL_STEP": "5", "FT_KILL_MODE": mode})
    surv = _assert_lost_and_healed(tmp_path, r, mode, per_group=1)
    committed = [e for e in surv if e["ok"]]
    # goodput: the replica-group categories in the run record and in `aios report`
    (run,) = (tmp_path / "runs").iterdir()
    rep = subprocess.run(
        [sys.executable, "-c", "from aios.cli.main import main; main()", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    degraded = sum(1 for e in committed if e["p"] == 1)
    lost = sum(1 for e in surv if not e["ok"])
    assert (
        f"replica groups: 2; steps committed with fewer groups: {degraded}; "
        f"steps not committed (trained again): {lost}; heals: group 1 in "
    ) in rep.stdout


@pytest.mark.parametrize("mode", ["between", "allreduce"])
def test_loader_workers_read_ahead_and_a_lost_group_heals(tmp_path: Path, mode: str) -> None:
    """The script's DataLoader has 2 workers (as public training code does). They read the next
    steps ahead, as each will be when it commits with the groups of the step they started
    from; a step whose samples differ (the first of the epoch, one after a step that did not
    commit or that committed with other groups) is read in the rank's own process, and the
    workers start over from the step after it. Group 1 is lost between steps and heals; every
    sample is trained once, exactly as without workers."""
    env = {"FT_KILL_STEP": "5", "FT_KILL_MODE": mode, "FT_WORKERS": "2"}
    r = aios_run(tmp_path, env=env)
    surv = _assert_lost_and_healed(tmp_path, r, mode, per_group=1)
    assert "num_workers" not in r.stderr
    # group 0 is the first participant throughout: its step's samples start at the committed
    # position, so a prediction holds while every step since the workers' start committed with
    # the groups assumed then
    assumed = None
    for i, e in enumerate(surv):
        predicted = i > 0 and surv[i - 1]["ok"] and surv[i - 1]["p"] == assumed
        if not predicted:
            assumed = e["p"]
        want = {0, 1} if predicted else {-1}
        assert set(e["read_by"]) <= want, (i, surv[max(0, i - 1) : i + 1])
    assert sum(1 for e in surv if -1 not in e["read_by"]) >= len(surv) // 2
    (again,) = [
        v for k, v in _logs(tmp_path).items() if k.startswith("g1-") and v and v[0]["restarted"]
    ]
    assert -1 not in again[-1]["read_by"]  # the healed group reads ahead again too


HABITS = Path(__file__).parent / "scripts" / "ft_habits.py"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_grad_accumulation_and_a_validation_pass_under_groups(tmp_path: Path, workers: str) -> None:
    """Public training code's habits under replica groups: ``grad_accum=2`` and a validation
    pass each epoch (``model.eval()``, ``torch.no_grad()``, a mean over ``len(val_loader)``);
    group 1 is lost after step 3 and heals. Each micro-batch of a step reads new samples (never
    the step's first batch again); over each epoch every training sample is in exactly one
    committed step's share (the healing step's batches not counted; the run's last, unfinished
    step's read); each group's validation passes see every validation sample once
    (``len(val_loader)`` batches), so its mean is the whole set's, and none of them hangs."""
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG"))}
    env.update(
        {
            "AIOS_LOGGING__TENSORBOARD": "false",
            "AIOS_LOGGING__RUN_DIR": str(tmp_path / "runs"),
            "OMP_NUM_THREADS": "1",
            "FT_OUT": str(tmp_path),
            "FT_KILL_STEP": "3",
        }
    )
    script = HABITS.read_text()
    if workers != "0":  # the same script with loader workers
        script = script.replace(
            "batch_size=2, shuffle=True", f"batch_size=2, shuffle=True, num_workers={workers}"
        )
        script = script.replace("batch_size=2\n", f"batch_size=2, num_workers={workers}\n")
        assert script.count(f"num_workers={workers}") == 2
    (tmp_path / "ft_habits.py").write_text(script)
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", "2", f"master_port={free_port()}", "ft.replica_groups=2"]
        + ["ft.heartbeat_timeout_ms=500", "ft.timeout=30", "grad_accum=2", "ft_habits.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "replica group 1 healed from a live group" in r.stderr
    runs = {
        p.name: [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(tmp_path.glob("h-g*-r*.jsonl"))
    }
    assert len(runs) == 3  # group 0; group 1 before its loss and after its restart
    per_epoch: dict[int, list[int]] = {0: [], 1: []}
    for run in runs.values():
        steps = [e["train"] for e in run if "train" in e]
        healing = steps[0] if steps and steps[0]["restarted"] else None
        for st in steps:
            assert len(st["batches"]) == 2  # the step's two micro-batches
            a, b = (ids for _, ids in st["batches"])
            assert not set(a) & set(b)  # the second micro-batch reads new samples
            if st is not healing:  # torchft zeroes the healing step's gradients
                for epoch, ids in st["batches"]:
                    per_epoch[epoch] += ids
        # the run's last step, unfinished (its samples read; a killed run has none)
        for e in run:
            for epoch, ids in e.get("dangling", []):
                per_epoch[epoch] += ids
        vals = [e["val"] for e in run if "val" in e]
        for v in vals:
            assert sorted(v["ids"]) == list(range(100, 114)) and v["len"] == 7
        ended = any("dangling" in e for e in run)  # not the run killed after step 3
        assert len(vals) == (2 if ended else 0)
    for epoch, seen in per_epoch.items():
        assert set(seen) == set(range(44)), (epoch, sorted(seen))
        dup = [i for i in set(seen) if seen.count(i) > 1]
        # only a short last step's padding repeats samples: from the start of the epoch's order
        assert len(dup) <= 2, (epoch, dup)
    assert "epoch 1: validation loss" in r.stdout + r.stderr


def test_training_in_eval_mode_under_groups_is_named_in_one_line(tmp_path: Path) -> None:
    """The script forgets ``model.train()`` after its first validation pass: its second epoch's
    training pass begins with the model in ``eval()`` mode, which under replica groups reads as
    a validation pass (each group the whole set). Said once, in one line, naming the fix."""
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG"))}
    env.update(
        {
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
            "FT_OUT": str(tmp_path),
            "FT_FORGET_TRAIN": "1",
        }
    )
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", "2", f"master_port={free_port()}", "ft.replica_groups=2", str(HABITS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = (
        "aios: a training step from a loader pass begun with the model in eval() mode: under "
        "ft.replica_groups such a pass is a validation pass (each group reads the whole set, "
        "not its share); call model.train() before training on it"
    )
    assert r.stderr.count(line) == 1, r.stderr[-3000:]  # by the first group in the quorum


def test_the_scripts_own_samplers_under_groups(tmp_path: Path) -> None:
    """``SubsetRandomSampler`` and ``WeightedRandomSampler`` (tests/scripts/own_samplers.py)
    under ``ft.replica_groups=2``: the groups split the subset's order of each epoch (every
    sample of the subset once, none outside it), and the weighted draws never include a sample
    of weight 0."""
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG"))}
    env.update({"AIOS_LOGGING__TENSORBOARD": "false", "OMP_NUM_THREADS": "1"})
    script = Path(__file__).parent / "scripts" / "own_samplers.py"
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", "2", f"master_port={free_port()}", "ft.replica_groups=2"]
        + [str(script), str(tmp_path / "own")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("own.rank*.json"))]
    assert sorted(g["group"] for g in got) == [0, 1]
    train = sorted(list(range(0, 40, 5)) + list(range(1, 40, 5)) + list(range(2, 40, 5)))
    for epoch in range(2):
        assert sorted(i for g in got for i in g["epochs"][epoch]) == train
    drawn = [i for g in got for i in g["weighted"]]
    assert drawn and not [i for i in drawn if i % 4 == 0], drawn


def test_a_group_restarted_after_the_others_finished_ends_without_training(
    tmp_path: Path,
) -> None:
    """Group 1 is SIGKILLed after step 5; group 0 trains the rest of the epoch alone and ends
    before the restarted group 1 asks for its first quorum. Nothing is left to train: group 1
    ends at once with one line and exit 0. It never trains the epoch again alone from step 0,
    and the run's last checkpoint stays group 0's (the trained weights, not group 1's fresh
    ones)."""
    import torch
    from aios.checkpoint import CheckpointStore

    ckpt = tmp_path / "ckpt"
    r = aios_run(
        tmp_path, f"checkpoint.dir={ckpt}", env={"FT_KILL_STEP": "5", "FT_KILL_MODE": "late"}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "aios: replica group 1 restarted after every other group had finished: they trained "
        "its share of the data; it ends without training"
    ) in r.stderr, r.stderr[-3000:]
    assert "without a single training step" not in r.stderr
    logs = _logs(tmp_path)
    (surv,) = [v for k, v in logs.items() if k.startswith("g0-")]
    g1 = [v for k, v in logs.items() if k.startswith("g1-")]
    starts = _starts(tmp_path)
    assert sum(1 for s in starts if s["restarted"]) == 1, starts  # group 1 did come back
    # the restarted group trained nothing: group 1's only steps are its first run's 5
    assert [[e["step"] for e in run] for run in g1 if run] == [[1, 2, 3, 4, 5]]
    assert all(e["ok"] for e in surv) and surv[-1]["p"] == 1
    _trained_once([surv], [run for run in g1 if run], [], per_group=1)
    # the last checkpoint: group 0's final step and parameters
    store = CheckpointStore(str(ckpt), keep=None)
    last = max(store.list(), key=lambda i: i.step)
    assert last.step == surv[-1]["step"]
    state = store.load(last)
    weights = [t.flatten().tolist() for t in state["modules"][0].values() if torch.is_tensor(t)]
    assert weights == surv[-1]["params"]


@pytest.mark.parametrize("warm_start", ["true", "false"])
def test_group_processes_start_warm_unless_turned_off_with_this_hosts_threads(
    tmp_path: Path, warm_start: str
) -> None:
    """The groups' processes are forked from aios-run's zygote (``launch.warm_start``, on by
    default), or start fresh with it off; either way each gets the plan's environment, as the
    ranks without groups do: this host's CPUs shared among its processes (``OMP_NUM_THREADS``
    unset here), never every CPU for each."""
    from aios.launcher.plan import rank_threads

    kw = _aios_run_args(tmp_path, f"launch.warm_start={warm_start}")
    del kw["env"]["OMP_NUM_THREADS"]
    r = subprocess.run(**kw, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    starts = _starts(tmp_path)
    assert len(starts) == 2
    assert all(s["warm"] is (warm_start == "true") for s in starts), starts
    assert all(s["threads"] == rank_threads(2) for s in starts), starts


def test_refused_without_divisible_nprocs(tmp_path: Path) -> None:
    r = aios_run(tmp_path, "ft.replica_groups=3")
    assert r.returncode == 2
    assert "nprocs=2 is not divisible by ft.replica_groups=3" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.glob("g*.jsonl"))  # no rank started


def test_a_rank_outside_a_group_is_stopped_not_run_without_it(tmp_path: Path) -> None:
    """``ft.replica_groups`` under a launcher that starts no groups (plain ``python``, torchrun,
    a cluster's own launcher) would train without fault tolerance, silently: ``aios.init``
    stops it in one line, exit 2, before anything trains."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    r = subprocess.run(
        [*python(str(SCRIPT))],
        capture_output=True,
        text=True,
        env={**env, "AIOS_FT__REPLICA_GROUPS": "2", "FT_OUT": str(tmp_path)},
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert any(
        "ft.replica_groups=2 is set, but this process was not started in a replica group" in x
        for x in lines
    ), r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("g*-r*.jsonl"))


def test_refused_without_torchft(tmp_path: Path) -> None:
    """torchft not importable (sys.modules entry None: find_spec answers None, as when it is not
    installed): one line naming the extra from this checkout, before any rank starts."""
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    code = "import sys; sys.modules['torchft'] = None; from aios.cli.run import main; main()"
    r = subprocess.run(
        [sys.executable, "-c", code, "--nprocs", "2", f"master_port={free_port()}"]
        + ["ft.replica_groups=2", str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**env, "FT_OUT": str(tmp_path)},
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert "ft.replica_groups=2 needs torchft, which is not installed" in r.stderr
    assert "./packages/core[ft]" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.glob("g*.jsonl"))


@pytest.mark.parametrize("backend", ["xla", "tpu", "neuron"])
def test_refused_on_backends_torchft_does_not_cover(backend: str) -> None:
    from aios.config.schema import resolve
    from aios.errors import ConfigError
    from aios.ft.plan import check

    cfg = resolve(None, ["ft.replica_groups=2"], {})
    with pytest.raises(ConfigError, match=f"not supported on backend '{backend}'"):
        check(cfg, backend, 2)
    assert check(cfg, "cpu", 4) == 2
    assert check(resolve(None, [], {}), backend, 2) == 1  # off: nothing refused


@pytest.mark.parametrize(
    "mode,strategy",
    [
        ("between", ["strategy=fsdp"]),
        ("allreduce", ["strategy=fsdp"]),
        ("between", ["strategy=hsdp", "mesh.replicate=2"]),
    ],
    ids=["between", "allreduce", "hsdp-between"],
)
def test_fsdp_inside_groups_loses_a_process_and_heals(
    tmp_path: Path, mode: str, strategy: list[str]
) -> None:
    """``strategy=fsdp`` inside each group of 2 processes (4 in all): one process of group 1 is
    SIGKILLed; group 1 is stopped and restarted, and each of its ranks heals its own shards from
    the same rank of group 0 (no collective on either side), bitwise. ``strategy=hsdp`` with
    ``mesh.replicate=2``: each group replicates over its 2 ranks (FSDP2's replicate dimension)
    inside, and the groups over the cross-group all-reduce."""
    env = {"FT_KILL_STEP": "5", "FT_KILL_MODE": mode}
    r = aios_run(tmp_path, *strategy, env=env, nprocs=4)
    _assert_lost_and_healed(tmp_path, r, mode, per_group=2)


def test_tp_inside_groups_loses_a_process_and_heals(tmp_path: Path) -> None:
    """``strategy=tp`` inside each group of 2 processes (the MLP column- then row-parallel over
    both): both ranks of a group read the same batch, and the step's batches are split over the
    groups only. One process of group 1 is SIGKILLed between steps; group 1 restarts and each
    of its ranks heals its own shard from the same rank of group 0, bitwise."""
    env = {"FT_KILL_STEP": "5", "FT_KILL_MODE": "between"}
    r = aios_run(tmp_path, "strategy=tp", "mesh.tp_plan=__main__:tp_plan", env=env, nprocs=4)
    _assert_lost_and_healed(tmp_path, r, "between", per_group=2, tp=2)
    # each rank holds half of the first layer's weight: a shard, not a replica
    (surv,) = [v for k, v in _logs(tmp_path).items() if k.startswith("g0-r0-")]
    assert len(surv[0]["params"][0]) == 16 * 4 // 2


def _two_hosts(base: dict, timeout: float) -> tuple[list[int], list[tuple[str, str]]]:
    """Two aios-runs of ``base`` (:func:`_aios_run_args`), one process each, as two hosts'
    shells run them (``--nnodes 2 --node-rank K --master-addr 127.0.0.1 --master-port P``, here
    on one machine); returns their exit codes and (stdout, stderr)."""
    from aios.testing.strategy_contract import free_port

    port = free_port()
    head = [a for a in base["args"] if not a.startswith("master_port=")]
    at = head.index("--nprocs")
    head[at + 1] = "1"
    procs = []
    for node in (0, 1):
        where = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1"]
        args = [*head[: at + 2], *where, "--master-port", str(port), *head[at + 2 :]]
        procs.append(
            subprocess.Popen(
                **{**base, "args": args}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], outs


def test_groups_over_two_hosts_one_aios_run_each(tmp_path: Path) -> None:
    """Replica groups over hosts, one aios-run per host as each host's shell runs it
    (``--nnodes 2 --node-rank K --master-addr A --master-port P``; here two on one machine):
    node 0's aios-run starts the lighthouse and the run's store on ``A:P``, node 1's finds the
    lighthouse there; each host runs its group. Group 1 (node 1) is SIGKILLed between steps:
    node 1's aios-run restarts it alone, it heals from group 0 on node 0, and both hosts end 0
    with every sample trained once."""
    env = {"FT_KILL_STEP": "5", "FT_KILL_MODE": "between"}
    codes, outs = _two_hosts(_aios_run_args(tmp_path, env=env), timeout=600)
    err = "\n".join(e for _, e in outs)
    r = subprocess.CompletedProcess(args=[], returncode=max(codes), stdout="", stderr=err)
    _assert_lost_and_healed(tmp_path, r, "between", per_group=1)
    # node 1's aios-run lost and restarted its own group; node 0's never restarted anything
    assert "restarting replica group 1" in outs[1][1] and "restarting" not in outs[0][1]
    assert codes == [0, 0], err[-3000:]


def test_a_hung_group_alone_on_its_host_is_judged_against_the_other_hosts(tmp_path: Path) -> None:
    """Replica groups over two hosts, one group each: group 1 (node 1) hangs after committing
    step 5. Node 1's aios-run has no other group of its own to compare it with: it reads group
    0's steps from the run's store (node 0's aios-run shares them there), judges group 1 hung,
    stops and restarts it; it heals from group 0 and both hosts end 0."""
    env = {"FT_KILL_STEP": "5", "FT_KILL_MODE": "hang"}
    codes, outs = _two_hosts(_aios_run_args(tmp_path, "ft.timeout=10", env=env), timeout=300)
    err0, err1 = outs[0][1], outs[1][1]
    assert codes == [0, 0], (err0 + err1)[-3000:]
    assert (
        "aios: replica group 1 lost at step 5 (hung: no step for 20s while another group "
        "stepped); 1 of 2 groups training"
    ) in err1, err1[-3000:]
    assert "restarting replica group 1" in err1 and "lost" not in err0, err0[-3000:]
    assert "replica group 1 healed from a live group" in err1 + err0
    logs = _logs(tmp_path)
    g0 = [v for k, v in logs.items() if k.startswith("g0-")]
    g1 = [v for k, v in logs.items() if k.startswith("g1-")]
    assert len(g0) == 1 and len(g1) == 2
    (surv,) = g0
    first, again = sorted(g1, key=lambda v: v[0]["restarted"])
    assert [e["step"] for e in first] == [1, 2, 3, 4, 5]  # it hung after step 5
    committed = [e for e in surv if e["ok"]]
    by_step = {e["step"]: e["params"] for e in committed}
    healed = [e for e in again if e["ok"]]
    assert healed and all(by_step[e["step"]] == e["params"] for e in healed)
    _trained_once([surv], [first], [again], per_group=1)


def test_a_host_whose_node_0_never_comes_is_one_line(tmp_path: Path) -> None:
    """Node 1's aios-run with no node 0 on the master address: one line naming the store it
    could not reach and what to start, exit 2, no traceback, no group process started."""
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    hosts = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"]
    port = free_port()
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()"), *hosts]
        + ["--master-port", str(port), "--nprocs", "1", "ft.replica_groups=2"]
        + ["ft.join_timeout_ms=1000", "ft.timeout=1", str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**env, "FT_OUT": str(tmp_path)},
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert (
        f"replica groups over 2 hosts: node 1 could not reach the run's store on 127.0.0.1:{port}"
    ) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("g*-r*.jsonl"))


def test_refused_with_a_strategy_groups_do_not_run() -> None:
    from aios.config.schema import resolve
    from aios.errors import ConfigError
    from aios.ft.plan import check

    over = resolve(None, ["ft.replica_groups=3", "nnodes=2"], {})
    with pytest.raises(ConfigError, match="each replica group runs on one host"):
        check(over, "cpu", 6)
    assert check(resolve(None, ["ft.replica_groups=4", "nnodes=2"], {}), "cpu", 4) == 4
    cfg = resolve(None, ["ft.replica_groups=2", "strategy=deepspeed"], {}, check_backend=False)
    with pytest.raises(
        ConfigError, match="strategy=deepspeed is not supported: replica groups run"
    ):
        check(cfg, "cpu", 4)
    for strategy in ("ddp", "fsdp", "hsdp", "tp", "auto"):
        assert (
            check(resolve(None, ["ft.replica_groups=2", f"strategy={strategy}"], {}), "cpu", 4) == 2
        )


def test_dry_run_names_the_groups(tmp_path: Path) -> None:
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()"), "--dry-run"]
        + ["--nprocs", "4", f"master_port={free_port()}", "ft.replica_groups=2", str(SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "replica groups: 2 of 2 processes; the lighthouse on 127.0.0.1:<free port>" in r.stdout
    port = free_port()
    hosts = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"]
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()"), "--dry-run", *hosts]
        + ["--master-port", str(port), "--nprocs", "2", "ft.replica_groups=4", str(SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "replica groups: 4 of 1 processes, 2 on each of 2 hosts; the lighthouse on "
        f"127.0.0.1:<free port>, started by node 0's aios-run, found through its store on "
        f"127.0.0.1:{port}"
    ) in r.stdout, r.stdout


README_SCRIPT = """\
import aios
import torch

rt = aios.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
model, opt, loader = rt.setup(model, opt, loader)
for x, y in loader:
    rt.backward(torch.nn.functional.mse_loss(model(x), y))
    rt.step()
print("groups", rt.replica_groups, "participants", rt.replica_participants)
rt.close()
"""


@pytest.mark.parametrize(
    "command",
    [
        "aios-run --nprocs 2 ft.replica_groups=2 train.py",
        "aios-run --nprocs 4 ft.replica_groups=2 strategy=fsdp train.py",
    ],
)
def test_the_readme_command_runs_as_printed(tmp_path: Path, command: str) -> None:
    """The core README's replica-group commands, typed as printed (no port, heartbeat or
    timeout settings), train every group to the end of the epoch."""
    (tmp_path / "train.py").write_text(README_SCRIPT)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert command in readme
    nprocs = int(command.split()[2])
    exe = Path(sys.executable).with_name("aios-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG"))}
    env["AIOS_LOGGING__RUN_DIR"] = str(tmp_path / "runs")
    r = subprocess.run(
        [str(exe), *command.split()[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("]:groups 2 participants 2\n") == nprocs, r.stdout[-2000:]
    assert all(f"[rank{k}]:groups" in r.stdout for k in range(nprocs))
    assert "Quorum!" not in r.stderr  # torchft's per-step lines are off
    assert "GET /checkpoint/" not in r.stderr  # its checkpoint server's access log too
    assert "buffer is not writable" not in r.stderr


def test_hang_watch_judges_a_group_left_behind(tmp_path: Path) -> None:
    """aios.ft.hang with an injected clock: a group is hung when one of its ranks stayed behind
    another live group's quorum request for the limit; not before its ranks' first request, not
    while every group is quiet, not when it catches up within the limit, not when it is the
    only live group, and not after a restart until it asks again. Two requests made between
    the same two looks (group 1's last, then group 0's next) still leave group 1 behind."""
    from aios.ft.hang import Beat, HangWatch

    now = [0.0]
    watch = HangWatch(str(tmp_path), per_group=2, limit_s=10.0, clock=lambda: now[0])
    beats = {(g, r): Beat(str(tmp_path), g, r) for g in (0, 1) for r in (0, 1)}
    assert watch.look([0, 1]) == []  # nobody asked yet: starting
    for b in beats.values():
        b.tick(0)
    assert watch.look([0, 1]) == []
    now[0] = 30.0  # everyone quiet for 30 s (an evaluation every group runs): no hang
    assert watch.look([0, 1]) == []
    beats[0, 0].tick(1)  # group 0 asks from step 1; group 1 is behind from now
    assert watch.look([0, 1]) == []
    now[0] = 39.0
    for r in (0, 1):  # group 1 catches up within the limit: no hang
        beats[1, r].tick(1)
    beats[0, 1].tick(1)
    assert watch.look([0, 1]) == []
    now[0] = 45.0
    beats[1, 0].tick(2)  # group 1's rank 1 stays at step 1 while the others ask from step 2
    for r in (0, 1):
        beats[0, r].tick(2)
    assert watch.look([0, 1]) == []
    now[0] = 55.5
    assert watch.look([0, 1]) == [1]  # 10.5 s behind group 0
    assert watch.look([1]) == []  # group 0 ended: group 1 alone is not judged
    watch.forget(1)  # restarted: its old steps gone, judged again once it asks
    assert watch.look([0, 1]) == []
    now[0] = 100.0
    assert watch.look([0, 1]) == []
    # over several hosts: group 1 alone on this host (restarted: its processes' new beats),
    # judged against another host's group 2
    for r in (0, 1):
        beats[1, r].close()
        beats[1, r] = Beat(str(tmp_path), 1, r)
        beats[1, r].tick(3)
    assert watch.look([1]) == [] and watch.look([1], {2: 3}) == []  # level with it
    assert watch.look([1], {2: 4}) == []  # group 2 asked from step 4: behind from now
    now[0] = 110.5
    assert watch.look([1], {2: 4}) == [1]
    assert watch.look([1], {}) == []  # the other host's group ended or was lost
    for b in beats.values():
        b.close()


def test_a_hung_group_is_stopped_and_heals(tmp_path: Path) -> None:
    """Group 1 hangs in the script after committing step 5 (a file, not a timer, decides
    where). Its manager still heartbeats, so torchft's lighthouse forms no quorum without it and
    group 0 waits in its quorum request (whose timeout outlasts the hang limit): aios-run judges
    group 1 hung (no quorum request for 2 x ft.timeout while group 0 asked), stops it and
    restarts it; group 0 goes on alone meanwhile, never restarts, group 1 heals and every
    sample is trained once. ft.timeout=10 leaves 10 s for aios-run to stop the hung group
    before group 0's quorum would give up, a margin a loaded machine does not eat."""
    r = aios_run(tmp_path, "ft.timeout=10", env={"FT_KILL_STEP": "5", "FT_KILL_MODE": "hang"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "aios: replica group 1 lost at step 5 (hung: no step for 20s while another group "
        "stepped); 1 of 2 groups training"
    ) in r.stderr, r.stderr[-3000:]
    assert "replica group 0 lost" not in r.stderr  # the survivor outlasted the hang
    # where the hung group was, before it was stopped
    head = "aios: watchdog: replica group 1 hung: no step for 20s while another group stepped"
    assert head in r.stderr, r.stderr[-3000:]
    assert "ft_loop.py" in r.stderr.split(head, 1)[1].splitlines()[1]
    assert "replica group 1 healed from a live group" in r.stderr
    logs = _logs(tmp_path)
    g0 = [v for k, v in logs.items() if k.startswith("g0-")]
    g1 = [v for k, v in logs.items() if k.startswith("g1-")]
    assert len(g0) == 1 and len(g1) == 2
    (surv,) = g0
    first, again = sorted(g1, key=lambda v: v[0]["restarted"])
    assert [e["step"] for e in first] == [1, 2, 3, 4, 5]  # it hung after step 5
    committed = [e for e in surv if e["ok"]]
    assert any(e["p"] == 1 for e in committed) and committed[-1]["p"] == 2
    by_step = {e["step"]: e["params"] for e in committed}
    healed = [e for e in again if e["ok"]]
    assert healed and all(by_step[e["step"]] == e["params"] for e in healed)
    _trained_once([surv], [first], [again], per_group=1)
    # the survivor's stall: from its step 5 to its next committed step (shown, not asserted)
    at5 = next(e["t"] for e in surv if e["step"] == 5 and e["ok"])
    after = next(e["t"] for e in surv if e["step"] == 6 and e["ok"])
    heal = next(line for line in r.stderr.splitlines() if "healed from" in line)
    print(f"survivor stalled {after - at5:.1f}s; {r.stderr.count('did not commit')} steps lost;")
    print(heal)


def test_sigusr1_prints_every_group_s_stacks_and_the_run_goes_on(tmp_path: Path) -> None:
    """SIGUSR1 to aios-run under replica groups (as without them): where each rank of each live
    group is, one summary per group, the full stacks in the group's run record; the run is not
    stopped and ends 0."""
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            **{**_aios_run_args(tmp_path, env={"FT_PAUSE_STEP": "3"}), "stderr": err},
            stdout=subprocess.DEVNULL,
        )
        try:
            for g in (0, 1):
                marker = tmp_path / f"paused-g{g}-r0"
                while not marker.exists():
                    assert proc.poll() is None, err_path.read_text()[-3000:]
                    time.sleep(0.05)
            # `aios stacks FOLDER` reads a group's folder as any run's (the folder is in each
            # rank's environment, where `aios stacks` without a folder finds it)
            folder = (tmp_path / "paused-g1-r0").read_text()
            assert folder and folder != (tmp_path / "paused-g0-r0").read_text()
            st = subprocess.run(
                [sys.executable, "-c", "from aios.cli.main import main; main()", "stacks"]
                + [folder, "--brief"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert st.returncode == 0 and "ft_loop.py" in st.stdout, st.stdout + st.stderr
            proc.send_signal(signal.SIGUSR1)
            # both groups' summaries, each naming where its rank waits (the script's line)
            while err_path.read_text().count("full stacks (every thread):") < 2:
                assert proc.poll() is None, err_path.read_text()[-3000:]
                time.sleep(0.05)
            (tmp_path / "go-on").touch()
            assert proc.wait(timeout=600) == 0, err_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    said = err_path.read_text()
    for g in (0, 1):
        head = f"aios: watchdog: on demand (SIGUSR1), replica group {g}; where each rank is:"
        assert head in said, said[-3000:]
        after = said.split(head, 1)[1].splitlines()[1]
        assert "rank 0 [pid" in after and "ft_loop.py" in after, after
    (run,) = (tmp_path / "runs").iterdir()
    assert len(list(run.glob("watchdog/stacks-1.txt"))) == 1
    assert len(list(run.glob("group1/watchdog/stacks-1.txt"))) == 1
    assert "lost" not in said and "restarting" not in said


def test_group_processes_die_with_a_killed_aios_run(tmp_path: Path) -> None:
    """aios-run SIGKILLed while its groups' processes are still starting (before aios.init,
    which watches the launcher too): the kernel kills them (the parent death signal every
    aios-run worker gets); none is left running."""
    from aios.launcher.worker import process_alive

    proc = subprocess.Popen(
        **_aios_run_args(tmp_path, env={"FT_WAIT_BEFORE_INIT": "1"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        while len(pids) < 2:  # both groups' processes started and wait before aios.init
            assert proc.poll() is None
            pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("pid-*")]
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120  # a bound for the wait, not a timing assert
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if process_alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pids:
            if process_alive(p):
                os.kill(p, signal.SIGKILL)
        for f in tmp_path.glob("pid-*"):  # aios-run's state folder, left by its SIGKILL
            shutil.rmtree(f.read_text(), ignore_errors=True)
