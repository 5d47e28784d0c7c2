"""Code sync tarballs: .gitignore honoured (git and plain directories); files in folders named
data stay home unless git tracks them, and a launch says what stayed home."""

from __future__ import annotations

import subprocess
import tarfile

import pytest
from aios.errors import AiosError
from aios_cloud.codesync import collect, data_left_out, data_line, make_tarball


def _tree(root):
    files = {
        "train.py": "print(1)",
        "pkg/__init__.py": "",
        "pkg/model.py": "x = 1",
        ".gitignore": "*.log\nout/\n/secret.txt\n",
        "run.log": "log",
        "out/result.txt": "r",
        "secret.txt": "s",
        "pkg/secret.txt": "kept: the rule is anchored to the root",
        "data/train.bin": "d",
        "pkg/data/shard.bin": "d",
        "checkpoints/ckpt-1/state.pt": "c",
        ".venv/bin/python": "v",
        "pkg/__pycache__/m.cpython-311.pyc": "p",
        "notes.md": "n",
        "sub/.gitignore": "*.tmp\n",
        "sub/a.tmp": "t",
        "sub/b.py": "b",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


EXPECTED = [
    ".gitignore",
    "notes.md",
    "pkg/__init__.py",
    "pkg/model.py",
    "pkg/secret.txt",
    "sub/.gitignore",
    "sub/b.py",
    "train.py",
]


def test_cloud_codesync_plain_directory(tmp_path):
    _tree(tmp_path)
    assert collect(tmp_path) == EXPECTED
    assert data_left_out(tmp_path) == ["data/train.bin", "pkg/data/shard.bin"]
    line = data_line(tmp_path)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "code sync left out 2 files in folders named data (data/train.bin, pkg/data/shard.bin): "
        "datasets stay home unless git tracks them"
    ), line
    assert collect(tmp_path, excludes=["notes.md", "sub"]) == [
        f for f in EXPECTED if f != "notes.md" and not f.startswith("sub/")
    ]


def test_cloud_codesync_git_work_tree(tmp_path):
    _tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("notes.md\n")
    # a file committed under data/ is part of the project (the script reads it): it ships; an
    # untracked one stays home, and the launch says so
    subprocess.run(
        ["git", "-C", str(tmp_path), "add", "-f", "data/train.bin", "train.py"], check=True
    )
    got = collect(tmp_path)
    assert got == sorted([f for f in EXPECTED if f != "notes.md"] + ["data/train.bin"])
    assert not any(part in f.split("/") for f in got for part in (".git", "checkpoints"))
    assert data_left_out(tmp_path) == ["pkg/data/shard.bin"]
    assert data_left_out(tmp_path, excludes=["pkg"]) == []  # excluded anyway: nothing to say
    assert data_line(tmp_path).startswith("code sync left out 1 file in folders named data (")
    assert collect(tmp_path, excludes=["data"]) == [f for f in EXPECTED if f != "notes.md"]


def test_cloud_codesync_ships_the_examples_data_from_a_clone():
    """``aios launch ... examples/gpt.py`` from a clone of aios: the corpus the example reads
    (tracked, examples/data/corpus.txt) reaches the hosts."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        pytest.skip("not a git clone of aios")
    got = collect(root)
    assert "examples/data/corpus.txt" in got and "examples/gpt.py" in got


def test_cloud_codesync_tarball_and_size_limit(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _tree(src)
    tb = make_tarball(src, tmp_path / "code.tar.gz")
    with tarfile.open(tb.path) as t:
        assert sorted(t.getnames()) == EXPECTED
    assert tb.files == len(EXPECTED) and tb.bytes > 0
    assert make_tarball(src, tmp_path / "again.tar.gz").digest == tb.digest  # stable content hash
    (src / "weights.safetensors").write_bytes(b"0" * 3 * 2**20)
    with pytest.raises(AiosError, match="code sync would upload 3 MiB .*weights.safetensors"):
        make_tarball(src, tmp_path / "big.tar.gz", max_bytes=2**20)
    assert not (tmp_path / "big.tar.gz").exists()


@pytest.mark.parametrize("git", [True, False], ids=["git-untracked", "plain"])
def test_cloud_codesync_never_ships_env_files_or_keys(tmp_path, git):
    """Untracked, not gitignored secret files stay home; templates and public keys go."""
    secrets = {
        ".env": "WANDB_API_KEY=abc",
        ".env.prod": "X=1",
        "conf/prod.env": "Y=2",
        "deploy/key.pem": "-----BEGIN",
        "id_ed25519": "k",
        "keys/id_rsa": "k",
        "gcp/service-account-prod.json": "{}",
        "credentials.json": "{}",
        ".aws/credentials": "[default]",
        ".netrc": "machine x",
    }
    kept = {
        "train.py": "print(1)",
        ".env.example": "WANDB_API_KEY=",
        "id_ed25519.pub": "ssh-ed25519 AAAA",
        "conf/model.yaml": "a: 1",
    }
    for rel, text in {**secrets, **kept}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    if git:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        subprocess.run(["git", "-C", str(tmp_path), "add", "train.py"], check=True)
    from aios_cloud.codesync import secret_files

    assert collect(tmp_path) == sorted(kept)
    assert secret_files(tmp_path) == sorted(secrets)
    t = make_tarball(tmp_path, tmp_path.parent / f"code-{git}.tar.gz")
    with tarfile.open(t.path) as tar:
        names = set(tar.getnames())
    assert names == set(kept) and not any(s in names for s in secrets)
