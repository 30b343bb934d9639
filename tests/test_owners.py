"""The response-id -> connection memory of the Responses API follow-up routes (proxy/owners.py)."""

from __future__ import annotations

from proxy.owners import KEY_PREFIX, RESPONSE_TTL_MS, ResponseOwners
from proxy.resilience.clock import FakeClock
from proxy.store import MemoryStore

CONNECTIONS = {"conn-a": object(), "conn-b": object()}


def test_an_id_is_remembered_for_24_hours_then_forgotten() -> None:
    clock = FakeClock()
    owners = ResponseOwners(clock, MemoryStore())
    owners.remember("resp_1", "conn-a")
    clock.advance(RESPONSE_TTL_MS - 1)
    assert owners.owner("resp_1") == "conn-a"
    clock.advance(1)
    assert owners.owner("resp_1") is None
    assert owners.owner("resp_never") is None


def test_entries_persist_in_the_pins_table_apart_from_session_pins() -> None:
    clock = FakeClock()
    store = MemoryStore()
    owners = ResponseOwners(clock, store)
    owners.remember("resp_1", "conn-a")
    owners.remember("resp_2", "conn-gone")
    owners.persist()
    store.save_pins({"session-x": ("conn-b", clock.now() + 1000)}, [])

    pins = store.load().pins
    assert pins[KEY_PREFIX + "resp_1"] == ("conn-a", clock.now() + RESPONSE_TTL_MS)
    again = ResponseOwners(clock, store)
    again.take(pins, CONNECTIONS)
    assert pins == {"session-x": ("conn-b", clock.now() + 1000)}  # the engine gets only session pins
    assert again.owner("resp_1") == "conn-a"
    assert again.owner("resp_2") is None  # its connection is no longer configured
    again.persist()
    assert KEY_PREFIX + "resp_2" not in store.load().pins


def test_expired_entries_are_pruned_from_memory_and_the_store() -> None:
    clock = FakeClock()
    store = MemoryStore()
    owners = ResponseOwners(clock, store)
    owners.remember("resp_old", "conn-a")
    owners.persist()
    clock.advance(RESPONSE_TTL_MS)
    owners.remember("resp_new", "conn-b")
    owners.persist()
    assert len(owners) == 1
    assert set(store.load().pins) == {KEY_PREFIX + "resp_new"}


def test_the_table_has_a_ceiling_and_the_oldest_gives_way() -> None:
    clock = FakeClock()
    owners = ResponseOwners(clock, MemoryStore(), limit=3)
    for n in range(5):
        owners.remember(f"resp_{n}", "conn-a")
        clock.advance(1)
    owners.persist()
    assert len(owners) == 3
    assert owners.owner("resp_0") is None
    assert owners.owner("resp_4") == "conn-a"


def test_no_session_header_can_name_a_response_entry() -> None:
    # HTTP strips leading whitespace from header values, so no session key starts with a tab.
    assert KEY_PREFIX.startswith("\t")
