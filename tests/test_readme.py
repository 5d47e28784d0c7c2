"""The root README's script runs as written, and its claims hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the README's script trains: needs torch")


def _snippet(root) -> str:
    text = (root / "README.md").read_text()
    section = text[text.index("## Writing a script") :]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "the README's 'Writing a script' section has no python block"
    return m.group(1)


def test_readme_script_runs_as_written_and_says_where_things_went(root, clean_env, tmp_path):
    """``python train.py`` (through the session's zygote: a fresh interpreter's start, without
    importing torch again), twice: the second run resumes."""
    from aios.testing.zygote import python

    script = tmp_path / "train.py"
    script.write_text(_snippet(root))
    env = dict(clean_env, AIOS_PLUGINS="aios-core")
    r = subprocess.run(
        python(str(script)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ckpts = sorted(os.listdir(tmp_path / "checkpoints" / "readme"))
    assert ckpts and ckpts[-1].startswith("ckpt-"), ckpts
    lines = r.stderr.splitlines()
    record = [ln for ln in lines if ln.startswith("aios: run record: ")]
    assert len(record) == 1 and (tmp_path / record[0].split(": ", 2)[2]).is_dir(), r.stderr
    assert "aios: checkpoints: checkpoints/readme" in lines
    # run again: it resumes from the newest complete checkpoint
    r2 = subprocess.run(
        python(str(script)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert len(os.listdir(tmp_path / "runs")) == 2


def test_readme_names_no_registry_install_and_no_missing_markers(root):
    text = (root / "README.md").read_text()
    assert "save_if_due" not in text
    if "`tpu`-marked" in text:
        markers = subprocess.run(
            ["grep", "-rl", "mark.tpu", str(root / "packages")], capture_output=True, text=True
        ).stdout
        assert markers.strip(), "README mentions tpu-marked tests but no test carries the mark"


def test_run_records_and_checkpoints_are_git_ignored(root):
    paths = [
        "runs/20240101-000000-1/record.json",
        "checkpoints/gpt/ckpt-000000200/meta.json",
        "examples/runs/x/record.json",
        "examples/checkpoints/gpt/x",
    ]
    r = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=root, capture_output=True, text=True
    )
    assert sorted(r.stdout.split()) == sorted(paths), r.stdout + r.stderr


# every user-facing install line: from the checkout, naming local packages by path in one call
_REGISTRY_INSTALL = re.compile(
    r"""pip install\s+(?:-[-\w]+\s+)*['"]?aios[-\w]*(?:\[[\w,]+\])?['"]?(?!/)"""
)


def test_no_install_hint_fetches_an_aios_project_from_the_registry(root):
    offenders = []
    for path in (
        sorted((root / "packages").glob("*/src/**/*.py"))
        + sorted(root.glob("packages/*/README.md"))
        + [root / "README.md"]
    ):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"pip install[^\n\"`]*", line):
                if _REGISTRY_INSTALL.match(m.group(0)):
                    offenders.append(f"{path.relative_to(root)}:{n}: {m.group(0)}")
    assert offenders == []


def _worked_case(root) -> list[str]:
    text = (root / "README.md").read_text()
    section = text[text.index("### Worked case: pytorch/examples' FSDP + tensor parallel") :]
    m = re.search(r"```console\n(.*?)```", section, re.S)
    assert m, "the worked case has no console block"
    return [ln[2:] for ln in m.group(1).splitlines() if ln.startswith("$ ")]


def test_readme_fsdp_tp_worked_case_gives_the_losses_of_torchrun(root, clean_env, tmp_path):
    """The two commands of the worked case, as printed, from the repository root: the original
    under torchrun and the aios port print the same losses (4 processes, dp=2 x tp=2, CPU)."""
    commands = _worked_case(root)
    assert [c.split()[0] for c in commands] == ["torchrun", "aios-run"], commands
    env = dict(clean_env, OMP_NUM_THREADS="1", AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    losses = []
    for cmd in commands:
        r = subprocess.run(
            cmd, shell=True, cwd=root, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        found = re.findall(r"loss \d+ (-?\d+\.\d+)", r.stdout)
        assert len(found) == 5, r.stdout
        losses.append(found)
    assert losses[0] == losses[1]


def _gpt_docstring_commands(root) -> list[str]:
    text = (root / "examples" / "gpt.py").read_text()
    doc = text[: text.index('"""', 3)]
    return [
        m.group(1).strip() for m in re.finditer(r"^    ((?:\w+=\S+ )*aios-run [^#\n]*)", doc, re.M)
    ]


def _ckpt_dir(cmd: str) -> str:
    m = re.search(r"checkpoint\.dir=(\S+)", cmd)
    return m.group(1) if m else "checkpoints/gpt"  # the script's default


@pytest.fixture
def gcs_bucket(monkeypatch):
    """gs://bucket on the Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`: the GCS
    JSON API on 127.0.0.1): where the docstring's ``checkpoint.dir=gs://bucket/gpt`` goes."""
    pytest.importorskip("aios_cloud_gcp", reason="gs:// is registered by aios-cloud-gcp")
    from aios_cloud_gcp.testing.gcs import GCSFS_ENV, GcsEmulator

    for k, v in GCSFS_ENV.items():  # before gcsfs's first import reads it
        monkeypatch.setenv(k, v)
    pytest.importorskip("gcsfs", reason="gs:// needs gcsfs")
    pytest.importorskip("gcp_storage_emulator", reason="needs gcp-storage-emulator")
    with GcsEmulator() as gcs:
        gcs.make_bucket("bucket")
        yield gcs.env


def test_gpt_docstring_commands_each_train_what_they_say(root, clean_env, tmp_path, gcs_bucket):
    """examples/gpt.py's own commands, in order, exactly as printed from a clone's root (the
    example copied to a scratch clone): each command that runs on this machine's CPUs trains
    its steps (none resumes another command's finished checkpoint), every command keeps its
    own checkpoints, and the first command run again says there is nothing left to train
    instead of a summary with a nan loss. ``GPT_STEPS``, which the docstring names, keeps the
    runs short."""
    import shutil

    commands = _gpt_docstring_commands(root)
    assert len(commands) == 5 and commands[0] == "aios-run examples/gpt.py", commands
    dirs = [_ckpt_dir(c) for c in commands]
    assert len(set(dirs)) == len(dirs), dirs  # no command resumes another one's training
    (tmp_path / "examples" / "data").mkdir(parents=True)
    shutil.copy(root / "examples" / "gpt.py", tmp_path / "examples" / "gpt.py")
    shutil.copy(root / "examples" / "data" / "corpus.txt", tmp_path / "examples" / "data")
    env = dict(clean_env, **gcs_bucket, GPT_STEPS="12", OMP_NUM_THREADS="1")
    env["AIOS_LOGGING__TENSORBOARD"] = "false"
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")

    def run(cmd: str) -> str:
        r = subprocess.run(
            cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout

    ran = 0
    for cmd in commands:
        if "--backend" in cmd:  # cuda, xla: no such device here (their own packages' tests)
            continue
        out = run(cmd)
        assert "gpt: done 12 steps (12 this run)" in out, f"{cmd}\n{out[-3000:]}"
        assert "resumed from" not in out and "nothing left to train" not in out, out[-3000:]
        ran += 1
    assert ran == 3
    assert (tmp_path / "checkpoints" / "gpt" / "ckpt-000000012").is_dir()
    assert (tmp_path / "checkpoints" / "gpt-2p" / "ckpt-000000012").is_dir()

    again = run(commands[0])
    assert "gpt: done" not in again and " nan" not in again, again[-3000:]
    (line,) = [ln for ln in again.splitlines() if "nothing left to train" in ln]
    assert line.startswith(
        "gpt: nothing left to train: the checkpoint in checkpoints/gpt is at step 12 of --steps 12"
    ), line
    assert re.search(r"val loss \d+\.\d+ vs unigram baseline \d+\.\d+$", line), line
