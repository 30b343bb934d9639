"""Session pins (session affinity) do not grow without bound (issue #9, item 10).

Every successful request with a session header pins its session for `sessionAffinity.ttlMs`. The
session ids are the client's choice, so the table must shed expired pins, in memory and in the
state database, without scanning the whole table on the request path, and must have a ceiling.
"""

from __future__ import annotations

from pathlib import Path

from proxy.engine import PIN_PRUNE_STEP, Attempt, ConnectionSpec, Engine, ProviderSpec, Target
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.settings import Settings
from proxy.store import MemoryStore, SqliteStore, StateStore

TTL_MS = 60_000
GPT = Target("openai", "gpt-4o")


def make_engine(clock: FakeClock, store: StateStore | None = None, **kwargs: int) -> Engine:
    engine = Engine(
        [ProviderSpec("openai", "apikey", per_model_quota=False)],
        [ConnectionSpec("oa-1", "openai", priority=1), ConnectionSpec("oa-2", "openai", priority=2)],
        clock=clock,
        store=store,
        settings=Settings(clock=clock),
        **kwargs,  # type: ignore[arg-type]
    )
    engine.settings.patch({"sessionAffinity": {"ttlMs": TTL_MS}}, "resilience")
    return engine


def serve(engine: Engine, session: str) -> None:
    attempt = engine.select([GPT], session=session)
    assert isinstance(attempt, Attempt)
    engine.record(attempt, Outcome.ok(), session=session)


def test_expired_pins_leave_memory_a_few_per_request_and_all_at_persist(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteStore(tmp_path / "state.db")
    engine = make_engine(clock, store)
    for i in range(1000):
        serve(engine, f"s{i}")
    engine.persist()
    assert store.flush()
    assert len(store.load().pins) == 1000

    clock.advance(TTL_MS + 1)  # every pin has expired
    serve(engine, "fresh")

    # The request path pays a bounded share of the cleanup, never a scan of 1,000 pins...
    assert len(engine.pins) == 1000 + 1 - PIN_PRUNE_STEP
    # ...and the periodic persist removes the rest, from memory and from the database.
    engine.persist()
    assert store.flush()
    assert list(engine.pins) == ["fresh"]
    assert list(store.load().pins) == ["fresh"]
    store.close()


def test_a_refreshed_pin_outlives_the_ones_around_it() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    serve(engine, "a")
    serve(engine, "b")
    clock.advance(TTL_MS // 2)
    serve(engine, "a")  # refreshed: now younger than b
    clock.advance(TTL_MS // 2 + 1)  # b has expired, a has not
    engine.persist()
    assert list(engine.pins) == ["a"]
    again = engine.select([GPT], session="a")
    assert isinstance(again, Attempt) and again.pinned_by_session


def test_steady_traffic_of_new_sessions_keeps_the_table_at_its_live_size() -> None:
    """New sessions forever, no persist at all: the request path alone keeps the table bounded."""
    clock = FakeClock()
    engine = make_engine(clock)
    sizes = []
    for i in range(20_000):
        serve(engine, f"s{i}")
        clock.advance(10)  # 6,000 sessions start per TTL
        sizes.append(len(engine.pins))
    assert max(sizes[-5000:]) <= TTL_MS // 10 + PIN_PRUNE_STEP


def test_the_table_has_a_ceiling_and_the_oldest_pin_gives_way() -> None:
    clock = FakeClock()
    store = MemoryStore()
    engine = make_engine(clock, store, max_session_pins=100)
    for i in range(150):
        serve(engine, f"s{i}")
        clock.advance(1)
    engine.persist()
    assert list(engine.pins) == [f"s{i}" for i in range(50, 150)]
    assert sorted(store.load().pins) == sorted(engine.pins)


def test_expired_pins_in_the_database_are_deleted_after_a_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    engine = make_engine(clock, store)
    for i in range(10):
        serve(engine, f"s{i}")
    engine.persist()
    store.close()

    clock.advance(TTL_MS + 1)
    store = SqliteStore(path)
    restarted = make_engine(clock, store)
    restarted.restore(store.load())
    serve(restarted, "new")
    restarted.persist()
    assert store.flush()
    assert list(store.load().pins) == ["new"]
    store.close()


def test_pins_restored_from_the_database_are_pruned_oldest_first(tmp_path: Path) -> None:
    """The database returns pins in any order; the in-memory order must be by expiry again."""
    clock = FakeClock()
    store = MemoryStore()
    now = clock.now()
    store.save_pins({"late": ("oa-1", now + 30_000), "early": ("oa-2", now + 10_000)}, [])
    engine = make_engine(clock, store)
    engine.restore(store.load())
    assert list(engine.pins) == ["early", "late"]
    clock.advance(20_000)
    engine.persist()
    assert list(engine.pins) == ["late"]


def test_a_pin_another_replica_made_is_adopted_unless_this_replicas_own_is_later() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    serve(engine, "s")  # oa-1, expires at now + TTL
    mine = engine.pins["s"][1]
    engine.persist()
    engine.adopt_pin("s", "oa-2", mine - 1)  # an older pin elsewhere: ours stands
    assert engine.pins["s"] == ("oa-1", mine)
    engine.adopt_pin("s", "oa-2", mine + 1)  # a later one: the session moved
    pick = engine.select([GPT], session="s")
    assert isinstance(pick, Attempt) and pick.connection.spec.id == "oa-2" and pick.pinned_by_session
    engine.adopt_pin("s", "nowhere", mine + 2)  # a connection this replica does not know
    engine.adopt_pin("t", "oa-2", clock.now())  # already expired
    assert engine.pins["s"] == ("oa-2", mine + 1) and "t" not in engine.pins
    # Adopted pins are the fleet's: not this replica's to persist.
    assert engine._layers.pins.take_dirty() == ({}, [])


def test_a_preferred_connection_comes_before_priority_and_the_sessions_pin() -> None:
    """`prefer` (the connection that created the response a request continues) wins over a lower
    priority number and over the session's own pin; when it cannot serve, selection goes on as
    usual rather than fail."""
    clock = FakeClock()
    engine = make_engine(clock)
    serve(engine, "s")  # pinned to oa-1, the lower priority number
    attempt = engine.select([GPT], session="s", prefer="oa-2")
    assert isinstance(attempt, Attempt) and attempt.connection.id == "oa-2"
    engine.record(attempt, Outcome.ok())
    engine.connections["oa-2"].health.enabled = False  # the operator took it out of service
    attempt = engine.select([GPT], session="s", prefer="oa-2")
    assert isinstance(attempt, Attempt) and attempt.connection.id == "oa-1"
    engine.record(attempt, Outcome.ok())
    attempt = engine.select([GPT], prefer="gone")  # a connection no longer configured
    assert isinstance(attempt, Attempt) and attempt.connection.id == "oa-1"
