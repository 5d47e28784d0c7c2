"""The one-writer lock of a checkpoint directory (``<dir>/.aios-lock``): taken atomically
(locally under an exclusive ``flock`` and created with ``link``; on S3/GCS with conditional
writes), kept alive by heartbeats, judged stale by age or a dead local process, fenced when a
holder could not refresh it, released only by its holder's token. See the rules in
:mod:`aios.checkpoint.store`; :class:`aios.checkpoint.store.CheckpointStore` is a
:class:`WriterLock`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import uuid
from typing import Any

from aios.errors import CheckpointError, os_cause

__all__ = [
    "LOCK_FENCE_S",
    "LOCK_FILE",
    "LOCK_GUARD",
    "LOCK_HEARTBEAT_S",
    "LOCK_STALE_S",
    "WriterLock",
]

LOCK_FILE = ".aios-lock"
#: seconds without a heartbeat after which a lock is stale
LOCK_STALE_S = 120.0
#: seconds between heartbeats of a held lock
LOCK_HEARTBEAT_S = 15.0
#: a holder whose heartbeat could not be refreshed for this long writes no more checkpoints:
#: shorter than :data:`LOCK_STALE_S`, so it has stopped before anyone may take the lock over
LOCK_FENCE_S = 60.0
#: flock'ed around every read-decide-write of the lock where a directory cannot be (NFS)
LOCK_GUARD = ".aios-lock.guard"
_LOCK_TEMP = re.compile(r"^\.aios-lock\.([0-9a-f]{8})\.(?:tmp|stale)$")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # pragma: no cover
        return False
    try:  # a zombie (killed, not yet reaped) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _nonce() -> str:
    return uuid.uuid4().hex[:8]


def fsync_dir(path: str) -> None:
    """Make renames/creations inside a local directory durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


class WriterLock:
    """The writer-lock half of a checkpoint store: the methods below run on the store's
    filesystem (``fs``, ``local``, ``_join``), clock and lock state."""

    fs: Any
    local: bool
    root: str
    clock: Any
    lost: str | None
    _lock_token: str | None
    _refreshed: float
    _refresh_error: str | None

    def _join(self, name: str) -> str:  # pragma: no cover - the store's
        raise NotImplementedError

    def display(self, path: str) -> str:  # pragma: no cover - the store's
        raise NotImplementedError

    @property
    def shown(self) -> str:  # pragma: no cover - the store's
        raise NotImplementedError

    # ---------------------------------------------------------------- the writer lock
    def _lock_path(self) -> str:
        return self._join(LOCK_FILE)

    @contextlib.contextmanager
    def _guard(self) -> Any:
        """Locally: an exclusive ``flock`` around every read-decide-write of the lock (released
        by the kernel when its holder dies). On the checkpoint directory itself; where the file
        system refuses a lock on a directory (NFS maps ``flock`` to POSIX locks, which need a
        file open for writing) on :data:`LOCK_GUARD`, an empty file that then stays in the
        directory (deleting a lock file while others wait on it would split them). Object
        stores: nothing (their writes are conditional)."""
        if not self.local:
            yield
            return
        import fcntl

        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                os.close(fd)
                fd = os.open(self._join(LOCK_GUARD), os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _lock_raw(self) -> tuple[bytes | None, Any]:
        """The lock's bytes and its version (local: mtime; GCS: generation; S3: ETag)."""
        path = self._lock_path()
        if self.local:
            try:
                with open(path, "rb") as f:
                    return f.read(), os.fstat(f.fileno()).st_mtime
            except FileNotFoundError:
                return None, None
        for _ in range(5):
            try:
                before = self.fs.info(path)
                raw = self.fs.cat_file(path)
                after = self.fs.info(path)
            except FileNotFoundError:
                return None, None
            if _version(before) == _version(after):
                return raw, _version(after)
        return raw, _version(after)

    @staticmethod
    def _parse_lock(raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def read_lock(self) -> dict[str, Any] | None:
        """The lock's record (``{}``: present but empty or unreadable; None: no lock)."""
        return self._parse_lock(self._lock_raw()[0])

    def lock_is_stale(
        self, held: dict[str, Any], stale_after: float = LOCK_STALE_S, mtime: Any = None
    ) -> bool:
        """A lock is stale when its heartbeat is older than ``stale_after`` or, on this host,
        its process is gone. An empty or unreadable lock (``{}``) is held by an unknown run
        until its file is ``stale_after`` old by modification time (``mtime``; unknown: held):
        it is never claimed while a writer may be about to fill it."""
        now = self.clock()
        if not held:
            return isinstance(mtime, (int, float)) and now - mtime > stale_after
        try:
            age = now - float(held.get("heartbeat", 0))
        except (TypeError, ValueError):
            age = float("inf")
        if age > stale_after:
            return True
        if held.get("host") == socket.gethostname():
            pid = int(held.get("pid", 0) or 0)
            return pid == os.getpid() or not _pid_alive(pid)  # one runtime per process
        return False

    def _lock_record(self, owner: dict[str, Any]) -> bytes:
        data = {
            **owner,
            "token": self._lock_token,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "heartbeat": self.clock(),
        }
        return json.dumps(data, sort_keys=True).encode()

    def acquire_lock(self, owner: dict[str, Any], stale_after: float = LOCK_STALE_S) -> None:
        """Become the only writer of this directory, or raise a one-line :class:`CheckpointError`
        naming the run that holds it. Atomic: locally the decision and the write happen under
        the guard ``flock`` and the lock is created with ``link`` (fails when it exists; the
        content is complete before it appears); on object stores the write is conditional
        (S3 ``If-None-Match``/``If-Match``, GCS ``ifGenerationMatch``) on the version that was
        judged stale, so of several contenders exactly one wins."""
        self._lock_token = uuid.uuid4().hex
        self._owner = owner
        self.lost = None
        for _attempt in range(5):
            with self._guard():
                raw, version = self._lock_raw()
                held = self._parse_lock(raw)
                if held is not None:
                    mtime = version if self.local else _mtime(self.fs, self._lock_path())
                    if not self.lock_is_stale(held, stale_after, mtime):
                        self._lock_token = None
                        raise self._held_error(held)
                if self._put_lock(
                    self._lock_record(owner), expect=version, replace=raw is not None
                ):
                    self._refreshed = self.clock()
                    return
        self._lock_token = None
        raise CheckpointError(
            f"cannot take the lock of checkpoint dir '{self.shown}' (it keeps changing)",
            "make sure no other run uses this checkpoint.dir",
        )

    def _put_lock(self, data: bytes, expect: Any, replace: bool) -> bool:
        """Write the lock if it is still what was read (``expect``: its version; ``replace``:
        whether there was one). False when another writer got there first."""
        path = self._lock_path()
        if self.local:  # under the guard: what was read is still there
            tmp = self._join(f".aios-lock.{_nonce()}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if replace:
                    os.replace(tmp, path)  # readers see the old lock or the new one, never none
                else:
                    try:
                        os.link(tmp, path)  # exclusive: fails when a lock exists
                    except FileExistsError:
                        return False
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            fsync_dir(self.root)
            return True
        return _conditional_put(self.fs, path, data, expect if replace else None)

    def _held_error(self, held: dict[str, Any]) -> CheckpointError:
        if not held:
            return CheckpointError(
                f"checkpoint dir '{self.shown}' is locked by an unknown writer (its lock file is "
                f"empty or unreadable; it counts as stale after {LOCK_STALE_S:.0f}s unchanged)",
                "wait, set another checkpoint.dir, or delete "
                f"{self.display(self._lock_path())} if no run uses this directory",
            )
        try:
            age = f"{self.clock() - float(held.get('heartbeat', 0)):.0f}s ago"
        except (TypeError, ValueError):
            age = "unknown"
        who = f"run {held.get('run_id', '?')} (pid {held.get('pid', '?')} on {held.get('host', '?')}, heartbeat {age})"
        return CheckpointError(
            f"checkpoint dir '{self.shown}' is in use by {who}",
            "wait for that run to end, set another checkpoint.dir, or delete "
            f"{self.display(self._lock_path())} if that run is gone",
        )

    def heartbeat(self) -> bool:
        """Refresh the lock's heartbeat (a conditional write: never over another run's lock).
        False once the lock is lost: taken over, or not refreshed for :data:`LOCK_FENCE_S`
        (then :attr:`lost` says why, and this store writes no checkpoint any more). A refresh
        that fails for a while (disk full, store unreachable) is retried by the caller."""
        if self._lock_token is None or self.lost:
            return False
        if self.clock() - self._refreshed > LOCK_FENCE_S:
            return self._fence()
        try:
            with self._guard():
                raw, version = self._lock_raw()
                held = self._parse_lock(raw)
                if not held or held.get("token") != self._lock_token:
                    self.lost = (
                        f"another run took over the lock of checkpoint dir '{self.shown}'"
                        f" ({LOCK_FILE} now holds {'run ' + str(held.get('run_id')) if held else 'no run'})"
                    )
                    return False
                if not self._put_lock(
                    self._lock_record(getattr(self, "_owner", {})), expect=version, replace=True
                ):
                    self.lost = f"another run took over the lock of checkpoint dir '{self.shown}'"
                    return False
        except Exception as exc:  # noqa: BLE001 - the fence above decides when it is too long
            self._refresh_error = os_cause(exc)
            return self.clock() - self._refreshed <= LOCK_FENCE_S or self._fence()
        self._refreshed = self.clock()
        self._refresh_error = None
        return True

    def _fence(self) -> bool:
        why = self._refresh_error or "no refresh"
        self.lost = (
            f"the lock of checkpoint dir '{self.shown}' could not be refreshed for "
            f"{self.clock() - self._refreshed:.0f}s ({why}); another run may take it over after "
            f"{LOCK_STALE_S:.0f}s, so this run writes no more checkpoints there"
        )
        return False

    def check_lock(self) -> None:
        """Before any checkpoint write by a lock holder: refuse once the lock is lost or its
        heartbeat is older than :data:`LOCK_FENCE_S` (a holder stops writing before anyone may
        take the directory over)."""
        if self._lock_token is None:
            return
        if not self.lost and self.clock() - self._refreshed > LOCK_FENCE_S:
            self._fence()
        if self.lost:
            raise CheckpointError(
                self.lost, "the last committed checkpoint is kept; relaunch to resume from it"
            )

    def release_lock(self) -> None:
        """Remove the lock if it is still ours."""
        if self._lock_token is None:
            return
        with contextlib.suppress(Exception), self._guard():
            raw, version = self._lock_raw()
            held = self._parse_lock(raw)
            if held and held.get("token") == self._lock_token:
                if self.local:
                    os.unlink(self._lock_path())
                else:
                    _conditional_rm(self.fs, self._lock_path(), version)
        self._lock_token = None


def _version(info: dict[str, Any]) -> Any:
    """An object's version as its store reports it: GCS generation, S3 ETag."""
    for key in ("generation", "ETag", "etag"):
        if info.get(key) is not None:
            return info[key]
    return (info.get("size"), info.get("mtime") or info.get("LastModified") or info.get("created"))


def _mtime(fs: Any, path: str) -> float | None:
    with contextlib.suppress(Exception):
        m = fs.modified(path)
        return float(m.timestamp())
    return None


def _protocols(fs: Any) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def _conditional_put(fs: Any, path: str, data: bytes, expect: Any) -> bool:
    """Write ``data`` to ``path`` only if it does not exist (``expect`` None) or is still the
    version ``expect``; False when the store refused (another writer won). S3: ``PutObject``
    with ``If-None-Match: *`` / ``If-Match: <ETag>``
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); GCS: an
    upload with ``ifGenerationMatch`` (0: must not exist;
    https://cloud.google.com/storage/docs/request-preconditions). Other fsspec stores: an
    exclusive create (``xb``) where they have one, else a plain write (best effort)."""
    protos = _protocols(fs)
    if "s3" in protos or "s3a" in protos:
        bucket, key, _ = fs.split_path(path)
        cond = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": expect}
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **cond)
        except Exception as exc:
            if _precondition_failed(exc):
                return False
            raise
        fs.invalidate_cache(path)
        return True
    if "gs" in protos or "gcs" in protos:
        from urllib.parse import quote

        bucket, key, _ = fs.split_path(path)
        try:
            fs.call(
                "POST",
                f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
                uploadType="media",
                name=key,
                ifGenerationMatch=str(expect if expect is not None else 0),
                data=data,
                json_out=True,
            )
        except Exception as exc:
            if _precondition_failed(exc):
                return False
            raise
        fs.invalidate_cache(path)
        return True
    if expect is None:
        try:
            with fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):
            pass
    with fs.open(path, "wb") as f:
        f.write(data)
    return True


def _conditional_rm(fs: Any, path: str, version: Any) -> None:
    """Delete the lock only while it is ``version`` (GCS ``ifGenerationMatch``, S3
    ``If-Match`` on DeleteObject); elsewhere a plain delete."""
    protos = _protocols(fs)
    with contextlib.suppress(Exception):
        if "gs" in protos or "gcs" in protos:
            bucket, key, _ = fs.split_path(path)
            fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version))
        elif "s3" in protos:
            bucket, key, _ = fs.split_path(path)
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
        else:
            fs.rm(path)
        fs.invalidate_cache(path)


def _precondition_failed(exc: BaseException) -> bool:
    if isinstance(exc, FileExistsError):  # s3fs's translation of PreconditionFailed
        return True
    chain = [exc, exc.__cause__, exc.__context__]
    text = " ".join(f"{type(e).__name__} {e} {getattr(e, 'code', '')}" for e in chain if e)
    text = text.lower().replace("-", "")
    return "preconditionfailed" in text or "precondition" in text or " 412" in text
