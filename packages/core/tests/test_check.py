"""``aios check``: what ties a training script to one accelerator, with the aios form that replaces
it; ``--fix`` for the safe rewrites; the hint ``aios-run`` prints when a rank dies of one of them."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aios.check import BACKENDS, check_file, check_source, fix_source
from aios.cli.main import cli
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts" / "check"
ROOT = HERE.parents[2]
CORE_SRC = HERE.parent / "src"
NO_TORCH = (
    "import sys\nfrom aios.cli.main import main\ntry:\n    main()\nfinally:\n"
    "    print('TORCH=%d' % ('torch' in sys.modules), file=sys.stderr)\n"
)
RUN = [sys.executable, "-c", "import sys; from aios.cli.run import main; main()"]


def _line(path: Path, text: str, nth: int = 0) -> int:
    """The 1-based line of the ``nth`` occurrence of ``text`` in ``path`` (no hard-coded numbers)."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln]
    assert len(hits) > nth, (path, text)
    return hits[nth]


def _codes(findings) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for f in findings:
        out.setdefault(f.line, set()).add(f.code)
    return out


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "PJRT_"))
    }
    env.update(
        PYTHONPATH=str(CORE_SRC),
        AIOS_LOGGING__RUN_DIR=str(tmp / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_TEST_DMI_PRODUCT="/nonexistent",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


def _check(*args: str):
    return CliRunner().invoke(cli, ["check", *args])


# ------------------------------------------------------------------ a GPU-only torchrun script

GPU = SCRIPTS / "gpu_ddp.py"
# what ties gpu_ddp.py to NVIDIA: a marker on the line, the code, and the aios form named
GPU_TIES = [
    ('init_process_group(backend="nccl")', "AIOS201", "aios.init()"),
    ("torch.cuda.set_device(", "AIOS103", "rt.device"),
    ("self.model = model.to(self.gpu_id)", "AIOS101", "rt.device"),
    ("torch.cuda.amp.GradScaler()", "AIOS302", "precision=fp16-mixed"),
    ("DDP(self.model, device_ids=", "AIOS202", "rt.setup(model)"),
    ('torch.autocast("cuda", dtype=torch.float16)', "AIOS301", "rt.autocast()"),
    ('torch.autocast("cuda", dtype=torch.float16)', "AIOS303", "precision=bf16-mixed"),
    ('device=f"cuda:{self.gpu_id}"', "AIOS101", "rt.device"),
    ("source = source.to(self.gpu_id)", "AIOS101", "rt.device"),
    ("targets.cuda(non_blocking=True)", "AIOS102", ".to(rt.device)"),
    ("torch.cuda.synchronize()", "AIOS104", "torch.accelerator.synchronize()"),
    ("self._save_checkpoint(epoch)", "AIOS603", "rt.save()"),
    ("fused=True", "AIOS410", "drop it"),
    ("torch.cuda.device_count()", "AIOS105", "torch.accelerator.device_count()"),
    # notes: nothing breaks, the aios form is named
    ("torch.cuda.set_device(", "AIOS206", "rt.local_rank"),
    ('self.gpu_id = int(os.environ["LOCAL_RANK"])', "AIOS206", "rt.local_rank"),
]


def test_gpu_script_every_nvidia_line_is_named_with_its_replacement_and_backends():
    findings = check_file(str(GPU))
    expected = {(_line(GPU, marker), code) for marker, code, _ in GPU_TIES}
    assert {(f.line, f.code) for f in findings} == expected
    by_key = {(f.line, f.code): f for f in findings}
    for marker, code, replacement in GPU_TIES:
        f = by_key[(_line(GPU, marker), code)]
        assert replacement in f.message, (marker, str(f))
        line = GPU.read_text().splitlines()[f.line - 1]
        assert 1 <= f.col <= len(line) and line[f.col - 1] != " "
        if code in ("AIOS206", "AIOS302", "AIOS105"):
            # a CUDA GradScaler disables itself with a warning elsewhere: a note, named once;
            # the device count here is only printed (0 elsewhere, nothing breaks): a note
            assert f.level == "note" and f.backends == (), str(f)
            assert str(f).endswith(("(note)", "(note) [--fix]")), str(f)
        elif code.startswith(("AIOS1", "AIOS2", "AIOS301")):
            assert "cuda" not in f.backends and {"cpu", "xla", "tpu", "neuron"} <= set(
                f.backends
            ), str(f)
    save = by_key[(_line(GPU, "self._save_checkpoint(epoch)"), "AIOS603")]
    assert save.strategies == ("fsdp", "tp", "hsdp")
    assert f"gpu_ddp.py:{_line(GPU, 'ckp = self.model.module.state_dict()')}" in save.message
    fp16 = by_key[(_line(GPU, "torch.float16"), "AIOS303")]
    assert set(fp16.backends) == {"xla", "tpu", "neuron"}  # fp16 trains on cpu and cuda
    # one line each, linter style, naming where it breaks
    out = _check(str(GPU))
    assert out.exit_code == 1
    first = out.stdout.splitlines()[0]
    assert re.fullmatch(
        rf"{re.escape(str(GPU))}:\d+:\d+ AIOS201 .*\(breaks on cpu, xla, tpu, neuron\) \[--fix\]",
        first,
    ), first


def test_fix_rewrites_the_safe_lines_and_the_ported_script_runs_on_cpu_and_plans_everywhere(
    tmp_path, free_port
):
    script = tmp_path / "gpu_ddp.py"
    shutil.copy(GPU, script)
    before = check_file(str(script))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_TORCH,
            "check",
            "--fix",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert out.returncode == 1, out.stderr  # what --fix cannot do stays a finding
    assert "TORCH=0" in out.stderr  # checking and fixing import no torch (LibCST only)
    fixed = script.read_text()
    # the diff shown is the change written; only the lines flagged [--fix] changed
    diff = [ln for ln in out.stdout.splitlines() if ln.startswith(("-", "+"))]
    assert diff[:2] == [f"--- {script}", f"+++ {script}"]
    assert [ln for ln in diff[2:] if ln.startswith("-")] == [
        '-    init_process_group(backend="nccl")',
        "-            torch.cuda.synchronize()",
        "-    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)",
        '-    print(f"rank {dist.get_rank()} of {torch.cuda.device_count()} GPUs")',
    ]
    assert [ln for ln in diff[2:] if ln.startswith("+")] == [
        "+    init_process_group()",
        "+            if torch.accelerator.is_available():",
        "+                torch.accelerator.synchronize()",
        "+    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)",
        '+    print(f"rank {dist.get_rank()} of {torch.accelerator.device_count()} GPUs")',
    ]
    after = check_file(str(script))
    assert {f.code for f in after} == {f.code for f in before if not f.fix}
    assert not any(f.fix for f in after)
    assert [ln for ln in out.stdout.splitlines() if " AIOS" in ln] == [str(f) for f in after]

    # the ported script = the fixed one with the remaining findings addressed as suggested:
    # every flagged line is edited, plus a few lines that thread the runtime through
    ported_path = SCRIPTS / "gpu_ddp_ported.py"
    ported = ported_path.read_text().splitlines()
    old = fixed.splitlines()
    changed: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old, ported).get_opcodes():
        if tag in ("replace", "delete"):
            changed.update(range(i1 + 1, i2 + 1))
    flagged = {f.line for f in after}
    # a rank-0-only save is addressed at its rank test (the `if` above it), every other one on
    # its own line; beyond those: the docstring, the DDP import, the save the finding names and
    # the `if` itself (plus one inserted line giving Trainer its runtime)
    in_rank_test = {f.line for f in after if f.code.startswith("AIOS6")}
    assert flagged - in_rank_test <= changed, sorted(flagged - changed)
    assert {line - 1 for line in in_rank_test} <= changed
    extra = changed - flagged - {1, 2}
    assert [old[i - 1].strip() for i in sorted(extra)] == [
        "import os",  # only the environment reads used it (rt.local_rank now)
        "from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817",
        # the scaler's uses: named once, where the GradScaler is made (a note)
        "self.scaler.scale(loss).backward()",
        "self.scaler.step(self.optimizer)",
        "self.scaler.update()",
        "ckp = self.model.module.state_dict()",  # the save the AIOS603 finding names
        "torch.save(ckp, self.snapshot_path)",
        "if self.gpu_id == 0 and epoch % self.save_every == 0:",
    ]
    assert check_file(str(ported_path)) == []

    r = subprocess.run(
        [*RUN, "--nprocs", "2", "--master-port", str(free_port()), str(ported_path), "2"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "epoch 1 loss" in r.stdout + r.stderr
    assert (tmp_path / "snapshot.pt.1").is_dir()  # rt.save() on every rank, written once
    plans = {
        "xla": ["xla.accelerator=v5litepod-8"],
        "tpu": ["xla.accelerator=v6e-8"],
        "neuron": ["neuron.instance_type=trn1.32xlarge"],
    }
    for backend, extra_args in plans.items():
        # the GPU original too on neuron, whose plan notes list what Trainium cannot run
        for path, clean in [(ported_path, True)] + [(GPU, False)] * (backend == "neuron"):
            d = subprocess.run(
                [*RUN, "--backend", backend, "--dry-run", "--json", *extra_args, str(path)],
                capture_output=True,
                text=True,
                env=_env(tmp_path),
                timeout=120,
            )
            assert d.returncode == 0, (backend, d.stderr)
            notes = json.loads(d.stdout)["notes"]
            # backend-neuron's own script scan (plan notes) agrees: nothing left on the port
            script_notes = [n for n in notes if re.search(r"\bline \d+:", n)]
            if backend == "neuron":
                assert bool(script_notes) != clean, (path, notes)


# ------------------------------------------------------------------ torch_xla and torch-neuronx habits


def test_torch_xla_habits_name_the_aios_form():
    path = SCRIPTS / "xla_spawn.py"
    by = {(f.line, f.code): f for f in check_file(str(path))}
    cases = [
        ("device = xm.xla_device()", "AIOS402", "Runtime is already initialized"),
        ("dev = xm.xla_device()", "AIOS406", "rt.device"),
        ("pl.MpDeviceLoader(", "AIOS405", "rt.setup(loader)"),
        ("xm.optimizer_step(opt)", "AIOS404", "rt.step(opt)"),
        ("xm.mark_step()", "AIOS404", "rt.step(opt)"),
        ("torch_xla.sync()", "AIOS404", "rt.step(opt)"),
        ("xmp.spawn(", "AIOS403", "aios-run --backend xla --nprocs N"),
        ("if xm.is_master_ordinal():", "AIOS407", "rt.is_main"),
        ('xm.save(model.state_dict(), "model.pt")', "AIOS408", "rt.save()"),
        ('xm.save(model.state_dict(), "model.pt")', "AIOS603", "rt.save() on every rank"),
        ("xm.master_print(", "AIOS408", "rt.print"),
        ("xm.master_print(", "AIOS407", "rt.world_size"),
        ("fused=True", "AIOS410", "drop it"),
        ("torch.Generator(device=dev)", "AIOS411", "CPU torch.Generator()"),
        ("import torch_xla.core.xla_model as xm", "AIOS401", "aios-run --backend xla"),
    ]
    for marker, code, form in cases:
        f = by.get((_line(path, marker), code))
        assert f is not None and form in f.message, (marker, code, sorted(by))
    spawn = by[(_line(path, "xmp.spawn("), "AIOS403")]
    assert set(spawn.backends) == set(BACKENDS)  # under aios-run the processes already exist
    step = by[(_line(path, "xm.mark_step()"), "AIOS404")]
    assert "xla" not in step.backends and "cpu" in step.backends
    fused = by[(_line(path, "fused=True"), "AIOS410")]
    assert set(fused.backends) == {"xla", "neuron"}  # TorchTPU has fused AdamW kernels


def test_torch_neuronx_habits_name_the_aios_form():
    path = SCRIPTS / "neuron_trn1.py"
    by = {(f.line, f.code): f for f in check_file(str(path))}
    cases = [
        ("import torch_neuronx", "AIOS401", "aios-run --backend neuron"),
        ('os.environ["XLA_USE_BF16"] = "1"', "AIOS412", "precision=bf16-true"),
        ('init_process_group("xla")', "AIOS201", "aios.init()"),
        ("initialize_model_parallel(", "AIOS409", "mesh.tp=N"),
        ("device = xm.xla_device()", "AIOS406", "rt.device"),
        (".half()", "AIOS303", "precision=bf16-true"),
        ("xm.optimizer_step(opt)", "AIOS404", "rt.step(opt)"),
        ("if xm.get_ordinal() == 0:", "AIOS407", "rt.rank"),
        ('xm.save(model.state_dict(), "model.pt")', "AIOS603", "rt.save()"),
    ]
    for marker, code, form in cases:
        f = by.get((_line(path, marker), code))
        assert f is not None and form in f.message, (marker, code, sorted(by))
    # a function-level xla_device() is no import-time hazard
    assert (_line(path, "device = xm.xla_device()"), "AIOS402") not in by


# ------------------------------------------------------------------ sharded strategies


def test_nanogpt_master_process_eval_is_a_sharded_hazard_and_its_per_rank_seed_is_not():
    path = SCRIPTS / "nanogpt_ddp.py"
    found = check_file(str(path))
    by = {(f.line, f.code): f for f in found}
    evaluation = by[(_line(path, "val = estimate_loss()"), "AIOS601")]
    assert f"nanogpt_ddp.py:{_line(path, 'logits, loss = model(X, Y)')}" in evaluation.message
    assert "hang" in evaluation.message and evaluation.strategies == ("fsdp", "tp", "hsdp")
    assert str(evaluation).endswith("(hangs or diverges under strategy=fsdp|tp|hsdp)")
    assert (_line(path, '{"model": raw_model.state_dict()'), "AIOS603") in by
    # saving what every rank already gathered is fine: the state_dict() line is the hazard
    assert (_line(path, "torch.save(checkpoint"), "AIOS603") not in by
    # a per-rank seed is right: aios gives every rank rank 0's weights under every strategy,
    # and each rank's own noise (dropout, sampling) should differ
    assert not [f for f in found if f.line == _line(path, "torch.manual_seed(1337 + seed_offset)")]
    # the forward every rank runs, and the loop's own lines, are no finding
    assert not [f for f in found if f.line == _line(path, "logits, loss = model(X, Y)", 1)]
    # NVIDIA ties of the same script
    for marker, code in [
        ('backend = "nccl"', "AIOS201"),
        ('device = "cuda"', "AIOS101"),
        ('device = f"cuda:{ddp_local_rank}"', "AIOS101"),
        ("torch.cuda.set_device(device)", "AIOS103"),
        ("scaler = torch.cuda.amp.GradScaler(", "AIOS302"),
        ('dtype = "bfloat16" if torch.cuda.is_available()', "AIOS106"),
    ]:
        assert (_line(path, marker), code) in by, marker


def test_rank_guards_and_effects_are_read_precisely():
    src = """
import torch
import torch.distributed as dist
import aios

rt = aios.init()
model = torch.nn.Linear(2, 2)
if rt.is_main:
    rt.print("hello")                # output on one rank: fine
    stats = {"loss": 1.0}
if rt.is_main:
    rt.barrier()                     # collective on one rank
if dist.get_rank() == 0:
    y = model(torch.ones(2))         # forward on one rank
if step % 10 == 0:
    y = model(torch.ones(2))         # not a rank test
torch.save(model.state_dict(), "m.pt")  # every rank writes it
"""
    found = check_source(src, "t.py")
    lines = src.splitlines()
    got = {(lines[f.line - 1].split("#")[1].strip(), f.code) for f in found}
    assert got == {
        ("collective on one rank", "AIOS602"),
        ("forward on one rank", "AIOS601"),
        ("every rank writes it", "AIOS605"),
    }


# ------------------------------------------------------------------ names resolved through imports


def test_names_are_resolved_through_imports_and_scopes():
    src = """
import torch
from torch.cuda.amp import GradScaler as GS
import torch_xla.core.xla_model as xm  # noqa
try:
    import flash_attn
except ImportError:
    flash_attn = None

def f(xm, device):
    xm.mark_step()               # a parameter, not torch_xla
    if "cuda" in str(device):    # a test, not a tie
        pass
    return torch.float32

def g():
    xm.mark_step()               # torch_xla
    scaler = GS()                # torch.cuda.amp.GradScaler
    from torch import cuda as c
    c.synchronize()              # torch.cuda.synchronize
"""
    found = check_source(src, "t.py")
    lines = src.splitlines()
    got = sorted((lines[f.line - 1].strip().split("(")[0], f.code) for f in found)
    assert got == [
        ("c.synchronize", "AIOS104"),
        ("import torch_xla.core.xla_model as xm  # noqa", "AIOS401"),
        ("scaler = GS", "AIOS302"),
        ("xm.mark_step", "AIOS404"),
    ], got
    sync = next(f for f in found if f.code == "AIOS104")
    assert sync.fix == ""  # written through an alias: not rewritten, only reported


# ------------------------------------------------------------------ CLI contract


def test_exit_codes_json_and_backend_filter(tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nx = torch.ones(2)\n")
    r = _check(str(clean))
    assert r.exit_code == 0 and r.stdout == ""

    r = _check("--json", str(GPU))
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["files"] == 1 and len(doc["findings"]) == len(GPU_TIES)
    keys = {"path", "line", "col", "code", "message", "backends", "strategies", "level", "fixable"}
    for f in doc["findings"]:
        assert set(f) == keys and f["path"] == str(GPU) and set(f["backends"]) <= set(BACKENDS)
    assert sum(f["fixable"] for f in doc["findings"]) == 4

    for backend in BACKENDS:
        r = _check("--json", "--backend", backend, str(GPU))
        got = json.loads(r.stdout)["findings"]
        assert all(backend in f["backends"] for f in got)
        assert len(got) == sum(backend in f["backends"] for f in doc["findings"])
        assert r.exit_code == (1 if any(f["level"] == "error" for f in got) else 0)
    cuda = json.loads(_check("--json", "--backend", "cuda", str(GPU)).stdout)["findings"]
    assert [f["code"] for f in cuda] == ["AIOS603"]  # on GPUs only the sharded-save hazard
    tpu = {
        f["code"]
        for f in json.loads(_check("--json", "--backend", "tpu", str(GPU)).stdout)["findings"]
    }
    assert "AIOS303" in tpu and "AIOS410" not in tpu


@pytest.mark.parametrize(
    "content,args,expect",
    [
        ("def f(:\n", [], "bad.py:1: syntax error"),
        (None, [], "missing.py: cannot read"),
        ("x = 1\n", ["--backend", "gpu"], "aios check knows no backend 'gpu'"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, content, args, expect):
    name = "missing.py" if content is None else "bad.py"
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    r = _check(*args, str(path))
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aios: error: ") and expect in lines[0], lines
    assert "Traceback" not in r.output


def test_no_false_alarms_on_examples_readmes_and_the_plugin_template():
    r = _check(str(ROOT / "examples"))
    assert r.exit_code == 0, r.output
    assert (
        re.search(r"in (\d+) file", r.stderr)
        and int(re.search(r"in (\d+) file", r.stderr).group(1)) >= 4
    )
    readmes = [
        ROOT / "README.md",
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("examples/**/README.md"),
    ]
    snippets = 0
    for readme in readmes:
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", readme.read_text(), re.S)):
            assert check_source(m.group(1), f"{readme}#{i}") == [], (readme, i)
            snippets += 1
    assert snippets >= 20


# ------------------------------------------------------------------ --fix: formatting, atomic writes


def test_fix_keeps_formatting_and_comments():
    src = """import torch
import torch.distributed as dist

dist.init_process_group(  # join
    "nccl",
    timeout=None,
)
opt = torch.optim.AdamW(params,   lr=3e-4, fused=True)  # keep this comment
print("devices:", torch.cuda.device_count())
if opt:
    torch.cuda.empty_cache()   # free
"""
    fixed = fix_source(src, check_source(src))
    assert (
        fixed
        == """import torch
import torch.distributed as dist

dist.init_process_group(  # join
    timeout=None,
)
opt = torch.optim.AdamW(params,   lr=3e-4)  # keep this comment
print("devices:", torch.accelerator.device_count())
if opt:
    if torch.accelerator.is_available():
        torch.accelerator.empty_cache()   # free
"""
    )
    assert [f.code for f in check_source(fixed)] == []


def test_fix_writes_atomically_or_not_at_all(tmp_path, monkeypatch):
    script = tmp_path / "t.py"
    original = "import torch\nprint(torch.cuda.device_count())\n"
    script.write_text(original)

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    r = _check("--fix", str(script))
    assert r.exit_code != 0
    assert script.read_text() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.py"]  # no temp file left


# ------------------------------------------------------------------ aios-run points at the finding


def test_aios_run_failure_ends_with_the_finding_for_the_nccl_line(tmp_path, free_port):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n\n\ndef setup():\n"
        '    dist.init_process_group("nccl")\n\n\nsetup()\n'
    )
    r = subprocess.run(
        [*RUN, "--nprocs", "2", "--master-port", str(free_port()), str(script)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=180,
    )
    assert r.returncode == 1
    # a CPU build of torch says the first, a CUDA build on a machine without a GPU the second
    assert (
        "Distributed package doesn't have NCCL built in" in r.stderr
        or "ProcessGroupNCCL is only supported with GPUs, no GPUs found" in r.stderr
    ), r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"aios-run: hint: {script}:5:5 AIOS201 "), last
    assert f"aios check {script}" in last


def _run_one(tmp: Path, script: Path) -> subprocess.CompletedProcess[str]:
    """``aios-run script``: one process, run directly (no torch launcher)."""
    return subprocess.run(
        [*RUN, str(script)], capture_output=True, text=True, env=_env(tmp), cwd=tmp, timeout=180
    )


def test_a_single_process_run_also_ends_with_the_finding_and_keeps_the_output(tmp_path):
    """One process runs the script directly (no torch launcher): its stderr is relayed through
    aios-run, whole and in order, and the hint still names the `.cuda()` line."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nimport torch\n\nprint('before', flush=True)\n"
        "print('warned', file=sys.stderr, flush=True)\n"
        "model = torch.nn.Linear(2, 2).cuda()\n"
    )
    r = _run_one(tmp_path, script)
    assert r.returncode == 1, r.stderr
    assert "before" in r.stdout and "warned" in r.stderr and "Traceback" in r.stderr, r.stderr
    # a CPU build of torch says the first; a CUDA build on a machine without a GPU another
    assert any(e in r.stderr for e in ("not compiled with CUDA", "NVIDIA driver", "CUDA")), r.stderr
    lines = r.stderr.strip().splitlines()
    assert (
        lines[-2] == f"aios-run: error: {script} exited with code 1 on rank 0; see its output above"
    )
    line = _line(script, ".cuda()")
    assert lines[-1].startswith(f"aios-run: hint: {script}:{line}:"), lines[-1]
    assert (
        r.stderr.index("warned") < r.stderr.index("Traceback") < r.stderr.index("aios-run: error")
    )


def test_a_single_process_run_on_a_terminal_keeps_a_terminal_for_the_script(tmp_path):
    """aios-run's stderr is a terminal: the script's stderr is one too (a pseudo-terminal of the
    same size: colours and progress bars as without aios), and the hint still comes."""
    import fcntl
    import pty
    import struct
    import termios

    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys, torch\n"
        "print(f'tty={sys.stderr.isatty()} size={tuple(os.get_terminal_size(2))}', "
        "file=sys.stderr, flush=True)\n"
        "torch.zeros(1).cuda()\n"
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 123, 0, 0))
    p = subprocess.Popen(
        [*RUN, str(script)],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=_env(tmp_path),
        cwd=tmp_path,
    )
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: aios-run, the last writer, is gone
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert p.wait(timeout=180) == 1
    text = err.decode(errors="replace").replace("\r\n", "\n")
    assert "tty=True size=(123, 33)" in text, text
    line = _line(script, ".cuda()")
    assert text.strip().splitlines()[-1].startswith(f"aios-run: hint: {script}:{line}:"), text


def test_a_single_process_run_of_a_plain_failure_gets_no_hint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('import torch\nraise ValueError("the user\'s own bug")\n')
    r = _run_one(tmp_path, script)
    assert r.returncode == 1 and "ValueError: the user's own bug" in r.stderr, r.stderr
    assert "hint" not in r.stderr.strip().splitlines()[-1], r.stderr


def test_hint_reads_the_failed_ranks_traceback_for_runtime_already_initialized(tmp_path):
    """The XLA case, from the traceback torch_xla prints (no torch_xla here): the hint names the
    import-time xla_device() line, not the spawn line the error surfaced at."""
    from types import SimpleNamespace

    from aios.launcher.outcome import portability_hint as _portability_hint

    script = tmp_path / "xla_spawn.py"
    shutil.copy(SCRIPTS / "xla_spawn.py", script)
    line = _line(script, "device = xm.xla_device()")
    log = tmp_path / "logs" / "run_x" / "attempt_0" / "1"
    log.mkdir(parents=True)
    (log / "stderr.log").write_text(
        "Traceback (most recent call last):\n"
        f'  File "{script}", line {line}, in <module>\n'
        "    device = xm.xla_device()\n"
        '  File "/opt/torch_xla/core/xla_model.py", line 99, in xla_device\n'
        "RuntimeError: Runtime is already initialized. Do not use the XLA device before "
        "calling xmp.spawn.\n"
    )
    hint = _portability_hint(str(script), str(tmp_path / "logs"), SimpleNamespace(local_rank=1))
    assert hint is not None and f"{script}:{line}:10 AIOS402" in hint
    (log / "stderr.log").write_text("ValueError: the user's own bug\n")
    assert (
        _portability_hint(str(script), str(tmp_path / "logs"), SimpleNamespace(local_rank=1))
        is None
    )


def test_the_readme_shows_what_aios_check_prints(tmp_path, monkeypatch):
    """The root README's 'Bringing an existing script' output is the real output for gpu_ddp.py."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Bringing an existing script") :]
    block = block[block.index("```console\n") + 11 :]
    block = block[: block.index("\n```")]
    shown_check, shown_fix = block.split("$ aios check --fix train.py\n")
    monkeypatch.chdir(tmp_path)
    shutil.copy(GPU, "train.py")
    real = _check("train.py")
    for line in shown_check.splitlines()[1:]:
        assert line == "..." or line in real.stdout.splitlines() + [real.stderr.strip()], line
    fixed = _check("--fix", "train.py")
    diff_shown = shown_fix[: shown_fix.index("train.py:")]
    assert fixed.stdout.startswith(diff_shown)
    assert shown_fix.splitlines()[-1] == fixed.stderr.strip()


def test_lightning_fabric_pinned_to_gpus_and_fp16():
    src = (
        "import lightning as L\n"
        'fabric = L.Fabric(accelerator="cuda", devices=2, precision="16-mixed")\n'
        'auto = L.Fabric(accelerator="auto", precision="bf16-mixed")\n'
    )
    found = check_source(src, "fabric.py")
    # accelerator="auto" with devices left to Lightning (issue 34): it counts 1 on a CPU and
    # raises against aios-run's WORLD_SIZE; one pinned to CUDA is named for that, not twice
    assert [(f.line, f.code) for f in found] == [(2, "AIOS101"), (2, "AIOS303"), (3, "AIOS204")]
    assert 'accelerator="auto"' in found[0].message and "cpu" in found[0].backends
    assert 'precision="bf16-mixed"' in found[1].message and "cpu" not in found[1].backends


def test_json_fix_reports_the_diff_it_wrote(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import torch\nprint(torch.cuda.device_count())\nx = torch.ones(2).cuda()\n")
    doc = json.loads(_check("--json", "--fix", str(script)).stdout)
    assert [f["code"] for f in doc["findings"]] == ["AIOS102"]  # left for the user
    (fixed,) = doc["fixed"]
    assert (
        fixed["path"] == str(script) and "+print(torch.accelerator.device_count())" in fixed["diff"]
    )
    assert script.read_text().splitlines()[1] == "print(torch.accelerator.device_count())"


def test_fix_without_libcst_says_so_and_writes_nothing(tmp_path, monkeypatch):
    script = tmp_path / "t.py"
    original = "import torch\ntorch.cuda.synchronize()\n"
    script.write_text(original)
    monkeypatch.setitem(sys.modules, "libcst", None)  # as if not installed
    r = _check("--fix", str(script))
    assert r.exit_code == 1  # the finding stands
    assert f"aios check: not rewriting {script}: --fix needs LibCST" in r.stderr
    assert "AIOS104" in r.stdout and script.read_text() == original


# ------------------------------------------------------------------ habits of public training code


def _by(src: str) -> dict[tuple[int, str], object]:
    return {(f.line, f.code): f for f in check_source(src, "t.py")}


def test_values_followed_through_argparse_defaults():
    src = """import argparse
import torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--dist-backend", default="nccl", type=str)
p.add_argument("--device", default="cuda")
p.add_argument("--world-size", default=-1, type=int)
p.add_argument("--seed", default=0, type=int)
args = p.parse_args()
dist.init_process_group(backend=args.dist_backend)
"""
    by = _by(src)
    assert set(by) == {(4, "AIOS201"), (5, "AIOS101"), (6, "AIOS209")}
    assert "--dist-backend defaults to 'nccl'" in by[(4, "AIOS201")].message
    assert "cuda" not in by[(4, "AIOS201")].backends
    assert by[(6, "AIOS209")].where() == "copies never join under aios-run --nprocs N"


def test_torch_accelerator_is_no_device_under_torch_xla():
    src = """import torch
use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
kind = torch.accelerator.current_accelerator().type
if torch.accelerator.is_available():
    torch.accelerator.synchronize()
local = rank % torch.accelerator.device_count()
print(torch.accelerator.device_count(), "devices")
"""
    by = _by(src)
    assert set(by) == {(2, "AIOS110"), (4, "AIOS110"), (7, "AIOS110")}
    assert "is 0 on CPU and under torch_xla" in by[(7, "AIOS110")].message
    assert by[(2, "AIOS110")].backends == ("xla",)  # a native tpu/neuron device is an accelerator
    assert "host CPU" in by[(2, "AIOS110")].message
    assert set(by[(4, "AIOS110")].backends) == {"cpu", "xla"}  # None there: AttributeError


def test_cuda_guarded_lines_are_notes_and_a_guard_alone_is_no_finding():
    src = """import torch
if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.set_device(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cuda":
    torch.cuda.synchronize()
else:
    x = torch.ones(2).cuda()
"""
    by = _by(src)
    assert (2, "AIOS106") not in by  # it only guards a seed and TF32 flags
    pick = by[(4, "AIOS103")]
    assert pick.level == "note" and pick.backends == () and "dead code" in pick.message
    assert str(pick).endswith("(note)") and not pick.fix
    choice = by[(5, "AIOS106")]
    assert choice.level == "error" and "'cpu'" in choice.message
    assert (5, "AIOS101") not in by  # the same choice, named once
    assert by[(7, "AIOS104")].level == "note"
    assert by[(9, "AIOS102")].level == "error"  # the else branch runs without CUDA


def test_spawn_load_pin_memory_download_and_guarded_autocast():
    src = """import torch
import torch.multiprocessing as mp
from torchvision import datasets
from torch.utils.data import DataLoader
mp.spawn(main, nprocs=2)
ckpt = torch.load("ckpt.pt")
ok = torch.load("ckpt.pt", map_location="cpu")
loader = DataLoader(ds, pin_memory=True)
buf = torch.empty(4, pin_memory=True)
data = datasets.MNIST("data", download=True)
device_type = "cuda" if "cuda" in device else "cpu"
ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16)
if device_type == "cuda":
    ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16)
"""
    by = _by(src)
    assert by[(5, "AIOS203")].backends == BACKENDS
    assert (6, "AIOS113") in by and (7, "AIOS113") not in by
    assert by[(8, "AIOS112")].level == "note"  # a loader warns and pins nothing
    assert by[(9, "AIOS112")].level == "error"  # a tensor factory raises without an accelerator
    assert "race" in by[(10, "AIOS606")].where()
    for line in (12, 14):
        f = by[(line, "AIOS304")]
        assert f.level == "warning" and "fp32" in f.message and "cuda" not in f.backends
    assert (11, "AIOS101") not in by


def test_compile_device_tools_fp8_hub_kernels_and_gpu_gates():
    src = """import subprocess
import sys
import torch
from kernels import get_kernel
assert torch.cuda.is_available()
if torch.cuda.device_count() < 4:
    print("needs 4 GPUs")
    sys.exit()
@torch.compile
def f(x):
    return torch._scaled_mm(x, x)
m = torch.compile(model, backend="inductor")
n = torch.compile(model, backend="openxla")
smi = subprocess.run(["nvidia-smi"], capture_output=True)
fa = get_kernel("kernels-community/flash-attn3")
"""
    by = _by(src)
    assert (5, "AIOS118") in by and (6, "AIOS118") in by
    assert by[(9, "AIOS413")].backends == ("xla",)
    assert set(by[(12, "AIOS413")].backends) == {"xla", "tpu", "neuron"}
    assert (13, "AIOS413") not in by
    assert "cpu" not in by[(11, "AIOS115")].backends  # torch._scaled_mm has a CPU kernel
    assert (14, "AIOS117") in by and (15, "AIOS502") in by


def test_own_parallelism_and_environment_ranks_are_named_as_notes(tmp_path):
    src = """import os
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module
rank = int(os.environ["RANK"])
world = int(os.environ.get("WORLD_SIZE", 1))
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
model = parallelize_module(model, mesh, plan)
model = fully_shard(model, mesh=mesh)
"""
    by = _by(src)
    assert "rt.rank" in by[(6, "AIOS206")].message and "rt.world_size" in by[(7, "AIOS206")].message
    assert "rt.mesh" in by[(8, "AIOS207")].message
    assert "rt.setup(model)" in by[(10, "AIOS207")].message
    assert all(f.level == "note" for f in by.values())
    script = tmp_path / "t.py"
    script.write_text(src)
    r = _check("--backend", "tpu", str(script))
    assert r.exit_code == 0 and r.stdout == ""  # notes break nothing anywhere
    r = _check(str(script))  # shown, but only notes: exit 0
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == len(by), r.output
    assert f"({len(by)} note(s))" in r.stderr


def test_per_rank_seeds_are_no_finding():
    src = """import torch
import torch.distributed as dist
rank = dist.get_rank()
torch.manual_seed(1337 + rank)
model = torch.nn.Linear(2, 2)
"""
    assert check_source(src) == []


def test_fix_never_rewrites_a_device_count_that_divides_or_sizes():
    src = """import torch
import torch.multiprocessing as mp
local = rank % torch.cuda.device_count()
mp.spawn(main, nprocs=torch.cuda.device_count())
print(f"{torch.cuda.device_count()} GPUs")
"""
    found = check_source(src)
    counts = [f for f in found if f.code == "AIOS105"]
    assert [(f.line, bool(f.fix)) for f in counts] == [(3, False), (4, False), (5, True)]
    assert "is 0 on CPU" in counts[0].message
    fixed = fix_source(src, found)
    assert (
        "rank % torch.cuda.device_count()" in fixed and "nprocs=torch.cuda.device_count()" in fixed
    )
    assert 'print(f"{torch.accelerator.device_count()} GPUs")' in fixed


def test_messages_name_what_they_saw():
    src = """import torch
class T:
    def save_model(self):
        torch.save(self.model.state_dict(), "m.pt")
    def run(self):
        x = x.to(device=self.local_rank)
        if self.rank == 0:
            self.save_model()
"""
    by = _by(src)
    assert "(self.local_rank)" in by[(6, "AIOS101")].message
    save = by[(8, "AIOS603")]  # a checkpoint write, not "a forward"
    assert "reaches a save" in save.message


def test_aios_help_imports_neither_torch_nor_the_checker(tmp_path):
    probe = (
        "import sys\nfrom aios.cli.main import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED=' + ','.join(m for m in ('torch', 'aios.check.walker', 'libcst') "
        "if m in sys.modules), file=sys.stderr)\n"
    )
    for args in (["--help"], ["check", "--help"]):
        out = subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            timeout=120,
        )
        assert out.returncode == 0 and "LOADED=\n" in out.stderr, (args, out.stderr)


def test_cuda_calls_that_do_nothing_elsewhere_are_notes_and_gates_by_count_are_found():
    src = """import torch
torch.cuda.empty_cache()
torch.cuda.manual_seed(0)
assert torch.cuda.device_count() >= 4, "needs 4 GPUs"
kwargs = {"num_workers": 2, "pin_memory": True}
"""
    by = _by(src)
    empty = by[(2, "AIOS104")]
    assert empty.level == "note" and empty.fix == "guard"  # still rewritten, but breaks nothing
    assert by[(3, "AIOS107")].level == "note"
    assert (4, "AIOS118") in by
    assert by[(5, "AIOS112")].level == "note"


def test_rank_tests_on_gpu_id_and_files_written_from_the_weights():
    src = """import torch
class Trainer:
    def __init__(self, model, gpu_id):
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
    def _save_checkpoint(self):
        torch.save(self.model.module.state_dict(), "ckpt.pt")
    def train(self):
        if self.gpu_id == 0:
            self._save_checkpoint()

def write_model(model, filename):
    params = {name: p.cpu() for name, p in model.named_parameters()}
    with open(filename, "wb") as f:
        f.write(b"")

def main(model, master_process):
    if master_process:
        write_model(model, "m.bin")
"""
    by = _by(src)
    assert "(gpu_id)" in by[(5, "AIOS101")].message
    assert (10, "AIOS603") in by and (7, "AIOS605") not in by  # rank 0 saves, not every rank
    assert "reaches a save" in by[(19, "AIOS603")].message


def test_guards_defaults_and_conditionals_read_as_the_script_runs():
    src = """import argparse
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from diffusers.training_utils import EMAModel
p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--amp-dtype", default="float16")
p.add_argument("--precision", default="bf16")
args = p.parse_args()
if args.device.startswith("cuda"):
    args.device = f"cuda:{rank}"
dist.init_process_group(backend="gloo" if args.device == "cpu" else "nccl")
dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
if args.amp_dtype == "float16":
    amp_dtype = torch.float16
if args.precision == "fp16":
    other = torch.float16
ema_model = EMAModel(model.parameters()) if args.use_ema else None
target = ema.module if ema is not None else model
if rank == 0:
    ema_model.save_pretrained("ema")
    torch.save(target.state_dict(), "last.pt")
per_node = torch.accelerator.device_count()
mp.spawn(worker, nprocs=per_node)
"""
    by = _by(src)
    assert by[(13, "AIOS101")].level == "note"  # under startswith("cuda"): dead code elsewhere
    assert by[(14, "AIOS201")].level == "error" and "xla" in by[(14, "AIOS201")].backends
    assert (15, "AIOS201") not in by  # nccl only where CUDA is
    assert by[(16, "AIOS202")].level == "note"  # device ids only on CUDA
    assert (18, "AIOS303") in by  # fp16 is the option's default: picked unasked
    assert (20, "AIOS303") not in by  # the user's own --precision fp16
    assert (24, "AIOS603") not in by  # an EMA copy every rank holds
    assert (25, "AIOS603") in by  # the model itself (no EMA by default)
    assert "is 0 on CPU and under torch_xla" in by[(26, "AIOS110")].message


def test_a_models_own_generation_method_is_a_forward():
    src = """import torch
class LM(torch.nn.Module):
    def forward(self, x):
        return x
    def sample(self, x, n):
        for _ in range(n):
            x = self(x)
        return x
model = LM()
if master_process:
    out = model.sample(x, 4)
"""
    assert "model.sample(...)" in _by(src)[(11, "AIOS601")].message
