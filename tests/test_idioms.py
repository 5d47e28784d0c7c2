"""The idioms suite: training scripts written in the habits of widely used public code, each
ported to aios the way the README's "Porting a training loop" says (``tests/idioms/``):

* ``nanogpt_train.py``: karpathy/nanoGPT's ``train.py`` (per-rank seeds, ``torch.randint``
  batches, evaluation and "save when it improves" at the top of the loop, the loss divided by
  the accumulation steps, no aios loader);
* ``torchrun_ddp.py``: pytorch/examples' ``multigpu_torchrun.py`` (a Trainer class, an epoch
  counter restored from the snapshot);
* ``hf_llama.py``: a ``transformers`` ``LlamaForCausalLM`` from a tiny config (random init, no
  downloads), FSDP units chosen by its decoder-layer class name, a transformers LR schedule;
* ``fabric_loop.py``: a Lightning-Fabric-style loop (setup, backward, ``optimizer.step()`` then
  ``scheduler.step()``, a ``state`` dict of counters).

Each under ddp and fsdp on 2 processes: every rank holds the same initial model; the run is
stopped by SIGTERM (emergency checkpoint, exit 75) and, after resuming, by SIGKILL of the whole
job, at steps drawn from an RNG seeded by the case name (printed); the final relaunch resumes and
finishes. Every step's loss and the final model must be bitwise those of the uninterrupted run,
and no run may hang (each is bounded by a timeout)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")

IDIOMS = Path(__file__).parent / "idioms"
KILLER = Path(__file__).parents[1] / "packages" / "core" / "tests" / "scripts" / "killer"
#: ``aios-run`` with the killer's hook loaded first (it acts only in the rank-0 worker): the
#: ranks forked from it inherit the hook, so the interrupted runs start warm as the others do
#: (on PYTHONPATH, a start-up hook makes every process of the run start fresh)
AIOS_RUN = "from aios.cli.run import main; main()"
KILLED_AIOS_RUN = (
    "import importlib.util as u; "
    f"s = u.spec_from_file_location('idioms_killer', {str(KILLER / 'sitecustomize.py')!r}); "
    "s.loader.exec_module(u.module_from_spec(s)); " + AIOS_RUN
)
#: script, settings under fsdp, optimizer steps of a whole run, its checkpoint.every
CASES = {
    "nanogpt": ("nanogpt_train.py", [], 12, 3),
    "torchrun": ("torchrun_ddp.py", [], 12, 4),
    "hf_llama": ("hf_llama.py", ["fsdp.wrap=[LlamaDecoderLayer]"], 8, 3),
    "fabric": ("fabric_loop.py", [], 12, 5),
}
LOSS = re.compile(r"^\[rank0\]:iter (\d+): loss (\S+)$", re.M)
INIT = re.compile(r"^\[rank(\d)\]:init model (\w+)", re.M)
RESUMED = re.compile(r"aios: resumed from \S+ at step (\d+)")
CKPT = re.compile(r"^ckpt-(\d+)$")
FINAL = re.compile(r"^\[rank0\]:final model (\w+)", re.M)


def _run(cwd: Path, args: list[str], kill: str | None = None) -> subprocess.CompletedProcess[str]:
    from aios.testing.strategy_contract import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update({"AIOS_LOGGING__TENSORBOARD": "false", "OMP_NUM_THREADS": "1"})
    if kill:
        env["IDIOMS_KILL_AT"] = kill
    return subprocess.run(
        [*python("-c", KILLED_AIOS_RUN if kill else AIOS_RUN)]
        + ["--nprocs", "2", f"master_port={free_port()}", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=400,
    )


def _same_initial_model(r: subprocess.CompletedProcess[str]) -> None:
    inits = dict(INIT.findall(r.stdout))
    assert set(inits) == {"0", "1"} and len(set(inits.values())) == 1, r.stdout


# every idiom under ddp and under fsdp
RESUME_CASES = [(i, s) for s in ("ddp", "fsdp") for i in CASES]


@pytest.mark.parametrize(("idiom", "strategy"), RESUME_CASES)
def test_idiom_resumes_bitwise_after_sigterm_and_sigkill(tmp_path, idiom, strategy):
    script, fsdp, steps, every = CASES[idiom]
    args = [f"strategy={strategy}", *(fsdp if strategy == "fsdp" else []), str(IDIOMS / script)]
    rng = random.Random(f"{idiom}/{strategy}")
    term_at = rng.randint(2, steps // 2)  # the emergency checkpoint is written at a step after

    (tmp_path / "ref").mkdir()
    ref = _run(tmp_path / "ref", [*args, "ckpt"])  # its own checkpoint dir
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    _same_initial_model(ref)
    want = dict(LOSS.findall(ref.stdout))
    assert len(want) == steps, ref.stdout  # one loss line per optimizer step

    got: dict[str, str] = {}
    args.append("ckpt")
    term = _run(tmp_path, args, kill=f"SIGTERM:{term_at}")
    assert term.returncode == 75, term.stdout[-3000:] + term.stderr[-3000:]
    # the step the emergency checkpoint holds: the ranks act on the notice at their next
    # agreement on it, which on a loaded machine may be a few steps after term_at
    saved = max(int(m[1]) for d in (tmp_path / "ckpt").iterdir() if (m := CKPT.match(d.name)))
    assert term_at < saved < steps - 1, f"emergency checkpoint at step {saved}"
    periodic = saved // every * every + every  # the SIGKILLed run's first periodic checkpoint
    # killed after it (a background save may still be in flight), else at the last step but one
    kill_at = rng.randint(min(periodic + 1, steps - 1), steps - 1)
    print(
        f"{idiom} under {strategy}: SIGTERM after step {term_at} (saved {saved}), SIGKILL after {kill_at}"
    )
    killed = _run(tmp_path, args, kill=f"SIGKILL:{kill_at}")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    last = _run(tmp_path, args)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    # (the SIGKILLed launcher takes its workers' last lines with it: their output is not used)
    for r in (term, last):
        _same_initial_model(r)
        got.update(LOSS.findall(r.stdout))
    resumed = [int(s) for s in RESUMED.findall(last.stdout)]
    assert resumed and resumed[0] > term_at, last.stdout
    assert {k: want[k] for k in got} == got  # every step's loss, bit for bit (repr of the float)
    assert len(got) >= steps - kill_at
    assert FINAL.findall(last.stdout) == FINAL.findall(ref.stdout) != []
