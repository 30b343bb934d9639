"""An acknowledged settings change survives a restart, however many arrive at once (issue #9, item 7).

`PATCH /api/resilience` promises "on disk before the answer". Concurrent PATCHes to different keys
must all be on disk after a restart, in the order they were applied; a write that fails must leave
the live settings as they were and answer a JSON 500 that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.config import load_config
from proxy.resilience.clock import FakeClock
from proxy.resilience.events import Event
from proxy.runtime import SETTINGS_TRIES, Runtime
from proxy.settings import ORDER_RULES, SCHEMA, SECTIONS, FieldSpec, StaleSettingsChange
from proxy.store import MemoryStore, StoreError
from tests.fakes import FakeUpstream
from tests.integration.conftest import Instance
from tests.two_providers import config_text

_ORDERED = {path for rule in ORDER_RULES for path in (rule.low, rule.high)}
# Every integer leaf that no cross-field rule ties to another: each can change on its own, so the
# PATCHes of one round are independent and all of them must be accepted.
_INDEPENDENT: list[FieldSpec] = [
    spec
    for spec in SCHEMA
    if spec.kind == "int" and spec.path not in _ORDERED and spec.path.split(".")[0] in SECTIONS["resilience"]
]
ROUNDS = 6


def _nest(path: str, value: object) -> dict[str, Any]:
    *parents, leaf = path.split(".")
    doc: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        doc = {part: doc}
    return doc


def _get(doc: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        doc = doc[part]
    return doc


def _value(spec: FieldSpec, round_: int) -> int:
    assert spec.min is not None and spec.max is not None
    return spec.min + 1 + round_  # in range for every independent field, and new each round


async def _patch_all_at_once(url: str, round_: int) -> dict[str, int]:
    """One PATCH per key, all in flight together on their own connections; returns what was acknowledged."""
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:

        async def one(spec: FieldSpec) -> tuple[str, int, httpx.Response]:
            value = _value(spec, round_)
            response = await client.patch("/api/resilience", json=_nest(spec.path, value))
            return spec.path, value, response

        results = await asyncio.gather(*(one(spec) for spec in _INDEPENDENT))
    acknowledged = {}
    for path, value, response in results:
        assert response.status_code == 200, response.text
        acknowledged[path] = value
    return acknowledged


def test_every_acknowledged_concurrent_patch_survives_a_restart(
    make_instance: Callable[..., Instance],
) -> None:
    assert len(_INDEPENDENT) >= 19
    proxy = make_instance()
    for round_ in range(ROUNDS):
        assert proxy.server is not None
        acknowledged = asyncio.run(_patch_all_at_once(proxy.server.url, round_))

        proxy.restart()  # a new Runtime on the same SQLite file: only what is on disk comes back

        document = proxy.get("/api/resilience").json()
        lost = {path: (value, _get(document, path)) for path, value in acknowledged.items()
                if _get(document, path) != value}  # fmt: skip
        assert not lost, f"round {round_}: acknowledged but lost after a restart: {lost}"


def test_a_failed_write_changes_nothing_and_answers_500_with_the_reason(
    proxy: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = proxy.runtime
    assert runtime is not None
    before = proxy.get("/api/resilience").json()
    events: list[Event] = []
    runtime.bus.subscribe(events.append)

    def broken(document: object) -> None:
        raise StoreError("state.db: cannot save settings (disk I/O error)")

    monkeypatch.setattr(runtime.store, "save_settings", broken)
    response = proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 60000}})

    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "settings_not_saved"
    assert error["type"] == "server_error"
    assert "disk I/O error" in error["message"]
    assert "Traceback" not in response.text
    # Memory is unchanged: the API, the typed views and the event log all still show the old value.
    assert proxy.get("/api/resilience").json() == before
    assert runtime.settings.session_ttl_ms() == 0
    assert [e for e in events if e.layer == "settings"] == []

    # The same change goes through once the disk works again, and is then on disk.
    monkeypatch.undo()
    assert proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 60000}}).status_code == 200
    proxy.restart()
    assert proxy.get("/api/resilience").json()["sessionAffinity"] == {"ttlMs": 60000}


def test_a_change_that_meets_a_newer_document_on_every_try_answers_409_and_changes_nothing(
    proxy: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet replica whose settings version disagreed with Redis's for good (found by a trial:
    Redis restarted empty) merged and wrote again for ever, holding the settings lock: that PATCH
    and every later one never answered. The tries are bounded."""
    runtime = proxy.runtime
    assert runtime is not None
    before = proxy.get("/api/resilience").json()
    tries: list[object] = []

    def always_stale(document: object) -> None:
        tries.append(document)
        raise StaleSettingsChange("another replica changed the settings meanwhile")

    monkeypatch.setattr(runtime.store, "save_settings", always_stale)
    response = proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 60000}})

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "settings_conflict" and "nothing changed" in error["message"]
    assert len(tries) == SETTINGS_TRIES
    assert proxy.get("/api/resilience").json() == before
    monkeypatch.undo()  # the lock was let go: the next change goes through
    assert proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 60000}}).status_code == 200


def test_a_failed_reset_changes_nothing(proxy: Instance, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = proxy.runtime
    assert runtime is not None
    ok = proxy.send("PATCH", "/api/resilience", {"providerBreaker": {"local": {"resetTimeoutMs": 5000}}})
    assert ok.status_code == 200
    before = runtime.settings.document()

    def broken(document: object) -> None:
        raise StoreError("state.db: cannot save settings (database is locked)")

    monkeypatch.setattr(runtime.store, "save_settings", broken)

    async def reset() -> None:
        with pytest.raises(StoreError, match="database is locked"):
            await runtime.reset_settings_section("providerBreaker")

    asyncio.run(reset())
    assert runtime.settings.document() == before


def test_a_change_that_slips_in_during_the_write_is_merged_not_lost(tmp_path: Path) -> None:
    """A memory-only `Settings.patch` that lands while a PATCH is being written makes the prepared
    change stale: it is merged again onto the newer version and written again, so both survive."""
    config_path = tmp_path / "config.toml"
    config_path.write_text(config_text(FakeUpstream.refused_url(), FakeUpstream.refused_url(), None))
    config_path.chmod(0o600)
    store = MemoryStore()
    runtime = Runtime(load_config(config_path, {}, explicit=True), store, clock=FakeClock(), env={})
    writes: list[dict[str, Any]] = []
    real_save = store.save_settings

    def save(document: dict[str, Any]) -> None:
        writes.append(document)
        real_save(document)
        if len(writes) == 1:  # the first write is in progress: another writer gets in first
            runtime.settings.patch({"requestQueue": {"maxQueueDepth": 7}}, "resilience")

    store.save_settings = save  # type: ignore[method-assign]
    result = asyncio.run(runtime.patch_settings({"sessionAffinity": {"ttlMs": 5000}}, "resilience"))

    assert len(writes) == 2
    assert result["sessionAffinity"] == {"ttlMs": 5000}
    assert result["requestQueue"]["maxQueueDepth"] == 7
    stored = store.load().settings
    assert stored is not None
    assert stored["sessionAffinity"] == {"ttlMs": 5000}
    assert stored["requestQueue"]["maxQueueDepth"] == 7
    store.close()
