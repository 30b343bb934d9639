"""State store: round trips, write-behind coalescing, durability, crash safety.

What it promises: docs/resilience.md#persistence-and-restarts.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.store import SCHEMA_VERSION, MemoryStore, SqliteStore, StateStore, StoredState, StoreError
from tests.conditions import fill_up, small_disk, unwritable

ROOT = Path(__file__).resolve().parent.parent

BREAKER = {
    "provider": "openai",
    "provider_class": "apikey",
    "state": "OPEN",
    "failure_count": 12,
    "open_cycle_count": 2,
    "opened_at": 1_767_225_600_000.0,
    "last_failure_at": 1_767_225_600_000.0,
    "last_transition_at": 1_767_225_600_000.0,
}
CONNECTION = {
    "connection_id": "openai-main",
    "provider": "openai",
    "enabled": True,
    "terminal": "expired",
    "rate_limited_until": None,
    "backoff_level": 3,
    "last_error": "401 Unauthorized",
    "last_error_type": "auth",
    "error_code": 401,
    "last_error_at": 1_767_225_601_000.0,
}


def lockout(provider: str, connection_id: str, model: str, count: int = 1) -> dict[str, Any]:
    return {
        "provider": provider,
        "connection_id": connection_id,
        "model": model,
        "reason": "not_found",
        "status": 404,
        "failure_count": count,
        "locked_at": 1_767_225_600_000.0,
        "expires_at": 1_767_225_720_000.0,
        "last_cooldown_ms": 120_000.0,
        "last_failure_at": 1_767_225_600_000.0,
    }


SETTINGS_DOC = {
    "providerBreaker": {"apikey": {"failureThreshold": 20}},
    "modelLockout": {"errorCodes": [404]},
}


def fill(store: StateStore) -> None:
    store.save_breakers({"openai": BREAKER, "ollama": {**BREAKER, "provider": "ollama", "state": "CLOSED"}})
    store.save_connections({"openai-main": CONNECTION})
    store.save_lockouts(
        [
            lockout("ollama", "ollama-1", "llama3:8b"),
            lockout("ollama", "ollama-1", "qwen"),
            lockout("a", "b", "c"),
        ],
        [],
    )
    store.save_lockouts([], [("a", "b", "c"), ("never", "stored", "model")])
    store.save_pins({"session-1": ("openai-main", 1_767_225_900_000.0), "session-2": ("ollama-1", 5.0)}, [])
    store.save_pins({}, ["session-2", "never-stored"])
    store.set_meta("fingerprint:openai-main", "sha256:abcd")
    store.save_settings(SETTINGS_DOC)


EXPECTED = StoredState(
    breakers={"openai": BREAKER, "ollama": {**BREAKER, "provider": "ollama", "state": "CLOSED"}},
    connections={"openai-main": CONNECTION},
    lockouts=[lockout("ollama", "ollama-1", "llama3:8b"), lockout("ollama", "ollama-1", "qwen")],
    settings=SETTINGS_DOC,
    pins={"session-1": ("openai-main", 1_767_225_900_000.0)},
    meta={"fingerprint:openai-main": "sha256:abcd"},
)


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], StateStore]]:
    stores: list[StateStore] = []

    def make() -> StateStore:
        store: StateStore = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "state.db")
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "state.db"


def read(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Read with a connection of our own: what another process would see on disk."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# -- both stores ------------------------------------------------------------------------------------


def test_round_trip_of_every_table(make_store: Callable[[], StateStore]) -> None:
    store = make_store()
    assert store.load() == StoredState()
    fill(store)
    assert store.flush() is True
    assert store.load() == EXPECTED


def test_later_saves_replace_earlier_ones(make_store: Callable[[], StateStore]) -> None:
    store = make_store()
    store.save_breakers({"openai": BREAKER})
    store.save_breakers({"openai": {**BREAKER, "state": "CLOSED", "failure_count": 0}})
    store.save_lockouts([lockout("p", "c", "m", 1)], [])
    store.save_lockouts([lockout("p", "c", "m", 4)], [])
    store.save_settings({"sessionAffinity": {"ttlMs": 1}})
    store.save_settings({"sessionAffinity": {"ttlMs": 2}})
    store.set_meta("k", "1")
    store.set_meta("k", "2")
    state = store.load()
    assert state.breakers == {"openai": {**BREAKER, "state": "CLOSED", "failure_count": 0}}
    assert state.lockouts == [lockout("p", "c", "m", 4)]
    assert state.settings == {"sessionAffinity": {"ttlMs": 2}}
    assert state.meta == {"k": "2"}


def test_a_caller_reusing_its_dict_does_not_change_what_is_saved(
    make_store: Callable[[], StateStore],
) -> None:
    store = make_store()
    record = {"state": "OPEN"}
    store.save_breakers({"openai": record})
    record["state"] = "MUTATED AFTERWARDS"
    assert store.load().breakers == {"openai": {"state": "OPEN"}}


def test_close_is_idempotent_and_later_saves_are_dropped(make_store: Callable[[], StateStore]) -> None:
    store = make_store()
    store.save_breakers({"openai": BREAKER})
    store.close()
    store.close()
    store.save_breakers({"late": BREAKER})  # an in-flight request finishing during shutdown: no error
    store.save_connections({"late": CONNECTION})
    store.save_lockouts([lockout("p", "c", "m")], [])
    store.save_pins({"s": ("c", 1.0)}, [])
    store.set_meta("late", "x")
    assert store.flush() is True
    with pytest.raises(StoreError, match="closed"):
        store.save_settings({})


def test_a_lockout_record_without_its_key_fields_is_refused(make_store: Callable[[], StateStore]) -> None:
    store = make_store()
    with pytest.raises(ValueError, match="provider, connection_id and model"):
        store.save_lockouts([{"provider": "p", "model": "m"}], [])


# -- SQLite ---------------------------------------------------------------------------------------


def test_reopen_after_close_reads_everything_back(db_path: Path) -> None:
    store = SqliteStore(db_path)
    fill(store)
    store.close()
    reopened = SqliteStore(db_path)
    try:
        assert reopened.load() == EXPECTED
    finally:
        reopened.close()


def test_the_database_is_wal_with_our_schema_version(db_path: Path) -> None:
    store = SqliteStore(db_path)
    try:
        assert read(db_path, "PRAGMA journal_mode") == [("wal",)]
        assert read(db_path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
        tables = {name for (name,) in read(db_path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"breakers", "connections", "lockouts", "settings", "pins", "meta"}
    finally:
        store.close()


def test_save_settings_is_on_disk_when_it_returns(db_path: Path) -> None:
    store = SqliteStore(db_path, batch_interval=60.0)  # the write-behind writer would not get there
    try:
        store.save_settings({"modelLockout": {"enabled": True}})
        assert read(db_path, "SELECT id, data FROM settings") == [(1, '{"modelLockout":{"enabled":true}}')]
    finally:
        store.close()


def test_engine_writes_return_at_once_and_reach_the_disk_within_one_second(db_path: Path) -> None:
    store = SqliteStore(db_path)
    try:
        started = time.perf_counter()
        store.save_breakers({"openai": BREAKER})
        assert time.perf_counter() - started < 0.05  # only queued, never committed on the caller's thread
        deadline = time.monotonic() + 1.0
        rows: list[tuple[Any, ...]] = []
        while not rows and time.monotonic() < deadline:
            rows = read(db_path, "SELECT provider FROM breakers")
            time.sleep(0.02)  # real concurrency with the writer thread is the point here
        assert rows == [("openai",)]
    finally:
        store.close()


def test_flush_commits_everything_queued_before_it(db_path: Path) -> None:
    store = SqliteStore(db_path, batch_interval=60.0)
    try:
        store.save_connections({"openai-main": CONNECTION})
        store.save_lockouts([lockout("p", "c", "m")], [])
        assert read(db_path, "SELECT count(*) FROM connections") == [(0,)]
        assert store.flush(timeout=5.0) is True
        assert read(db_path, "SELECT id FROM connections") == [("openai-main",)]
        assert read(db_path, "SELECT provider, connection_id, model FROM lockouts") == [("p", "c", "m")]
        assert store.flush() is True  # nothing queued: returns at once
    finally:
        store.close()


def test_close_commits_what_is_queued(db_path: Path) -> None:
    store = SqliteStore(db_path, batch_interval=60.0)
    store.save_pins({"s": ("c", 42.5)}, [])
    store.close()
    assert read(db_path, "SELECT key, connection_id, expires_at FROM pins") == [("s", "c", 42.5)]


def test_a_thousand_updates_of_one_breaker_write_one_row(db_path: Path) -> None:
    store = SqliteStore(db_path, batch_interval=60.0)
    try:
        for count in range(1000):
            store.save_breakers({"openai": {**BREAKER, "failure_count": count}})
        assert store.flush() is True
        assert store.rows_written == 1
        assert store.load().breakers["openai"]["failure_count"] == 999
    finally:
        store.close()


def test_a_record_json_cannot_encode_is_dropped_and_the_rest_is_written(db_path: Path) -> None:
    store = SqliteStore(db_path)
    try:
        store.save_breakers({"bad": {"opened_at": object()}, "openai": BREAKER})
        assert store.flush() is True
        assert store.load().breakers == {"openai": BREAKER}
    finally:
        store.close()


def test_not_a_database_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite, just some text that happens to be here\n" * 100)
    with pytest.raises(StoreError) as caught:
        SqliteStore(path)
    assert str(caught.value) == f"{path}: not a valid state database (file is not a database)"
    assert path.read_bytes().startswith(b"this is not sqlite")  # left as it was


def test_someone_elses_database_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"not a valid state database \(unknown tables \['invoices'\]\)"):
        SqliteStore(path)


def test_a_database_from_a_newer_version_raises_store_error(db_path: Path) -> None:
    SqliteStore(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        SqliteStore(db_path)


def test_a_directory_at_the_path_raises_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as caught:
        SqliteStore(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}: is a directory, not a state database")


def test_a_fifo_at_the_path_raises_store_error_instead_of_hanging(tmp_path: Path) -> None:
    """SQLite's open of a FIFO waits for a writer for ever: the start hung without a word (found by a
    lifecycle trial)."""
    fifo = tmp_path / "state.db"
    os.mkfifo(fifo)
    with pytest.raises(StoreError) as caught:
        SqliteStore(fifo)
    assert str(caught.value) == f"{fifo}: is a FIFO, not a state database"


def test_a_file_where_its_folder_should_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a folder")
    with pytest.raises(StoreError) as caught:
        SqliteStore(tmp_path / "data" / "state.db")
    assert str(caught.value).startswith(f"{tmp_path / 'data' / 'state.db'}: cannot create its directory")
    assert f"{tmp_path / 'data'} is a file, not a directory" in str(caught.value)


# -- storage failures, told as what they are (issue #21) ------------------------------------------


@pytest.mark.parametrize("which", ["state.db", "state.db-wal", "state.db-shm"])
def test_a_state_file_that_cannot_be_written_is_refused_at_open(tmp_path: Path, which: str) -> None:
    """SQLite opens an unwritable file read-only without a word; the store must find out at open,
    not in the writer's retry loop once the proxy is serving."""
    path = tmp_path / "state.db"
    SqliteStore(path).close()  # a clean close removes -wal and -shm: recreate them empty
    (tmp_path / which).touch()
    with unwritable(tmp_path / which), pytest.raises(StoreError) as caught:
        SqliteStore(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot write the state database"), message
    assert f"{tmp_path / which} is not writable" in message


@pytest.mark.parametrize("existing", [True, False])
def test_a_directory_that_cannot_be_written_is_named(tmp_path: Path, existing: bool) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    path = folder / "state.db"
    if existing:
        SqliteStore(path).close()
    with unwritable(folder), pytest.raises(StoreError) as caught:
        SqliteStore(path)
    message = str(caught.value)
    assert "not a valid state database" not in message
    assert message.startswith(f"{path}: cannot ")
    assert f"{folder} is not writable" in message


def test_a_full_disk_at_open_says_the_disk_is_full(tmp_path: Path) -> None:
    with small_disk(256) as disk:
        fill_up(disk)
        path = disk / "state.db"
        with pytest.raises(StoreError) as caught:
            SqliteStore(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert "the disk is full" in message
    assert "not a valid state database" not in message


def test_a_full_disk_while_running_logs_the_real_error(caplog: pytest.LogCaptureFixture) -> None:
    """On SQLITE_FULL SQLite rolls the transaction back itself; the writer's own ROLLBACK then
    failed with "no transaction is active", and that was the only error anyone saw."""
    with small_disk(256) as disk:
        store = SqliteStore(disk / "state.db", batch_interval=0.01)
        try:
            for n in range(100):
                store.save_breakers({f"p{n}": {"padding": "x" * 4000}})
            assert store.flush(timeout=5.0) is False  # it cannot all fit
        finally:
            store.close()
    failures = [r.getMessage() for r in caplog.records if r.name == "proxy.store"]
    assert failures, "the writer logged nothing"
    assert all("no transaction is active" not in text for text in failures), failures
    assert any("the disk is full (database or disk is full)" in text for text in failures), failures


class _FailingWrites:
    """The writer's connection, except that `executemany` fails like a full disk does: SQLite has
    already rolled the transaction back when the error reaches Python."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self._conn.execute("ROLLBACK")
        error = sqlite3.OperationalError("database or disk is full")
        error.sqlite_errorcode = sqlite3.SQLITE_FULL
        raise error


def test_a_failed_rollback_keeps_the_real_error(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same as the full-disk test above, by injection, for machines where no tmpfs can be mounted."""
    store = SqliteStore(db_path, batch_interval=60.0)
    try:
        store._writer_db = _FailingWrites(store._writer_db)  # type: ignore[assignment]
        store.save_breakers({"openai": BREAKER})
        assert store.flush(timeout=0.5) is False
    finally:
        store.close()
    failures = [r.getMessage() for r in caplog.records if r.name == "proxy.store"]
    assert failures
    assert all("no transaction is active" not in text for text in failures), failures
    assert any("the disk is full (database or disk is full)" in text for text in failures), failures


_WRITER_SCRIPT = """
import sys
from proxy.store import SqliteStore

store = SqliteStore(sys.argv[1], batch_interval=0.01)
i = 0
while True:
    i += 1
    store.save_breakers({"p": {"n": i}})
    store.save_connections({"c": {"n": i}})
    store.save_lockouts([{"provider": "p", "connection_id": "c", "model": "m", "n": i}], [])
    store.save_pins({"s": ("c", float(i))}, [])
    if i % 500 == 0:
        store.flush()
        print(i, flush=True)
"""


def test_kill_9_while_writing_leaves_the_last_committed_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", _WRITER_SCRIPT, str(path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as child:
        try:
            assert child.stdout is not None
            reported = [int(child.stdout.readline()) for _ in range(5)]  # five flushes known to be on disk
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL

    assert read(path, "PRAGMA integrity_check") == [("ok",)]
    store = SqliteStore(path)
    try:
        state = store.load()
    finally:
        store.close()
    breaker_n = state.breakers["p"]["n"]
    connection_n = state.connections["c"]["n"]
    lockout_n = state.lockouts[0]["n"]
    pin_n = state.pins["s"][1]
    assert breaker_n >= reported[-1]
    # Each loop turn enqueues four saves; a batch can cut between them, never reorder them.
    assert breaker_n - 1 <= connection_n <= breaker_n
    assert connection_n - 1 <= lockout_n <= connection_n
    assert lockout_n - 1 <= pin_n <= lockout_n


@pytest.mark.parametrize(("data", "reason"), [("soon", "not JSON"), ("[1, 2]", "not a JSON object (list)")])
def test_a_stored_row_that_is_not_a_record_names_its_table_and_row(
    db_path: Path, data: str, reason: str
) -> None:
    SqliteStore(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("INSERT INTO connections (id, data) VALUES ('openai-main', ?)", (data,))
    conn.commit()
    conn.close()
    store = SqliteStore(db_path)
    try:
        with pytest.raises(StoreError) as caught:
            store.load()
    finally:
        store.close()
    assert str(caught.value).startswith(
        f"{db_path}: bad record in table connections, row 'openai-main': {reason}"
    )


def test_a_key_that_is_not_utf8_text_is_dropped_and_the_writer_lives_on(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lone surrogate in a key (a model name, a session) cannot be bound as SQLite text: it used
    to raise in the writer thread, which then died and persisted nothing ever again."""
    store = SqliteStore(db_path)
    try:
        store.save_lockouts(
            [lockout("ollama", "ollama-1", "\ud800"), lockout("ollama", "ollama-1", "ok")], []
        )
        store.save_pins({"\udc00": ("ollama-1", 5.0)}, [])
        assert store.flush()
        store.save_breakers({"openai": BREAKER})
        assert store.flush()
    finally:
        store.close()
    assert read(db_path, "SELECT model FROM lockouts") == [("ok",)]
    assert read(db_path, "SELECT provider FROM breakers") == [("openai",)]
    assert "not UTF-8 text" in caplog.text


def test_a_damaged_database_is_refused_in_one_line(db_path: Path) -> None:
    """SQLite's integrity check reports on lines of their own ("*** in database main ***", then a
    line per page): the refusal is one line on stderr, as every start refusal is (found by a
    lifecycle trial)."""
    store = SqliteStore(db_path)
    store.save_breakers({f"p{i}": BREAKER for i in range(200)})
    assert store.flush()
    store.close()
    with open(db_path, "r+b") as raw:  # page 3's header: a first freeblock where there is none
        raw.seek(2 * 4096 + 1)
        raw.write(b"\x00\x10")
    with pytest.raises(StoreError) as refused:
        SqliteStore(db_path).close()
    said = str(refused.value)
    assert "not a valid state database (integrity check: " in said
    assert "\n" not in said and "  " not in said, said


def test_a_state_file_moved_away_under_the_store_holds_the_whole_state_and_the_log_says_where(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`mv state.db state.db.bak` while the instance ran: SQLite does not fold the write-ahead log
    into a file that moved when it closes, so the `.bak` held a bare header and the state sat in a
    `state.db-wal` that the next start on `state.db` overwrote, with nothing logged (found by a
    lifecycle trial). The store folds the log in at close and says where the state went."""
    store = SqliteStore(db_path, batch_interval=0.01)
    try:
        store.save_settings({"comboCooldownWait": {"maxWaitMs": 4242}})
        store.save_breakers({"openai": BREAKER})
        assert store.flush()
        moved = db_path.with_name(db_path.name + ".bak")
        db_path.rename(moved)
    finally:
        store.close()
    assert read(moved, "SELECT provider FROM breakers") == [("openai",)]
    kept = SqliteStore(moved)
    try:
        assert kept.load().settings == {"comboCooldownWait": {"maxWaitMs": 4242}}
    finally:
        kept.close()
    assert f"{db_path}: the state file was moved to {moved} while the instance ran" in caplog.text


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_state_file_removed_or_replaced_under_the_store_refuses_what_it_cannot_keep(
    db_path: Path, how: str
) -> None:
    """Written through the descriptor it opened, every later change went into a file no start reads,
    and was acknowledged (`rm state.db*` to start afresh, `mv state.db state.db.bak`; found by a
    lifecycle trial). Now the store notices: settings are refused, a flush says it failed, and why."""
    store = SqliteStore(db_path, batch_interval=0.01)
    try:
        for name in (db_path.name, f"{db_path.name}-wal", f"{db_path.name}-shm"):
            (db_path.parent / name).unlink(missing_ok=True)
        if how == "replaced":
            SqliteStore(db_path).close()  # another file at the same path
        with pytest.raises(StoreError, match="removed or replaced while the instance ran"):
            store.save_settings({"x": 1})
        store.save_breakers({"p": {"state": "OPEN"}})
        started = time.monotonic()
        assert store.flush(5.0) is False
        assert time.monotonic() - started < 2.0  # a refusal is said at once, not after the timeout
        assert store.write_problem is not None and "removed or replaced" in store.write_problem
    finally:
        store.close()
