"""Code sync: a tarball of the working directory, honouring ``.gitignore`` plus explicit
excludes; datasets stay home unless git tracks them.

What goes in:

* inside a git work tree: ``git ls-files --cached --others --exclude-standard`` (tracked files
  plus untracked files that no ``.gitignore``, ``.git/info/exclude`` or global excludes file
  ignores);
* elsewhere: every file, minus what the ``.gitignore`` files in the tree say (gitignore
  semantics through ``pathspec`` when installed, a close fnmatch approximation otherwise).

Always left out, whatever the ignore files say: :data:`ALWAYS_EXCLUDE` (``.git``,
``checkpoints``, virtualenvs, caches, run directories, archives), :data:`SECRET_EXCLUDE` (``.env``
files, private keys, cloud and registry credentials: secrets never reach the hosts through code
sync, tracked or not; :func:`secret_files` names what was left out) and the caller's
``excludes`` (glob patterns matched against each path component and the relative path).

Folders named ``data`` (:data:`DATA_EXCLUDE`) hold datasets, often far larger than the code, so
their files stay home, except the ones git tracks: a file committed with the code (the
example's ``examples/data/corpus.txt``) is part of the project and the script needs it on the
hosts. :func:`data_left_out` names what stayed home, and every launch and dry run says it in one
line (:func:`data_line`).
"""

from __future__ import annotations

import builtins
import fnmatch
import hashlib
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from aios.errors import AiosError

ALWAYS_EXCLUDE = (
    ".git",
    "checkpoints",
    "ckpt",
    "__pycache__",
    "*.pyc",
    ".venv",
    "venv",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "runs",
    "wandb",
    ".aios",
    "node_modules",
    "*.tar.gz",
    "*.tgz",
    ".DS_Store",
)
# Dataset folders: their untracked files stay home (matched like ALWAYS_EXCLUDE); what git
# tracks there ships with the code.
DATA_EXCLUDE = ("data",)
# Files that hold secrets by convention. Matched like ALWAYS_EXCLUDE (any path component).
SECRET_EXCLUDE = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.ppk",
    "id_rsa",
    "id_rsa.*",
    "id_dsa",
    "id_dsa.*",
    "id_ecdsa",
    "id_ecdsa.*",
    "id_ed25519",
    "id_ed25519.*",
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".dockercfg",
    "credentials.json",
    "application_default_credentials.json",
    "*service-account*.json",
    "*serviceaccount*.json",
    "kubeconfig",
    "*.kubeconfig",
    ".htpasswd",
    "secrets.yaml",
    "secrets.yml",
    "secrets.json",
    "secrets.toml",
)
# Templates that only name the variables.
SECRET_ALLOW = (".env.example", ".env.sample", ".env.template", ".env.dist", "*.pub")
MAX_BYTES_DEFAULT = 512 * 1024 * 1024


@dataclass
class Tarball:
    path: Path
    files: int
    bytes: int
    digest: str


def _excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        pat = pat.rstrip("/")
        if "/" in pat:
            if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat + "/*"):
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in parts):
            return True
    return False


def _git_files(root: Path) -> list[str] | None:
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if top.returncode != 0 or top.stdout.strip() != "true":
        return None
    r = subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            ".",
        ],
        capture_output=True,
        timeout=120,
    )
    if r.returncode != 0:
        return None
    return [p for p in r.stdout.decode().split("\0") if p]


def _git_tracked(root: Path) -> set[str]:
    """The files under ``root`` that git tracks (empty outside a work tree)."""
    try:
        r = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--", "."],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if r.returncode != 0:
        return set()
    return {p for p in r.stdout.decode().split("\0") if p}


def _walk_gitignore(
    root: Path, prune: tuple[str, ...] = ALWAYS_EXCLUDE + DATA_EXCLUDE
) -> list[str]:
    try:
        import pathspec
    except ImportError:  # pragma: no cover - pathspec is usually present
        pathspec = None  # type: ignore[assignment]
    out: list[str] = []
    specs: list[tuple[str, object]] = []  # (dir prefix, matcher)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        gi = Path(dirpath) / ".gitignore"
        if gi.is_file():
            lines = gi.read_text(errors="replace").splitlines()
            if pathspec is not None:
                specs.append((rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))
            else:
                specs.append(
                    (rel_dir, [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")])
                )

        def ignored(rel: str, is_dir: bool) -> bool:
            for prefix, m in specs:
                if prefix and not rel.startswith(prefix + "/"):
                    continue
                sub = rel[len(prefix) + 1 :] if prefix else rel
                if pathspec is not None:
                    if m.match_file(sub + ("/" if is_dir else "")):  # type: ignore[attr-defined,unused-ignore]
                        return True
                elif _excluded(sub, tuple(p.lstrip("/") for p in m)):  # type: ignore[attr-defined,unused-ignore]
                    return True
            return False

        keep = []
        for d in dirnames:
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if not ignored(rel, True) and not _excluded(rel, prune):
                keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if not ignored(rel, False):
                out.append(rel)
    return out


def _candidates(root: Path, with_data: bool = False) -> tuple[list[str], set[str]]:
    """Every file the ignore rules let through (``with_data``: the data folders' too, outside
    git), and the ones git tracks."""
    files = _git_files(root)
    if files is None:
        prune = ALWAYS_EXCLUDE if with_data else ALWAYS_EXCLUDE + DATA_EXCLUDE
        return _walk_gitignore(root, prune), set()
    return files, _git_tracked(root)


def _ships(root: Path, f: str, patterns: tuple[str, ...], tracked: set[str]) -> bool:
    return (
        not _excluded(f, patterns)
        and not (_excluded(f, DATA_EXCLUDE) and f not in tracked)
        and not is_secret_file(f)
        and ((root / f).is_file() or (root / f).is_symlink())
    )


def collect(root: str | os.PathLike[str], excludes: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Relative paths (``/``-separated, sorted) that code sync would ship from ``root``."""
    root = Path(root)
    files, tracked = _candidates(root)
    patterns = tuple(ALWAYS_EXCLUDE) + tuple(excludes)
    return sorted(f for f in files if _ships(root, f, patterns, tracked))


def data_left_out(
    root: str | os.PathLike[str], excludes: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """The files in folders named ``data`` that code sync leaves home (untracked by git), which
    it would ship otherwise."""
    root = Path(root)
    files, tracked = _candidates(root, with_data=True)
    patterns = tuple(ALWAYS_EXCLUDE) + tuple(excludes)
    return sorted(
        f
        for f in files
        if _excluded(f, DATA_EXCLUDE)
        and f not in tracked
        and not _excluded(f, patterns)
        and not is_secret_file(f)
        and (root / f).is_file()
    )


def data_line(
    root: str | os.PathLike[str], excludes: tuple[str, ...] | list[str] = ()
) -> str | None:
    """One line naming the data files code sync leaves home and why; None when there are none."""
    left = data_left_out(root, excludes)
    if not left:
        return None
    return (
        f"code sync left out {len(left)} file{'s' if len(left) != 1 else ''} in folders named "
        f"data ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}): datasets stay home "
        "unless git tracks them; commit the small files the script reads, put large ones where "
        "the hosts read them (a bucket, a shared path, `aios sync`)"
    )


def is_secret_file(rel: str) -> bool:
    """Whether ``rel`` (relative, ``/``-separated) looks like it holds a secret."""
    name = rel.rsplit("/", 1)[-1]
    if any(fnmatch.fnmatch(name, p) for p in SECRET_ALLOW):
        return False
    return _excluded(rel, SECRET_EXCLUDE)


def secret_files(
    root: str | os.PathLike[str], excludes: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """The secret-looking files under ``root`` that code sync leaves out (to tell the user)."""
    root = Path(root)
    files, tracked = _candidates(root)
    patterns = tuple(ALWAYS_EXCLUDE) + tuple(excludes)
    return sorted(
        f
        for f in files
        if not _excluded(f, patterns)
        and not (_excluded(f, DATA_EXCLUDE) and f not in tracked)
        and is_secret_file(f)
    )


def _collect_bounded(
    root: Path, excludes: tuple[str, ...] | list[str], max_bytes: int
) -> tuple[list[str], int]:
    """:func:`collect` and the bytes it holds, refusing more than ``max_bytes`` of input
    (someone's dataset slipped through the ignore rules) with a one-line error naming the
    largest files."""

    files = collect(root, excludes)
    total = sum((root / f).lstat().st_size for f in files)
    if total > max_bytes:
        big = sorted(files, key=lambda f: -(root / f).lstat().st_size)[:3]
        raise AiosError(
            f"code sync would upload {total / 2**20:.0f} MiB from {root} (largest: {', '.join(big)})",
            "add those paths to .gitignore or --exclude, or raise --max-sync-mb",
        )
    return files, total


def make_tarball(
    root: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    excludes: tuple[str, ...] | list[str] = (),
    max_bytes: int = MAX_BYTES_DEFAULT,
    extra_files: list[tuple[Path, str]] | None = None,
    generated: dict[str, str] | None = None,
) -> Tarball:
    """Write ``dest`` (gzip tar of :func:`collect`); refuses more than ``max_bytes`` of input
    (someone's dataset slipped through the ignore rules) with a one-line error."""
    root = Path(root)
    files, total = _collect_bounded(root, excludes, max_bytes)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    h = hashlib.sha256()
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for f in files:
            info = tar.gettarinfo(str(root / f), arcname=f)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            h.update(f.encode() + b"\0" + str(info.size).encode() + b"\0")
            if info.isfile():
                with open(root / f, "rb") as fh:
                    tar.addfile(info, fh)
                    fh.seek(0)
                    h.update(hashlib.sha256(fh.read()).digest())
            else:
                tar.addfile(info)
        for src, arc in extra_files or []:
            tar.add(str(src), arcname=arc, recursive=False)
        for arc, text in (generated or {}).items():
            import io

            data = text.encode()
            ti = tarfile.TarInfo(arc)
            ti.size = len(data)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))
    os.replace(tmp, dest)
    return Tarball(dest, len(files), total, h.hexdigest()[:16])


@dataclass
class Manifest:
    """What code sync ships, by content: ``entries`` are ``(path, sha, mode)`` (``mode`` an
    octal string, or ``"l"`` for a symlink whose blob is its target), ``blobs`` maps each
    ``sha`` to its source file or bytes. ``files``/``bytes`` count the workdir alone."""

    entries: list[tuple[str, str, str]]
    blobs: dict[str, Path | builtins.bytes]
    files: int
    bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(
            len(b) if isinstance(b, builtins.bytes) else b.stat().st_size
            for b in self.blobs.values()
        )

    def payload(self) -> builtins.bytes:
        """The manifest as the head host's ``fleet.py have`` reads it (gzip JSON)."""
        import gzip
        import json

        return gzip.compress(json.dumps({"files": self.entries}).encode(), 9)

    def blob_tar(self, shas: list[str]) -> builtins.bytes:
        """A gzip tar of the named blobs (members named by hash)."""
        import io

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
            for sha in shas:
                src = self.blobs[sha]
                data = src if isinstance(src, builtins.bytes) else src.read_bytes()
                if _sha(data) != sha:
                    raise AiosError(
                        f"{src if isinstance(src, Path) else 'a generated file'} changed while "
                        "aios was syncing it",
                        "launch again once your files are saved",
                    )
                ti = tarfile.TarInfo(sha)
                ti.size = len(data)
                ti.mode = 0o600
                tar.addfile(ti, io.BytesIO(data))
        return buf.getvalue()


SHA_CHARS = 20  # 80 bits of sha256: content addresses within one cluster's code


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:SHA_CHARS]


def make_manifest(
    root: str | os.PathLike[str],
    excludes: tuple[str, ...] | list[str] = (),
    max_bytes: int = MAX_BYTES_DEFAULT,
    extra_files: list[tuple[Path, str]] | None = None,
    generated: dict[str, str] | None = None,
) -> Manifest:
    """The content manifest of :func:`collect` (plus ``extra_files``/``generated``, the aios
    bundle): the head host keeps the blobs, so a relaunch sends only what changed. Refuses more
    than ``max_bytes`` of workdir input like :func:`make_tarball`."""
    root = Path(root)
    files, total = _collect_bounded(root, excludes, max_bytes)
    entries: list[tuple[str, str, str]] = []
    blobs: dict[str, Path | bytes] = {}
    sources = [(root / f, f) for f in files] + list(extra_files or [])
    for src, arc in sources:
        if src.is_symlink():
            data = os.readlink(src).encode()
            sha, mode = _sha(data), "l"
            blobs[sha] = data
        else:
            sha, mode = _sha(src.read_bytes()), oct(src.stat().st_mode & 0o777)[2:]
            blobs[sha] = src
        entries.append((arc, sha, mode))
    for arc, text in (generated or {}).items():
        data = text.encode()
        sha = _sha(data)
        blobs[sha] = data
        entries.append((arc, sha, "644"))
    return Manifest(entries, blobs, len(files), total)
