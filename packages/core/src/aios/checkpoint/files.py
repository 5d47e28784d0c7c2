"""Checkpoint files: the digest every file is recorded with, writes hashed as they happen, the
filesystem behind a path or URL, and the atomic swap of two directories. Used by the store
(:mod:`aios.checkpoint.store`), the manager and the ``dcp`` format. Nothing here imports torch
at import time."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from typing import Any

from aios.errors import CheckpointError
from aios.plugins.registry import get_registry

#: the digest every checkpoint file is recorded with in the marker: XXH3-128 (the ``xxhash``
#: package, a core dependency), about 20 GB/s on one core, so that hashing costs next to
#: nothing beside the disk (sha256 runs at 1-2 GB/s with SHA instructions, slower than a fast
#: disk: it was the largest cost of a save and of a load, see bench/bench_ckpt_io.py). It is a
#: checksum against torn, truncated and corrupted files, which is what the marker guards: the
#: marker lies next to the files, so no digest there could stop a writer who can change both.
#: Where ``xxhash`` cannot be imported new files record sha256 (slower, equally checked).
DIGEST = "xxh3_128" if importlib.util.find_spec("xxhash") is not None else "sha256"
#: the digests a marker may record for a file, in the order they are checked (checkpoints of
#: earlier versions record sha256)
DIGESTS = ("xxh3_128", "sha256")
#: written by the ``dcp`` format's writers next to the shards (each file's size and digest,
#: hashed as the shards were written) and merged into the marker at commit
DIGESTS_FILE = "aios-digests.json"
CHUNK = 8 << 20


def new_hash(name: str = DIGEST) -> Any:
    """A streaming hash object (``update``, ``hexdigest``) for the digest ``name``."""
    if name == "xxh3_128":
        try:
            import xxhash
        except ImportError:
            raise CheckpointError(
                "this checkpoint records xxh3_128 digests, which need the 'xxhash' package",
                "pip install xxhash (a dependency of aios-core)",
            ) from None
        return xxhash.xxh3_128()
    return hashlib.new(name)


def recorded_digest(entry: dict[str, Any]) -> tuple[str, str] | None:
    """``(name, hex digest)`` a marker's file entry records (None: sizes only, as in
    checkpoints written before digests were recorded)."""
    for name in DIGESTS:
        value = entry.get(name)
        if value:
            return name, str(value)
    return None


def torch_save(obj: Any, f: Any) -> None:
    """``torch.save(obj, f)`` for a file whose every byte the marker's digest covers, without
    the zip CRC-32 torch otherwise computes for each record: a second pass over every byte at
    about the disk's own speed (half the cost of a save, see bench/bench_ckpt_io.py) that no
    reader checks (``torch.load`` ignores it; aios verifies the digest). A zip tool that tests
    CRCs (``unzip -t``, Python's ``zipfile``) reports the records' CRCs as wrong."""
    import torch

    try:
        from torch.serialization import get_crc32_options, set_crc32_options
    except ImportError:  # torch before 2.6 always computes it
        torch.save(obj, f)
        return
    before = get_crc32_options()
    set_crc32_options(False)
    try:
        torch.save(obj, f)
    finally:
        set_crc32_options(before)


class HashingWriter:
    """File-like wrapper that hashes and counts what passes through (no second copy in memory).
    Everything else (``tell``, ``fileno``, ``close`` ...) goes to the wrapped file."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.hash = new_hash()
        self.size = 0
        #: the OS error of a failed write: torch's zip writer replaces it with its own message
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += view.nbytes
        try:
            self.f.write(view)
        except OSError as exc:
            self.error = exc
            raise
        return view.nbytes

    def flush(self) -> None:
        self.f.flush()

    def entry(self) -> dict[str, Any]:
        return {"size": self.size, DIGEST: self.hash.hexdigest()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


def filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` for a local path or a registered URL scheme."""
    import fsspec

    if "://" not in url:
        return fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(url))
    scheme = url.split("://", 1)[0]

    reg = get_registry()
    spec = reg.storage.get(scheme)
    if spec is None:
        known = ", ".join(sorted(reg.storage)) or "none"
        hint = {
            "gs": "pip install -e './packages/core[gcp]' ./packages/cloud ./packages/backend-xla "
            "./packages/cloud-gcp (from the aios checkout)",
            "s3": "pip install -e './packages/core[aws]' ./packages/cloud ./packages/cloud-aws "
            "(from the aios checkout)",
        }.get(scheme, "install the plugin that registers it")
        raise CheckpointError(
            f"checkpoint URL scheme '{scheme}://' is not registered (registered: {known})", hint
        )
    if spec.requires:
        import importlib.util

        if importlib.util.find_spec(spec.requires) is None:
            raise CheckpointError(
                f"'{scheme}://' checkpoints need the '{spec.requires}' package",
                spec.install_hint or f"pip install {spec.requires}",
            )
    options = spec.storage_options(url) if spec.storage_options else {}
    fs = fsspec.filesystem(spec.protocol, **options)
    path = fs._strip_protocol(url) if hasattr(fs, "_strip_protocol") else url.split("://", 1)[1]
    return fs, path


def swap_dirs(new: str, old: str) -> None:
    """Give the committed directory ``new`` the name ``old`` (an older checkpoint), which then
    lies at ``new``: one atomic ``renameat2(RENAME_EXCHANGE)`` on Linux, so at every instant a
    complete checkpoint has the name. Where the kernel or file system lacks it: the old copy
    is renamed aside first (for an instant the name is free; the old copy keeps its marker
    under ``new``'s name and is removed by the caller)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(old), rename_exchange) == 0:
            return
    aside = f"{new}.old"
    os.rename(old, aside)
    os.rename(new, old)
    os.rename(aside, new)
