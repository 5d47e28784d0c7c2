"""Cluster and job records in an embedded SQLite database under the aios home.

``$AIOS_HOME`` (default ``~/.aios``) holds ``state.db``. Several ``aios`` commands may run at
once (a managed-spot watcher updating a job while the user runs ``aios status`` and
``aios down``): the database is in WAL mode, every connection waits up to 30 s for a lock, and
every read-modify-write runs in a ``BEGIN IMMEDIATE`` transaction so two writers never lose each
other's update. Nothing secret is stored (SSH key *paths* only).

Failures are one line (:class:`StateError`, exit 2): a lock held by another process past the
timeout, a corrupt database or a corrupt row, ``AIOS_HOME`` that is not a writable directory. A
database that cannot be written (read-only file, directory or filesystem) is opened read-only:
commands that only read (``aios status``, ``aios logs``) work, writes fail with one line.

Tables: ``clusters`` (one row per cluster name), ``jobs`` (runs on a cluster, with restart
counts and checkpoint dir), ``events`` (history: created, preempted, recovered, repaired ...;
``aios status`` shows each recovery from here).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from aios.errors import AiosError


class StateError(AiosError):
    """The aios state database or home directory cannot be used."""


class _BadRow(Exception):
    """A row whose JSON column does not parse (turned into a :class:`StateError` naming the db)."""


SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY,
    cloud TEXT NOT NULL,
    zone TEXT,
    accelerator TEXT NOT NULL,
    spot INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    hosts TEXT NOT NULL DEFAULT '[]',
    request TEXT NOT NULL DEFAULT '{}',
    ssh_user TEXT,
    ssh_key TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster TEXT NOT NULL,
    state TEXT NOT NULL,
    command TEXT NOT NULL,
    backend TEXT,
    managed INTEGER NOT NULL DEFAULT 0,
    max_restarts INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    checkpoint_dir TEXT,
    exit_codes TEXT,
    watcher_pid INTEGER,
    spec TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster TEXT NOT NULL,
    job_id INTEGER,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_cluster ON jobs(cluster);
CREATE INDEX IF NOT EXISTS events_cluster ON events(cluster);
"""

# Job states
JOB_PENDING = "PENDING"
JOB_SETTING_UP = "SETTING_UP"
JOB_RUNNING = "RUNNING"
JOB_RECOVERING = "RECOVERING"
JOB_SUCCEEDED = "SUCCEEDED"
JOB_FAILED = "FAILED"
JOB_CANCELLED = "CANCELLED"
JOB_FINAL = (JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED)


def _mkdir(d: Path, what: str) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StateError(
            f"{what} {d} is not a directory (a file is in the way)",
            "set AIOS_HOME to a directory, or move that file",
        ) from None
    except OSError as exc:
        raise StateError(
            f"cannot create {what} {d}: {exc.strerror or exc}",
            "set AIOS_HOME to a writable directory",
        ) from None


def aios_home() -> Path:
    """``$AIOS_HOME`` or ``~/.aios`` (created on first use, mode 0700)."""
    env = os.environ.get("AIOS_HOME")
    home = Path(env or Path.home() / ".aios").expanduser()
    _mkdir(home, "the aios home (AIOS_HOME)" if env else "the aios home")
    with contextlib.suppress(OSError):
        os.chmod(home, 0o700)
    return home


def cluster_dir(name: str) -> Path:
    """Per-cluster files (known_hosts, code tarballs, fetched logs)."""
    d = aios_home() / "clusters" / name
    _mkdir(d, "the cluster directory")
    return d


@dataclass
class ClusterRecord:
    name: str
    cloud: str
    zone: str | None
    accelerator: str
    spot: bool
    state: str
    hosts: list[dict[str, Any]] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    ssh_user: str | None = None
    ssh_key: str | None = None
    created: float = 0.0
    updated: float = 0.0


@dataclass
class JobRecord:
    id: int
    cluster: str
    state: str
    command: str
    backend: str | None
    managed: bool
    max_restarts: int
    restarts: int
    checkpoint_dir: str | None
    exit_codes: list[int] | None
    watcher_pid: int | None
    spec: dict[str, Any]
    created: float
    updated: float


@dataclass
class EventRecord:
    id: int
    cluster: str
    job_id: int | None
    time: float
    kind: str
    message: str


class Store:
    """The state database. Cheap to open; open one per command (or per thread)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> None:
        self.path = Path(path) if path else aios_home() / "state.db"
        self.timeout = timeout
        self.readonly = False
        self.db: sqlite3.Connection | None = None
        _mkdir(self.path.parent, "the directory of the aios state database")
        try:
            self._open()
        except sqlite3.Error as exc:
            if self.db is not None:
                self.db.close()
            if _is_readonly(exc) and self.path.is_file():
                self._open_readonly(exc)
            else:
                raise self._error(exc) from None

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(
            target, timeout=self.timeout, isolation_level=None, check_same_thread=False, uri=uri
        )
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        return db

    def _conn(self) -> sqlite3.Connection:
        """The open connection (every method runs after ``__init__`` opened it)."""
        assert self.db is not None, "the store is not open"
        return self.db

    def _open(self) -> None:
        self.db = self._connect(str(self.path))
        self._retry_locked(lambda: self._conn().execute("PRAGMA journal_mode = WAL"))
        self._conn().execute("PRAGMA synchronous = NORMAL")
        self._conn().execute("PRAGMA foreign_keys = ON")
        self._init_schema()

    def _open_readonly(self, cause: sqlite3.Error) -> None:
        """The database cannot be written here: open it for reading (``aios status`` works)."""
        base = "file:" + quote(str(self.path.resolve()))
        last: sqlite3.Error = cause
        for query in ("?mode=ro", "?mode=ro&immutable=1"):  # immutable: a WAL db in a read-only dir
            try:
                db = self._connect(base + query, uri=True)
                db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            except sqlite3.Error as exc:
                last = exc
                continue
            self.db, self.readonly = db, True
            return
        raise self._error(last) from None

    def _retry_locked(self, fn: Callable[[], Any], attempts: int = 3) -> Any:
        """``fn()`` again after a short pause when the lock is still held after the busy timeout;
        then a :class:`StateError` naming the lock."""
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or i == attempts - 1:
                    raise
                time.sleep(0.05 * (i + 1))
        return None  # pragma: no cover

    def _error(self, exc: BaseException) -> StateError:
        """One line for a database failure, with what to do about it."""
        text = str(exc)
        if isinstance(exc, _BadRow):
            return StateError(
                f"the aios state database {self.path} has a corrupt record: {text}",
                f"repair or delete that row (sqlite3 {self.path}), or move the file aside",
            )
        if _is_locked(exc):
            return StateError(
                f"the aios state database {self.path} is locked by another aios process "
                f"(waited {self.timeout:g}s)",
                "retry when that command has finished, or stop the process that holds it",
            )
        if _is_readonly(exc):
            return StateError(
                f"the aios state database {self.path} is read-only: this command needs to write it",
                f"make {self.path} and its directory writable, or set AIOS_HOME to a writable directory",
            )
        if any(
            w in text
            for w in ("not a database", "malformed", "corrupt", "no such table", "no such column")
        ):
            return StateError(
                f"the aios state database {self.path} is corrupt ({text})",
                f"move it aside (mv {self.path} {self.path}.bad) and aios starts a new one; "
                "then check your clouds for clusters it recorded",
            )
        return StateError(
            f"the aios state database {self.path} failed: {text}",
            "check that AIOS_HOME is a writable local directory",
        )

    def _init_schema(self) -> None:
        try:  # an existing database: nothing to create (and no write lock needed to open it)
            row = (
                self._conn()
                .execute("SELECT value FROM meta WHERE key = 'schema_version'")
                .fetchone()
            )
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            row = None
        if row is not None:
            return
        with self._transaction() as db:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        assert self.db is not None
        self._retry_locked(lambda: self._conn().execute("BEGIN IMMEDIATE"))
        try:
            yield self.db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._conn().execute("ROLLBACK")
            raise
        else:
            self._conn().execute("COMMIT")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``: takes the write lock up front so a read-modify-write
        is atomic against other processes; rolls back on error. Database failures are one-line
        :class:`StateError` errors."""
        if self.readonly:
            raise StateError(
                f"the aios state database {self.path} is read-only: this command needs to write it",
                f"make {self.path} and its directory writable, or set AIOS_HOME to a writable directory",
            )
        try:
            with self._transaction() as db:
                yield db
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ clusters
    @staticmethod
    def _cluster(row: sqlite3.Row) -> ClusterRecord:
        return ClusterRecord(
            name=row["name"],
            cloud=row["cloud"],
            zone=row["zone"],
            accelerator=row["accelerator"],
            spot=bool(row["spot"]),
            state=row["state"],
            hosts=_loads(row, "hosts", "cluster", "name"),
            request=_loads(row, "request", "cluster", "name"),
            ssh_user=row["ssh_user"],
            ssh_key=row["ssh_key"],
            created=row["created"],
            updated=row["updated"],
        )

    def claim_cluster(self, rec: ClusterRecord) -> bool:
        """Insert a new cluster record; ``False`` when the name is already taken (atomic: two
        concurrent launches of one name cannot both succeed)."""
        now = time.time()
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM clusters WHERE name = ?", (rec.name,)).fetchone():
                return False
            db.execute(
                "INSERT INTO clusters(name, cloud, zone, accelerator, spot, state, hosts, "
                "request, ssh_user, ssh_key, created, updated)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rec.name,
                    rec.cloud,
                    rec.zone,
                    rec.accelerator,
                    int(rec.spot),
                    rec.state,
                    json.dumps(rec.hosts),
                    json.dumps(rec.request),
                    rec.ssh_user,
                    rec.ssh_key,
                    now,
                    now,
                ),
            )
            db.execute(
                "INSERT INTO events(cluster, job_id, time, kind, message) VALUES (?,?,?,?,?)",
                (rec.name, None, now, "claimed", f"{rec.cloud} {rec.accelerator}"),
            )
        return True

    def get_cluster(self, name: str) -> ClusterRecord | None:
        row = self._conn().execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return self._cluster(row) if row else None

    def clusters(self) -> list[ClusterRecord]:
        return [
            self._cluster(r)
            for r in self._conn().execute("SELECT * FROM clusters ORDER BY created")
        ]

    def _update_row(self, table: str, key: str, value: Any, fields: dict[str, Any]) -> None:
        """``UPDATE table SET fields..., updated = now WHERE key = value`` (values encoded)."""
        if not fields:
            return
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.transaction() as db:
            db.execute(
                f"UPDATE {table} SET {cols}, updated = ? WHERE {key} = ?",
                (*fields.values(), time.time(), value),
            )

    def update_cluster(self, name: str, **fields: Any) -> None:
        for k in ("hosts", "request"):
            if k in fields:
                fields[k] = json.dumps(fields[k])
        if "spot" in fields:
            fields["spot"] = int(fields["spot"])
        self._update_row("clusters", "name", name, fields)

    def delete_cluster(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))
            db.execute(
                "INSERT INTO events(cluster, job_id, time, kind, message) VALUES (?,?,?,?,?)",
                (name, None, time.time(), "deleted", "cluster record removed"),
            )

    # ------------------------------------------------------------------ jobs
    @staticmethod
    def _job(row: sqlite3.Row) -> JobRecord:
        return JobRecord(
            id=row["id"],
            cluster=row["cluster"],
            state=row["state"],
            command=row["command"],
            backend=row["backend"],
            managed=bool(row["managed"]),
            max_restarts=row["max_restarts"],
            restarts=row["restarts"],
            checkpoint_dir=row["checkpoint_dir"],
            exit_codes=_loads(row, "exit_codes", "job", "id") if row["exit_codes"] else None,
            watcher_pid=row["watcher_pid"],
            spec=_loads(row, "spec", "job", "id"),
            created=row["created"],
            updated=row["updated"],
        )

    def add_job(
        self,
        cluster: str,
        command: str,
        backend: str | None = None,
        managed: bool = False,
        max_restarts: int = 0,
        checkpoint_dir: str | None = None,
        spec: dict[str, Any] | None = None,
    ) -> int:
        now = time.time()
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO jobs(cluster, state, command, backend, managed, max_restarts, "
                "checkpoint_dir, spec, created, updated)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    cluster,
                    JOB_PENDING,
                    command,
                    backend,
                    int(managed),
                    max_restarts,
                    checkpoint_dir,
                    json.dumps(spec or {}),
                    now,
                    now,
                ),
            )
            assert cur.lastrowid is not None
            return int(cur.lastrowid)

    def get_job(self, job_id: int) -> JobRecord | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._job(row) if row else None

    def jobs(self, cluster: str | None = None) -> list[JobRecord]:
        if cluster:
            rows = self._conn().execute(
                "SELECT * FROM jobs WHERE cluster = ? ORDER BY id", (cluster,)
            )
        else:
            rows = self._conn().execute("SELECT * FROM jobs ORDER BY id")
        return [self._job(r) for r in rows]

    def latest_job(self, cluster: str) -> JobRecord | None:
        row = (
            self._conn()
            .execute("SELECT * FROM jobs WHERE cluster = ? ORDER BY id DESC LIMIT 1", (cluster,))
            .fetchone()
        )
        return self._job(row) if row else None

    def update_job(self, job_id: int, **fields: Any) -> None:
        for k in ("exit_codes", "spec"):
            if fields.get(k) is not None:
                fields[k] = json.dumps(fields[k])
        if "managed" in fields:
            fields["managed"] = int(fields["managed"])
        self._update_row("jobs", "id", job_id, fields)

    def bump_restarts(self, job_id: int) -> int:
        """Atomically increment a job's restart count; returns the new count."""
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET restarts = restarts + 1, updated = ? WHERE id = ?",
                (time.time(), job_id),
            )
            return int(
                db.execute("SELECT restarts FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            )

    # ------------------------------------------------------------------ events
    def event(self, cluster: str, kind: str, message: str, job_id: int | None = None) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO events(cluster, job_id, time, kind, message) VALUES (?,?,?,?,?)",
                (cluster, job_id, time.time(), kind, message),
            )

    def events(self, cluster: str | None = None, kind: str | None = None) -> list[EventRecord]:
        q, args = "SELECT * FROM events", []
        conds = []
        if cluster:
            conds.append("cluster = ?")
            args.append(cluster)
        if kind:
            conds.append("kind = ?")
            args.append(kind)
        if conds:
            q += " WHERE " + " AND ".join(conds)
        q += " ORDER BY id"
        return [
            EventRecord(r["id"], r["cluster"], r["job_id"], r["time"], r["kind"], r["message"])
            for r in self._conn().execute(q, args)
        ]


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


def _is_readonly(exc: BaseException) -> bool:
    t = str(exc)
    return isinstance(exc, sqlite3.Error) and (
        "readonly" in t or "read-only" in t or "unable to open" in t
    )


def _loads(row: sqlite3.Row, col: str, kind: str, key: str) -> Any:
    try:
        return json.loads(row[col])
    except (TypeError, ValueError) as exc:
        raise _BadRow(f"{kind} {row[key]!r}: column {col} is not valid JSON ({exc})") from None


_F = TypeVar("_F", bound=Callable[..., Any])


def _guard(fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except (sqlite3.Error, _BadRow) as exc:
            raise self._error(exc) from None

    return wrapper  # type: ignore[return-value]


for _name in (
    "claim_cluster",
    "get_cluster",
    "clusters",
    "update_cluster",
    "delete_cluster",
    "add_job",
    "get_job",
    "jobs",
    "latest_job",
    "update_job",
    "bump_restarts",
    "event",
    "events",
):
    setattr(Store, _name, _guard(getattr(Store, _name)))
