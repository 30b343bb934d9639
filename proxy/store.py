"""Persistence of engine state and settings behind one small interface.

What it promises: docs/resilience.md#persistence-and-restarts.

`StateStore` is what the layers see; `SqliteStore` is the real one and `MemoryStore` serves tests
and `--demo`. A shared backend (Redis, for several replicas) would be a third implementation.

Two write paths, because they have different promises:

- Engine transitions (`save_breakers`, `save_connections`, `save_lockouts`, `save_pins`,
  `set_meta`) are write-behind. The request path only drops the record into a dict keyed like
  the table (so 1,000 updates of one breaker are one row write) and returns in microseconds.
  One writer thread commits everything pending as one transaction at most every 200 ms, so a
  transition is on disk well within a second, and a crash loses at most the last batch.
- `save_settings` is synchronous and durable before it returns: the API and the card only
  acknowledge a change that a restart would keep.

Crash safety comes from SQLite itself: WAL plus one transaction per batch, so after `kill -9` the
database holds exactly the last committed batch. Blocking calls (`load`, `save_settings`, `flush`,
`close`) belong at startup / shutdown or in `asyncio.to_thread`, never on the event loop.

Long on purpose (about 800 lines): the interface and both implementations, most of it the SQLite
store's one mechanism (the write-behind batch, its writer thread, the merge-back of a failed batch
and the failure log that keeps one failure from flooding the log). A shared backend is being added
beside it (issue #17); splitting the implementations into a package belongs with that change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from proxy import untrusted
from proxy.resilience.errors import OmniRouteError

__all__ = [
    "SCHEMA_VERSION",
    "BadRecord",
    "MemoryStore",
    "SqliteStore",
    "StateStore",
    "StoreError",
    "StoredState",
]

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Stored in `PRAGMA user_version`; a database from a newer version is refused, not rewritten."""

_BATCH_INTERVAL_S = 0.2
_RETRY_DELAY_S = 1.0
_REPEAT_LOG_S = 60.0
"""A write failure that persists is logged again at most this often (with how many retries failed)."""
_CLOSE_JOIN_TIMEOUT_S = 10.0

_LockoutKey = tuple[str, str, str]
_K = TypeVar("_K")
_V = TypeVar("_V")


class StoreError(OmniRouteError):
    """The state database cannot be opened, read or written."""

    code = "state_store_error"


class BadRecord(StoreError):
    """One stored row that cannot be used: the message names the file (once known), table and row."""

    def __init__(self, table: str, row: str, reason: str, path: str | None = None) -> None:
        self.table = table
        self.row = row
        self.reason = reason
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(
            f"{where}bad record in table {table}, row {row}: {reason}"
            " (delete that row, or move the file away to start from empty state)"
        )

    def at(self, path: str | os.PathLike[str]) -> BadRecord:
        """The same error, naming the file it was read from."""
        return BadRecord(self.table, self.row, self.reason, os.fspath(path))


@dataclass
class StoredState:
    """Everything `load()` returns: the raw records, for each layer to restore from."""

    breakers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """provider -> CircuitBreaker.to_record()"""
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    """connection id -> ConnectionHealth.to_record()"""
    lockouts: list[dict[str, Any]] = field(default_factory=list)
    """LockoutEntry.to_record() each (keys provider, connection_id, model, ...)"""
    settings: dict[str, Any] | None = None
    """The settings document, None if never saved."""
    pins: dict[str, tuple[str, float]] = field(default_factory=dict)
    """session key -> (connection id, expires_at epoch ms)"""
    meta: dict[str, str] = field(default_factory=dict)
    """Free key/values (e.g. credential fingerprints per connection)."""


class StateStore(Protocol):
    def load(self) -> StoredState:
        """Everything stored. Blocking: call at startup (or via asyncio.to_thread)."""
        ...

    def save_breakers(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Upsert provider -> record. Write-behind: returns at once."""
        ...

    def save_connections(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Upsert connection id -> record. Write-behind: returns at once."""
        ...

    def save_lockouts(
        self, upserts: Sequence[Mapping[str, Any]], deletes: Sequence[tuple[str, str, str]]
    ) -> None:
        """Upsert records (keyed by their provider, connection_id, model), then delete (provider,
        connection_id, model) triples; a triple in both is deleted. Write-behind: returns at once."""
        ...

    def save_pins(self, upserts: Mapping[str, tuple[str, float]], deletes: Sequence[str]) -> None:
        """Upsert session key -> (connection id, expires_at), then delete keys. Write-behind."""
        ...

    def set_meta(self, key: str, value: str) -> None:
        """Upsert one free key/value. Write-behind."""
        ...

    def save_settings(self, document: Mapping[str, Any]) -> None:
        """Replace the settings document; durable before it returns. Blocking: use asyncio.to_thread."""
        ...

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything queued so far is committed; False if that did not happen in time,
        or a write failed meanwhile (then `write_problem` says why)."""
        ...

    @property
    def write_problem(self) -> str | None:
        """Why the last write failed, in words; None while writes succeed."""
        ...

    def purge(self, finds: Callable[[str], bool]) -> bool:
        """After what is queued is committed: if any text the store holds, in live rows or left over
        from rows since overwritten, is something `finds`, rebuild the storage from the live rows
        alone. True if it did. Blocking: call at startup."""
        ...

    def close(self) -> None:
        """Flush and close; idempotent. Later write-behind saves are dropped."""
        ...


def _lockout_key(record: Mapping[str, Any]) -> _LockoutKey:
    try:
        return (record["provider"], record["connection_id"], record["model"])
    except KeyError as exc:
        raise ValueError(
            f"a lockout record needs provider, connection_id and model (missing {exc})"
        ) from None


# ---------------------------------------------------------------------------------------------


class MemoryStore:
    """The same protocol over dicts: nothing survives the process. For tests and `--demo`.

    Records go through JSON on the way in, exactly as in SQLite, so a record that would not
    survive a real restart (a tuple, a non-string key, an object) fails here too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._breakers: dict[str, str] = {}
        self._connections: dict[str, str] = {}
        self._lockouts: dict[_LockoutKey, str] = {}
        self._settings: str | None = None
        self._pins: dict[str, tuple[str, float]] = {}
        self._meta: dict[str, str] = {}

    def load(self) -> StoredState:
        with self._lock:
            return StoredState(
                breakers={k: json.loads(v) for k, v in self._breakers.items()},
                connections={k: json.loads(v) for k, v in self._connections.items()},
                lockouts=[json.loads(self._lockouts[k]) for k in sorted(self._lockouts)],
                settings=None if self._settings is None else json.loads(self._settings),
                pins=dict(self._pins),
                meta=dict(self._meta),
            )

    def save_breakers(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        rows = {key: _dumps(record) for key, record in records.items()}
        with self._lock:
            if not self._closed:
                self._breakers.update(rows)

    def save_connections(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        rows = {key: _dumps(record) for key, record in records.items()}
        with self._lock:
            if not self._closed:
                self._connections.update(rows)

    def save_lockouts(
        self, upserts: Sequence[Mapping[str, Any]], deletes: Sequence[tuple[str, str, str]]
    ) -> None:
        rows = {_lockout_key(record): _dumps(record) for record in upserts}
        with self._lock:
            if self._closed:
                return
            self._lockouts.update(rows)
            for provider, connection_id, model in deletes:
                self._lockouts.pop((provider, connection_id, model), None)

    def save_pins(self, upserts: Mapping[str, tuple[str, float]], deletes: Sequence[str]) -> None:
        with self._lock:
            if self._closed:
                return
            for key, (connection_id, expires_at) in upserts.items():
                self._pins[key] = (connection_id, float(expires_at))
            for key in deletes:
                self._pins.pop(key, None)

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            if not self._closed:
                self._meta[key] = value

    def save_settings(self, document: Mapping[str, Any]) -> None:
        text = _dumps(document)
        with self._lock:
            if self._closed:
                raise StoreError("state store is closed")
            self._settings = text

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    @property
    def write_problem(self) -> str | None:
        return None

    def purge(self, finds: Callable[[str], bool]) -> bool:
        return False  # nothing is left over: an overwritten row is gone with its string

    def close(self) -> None:
        with self._lock:
            self._closed = True


# ---------------------------------------------------------------------------------------------


_SCHEMA_SQL = """
CREATE TABLE breakers (provider TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE connections (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE lockouts (
    provider TEXT NOT NULL,
    connection_id TEXT NOT NULL,
    model TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (provider, connection_id, model)
);
CREATE TABLE settings (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
CREATE TABLE pins (key TEXT PRIMARY KEY, connection_id TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_TABLES = frozenset({"breakers", "connections", "lockouts", "settings", "pins", "meta"})
_SQL = {
    "breaker": "INSERT OR REPLACE INTO breakers (provider, data) VALUES (?, ?)",
    "connection": "INSERT OR REPLACE INTO connections (id, data) VALUES (?, ?)",
    "lockout": "INSERT OR REPLACE INTO lockouts (provider, connection_id, model, data) VALUES (?, ?, ?, ?)",
    "lockout_delete": "DELETE FROM lockouts WHERE provider = ? AND connection_id = ? AND model = ?",
    "pin": "INSERT OR REPLACE INTO pins (key, connection_id, expires_at) VALUES (?, ?, ?)",
    "pin_delete": "DELETE FROM pins WHERE key = ?",
    "meta": "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
}


@dataclass
class _Batch:
    """What the writer took from the queue in one go; `seq` is the last enqueue it contains."""

    seq: int
    breakers: dict[str, Mapping[str, Any]]
    connections: dict[str, Mapping[str, Any]]
    lockouts: dict[_LockoutKey, Mapping[str, Any] | None]  # None = delete
    pins: dict[str, tuple[str, float] | None]  # None = delete
    meta: dict[str, str]

    def size(self) -> int:
        return (
            len(self.breakers) + len(self.connections) + len(self.lockouts) + len(self.pins) + len(self.meta)
        )


class SqliteStore:
    """SQLite (WAL) with a write-behind queue and one writer thread.

    Two connections: the writer thread's own (synchronous=NORMAL: a crash keeps every committed
    batch, which is the promise for engine state) and a foreground one for `load` and
    `save_settings` (synchronous=FULL: an acknowledged settings change survives even a power cut).
    """

    def __init__(self, path: str | os.PathLike[str], *, batch_interval: float = _BATCH_INTERVAL_S) -> None:
        """Open or create the database, and prove it can be written; StoreError (naming the file and
        what is wrong with it) if it is not a state database or cannot be written."""
        self.path = os.fspath(path)
        self._batch_interval = batch_interval
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"{self.path}: cannot create its directory ({_blocking_file(self.path) or exc.strerror or exc})"
            ) from exc
        kind = _not_a_file(self.path)
        if kind is not None:
            raise StoreError(f"{self.path}: is {kind}, not a state database")
        # Before SQLite touches anything: it opens a file it may not write read-only, and creates
        # the -wal and -shm files beside it with the file's own mode, which would then refuse the
        # next start too, after the operator fixed what this one named.
        blocker = _first_unwritable(self.path)
        if blocker is not None:
            raise StoreError(_not_writable(self.path, blocker, None))
        self._fg = self._connect(synchronous="FULL", prepare=True)
        self._identity = _identity(self.path)
        """The file this store opened: a path that leads elsewhere later (the file removed or replaced
        while the instance runs) would take every later write into a file no start reads."""
        self._fg_lock = threading.Lock()
        try:
            self._writer_db = self._connect(synchronous="NORMAL", prepare=False)
        except StoreError:
            self._fg.close()
            raise

        # Everything below is guarded by _lock. The request path takes the bare lock (a C-level
        # context manager, cheaper than Condition.__enter__); _cond shares it for the waits.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._breakers: dict[str, Mapping[str, Any]] = {}
        self._connections: dict[str, Mapping[str, Any]] = {}
        self._lockouts: dict[_LockoutKey, Mapping[str, Any] | None] = {}
        self._pins: dict[str, tuple[str, float] | None] = {}
        self._meta: dict[str, str] = {}
        self._dirty = False
        self._enqueued = 0  # number of save_* calls accepted so far
        self._committed = 0  # value of _enqueued covered by the last commit
        self._flush_wanted = False
        self._closed = False
        self._rows_written = 0
        self._failures = 0  # failed batches so far: a flush waiting for a failing writer gives up
        self._problem: str | None = None

        self._thread = threading.Thread(target=self._run, name="omniroute-state-writer", daemon=True)
        self._thread.start()

    @property
    def write_problem(self) -> str | None:
        with self._cond:
            return self._problem

    def _moved(self) -> str | None:
        """Why the path no longer leads to the file this store writes, if it does not."""
        if _identity(self.path) == self._identity:
            return None
        return (
            "the state file was removed or replaced while the instance ran: nothing written now would"
            " be read by the next start (restart the instance to start a new state file)"
        )

    @property
    def rows_written(self) -> int:
        """Rows the writer has written (upserts plus deletes): shows how well the queue coalesces."""
        with self._cond:
            return self._rows_written

    # -- opening -----------------------------------------------------------------------------

    def _connect(self, *, synchronous: str, prepare: bool) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch is exactly one
            # transaction. check_same_thread=False: each connection is used by one thread at a time
            # (the writer's by the writer; the foreground one under _fg_lock), not by its creator.
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            # Overwritten and deleted content is zeroed, not left in free space: what a row once said
            # (an error an upstream wrote) must not outlive the row in the file.
            conn.execute("PRAGMA secure_delete=ON")
            if prepare:
                self._prepare(conn)
            return conn
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise StoreError(self._open_problem(exc)) from exc
        except StoreError:
            if conn is not None:
                conn.close()
            raise

    def _open_problem(self, exc: sqlite3.Error) -> str:
        """The one line an operator reads when the database cannot be opened or written at start.

        SQLite says "unable to open database file" for a missing permission and for a full disk
        alike, and opens a file it may not write read-only without a word (the write then fails):
        so a permission problem is traced to the path that blocks it, checked the way the kernel
        will check it (os.access honours the immutable flag and read-only mounts, even for root).
        """
        path = self.path
        code = _primary_code(exc)
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_CANTOPEN and _no_space_left(path)):
            return f"{path}: cannot write the state database: {_reason(exc)}; free space there or move the state file"
        if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN):
            blocker = _first_unwritable(path)
            if blocker is not None:
                return _not_writable(path, blocker, exc)
            verb = "open" if code == sqlite3.SQLITE_CANTOPEN else "write"
            return f"{path}: cannot {verb} the state database ({exc})"
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return f"{path}: not a valid state database ({exc})"
        return f"{path}: cannot use the state database: {_reason(exc)}"

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check that the file is ours and intact; create the schema in a new file."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: not a valid state database (schema {version} is newer than {SCHEMA_VERSION};"
                " written by a newer omniroute)"
            )
        if version == 0:
            if tables:
                raise StoreError(f"{self.path}: not a valid state database (unknown tables {sorted(tables)})")
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA_SQL} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
            return
        if missing := _TABLES - tables:
            raise StoreError(f"{self.path}: not a valid state database (missing tables {sorted(missing)})")
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            # (SQLite's report is a line per finding: a start's refusal is one line on stderr.)
            said = "; ".join(line.strip(" *") for line in str(check).splitlines() if line.strip(" *"))
            raise StoreError(f"{self.path}: not a valid state database (integrity check: {said})")
        # Prove the file can be written, through the WAL and its index as every later write goes:
        # SQLite opens a file it may not write read-only and says nothing until the first write,
        # which would be the writer thread's, retrying forever while the proxy serves.
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        finally:
            _rollback_quietly(conn)

    # -- reading and the synchronous write ---------------------------------------------------

    def load(self) -> StoredState:
        """Everything stored, after committing what is queued. Blocking: call at startup or via to_thread."""
        self.flush()
        with self._fg_lock:
            if self._closed:
                raise StoreError("state store is closed")
            try:
                db = self._fg
                settings = db.execute("SELECT data FROM settings WHERE id = 1").fetchone()
                return StoredState(
                    breakers={
                        k: _decode("breakers", k, v)
                        for k, v in db.execute("SELECT provider, data FROM breakers")
                    },
                    connections={
                        k: _decode("connections", k, v)
                        for k, v in db.execute("SELECT id, data FROM connections")
                    },
                    lockouts=[
                        _decode("lockouts", " / ".join((p, c, m)), v)
                        for p, c, m, v in db.execute(
                            "SELECT provider, connection_id, model, data FROM lockouts"
                            " ORDER BY provider, connection_id, model"
                        )
                    ],
                    settings=None if settings is None else _decode("settings", "1", settings[0]),
                    pins={
                        k: (c, e) for k, c, e in db.execute("SELECT key, connection_id, expires_at FROM pins")
                    },
                    meta=dict(db.execute("SELECT key, value FROM meta")),
                )
            except BadRecord as exc:
                raise exc.at(self.path) from None
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot read the state database: {_reason(exc)}") from exc

    def save_settings(self, document: Mapping[str, Any]) -> None:
        """Replace the settings document, committed (and fsynced) before returning. Blocking: to_thread."""
        text = _dumps(document)
        with self._fg_lock:
            if self._closed:
                raise StoreError("state store is closed")
            moved = self._moved()
            if moved is not None:
                raise StoreError(f"{self.path}: cannot save settings: {moved}")
            try:
                self._fg.execute("INSERT OR REPLACE INTO settings (id, data) VALUES (1, ?)", (text,))
            except sqlite3.Error as exc:
                _rollback_quietly(self._fg)
                raise StoreError(f"{self.path}: cannot save settings: {_reason(exc)}") from exc

    # -- write-behind: the request path --------------------------------------------------------
    # Each call takes one uncontended lock, updates a dict and, only when the queue was empty,
    # wakes the writer. Records are copied shallowly so a caller reusing its dict cannot change
    # what gets written; serialisation happens on the writer thread.

    def save_breakers(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        with self._lock:
            if self._closed:
                return
            for key, record in records.items():
                self._breakers[key] = dict(record)
            self._mark_dirty()

    def save_connections(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        with self._lock:
            if self._closed:
                return
            for key, record in records.items():
                self._connections[key] = dict(record)
            self._mark_dirty()

    def save_lockouts(
        self, upserts: Sequence[Mapping[str, Any]], deletes: Sequence[tuple[str, str, str]]
    ) -> None:
        rows = [(_lockout_key(record), dict(record)) for record in upserts]
        with self._lock:
            if self._closed:
                return
            for key, record in rows:
                self._lockouts[key] = record
            for provider, connection_id, model in deletes:
                self._lockouts[(provider, connection_id, model)] = None
            self._mark_dirty()

    def save_pins(self, upserts: Mapping[str, tuple[str, float]], deletes: Sequence[str]) -> None:
        rows = {
            key: (connection_id, float(expires_at)) for key, (connection_id, expires_at) in upserts.items()
        }
        with self._lock:
            if self._closed:
                return
            self._pins.update(rows)
            for key in deletes:
                self._pins[key] = None
            self._mark_dirty()

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._meta[key] = value
            self._mark_dirty()

    def _mark_dirty(self) -> None:
        self._enqueued += 1
        if not self._dirty:
            self._dirty = True
            self._cond.notify_all()

    # -- flush / close ---------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything queued before this call is committed; False on timeout or write errors."""
        with self._cond:
            target = self._enqueued
            if self._committed >= target:
                return True
            self._flush_wanted = True
            self._cond.notify_all()
            failures = self._failures
            self._cond.wait_for(
                lambda: self._committed >= target or self._failures > failures, timeout=timeout
            )
            return self._committed >= target

    def purge(self, finds: Callable[[str], bool]) -> bool:
        """Rebuild the file (VACUUM) and empty the WAL into it when its bytes, free pages and WAL
        frames included, hold text `finds`: a file written before secure_delete was on keeps what
        overwritten rows said. A failure is logged and leaves the file as it was (it still works)."""
        self.flush()
        try:
            raw = b"".join(
                Path(name).read_bytes() for name in (self.path, f"{self.path}-wal") if os.path.exists(name)
            )
        except OSError as exc:
            _log.warning("%s: cannot read the state file to check it for secrets: %s", self.path, exc)
            return False
        # latin-1 maps every byte to one character, so text of any shape is found wherever it lies.
        if not finds(raw.decode("latin-1")):
            return False
        with self._fg_lock:
            try:
                self._fg.execute("VACUUM")
                self._fg.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                _log.warning(
                    "%s: cannot rebuild the state file without old error text: %s", self.path, _reason(exc)
                )
                return False
        return True

    def close(self) -> None:
        """Commit what is queued, stop the writer and close the database; idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True  # from here on write-behind saves are dropped
            self._cond.notify_all()
        self._thread.join(_CLOSE_JOIN_TIMEOUT_S)
        with self._fg_lock:
            if self._moved() is not None:
                self._fold_into_moved_file()
            self._fg.close()
        if self._thread.is_alive():  # a hung disk: leave its connection to the daemon thread
            _log.error("%s: the state writer did not stop within %ss", self.path, _CLOSE_JOIN_TIMEOUT_S)
        else:
            self._writer_db.close()

    def _fold_into_moved_file(self) -> None:
        """At close, the path no longer leads to this store's file (moved, removed or replaced while
        the instance ran). SQLite does not fold the write-ahead log into a file that moved when it
        closes: `mv state.db state.db.bak` left a `.bak` of bare headers and the state in a
        `state.db-wal` that the next start on `state.db` overwrote. The log is folded in here, so
        that a moved file holds the whole state (as of the move: later writes were refused), and
        the log says where it is."""
        try:
            self._fg.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            _log.error(
                "%s: cannot fold the write-ahead log into the moved state file: %s", self.path, _reason(exc)
            )
            return
        now_at = _found_as(self.path, self._identity)
        if now_at is not None:
            _log.warning(
                "%s: the state file was moved to %s while the instance ran; the state is there, whole"
                " (move it back before the next start, which would otherwise begin with none)",
                self.path,
                now_at,
            )
        else:
            _log.warning(
                "%s: the state file was removed or replaced while the instance ran; the state it held"
                " is gone with it (the next start reads what the path holds now)",
                self.path,
            )

    # -- the writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        failing = _FailureLog(self.path)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._closed)
                # Gather for one interval so a burst of transitions becomes one transaction;
                # a flush or close cuts the wait short.
                self._cond.wait_for(lambda: self._flush_wanted or self._closed, timeout=self._batch_interval)
                batch = self._take()
                closing = self._closed
            error = self._write(batch) if batch is not None else None
            with self._cond:
                if error is None:
                    if batch is not None:
                        self._committed = batch.seq
                        self._rows_written += batch.size()
                        self._problem = None
                else:
                    self._restore(batch)
                    self._failures += 1
                    self._problem = _reason(error)
                if not self._dirty:
                    self._flush_wanted = False
                self._cond.notify_all()
                if closing and (error is not None or not self._dirty):
                    if error is not None:
                        _log.error(
                            "%s: state lost at close, the last batch failed: %s", self.path, _reason(error)
                        )
                    return
                if error is not None:
                    failing.failed(error)
                    self._cond.wait_for(lambda: self._closed, timeout=_RETRY_DELAY_S)
                elif batch is not None:
                    failing.succeeded()

    def _take(self) -> _Batch | None:
        if not self._dirty:
            return None
        batch = _Batch(
            self._enqueued, self._breakers, self._connections, self._lockouts, self._pins, self._meta
        )
        self._breakers, self._connections, self._lockouts, self._pins, self._meta = {}, {}, {}, {}, {}
        self._dirty = False
        return batch

    def _restore(self, batch: _Batch | None) -> None:
        """Put a failed batch back under whatever was queued since (newer values win)."""
        if batch is None:
            return
        _merge_back(self._breakers, batch.breakers)
        _merge_back(self._connections, batch.connections)
        _merge_back(self._lockouts, batch.lockouts)
        _merge_back(self._pins, batch.pins)
        _merge_back(self._meta, batch.meta)
        self._dirty = True

    def _write(self, batch: _Batch) -> sqlite3.Error | None:
        """Commit one batch in one transaction; the error if it failed (nothing of it is then on disk)."""
        # Serialise first: a record JSON cannot encode would fail every retry, so it is dropped
        # (and logged) instead of holding every later transition back.
        # Keys are bound as SQL text, which must be UTF-8: a key holding a lone surrogate would raise
        # UnicodeEncodeError here, on every retry, and end the writer thread. Such rows are dropped too.
        breakers = self._encode(self._bindable(batch.breakers).items())
        connections = self._encode(self._bindable(batch.connections).items())
        lockout_rows = self._bindable(batch.lockouts)
        lockouts = self._encode((key, record) for key, record in lockout_rows.items() if record is not None)
        lockout_deletes = [key for key, record in lockout_rows.items() if record is None]
        pin_rows = self._bindable(batch.pins)
        pins = [(key, *pin) for key, pin in pin_rows.items() if pin is not None]
        pin_deletes = [(key,) for key, pin in pin_rows.items() if pin is None]
        meta = self._bindable(batch.meta)
        moved = self._moved()
        if moved is not None:
            return sqlite3.OperationalError(moved)
        db = self._writer_db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(_SQL["breaker"], breakers)
                db.executemany(_SQL["connection"], connections)
                db.executemany(_SQL["lockout"], [(*key, data) for key, data in lockouts])
                db.executemany(_SQL["lockout_delete"], lockout_deletes)
                db.executemany(_SQL["pin"], pins)
                db.executemany(_SQL["pin_delete"], pin_deletes)
                db.executemany(_SQL["meta"], [(key, value) for key, value in meta.items() if _text(value)])
                db.execute("COMMIT")
            except BaseException:
                _rollback_quietly(db)
                raise
        except sqlite3.Error as exc:
            return exc
        return None

    def _bindable(self, rows: Mapping[_K, _V]) -> Mapping[_K, _V]:
        if all(_text(key) for key in rows):
            return rows
        _log.error("%s: dropping records whose key is not UTF-8 text", self.path)
        return {key: value for key, value in rows.items() if _text(key)}

    def _encode(self, items: Iterable[tuple[_K, Mapping[str, Any]]]) -> list[tuple[_K, str]]:
        rows: list[tuple[_K, str]] = []
        for key, record in items:
            try:
                rows.append((key, _dumps(record)))
            except (TypeError, ValueError) as exc:
                _log.error("%s: dropping a record for %r that is not JSON: %s", self.path, key, exc)
        return rows


class _FailureLog:
    """The writer's failures, logged when they start, when their reason changes, at most once a
    minute while they last, and when writing works again: not once a second for as long as a
    disk stays full."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.reason: str | None = None
        self.count = 0
        self.logged_at = 0.0

    def failed(self, error: sqlite3.Error) -> None:
        reason = _reason(error)
        self.count += 1
        now = time.monotonic()
        if reason != self.reason or now - self.logged_at >= _REPEAT_LOG_S:
            again = f" ({self.count} failed writes so far)" if reason == self.reason else ""
            _log.warning("%s: state write failed, retrying: %s%s", self.path, reason, again)
            self.reason, self.logged_at = reason, now

    def succeeded(self) -> None:
        if self.reason is not None:
            _log.warning("%s: state writes work again after %d failed", self.path, self.count)
            self.reason, self.count = None, 0


def _not_a_file(path: str) -> str | None:
    """What is at `path` when it is there and not a regular file ("a directory", "a FIFO"...)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return None


def _blocking_file(path: str) -> str | None:
    """`X is a file, not a directory` for the first folder on `path`'s way that is a file."""
    for parent in Path(path).parents:
        if parent.is_file():
            return f"{parent} is a file, not a directory"
    return None


def _found_as(path: str, identity: tuple[int, int] | None) -> str | None:
    """Where the file `identity` names is now, if it is still in `path`'s folder (a rename)."""
    if identity is None:
        return None
    try:
        with os.scandir(os.path.dirname(os.path.abspath(path))) as entries:
            for entry in entries:
                found = entry.stat(follow_symlinks=False)
                if (found.st_dev, found.st_ino) == identity:
                    return entry.path
    except OSError:
        return None
    return None


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def _primary_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code (SQLITE_FULL, ...) of an error, without its extended bits."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _reason(exc: sqlite3.Error) -> str:
    """What an SQLite error means, in words, with SQLite's own text in brackets: the real error,
    as SQLite reported it, is always part of what the operator reads."""
    code = _primary_code(exc)
    if code == sqlite3.SQLITE_FULL:
        return f"the disk is full ({exc})"
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM):
        return f"the file is not writable ({exc})"
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return f"the database is damaged ({exc})"
    if code == sqlite3.SQLITE_IOERR:
        return f"an I/O error ({exc})"
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return f"another program holds a lock on it ({exc})"
    return str(exc)


def _rollback_quietly(db: sqlite3.Connection) -> None:
    """End a failed transaction, keeping the error that failed it. After a full disk or an I/O
    error SQLite may already have rolled back by itself, and a ROLLBACK would then raise "no
    transaction is active" in place of the real error."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _not_writable(path: str, blocker: str, exc: sqlite3.Error | None) -> str:
    said = f" ({exc})" if exc is not None else ""
    return (
        f"{path}: cannot write the state database: {blocker} is not writable by this user{said};"
        " fix its owner, mode or mount, or choose another --state"
    )


def _first_unwritable(path: str) -> str | None:
    """The first of the database's directory, file, -wal and -shm that exists and this process may not
    write (SQLite needs to create the last two beside the file, and write all of them)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.access(directory, os.W_OK | os.X_OK):
        return directory
    for candidate in (path, f"{path}-wal", f"{path}-shm"):
        if os.path.exists(candidate) and not os.access(candidate, os.R_OK | os.W_OK):
            return candidate
    return None


def _no_space_left(path: str) -> bool:
    try:
        return os.statvfs(os.path.dirname(os.path.abspath(path))).f_bavail == 0
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return False


def _decode(table: str, row: str, text: str) -> dict[str, Any]:
    """One stored JSON record; BadRecord (naming table and row) if it is not a JSON object."""
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise BadRecord(table, repr(row), f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise BadRecord(table, repr(row), f"not a JSON object ({type(record).__name__})")
    return record


def _merge_back(pending: dict[_K, _V], failed: Mapping[_K, _V]) -> None:
    for key, value in failed.items():
        pending.setdefault(key, value)


def _text(key: object) -> bool:
    """Can SQLite take `key` (a string, or a tuple of them) as text? Not with a lone surrogate in it."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(not isinstance(part, str) or untrusted.is_text(part) for part in parts)


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))
