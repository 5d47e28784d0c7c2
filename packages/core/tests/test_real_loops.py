"""Habits of real training loops, on 2 processes over gloo: one model under every strategy
when each rank seeds differently before building it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")

SCRIPTS = Path(__file__).parent / "scripts"


def aios_run(tmp: Path, *args: str, timeout: int = 300, env: dict[str, str] | None = None):
    from aios.testing.strategy_contract import free_port

    full = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    full.update({"AIOS_LOGGING__TENSORBOARD": "false", "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + [f"master_port={free_port()}", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp,
        timeout=timeout,
    )


def _rank0_model_output() -> float:
    import torch

    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        return float(model(torch.linspace(-1, 1, 16).view(2, 8)).double().square().sum())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "hsdp"])
def test_per_rank_seeds_give_one_model_under_every_strategy(tmp_path, strategy):
    """nanoGPT seeds ``1337 + rank`` before building the model: every strategy must train rank
    0's model (DDP broadcasts it; the sharded strategies broadcast before sharding), never a
    patchwork of each rank's own initialisation."""
    r = aios_run(tmp_path, "--nprocs", "2", f"strategy={strategy}", str(SCRIPTS / "init_probe.py"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = [float(v) for v in re.findall(rf"probe {strategy}: ([0-9.]+)", r.stdout)]
    assert len(found) == 2, r.stdout
    want = _rank0_model_output()
    for got in found:  # tp sums partial products in another order: float32 rounding only
        assert got == pytest.approx(want, rel=1e-6), (found, want)


@pytest.mark.parametrize(
    "strategy,failing,cause",
    [
        ("ddp", "exists", "already exists"),  # rank 0 writes the full format
        ("fsdp", "1", "File too large"),  # every rank writes its DCP shards
    ],
)
def test_a_save_that_fails_on_one_rank_stops_every_rank_with_one_line(
    tmp_path, strategy, failing, cause
):
    r = aios_run(
        tmp_path,
        "--nprocs",
        "2",
        f"strategy={strategy}",
        str(SCRIPTS / "save_fails_on_rank.py"),
        failing,
    )
    out = r.stdout + r.stderr
    rank = 0 if failing == "exists" else int(failing)
    assert r.returncode == 2, out
    errors = [line for line in out.splitlines() if "aios: error" in line]
    assert len(errors) == 1 and f"aios: error (rank {rank}):" in errors[0], out
    assert cause in errors[0], out
    assert "Traceback" not in out and "Connection closed" not in out, out
    assert f"exited with code 2 on rank {rank}" in out, out


def test_best_save_killed_mid_write_keeps_the_last_best_and_the_run_goes_on(tmp_path):
    """A best-save after each of 10 evaluations; the whole job is SIGKILLed while the k-th
    best checkpoint's files are being written (k from a seeded RNG): the previous best stays
    complete under its name, and the relaunched run resumes and saves the later bests."""
    import json
    import random

    k = random.Random(20).randint(2, 9)
    print(f"SIGKILL during best save {k} of 10")
    ck = tmp_path / "ck"
    env = {"PYTHONPATH": str(SCRIPTS / "killer"), "IDIOMS_KILL_AT": f"SIGKILL:save:{k}"}
    script = str(SCRIPTS / "best_every_eval.py")
    r = aios_run(tmp_path, "--nprocs", "2", script, str(ck), env=env)
    # (the SIGKILLed launcher takes its workers' last lines with it: the files tell what ran)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    marker = json.loads((ck / "best" / "aios-checkpoint.json").read_text())
    assert marker["step"] == 2 * (k - 1)  # the last committed best, complete
    half = [p.name for p in ck.iterdir() if p.name.startswith(".aios-partial-")]
    assert len(half) == 1 and half[0].startswith(f".aios-partial-ckpt-{2 * k:09d}-"), sorted(
        p.name for p in ck.iterdir()
    )  # the k-th best, killed mid-write at step 2k
    r = aios_run(tmp_path, "--nprocs", "2", script, str(ck))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from" in r.stdout
    assert f"best {10 - k}.0 at step {2 * k}" in r.stdout  # the interrupted best, written now
    assert "done at step 20: best 0.0 steps 20" in r.stdout  # plain values resumed, not recounted
    assert json.loads((ck / "best" / "aios-checkpoint.json").read_text())["step"] == 20
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith(".aios-partial")) == []


def test_global_batch_gives_grad_accum_once_the_data_ranks_are_known():
    from types import SimpleNamespace

    from aios.errors import ConfigError
    from aios.runtime import derive_grad_accum, resolve_config

    def accum(ranks: int, **cfg: object) -> int:
        config = resolve_config(dict(cfg))
        derive_grad_accum(config, SimpleNamespace(data_world=ranks, world_size=ranks))
        return config.grad_accum

    assert accum(2, global_batch=64, micro_batch=8) == 4
    assert accum(4, global_batch=64, micro_batch=8) == 2
    assert accum(1, grad_accum=3) == 3  # no batch sizes: grad_accum as given
    for bad, words in [
        ({"global_batch": 60, "micro_batch": 8}, "not a multiple of micro_batch=8 x 2"),
        ({"global_batch": 64, "micro_batch": 8, "grad_accum": 2}, "contradicts"),
        ({"global_batch": 64}, "without micro_batch"),
    ]:
        with pytest.raises(ConfigError, match=words):
            accum(2, **bad)


def test_register_takes_plain_values_and_names_what_it_cannot_save():
    from types import SimpleNamespace

    import torch
    from aios.checkpoint.state import TrainingState
    from aios.errors import AiosError

    tr = TrainingState(SimpleNamespace(world_size=1), SimpleNamespace(), "cpu")
    hist = tr.register("hist", [1.0])
    assert tr.register("best", 3.5) == 3.5
    tr.register("cfg", {"lr": 0.1, "w": torch.ones(2)})
    saved = {k: v.state_dict() for k, v in tr.objects.items()}
    hist.append(2.0)
    tr.values["best"] = 1.0
    tr.load_objects(saved)
    assert hist == [1.0] and tr.values["hist"] is hist and tr.values["best"] == 3.5
    tr.load_objects({"later": {"value": 7}})  # registered after the resume: gets its value
    assert tr.register("later", 0) == 7
    with pytest.raises(AiosError, match="plain value, and got object"):
        tr.register("bad", {"x": object()})


def test_one_cpu_process_gets_the_idle_cpus_and_is_told_so():
    from aios.plugins.builtin import cpu_threads

    assert cpu_threads(1, 2, 0.3) == (2, None)  # an idle machine: torch's default
    threads, note = cpu_threads(1, 2, 1.9)  # a busy one: one thread, and a note saying why
    assert threads == 1 and note and "OMP_NUM_THREADS=1" in note and "1.9 of 2 CPUs busy" in note
    assert cpu_threads(1, 16, 4.0)[0] == 12
    assert cpu_threads(4, 16, 30.0) == (4, None)  # several processes share the CPUs (torchrun)


def test_a_traceback_has_one_rank_prefix_and_the_last_line_names_the_failing_rank(tmp_path):
    r = aios_run(tmp_path, "--nprocs", "2", str(SCRIPTS / "fails_on_rank1.py"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[rank1]:ValueError: boom on rank 1" in out, out
    assert "[rank1]:[rank1]:" not in out and "[rank0]:[rank0]:" not in out, out
    assert (
        out.rstrip()
        .splitlines()[-1]
        .endswith("exited with code 1 on rank 1 (other ranks stopped); see its output above")
    ), out


def test_a_plain_torchrun_script_s_traceback_has_one_rank_prefix_too(tmp_path):
    """No aios.init: torch's init_process_group prefixes the excepthook's lines with
    ``[rank1]:`` and aios-run prefixes every line of rank 1 with the same: one is kept."""
    r = aios_run(tmp_path, "--nprocs", "2", str(SCRIPTS / "plain_fails_on_rank1.py"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "ValueError: boom on rank 1" in out, out
    assert "[rank1]:[rank1]:" not in out and "[rank0]:[rank0]:" not in out, out
    tb = [ln for ln in out.splitlines() if "Traceback (most recent call last)" in ln]
    assert tb and all(ln.startswith("[rank") for ln in tb), out


def test_a_model_built_on_the_meta_device_is_sharded_as_it_is(tmp_path):
    r = aios_run(tmp_path, "--nprocs", "2", "strategy=fsdp", str(SCRIPTS / "init_meta.py"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):  # each rank holds half of the first weight, materialized after setup
        assert f"[rank{rank}]:ok meta=False local=(8, 8) out=(2, 4)" in r.stdout, r.stdout


def test_a_named_save_replaces_only_an_aios_checkpoint_and_only_once_committed(tmp_path):
    import json

    from aios.checkpoint import MARKER, CheckpointStore
    from aios.errors import CheckpointError

    store = CheckpointStore(str(tmp_path), keep=None)

    def save(step: int, replace: bool) -> None:
        staging = store.begin(step, "best", replace=replace)
        store.write_file(staging, "state.pt", lambda f: f.write(b"x" * step))
        # until the commit, "best" is still the previous complete checkpoint
        if (tmp_path / "best").exists():
            assert json.loads((tmp_path / "best" / MARKER).read_text())["step"] == step - 1
        store.commit(staging, {})

    save(1, replace=False)
    with pytest.raises(CheckpointError, match="already exists.*replace=True"):
        store.begin(2, "best")
    save(2, replace=True)
    assert json.loads((tmp_path / "best" / MARKER).read_text())["step"] == 2
    assert (tmp_path / "best" / "state.pt").read_bytes() == b"xx"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]  # the old copy is gone
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match="is not an aios checkpoint"):
        store.begin(3, "mine", replace=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
