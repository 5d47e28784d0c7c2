"""Atomic, verifiable checkpoints on a local path or any fsspec URL.

Layout of ``checkpoint.dir``::

    <dir>/ckpt-000000120/state.pt              torch.save of the full training state
    <dir>/ckpt-000000120/aios-checkpoint.json  commit marker: step, time, size and sha256 per file

Rules:

* **Atomic.** Locally a checkpoint is written into ``<dir>/.partial-ckpt-<step>-<pid>/`` and
  renamed into place (``rename`` is atomic on POSIX) with its marker inside. On object stores
  (``gs://``, ``s3://``, ...) where renames are copies, files are written in place and the marker
  is written **last**. Either way a checkpoint without a marker is incomplete, and a crash at any
  point of a save leaves the previous complete checkpoint untouched.
* **Keep N.** After a save, complete checkpoints beyond ``keep`` (oldest first) and leftovers of
  interrupted saves are deleted.
* **Resume** picks the newest *complete* checkpoint. Incomplete ones (no marker: an interrupted
  save) are skipped with a warning. A checkpoint whose marker is present but whose files do not
  match it (size or sha256), or that cannot be unpickled, is **corrupt**: that is an error
  (:class:`aios.errors.CheckpointError`, one line, exit 2) rather than a silent fallback to an
  older checkpoint, because silently losing training progress is worse than stopping. The fix
  the error names: delete that checkpoint directory, or start fresh with
  ``checkpoint.resume=false``.

URL schemes come from the registry (:func:`aios.hookspecs.aios_register_storage`); a scheme no
installed plugin registers is an error with the install hint.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, BinaryIO

from aios.errors import CheckpointError

MARKER = "aios-checkpoint.json"
STATE_FILE = "state.pt"
FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{9,})$")


def ckpt_name(step: int) -> str:
    return f"ckpt-{step:09d}"


@dataclass
class CheckpointInfo:
    path: str
    step: int
    complete: bool
    meta: dict[str, Any]


class _HashingWriter:
    """File-like wrapper that hashes and counts what passes through (no second copy in memory)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        b = bytes(data) if not isinstance(data, bytes) else data
        self.sha.update(b)
        self.size += len(b)
        self.f.write(b)
        return len(b)

    def flush(self) -> None:
        self.f.flush()


def filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` for a local path or a registered URL scheme."""
    import fsspec

    if "://" not in url:
        return fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(url))
    scheme = url.split("://", 1)[0]
    from aios.plugins import get_registry

    reg = get_registry()
    spec = reg.storage.get(scheme)
    if spec is None:
        known = ", ".join(sorted(reg.storage)) or "none"
        hint = {"gs": "pip install -e './packages/core[gcp]' ./packages/backend-xla ./packages/cloud-gcp (from the aios checkout)", "s3": "pip install -e './packages/core[aws]' ./packages/cloud-aws (from the aios checkout)"}.get(scheme, "install the plugin that registers it")
        raise CheckpointError(f"checkpoint URL scheme '{scheme}://' is not registered (registered: {known})", hint)
    if spec.requires:
        import importlib.util

        if importlib.util.find_spec(spec.requires) is None:
            raise CheckpointError(f"'{scheme}://' checkpoints need the '{spec.requires}' package", spec.install_hint or f"pip install {spec.requires}")
    options = spec.storage_options(url) if spec.storage_options else {}
    fs = fsspec.filesystem(spec.protocol, **options)
    path = fs._strip_protocol(url) if hasattr(fs, "_strip_protocol") else url.split("://", 1)[1]
    return fs, path


class CheckpointStore:
    """Checkpoints under one directory or URL (see the module docstring for the rules)."""

    def __init__(self, url: str, keep: int = 3) -> None:
        self.url = url
        self.keep = keep
        self.fs, self.root = filesystem(url)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def display(self, path: str) -> str:
        if self.local:
            return path
        scheme = self.url.split("://", 1)[0]
        return f"{scheme}://{path.lstrip('/')}"

    # ---------------------------------------------------------------- checks
    def check_writable(self) -> None:
        """Create the directory and write/delete a probe file; a clear error when that fails."""
        probe = self._join(f".aios-write-test-{os.getpid()}")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            with self.fs.open(probe, "wb") as f:
                f.write(b"ok")
            self.fs.rm(probe)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint dir '{self.url}' is not writable ({type(exc).__name__}: {exc})",
                "set checkpoint.dir to a writable path or URL",
            ) from None

    # ---------------------------------------------------------------- listing
    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint directory (complete or not), oldest first."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"cannot list checkpoint dir '{self.url}' ({type(exc).__name__}: {exc})", "check the path and its permissions") from None
        out: list[CheckpointInfo] = []
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            m = _NAME.match(name)
            if not m:
                continue
            path = self._join(name)
            meta = self._read_marker(path)
            out.append(CheckpointInfo(path, int(m.group(1)), meta is not None, meta or {}))
        return sorted(out, key=lambda c: c.step)

    def _read_marker(self, path: str) -> dict[str, Any] | None:
        marker = f"{path}/{MARKER}"
        try:
            with self.fs.open(marker, "rb") as f:
                raw = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            meta = json.loads(raw)
            if not isinstance(meta, dict) or "files" not in meta:
                raise ValueError("no 'files' entry")
        except ValueError as exc:
            raise CheckpointError(
                f"checkpoint '{self.display(path)}' is corrupt: unreadable marker {MARKER} ({exc})",
                f"delete {self.display(path)} or start fresh with checkpoint.resume=false",
            ) from None
        return meta

    def latest(self, warn: bool = True) -> CheckpointInfo | None:
        """The newest complete checkpoint; incomplete newer ones are skipped with a warning."""
        for info in reversed(self.list()):
            if info.complete:
                return info
            if warn:
                warnings.warn(f"aios: skipping incomplete checkpoint {self.display(info.path)} (interrupted save, no {MARKER})", stacklevel=2)
        return None

    def verify(self, info: CheckpointInfo, hash_files: bool = False) -> None:
        """Check sizes (and sha256 when ``hash_files``) against the marker."""
        for name, want in info.meta.get("files", {}).items():
            p = f"{info.path}/{name}"
            try:
                size = self.fs.size(p)
            except FileNotFoundError:
                size = None
            if size != want.get("size"):
                raise CheckpointError(
                    f"checkpoint '{self.display(info.path)}' is corrupt: {name} has {size} bytes, its marker says {want.get('size')}",
                    f"delete {self.display(info.path)} or start fresh with checkpoint.resume=false",
                )
            if hash_files:
                self.read_file(info, name)

    # ---------------------------------------------------------------- save
    def _open_write(self, path: str) -> Any:
        if self.local:
            return open(path, "wb")  # noqa: SIM115 - closed by the caller's with
        return self.fs.open(path, "wb")

    def _fsync(self, f: Any) -> None:
        if self.local:
            f.flush()
            os.fsync(f.fileno())

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any] | None = None) -> str:
        """Write ``state`` (torch-serialisable) as the checkpoint for ``step``; return its path."""
        import torch

        name = ckpt_name(step)
        final = self._join(name)
        if self.local:
            work = self._join(f".partial-{name}-{os.getpid()}")
            if self.fs.exists(work):
                self.fs.rm(work, recursive=True)
        else:
            work = final
            if self.fs.exists(final):  # re-saving a step: drop the old marker first
                self.fs.rm(final, recursive=True)
        try:
            self.fs.makedirs(work, exist_ok=True)
            with self._open_write(f"{work}/{STATE_FILE}") as f:
                w = _HashingWriter(f)
                torch.save(state, w)
                self._fsync(f)
            files = {STATE_FILE: {"size": w.size, "sha256": w.sha.hexdigest()}}
            marker = {"format": FORMAT, "step": step, "time": time.time(), "files": files, **(meta or {})}
            with self._open_write(f"{work}/{MARKER}") as f:
                f.write(json.dumps(marker, indent=1, sort_keys=True).encode())
                self._fsync(f)
            if self.local:
                if os.path.exists(final):
                    old = self._join(f".old-{name}-{os.getpid()}")
                    os.rename(final, old)
                    os.rename(work, final)
                    self.fs.rm(old, recursive=True)
                else:
                    os.rename(work, final)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001
            if self.local:
                try:
                    self.fs.rm(work, recursive=True)
                except Exception:  # noqa: BLE001
                    pass
            raise CheckpointError(
                f"saving checkpoint to '{self.display(final)}' failed ({type(exc).__name__}: {exc})",
                "check that checkpoint.dir is writable and has free space",
            ) from exc
        self.prune()
        return self.display(final)

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; drop leftovers of interrupted saves."""
        infos = self.list()
        complete = [i for i in infos if i.complete]
        doomed = complete[: max(0, len(complete) - self.keep)]
        newest = complete[-1].step if complete else -1
        doomed += [i for i in infos if not i.complete and i.step <= newest]
        for info in doomed:
            try:
                self.fs.rm(info.path, recursive=True)
            except Exception:  # noqa: BLE001
                pass
        if self.local:
            try:
                for entry in self.fs.ls(self.root, detail=False):
                    base = entry.rstrip("/").rsplit("/", 1)[-1]
                    if base.startswith((".partial-", ".old-")) and not base.endswith(f"-{os.getpid()}"):
                        self.fs.rm(entry, recursive=True)
            except Exception:  # noqa: BLE001
                pass

    # ---------------------------------------------------------------- load
    def read_file(self, info: CheckpointInfo, name: str) -> bytes:
        want = info.meta.get("files", {}).get(name)
        try:
            with self.fs.open(f"{info.path}/{name}", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        fix = f"delete {self.display(info.path)} or start fresh with checkpoint.resume=false"
        if data is None or want is None:
            raise CheckpointError(f"checkpoint '{self.display(info.path)}' is corrupt: {name} is missing", fix)
        if len(data) != want.get("size") or hashlib.sha256(data).hexdigest() != want.get("sha256"):
            raise CheckpointError(f"checkpoint '{self.display(info.path)}' is corrupt: {name} does not match the sha256 in its marker", fix)
        return data

    def load(self, info: CheckpointInfo) -> dict[str, Any]:
        import torch

        data = self.read_file(info, STATE_FILE)
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint '{self.display(info.path)}' cannot be loaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                f"delete {self.display(info.path)} or start fresh with checkpoint.resume=false",
            ) from None

    def resolve(self, path_or_step: str | int | None) -> CheckpointInfo:
        """A checkpoint by step number, by directory/URL, or the newest complete one."""
        if path_or_step is None:
            info = self.latest()
            if info is None:
                raise CheckpointError(f"no complete checkpoint in '{self.url}'", "train first, or point checkpoint.dir at a directory holding checkpoints")
            return info
        if isinstance(path_or_step, int):
            name = ckpt_name(path_or_step)
            path = self._join(name)
        else:
            path = path_or_step
            if "://" not in path and not os.path.isabs(path) and not path.startswith(self.root):
                path = self._join(path) if not os.path.exists(path) else os.path.abspath(path)
            elif "://" in path:
                path = filesystem(path)[1]
        m = _NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
        meta = self._read_marker(path)
        if meta is None:
            raise CheckpointError(
                f"'{self.display(path)}' is not a complete checkpoint (no {MARKER}: missing or an interrupted save)",
                "pick another checkpoint or let resume choose the newest complete one",
            )
        return CheckpointInfo(path, int(m.group(1)) if m else int(meta.get("step", 0)), True, meta)


def open_any(path: str) -> tuple[CheckpointStore, CheckpointInfo]:
    """Store and info for one checkpoint given by its full path or URL."""
    parent, _, name = path.rstrip("/").rpartition("/")
    store = CheckpointStore(parent or ".")
    return store, store.resolve(path)
