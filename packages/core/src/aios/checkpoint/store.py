"""Atomic, verifiable checkpoints on a local path or any fsspec URL; one writer per directory;
aios deletes only what it wrote.

Layout of ``checkpoint.dir``::

    <dir>/ckpt-000000120/state.pt              the files of one checkpoint (here: the full state)
    <dir>/ckpt-000000120/aios-checkpoint.json  commit marker: step, time, lineage, run, world size,
                                               backend, strategy, format, size+digest per file
    <dir>/ckpt-000000120-3f9c01ab/             the same step written again (see re-save below)
    <dir>/.aios-lock                           the writer lock (run, pid, host, heartbeat)

Rules:

* **Staging + commit.** A save is ``begin(step)`` (a staging directory; every rank of a sharded
  writer may put its files there), the files, then ``commit(staging, files, meta)``: the marker is
  written **last**, after every file is durable (fsynced locally). Locally the staging directory
  is ``.aios-partial-ckpt-<step>-<lineage>-<nonce>`` and is renamed into place (atomic on POSIX),
  and the directory is fsynced after every rename. On object stores (``gs://``, ``s3://``, ...)
  where renames are copies, files are written in place and the marker last. A checkpoint without
  a marker is incomplete; a crash at any point leaves the previous complete checkpoint in place.
* **Re-save of a step** never removes the good copy first: the new copy is committed under a
  unique name (``ckpt-<step>-<nonce>``), only then is the old one retired (its marker goes first,
  so a half-deleted copy is "incomplete", never "corrupt"), and locally the new copy is renamed to
  ``ckpt-<step>``. At every instant a complete copy is discoverable by resume.
* **Lineage.** Every checkpoint's marker records the *lineage*: the id shared by a run and every
  run that resumed from it. ``keep`` counts only the store's own lineage, and pruning removes only
  that lineage's checkpoints and leftovers whose names carry its token. Other runs' checkpoints,
  legacy ones and files aios did not name are never deleted.
* **Resume** picks the most recently committed complete checkpoint (the lineage that wrote last;
  within one lineage, the highest step). Incomplete ones are skipped with a warning. A checkpoint
  whose marker is present but whose files do not match it (size or digest), or that cannot be
  unpickled, is **corrupt**: that is an error (:class:`aios.errors.CheckpointError`, one line,
  exit 2) rather than a silent fallback to an older checkpoint.
* **Digests.** Every file of every format is listed in the marker with its size and digest
  (:data:`DIGEST`, XXH3-128; sha256 in checkpoints of earlier versions, still checked),
  computed as the file is written (:class:`HashingWriter`; the ``dcp`` format's writers do the
  same for shards and ``.metadata``). Resume checks them before anything is unpickled; the full
  format's ``state.pt`` is read from the disk once: hashed in one sequential pass, then mapped
  by ``torch.load`` from the page cache (:meth:`CheckpointStore.load`).
* **One writer.** :meth:`CheckpointStore.acquire_lock` takes ``.aios-lock`` atomically: locally
  under an exclusive ``flock`` (of the directory; of ``.aios-lock.guard`` where directories
  cannot be locked) and created with ``link`` (never seen empty); on S3/GCS with conditional
  writes. A second run stops with one line naming the run holding it. A lock is stale (taken
  over, compare-and-swap on what was read) when its holder's process is gone (same host) or its
  heartbeat is older than :data:`LOCK_STALE_S`; an empty or unreadable lock only once its file
  is that old. A holder that cannot refresh for :data:`LOCK_FENCE_S` (< :data:`LOCK_STALE_S`)
  writes nothing more (:meth:`CheckpointStore.check_lock`), nor does one that was taken over.

URL schemes come from the registry (:func:`aios.plugins.hookspecs.aios_register_storage`); a scheme no
installed plugin registers is an error with the install hint.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aios.checkpoint.files import (
    CHUNK,
    HashingWriter,
    filesystem,
    new_hash,
    recorded_digest,
    swap_dirs,
    torch_save,
)
from aios.checkpoint.lock import WriterLock, _nonce, fsync_dir
from aios.config.redact import redact_url
from aios.errors import CheckpointError, os_cause

MARKER = "aios-checkpoint.json"
STATE_FILE = "state.pt"
#: written first into a staging directory: whose (lineage) and which step it is
STAGING_FILE = ".aios-staging.json"
FORMAT = 1

#: object stores cannot rename a directory, so a replaceable named checkpoint there
#: (``save(path, replace=True)``, ``rt.save_best``) is a version directory
#: ``<name>.aios-v-<nonce>`` plus the pointer object ``<name>.aios-current`` naming the committed
#: version. The pointer is one small object, replaced whole by one PUT (GCS and S3 give
#: read-after-write consistency on single objects), so a reader sees the previous version or the
#: new one, never none; the previous version is deleted only after the pointer names the new one.
#: ``<name>`` is read through its pointer.
POINTER_SUFFIX = ".aios-current"
VERSION_SEP = ".aios-v-"

_NAME = re.compile(r"^ckpt-(\d{9,})(?:-([0-9a-f]{8}))?$")
# names aios generates for its own temporary directories: lineage (16 hex) and nonce (8 hex)
_TEMP = re.compile(r"^\.aios-(?:partial|trash)-ckpt-(\d{9,})-([0-9a-f]{16})-([0-9a-f]{8})$")


def ckpt_name(step: int) -> str:
    return f"ckpt-{step:09d}"


def new_lineage() -> str:
    """A new lineage id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


@dataclass
class CheckpointInfo:
    path: str
    step: int
    complete: bool
    meta: dict[str, Any]
    #: why its marker cannot be read (a damaged checkpoint: never resumed, never pruned)
    damaged: str | None = None

    @property
    def lineage(self) -> str | None:
        return self.meta.get("lineage")

    @property
    def time(self) -> float:
        try:
            return float(self.meta.get("time", 0.0))
        except (TypeError, ValueError):
            return 0.0


@dataclass
class Staging:
    """A save in progress: the directory every writer puts its files into."""

    step: int
    path: str
    lineage: str
    nonce: str
    #: object stores: the staging directory is the checkpoint's final place
    in_place: bool = False
    files: dict[str, Any] = field(default_factory=dict)
    #: an explicit directory name (``rt.save(path)``) instead of ``ckpt-<step>``
    target: str | None = None
    #: the explicit directory may hold an aios checkpoint that the commit replaces
    replace: bool = False


def _say_stderr(line: str) -> None:
    """Where a store says its one-line notices when nobody passed ``say``."""
    print(line, file=sys.stderr, flush=True)


class CheckpointStore(WriterLock):
    """Checkpoints under one directory or URL (see the module docstring for the rules).

    :param keep: complete checkpoints of this store's lineage kept after a commit (``None``:
        never prune).
    :param lineage: the lineage new checkpoints belong to (a new one when omitted).
    """

    def __init__(self, url: str, keep: int | None = 3, lineage: str | None = None) -> None:
        self.url = url
        self.keep = keep
        self.lineage = lineage or new_lineage()
        self.fs, self.root = filesystem(url)
        self.local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        self._lock_token: str | None = None
        #: why this store lost its writer lock (then it writes no checkpoint)
        self.lost: str | None = None
        self._refreshed = 0.0
        self._refresh_error: str | None = None
        #: the wall clock of lock heartbeats (tests inject their own)
        self.clock = time.time

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def display(self, path: str) -> str:
        """``path`` as a URL on object stores (usable for I/O: what aios prints or records of
        it goes through :func:`aios.config.schema.redact_url`)."""
        if self.local:
            return path
        scheme = self.url.split("://", 1)[0]
        return f"{scheme}://{path.lstrip('/')}"

    def _shown(self, path: str) -> str:
        return redact_url(self.display(path))

    @property
    def shown(self) -> str:
        """The store's URL as aios prints it (secrets redacted)."""
        return redact_url(self.url)

    # ---------------------------------------------------------------- checks
    def check_writable(self) -> None:
        """Create the directory and write/delete a probe file; a clear error when that fails."""
        probe = self._join(f".aios-write-test-{_nonce()}")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            with self.fs.open(probe, "wb") as f:
                f.write(b"ok")
            self.fs.rm(probe)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint dir '{self.shown}' is not writable ({type(exc).__name__}: {exc})",
                "set checkpoint.dir to a writable path or URL",
            ) from None

    # ---------------------------------------------------------------- listing
    def _entries(self) -> list[str]:
        try:
            return [e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"cannot list checkpoint dir '{self.shown}' ({type(exc).__name__}: {exc})",
                "check the path and its permissions",
            ) from None

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint directory (complete or not), by step, then commit time."""
        out: list[CheckpointInfo] = []
        for name in self._entries():
            m = _NAME.match(name)
            if not m:
                continue
            path = self._join(name)
            try:
                meta = self._read_marker(path)
            except CheckpointError as exc:  # judged by latest(): only a newer one blocks resume
                out.append(CheckpointInfo(path, int(m.group(1)), False, {}, exc.one_line()))
                continue
            out.append(CheckpointInfo(path, int(m.group(1)), meta is not None, meta or {}))
        return sorted(out, key=lambda c: (c.step, c.time))

    def _read_json(self, path: str) -> bytes | None:
        try:
            with self.fs.open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _read_marker(self, path: str) -> dict[str, Any] | None:
        raw = self._read_json(f"{path}/{MARKER}")
        if raw is None:
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

    def _staging_lineage(self, path: str) -> str | None:
        """The lineage recorded in an incomplete checkpoint's staging file (None: not aios's)."""
        raw = self._read_json(f"{path}/{STAGING_FILE}")
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            return None
        return data.get("lineage") if isinstance(data, dict) else None

    def latest(
        self,
        warn: bool = True,
        lineage: str | None = None,
        say: Callable[[str], None] | None = None,
    ) -> CheckpointInfo | None:
        """The checkpoint to resume: with ``lineage``, that lineage's highest step; otherwise the
        most recently committed complete checkpoint. Incomplete checkpoints of a higher step
        and older damaged ones are skipped, each said in one ``aios:`` line through ``say``
        (the runtime passes its rank-0 print; default: standard error), never as a Python
        warning with aios's source path in front."""
        infos = self.list()
        complete = [i for i in infos if i.complete and (lineage is None or i.lineage == lineage)]
        if not complete:
            chosen = None
        elif lineage is not None:
            chosen = complete[-1]
        else:
            chosen = max(complete, key=lambda i: (i.time, i.step))
        for info in infos:  # a damaged marker newer than the choice: never a silent fallback
            if info.damaged and (chosen is None or info.step > chosen.step):
                raise CheckpointError(info.damaged)
        if warn:
            say = say or _say_stderr
            for info in infos:
                if info.damaged:
                    say(
                        f"aios: skipping older damaged checkpoint {self._shown(info.path)} "
                        f"(unreadable {MARKER})"
                    )
                elif not info.complete and (chosen is None or info.step > chosen.step):
                    say(
                        f"aios: skipping incomplete checkpoint {self._shown(info.path)} "
                        f"(interrupted save, no {MARKER})"
                    )
        return chosen

    def _corrupt(self, info: CheckpointInfo, what: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint '{self.display(info.path)}' is corrupt: {what}",
            f"delete {self.display(info.path)}, load an older checkpoint explicitly, or start "
            "fresh with checkpoint.resume=false",
        )

    def verify(self, info: CheckpointInfo, hash_files: bool = False, names: Any = None) -> None:
        """Check every file's size against the marker, and the digest of ``names`` (every file
        with ``hash_files``), streamed: a one-line "corrupt" error naming the file."""
        entries = info.meta.get("files", {})
        for name, want in entries.items():
            p = f"{info.path}/{name}"
            try:
                size = self.fs.size(p)
            except FileNotFoundError:
                size = None
            if size != want.get("size"):
                what = "is missing" if size is None else f"has {size} bytes"
                raise self._corrupt(info, f"{name} {what}, its marker says {want.get('size')}")
        for name in list(entries) if hash_files else names or []:
            self.check_digest(info, name)

    def check_digest(self, info: CheckpointInfo, name: str) -> None:
        """Hash one file of a checkpoint as it streams from the store; raise "corrupt" naming
        it when it differs from the digest its writer recorded (no digest recorded: sizes
        only, as in checkpoints of earlier versions)."""
        want = recorded_digest(info.meta.get("files", {}).get(name) or {})
        if want is None:
            return
        h = new_hash(want[0])
        try:
            with self.fs.open(f"{info.path}/{name}", "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        except (FileNotFoundError, IsADirectoryError):
            raise self._corrupt(info, f"{name} is missing") from None
        except OSError as exc:
            raise self._corrupt(info, f"{name} cannot be read ({os_cause(exc)})") from None
        if h.hexdigest() != want[1]:
            raise self._corrupt(info, f"{name} does not match the {want[0]} in its marker")

    # ---------------------------------------------------------------- writing files
    def open_write(self, path: str) -> Any:
        if self.local:
            return open(path, "wb")
        return self.fs.open(path, "wb")

    def fsync(self, f: Any) -> None:
        if self.local:
            f.flush()
            os.fsync(f.fileno())

    def write_file(self, staging: Staging, name: str, writer: Any) -> dict[str, Any]:
        """Write ``<staging>/<name>`` through ``writer(fileobj)``, durable; returns its entry for
        the marker (size and digest). Any rank may call it for its own files."""
        w: HashingWriter | None = None
        try:
            with self.open_write(f"{staging.path}/{name}") as f:
                w = HashingWriter(f)
                writer(w)
                self.fsync(f)
        except Exception as exc:
            if w is not None and w.error is not None and w.error is not exc:
                raise w.error from exc  # the OS's word, not torch's zip writer's
            raise
        entry = w.entry()
        staging.files[name] = entry
        return entry

    # ---------------------------------------------------------------- staging and commit
    def begin(self, step: int, target: str | None = None, replace: bool = False) -> Staging:
        """Start a save of ``step``: a new staging directory that belongs to this lineage. With
        ``target`` (a directory name in this store) the checkpoint ends up there instead of at
        ``ckpt-<step>``; it must not exist, unless ``replace``: then an aios checkpoint there
        is replaced when the new one is committed (see :meth:`_place`)."""
        self.check_lock()
        nonce = _nonce()
        name = ckpt_name(step)
        in_place = not self.local
        if target is not None:
            plain = self.fs.exists(self._join(target))
            if plain or (not self.local and self.follow(self._join(target)) is not None):
                where = self.display(self._join(target))
                if not replace:
                    raise CheckpointError(
                        f"'{where}' already exists",
                        "choose a new path, delete it, or replace it with save(path, replace=True)",
                    )
                if plain:
                    self._check_replaceable(self._join(target))
        if self.local:
            path = self._join(f".aios-partial-{name}-{self.lineage}-{nonce}")
        elif target is not None and replace:  # a new version; the pointer names it at commit
            path = self._join(f"{target}{VERSION_SEP}{nonce}")
        elif target is not None:
            path = self._join(target)
        else:
            path = self._join(name if not self.fs.exists(self._join(name)) else f"{name}-{nonce}")
        staging = Staging(step, path, self.lineage, nonce, in_place, target=target, replace=replace)
        try:
            self.fs.makedirs(path, exist_ok=True)
            with self.open_write(f"{path}/{STAGING_FILE}") as f:
                f.write(
                    json.dumps(
                        {
                            "lineage": self.lineage,
                            "step": step,
                            "pid": os.getpid(),
                            "time": time.time(),
                        }
                    ).encode()
                )
        except Exception as exc:
            self.abort(staging)
            raise self._save_error(step, exc) from exc
        return staging

    def _save_error(self, step: int, exc: BaseException) -> CheckpointError:
        return CheckpointError(
            f"saving checkpoint to '{self.display(self._join(ckpt_name(step)))}' failed ({os_cause(exc)})",
            "check that checkpoint.dir is writable and has free space",
        )

    def abort(self, staging: Staging) -> None:
        """Remove what a failed save wrote (only its own staging directory)."""
        with contextlib.suppress(Exception):
            if self.fs.exists(staging.path):
                self.fs.rm(staging.path, recursive=True)

    def commit(
        self,
        staging: Staging,
        meta: dict[str, Any] | None = None,
        files: dict[str, Any] | None = None,
    ) -> str:
        """Write the marker (last, after every file of every writer is durable), move the
        checkpoint into place, retire an older copy of the same step of this lineage, prune.
        Returns the checkpoint's path (URL on object stores)."""
        step = staging.step
        name = ckpt_name(step)
        final = self._join(name)
        marker = {
            "format": FORMAT,
            "step": step,
            "time": time.time(),
            "files": {**staging.files, **(files or {})},
            **(meta or {}),
            "lineage": self.lineage,
        }
        try:
            self.check_lock()  # a holder that lost its lock commits nothing
            if self.local:
                fsync_dir(staging.path)  # every writer's file names are durable before the marker
            with self.open_write(f"{staging.path}/{MARKER}") as f:
                f.write(json.dumps(marker, indent=1, sort_keys=True, default=str).encode())
                self.fsync(f)
        except Exception as exc:
            self.abort(staging)
            raise self._save_error(step, exc) from exc
        try:
            where = self._place(staging, final, name)
        except Exception as exc:
            if self.local:
                self.abort(staging)  # still there only when it was never moved into place
            raise self._save_error(step, exc) from exc
        self.prune()
        return self.display(where)

    def _ours(self, path: str) -> bool:
        try:
            meta = self._read_marker(path)
        except CheckpointError:
            return False
        if meta is not None:
            return meta.get("lineage") == self.lineage
        return self._staging_lineage(path) == self.lineage

    def _check_replaceable(self, path: str) -> None:
        """Only an aios checkpoint may be replaced: aios never deletes what it did not write."""
        if self._read_marker(path) is None:
            raise CheckpointError(
                f"'{self.display(path)}' exists and is not an aios checkpoint (no {MARKER})",
                "move it away or save under another name",
            )

    def follow(self, path: str) -> str | None:
        """Object stores: the committed version a replaceable named checkpoint's pointer
        (``<path>.aios-current``) names, or None (no pointer, or one naming anything else than
        a version of ``path``)."""
        raw = self._read_json(path.rstrip("/") + POINTER_SUFFIX)
        if raw is None:
            return None
        try:
            version = json.loads(raw).get("version")
        except (ValueError, AttributeError):
            return None
        parent, _, base = path.rstrip("/").rpartition("/")
        if not isinstance(version, str) or "/" in version:
            return None
        if not version.startswith(base + VERSION_SEP):
            return None
        return f"{parent}/{version}" if parent else version

    def _point(self, staging: Staging, where: str) -> str:
        """Object stores: make the pointer of ``where`` name the committed version, then delete
        what it replaced (the previous version, a copy saved there without ``replace``) and this
        lineage's versions no pointer names (a save stopped before its pointer was written)."""
        old = self.follow(where)
        version = staging.path.rstrip("/").rsplit("/", 1)[-1]
        pointer = {"version": version, "step": staging.step, "lineage": self.lineage}
        with self.open_write(where.rstrip("/") + POINTER_SUFFIX) as f:
            f.write(json.dumps(pointer).encode())
        doomed = []
        if old is not None and old != staging.path:
            doomed.append(old)
        with contextlib.suppress(CheckpointError):
            if self.fs.exists(where) and self._read_marker(where) is not None:
                doomed.append(where)
        base = where.rstrip("/").rsplit("/", 1)[-1]
        with contextlib.suppress(CheckpointError):
            for entry in self._entries():
                path = self._join(entry)
                if not entry.startswith(base + VERSION_SEP) or path in (staging.path, *doomed):
                    continue
                try:
                    meta = self._read_marker(path)
                except CheckpointError:
                    continue
                mine = (meta or {}).get("lineage") if meta else self._staging_lineage(path)
                if mine == self.lineage:
                    doomed.append(path)
        for path in doomed:
            self.retire(path)
        return where

    def _place(self, staging: Staging, final: str, name: str) -> str:
        if staging.target is not None:  # an explicit path: replaced only when asked to
            where = self._join(staging.target)
            if not self.local and staging.replace:
                return self._point(staging, where)
            if self.local:
                if not os.path.exists(where):
                    os.rename(staging.path, where)
                elif not staging.replace:
                    raise FileExistsError(f"'{where}' already exists")
                else:
                    self._check_replaceable(where)
                    swap_dirs(staging.path, where)  # the committed new copy takes the name at once
                    fsync_dir(self.root)
                    with contextlib.suppress(Exception):
                        self.fs.rm(staging.path, recursive=True)  # the old copy, now here
                    return where
                fsync_dir(self.root)
            return where
        if not self.local:
            if staging.path != final and self._ours(final):
                self.retire(final)  # the new copy is complete: now the old one may go
            return staging.path
        if not os.path.exists(final):
            os.rename(staging.path, final)
            fsync_dir(self.root)
            return final
        unique = self._join(f"{name}-{staging.nonce}")
        os.rename(staging.path, unique)  # complete and discoverable under its unique name
        fsync_dir(self.root)
        if not self._ours(final):
            return unique  # another run's checkpoint of the same step: never touched
        self.retire(final)
        with contextlib.suppress(OSError):
            os.rename(unique, final)
            fsync_dir(self.root)
            return final
        return unique

    def retire(self, path: str) -> None:
        """Delete one checkpoint so that no instant shows it corrupt: locally an atomic rename
        to a trash name first; on object stores the marker first."""
        if self.local:
            m = _NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
            step = int(m.group(1)) if m else 0
            trash = self._join(f".aios-trash-{ckpt_name(step)}-{self.lineage}-{_nonce()}")
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                return
            fsync_dir(self.root)
            with contextlib.suppress(Exception):
                self.fs.rm(trash, recursive=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(f"{path}/{MARKER}")
        with contextlib.suppress(Exception):
            self.fs.rm(path, recursive=True)

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any] | None = None) -> str:
        """Write ``state`` (torch-serialisable) as the checkpoint for ``step``; return its path."""
        staging = self.begin(step)
        try:
            self.write_file(staging, STATE_FILE, lambda f: torch_save(state, f))
        except Exception as exc:
            self.abort(staging)
            raise self._save_error(step, exc) from exc
        return self.commit(staging, meta)

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints of this lineage (one copy per step);
        remove this lineage's interrupted saves and temporary directories. Nothing else."""
        if self.keep is None:
            return
        try:
            infos = self.list()
        except CheckpointError:
            return
        ours = [i for i in infos if i.complete and i.lineage == self.lineage]
        by_step: dict[int, list[CheckpointInfo]] = {}
        for i in ours:
            by_step.setdefault(i.step, []).append(i)
        doomed: list[CheckpointInfo] = []
        for copies in by_step.values():
            copies.sort(key=lambda c: c.time)
            doomed += copies[:-1]  # older copies of a re-saved step
        steps = sorted(by_step)
        for s in steps[: max(0, len(steps) - self.keep)]:
            doomed.append(by_step[s][-1])
        newest = steps[-1] if steps else -1
        doomed += [
            i
            for i in infos
            if not i.complete
            and not i.damaged
            and i.step <= newest
            and self._staging_lineage(i.path) == self.lineage
        ]
        for info in doomed:
            self.retire(info.path)
        if self.local:
            with contextlib.suppress(Exception):
                for name in self._entries():
                    m = _TEMP.match(name)
                    if m and m.group(2) == self.lineage:
                        self.fs.rm(self._join(name), recursive=True)

    # ---------------------------------------------------------------- load
    def read_file(self, info: CheckpointInfo, name: str) -> bytes:
        entry = info.meta.get("files", {}).get(name)
        try:
            with self.fs.open(f"{info.path}/{name}", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        if data is None or entry is None:
            raise self._corrupt(info, f"{name} is missing")
        if len(data) != entry.get("size"):
            raise self._corrupt(
                info, f"{name} has {len(data)} bytes, its marker says {entry.get('size')}"
            )
        want = recorded_digest(entry)
        if want is not None:
            h = new_hash(want[0])
            h.update(data)
            if h.hexdigest() != want[1]:
                raise self._corrupt(info, f"{name} does not match the {want[0]} in its marker")
        return data

    def _load_local(self, info: CheckpointInfo, name: str, mmap: bool) -> Any:
        """``torch.load`` of a local checkpoint file that is read from the disk once: one
        sequential pass hashes the whole file (large reads; the file's pages stay in the page
        cache), the digest is checked against the marker, and only then does torch unpickle it,
        from the same open file (``/proc/self/fd``: a file renamed over the path meanwhile is
        never the one loaded). With ``mmap`` torch maps those cached pages (private,
        copy-on-write) instead of copying every tensor out of the cache into fresh memory."""
        import torch

        entry = info.meta.get("files", {}).get(name)
        path = f"{info.path}/{name}"
        if entry is None:
            raise self._corrupt(info, f"{name} is missing")
        want = recorded_digest(entry)
        h = new_hash(want[0]) if want is not None else None
        try:
            f = open(path, "rb", buffering=0)  # closed below, after torch.load
        except (FileNotFoundError, IsADirectoryError):
            raise self._corrupt(info, f"{name} is missing") from None
        except OSError as exc:
            raise self._corrupt(info, f"{name} cannot be read ({os_cause(exc)})") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size != entry.get("size"):
                raise self._corrupt(
                    info, f"{name} has {size} bytes, its marker says {entry.get('size')}"
                )
            if h is not None and want is not None:
                with contextlib.suppress(AttributeError, OSError):
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                buf = bytearray(min(CHUNK, max(size, 1)))
                view = memoryview(buf)
                got = 0
                try:
                    while n := f.readinto(buf):
                        h.update(view[:n])
                        got += n
                except OSError as exc:
                    raise self._corrupt(info, f"{name} cannot be read ({os_cause(exc)})") from None
                if got != size:
                    raise self._corrupt(info, f"{name} changed size while it was read")
                if h.hexdigest() != want[1]:
                    raise self._corrupt(info, f"{name} does not match the {want[0]} in its marker")
            source = f"/proc/self/fd/{f.fileno()}"
            if not os.path.exists(source):
                source = path
            if mmap:
                try:
                    return torch.load(source, map_location="cpu", weights_only=True, mmap=True)
                except Exception:  # noqa: BLE001 - a file system that cannot map: read it
                    pass
            return torch.load(source, map_location="cpu", weights_only=True)

    def load(self, info: CheckpointInfo, mmap: bool = True) -> dict[str, Any]:
        """The full state of ``info`` (``state.pt``), verified against the marker before it is
        unpickled; a mismatch is a one-line "corrupt" error and nothing is returned.

        :param mmap: locally, the tensors are backed by the file's pages (a private
            copy-on-write map: nothing is copied until written) rather than copied into
            memory of their own. Such a tensor keeps the file (its disk space) alive while it
            lives: clone what outlives the checkpoint (``FullStateFormat.load`` does for all
            but the model weights, which are copied into the model)."""
        import torch

        try:
            if self.local:
                return self._load_local(info, STATE_FILE, mmap)
            data = self.read_file(info, STATE_FILE)
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint '{self.display(info.path)}' cannot be loaded "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                f"delete {self.display(info.path)} or start fresh with checkpoint.resume=false",
            ) from None

    def resolve(self, path_or_step: str | int | None) -> CheckpointInfo:
        """A checkpoint by step number, by directory/URL, or the newest complete one."""
        if path_or_step is None:
            info = self.latest()
            if info is None:
                raise CheckpointError(
                    f"no complete checkpoint in '{self.shown}'",
                    "train first, or point checkpoint.dir at a directory holding checkpoints",
                )
            return info
        if isinstance(path_or_step, int):
            copies = [i for i in self.list() if i.complete and i.step == path_or_step]
            mine = [i for i in copies if i.lineage == self.lineage]
            if mine or copies:
                return max(mine or copies, key=lambda i: i.time)
            path = self._join(ckpt_name(path_or_step))
        else:
            path = path_or_step
            if "://" not in path and not os.path.isabs(path) and not path.startswith(self.root):
                path = self._join(path) if not os.path.exists(path) else os.path.abspath(path)
            elif "://" in path:
                path = filesystem(path)[1]
        if not self.local:  # a replaceable named checkpoint: the version its pointer names
            path = self.follow(path) or path
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
    store = CheckpointStore(parent or ".", keep=None)
    return store, store.resolve(path)
