"""Shared state another writer broke (a hand-edited key, another program under the same prefix, a
Redis restored from a bad dump).

A replica starting on it refuses to start, as with a bad row in a state file, in one line that
names the Redis key to delete (the CLI's exit 2, never an "unexpected error"), and the fleet's
other records are untouched. Running replicas read such a key as absent, say so in the log, and
go on: no heartbeat, probe or document of theirs depends on what another writer left."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import load_config
from proxy.fleet.backend import FleetUnavailable
from proxy.runtime import Runtime
from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import REDIS_URL, Fleet, require_redis, wait_for
from tests.fleet.test_overlap import CONFIG
from tests.fleet.test_redis_away import NO_WAITING


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Any, str, Callable[[], Runtime]]]:
    redis = require_redis()
    prefix = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
    path = tmp_path / "r.toml"
    path.write_text(CONFIG.format(port=1, url=REDIS_URL, prefix=prefix))

    def open_replica() -> Runtime:
        return Runtime.open(load_config(path, {}, explicit=True), tmp_path / "unused.db")

    try:
        yield redis, prefix, open_replica
    finally:
        keys = list(redis.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis.delete(*keys)


@pytest.mark.parametrize(
    ("key", "write"),
    [
        pytest.param(
            "b:keys", lambda r, k: r.hset(k, mapping={"v": 3, "r": "{not json"}), id="record-not-json"
        ),
        pytest.param(
            "c:key-1", lambda r, k: r.hset(k, mapping={"v": "x", "r": "{}"}), id="version-not-a-number"
        ),
        pytest.param("b:keys", lambda r, k: r.set(k, "a string"), id="wrong-type"),
        pytest.param(
            "settings", lambda r, k: r.hset(k, mapping={"v": 2, "r": "[1,"}), id="settings-not-json"
        ),
        pytest.param(
            "b:keys", lambda r, k: r.hset(k, mapping={"v": 3, "r": '{"state": "WEIRD"}'}), id="unknown-state"
        ),
    ],
)
def test_a_key_no_replica_can_read_is_named_and_the_replica_does_not_start(
    shared: tuple[Any, str, Callable[[], Runtime]], key: str, write: Callable[[Any, str], object]
) -> None:
    redis, prefix, open_replica = shared
    write(redis, prefix + key)
    with pytest.raises(FleetUnavailable) as refused:
        open_replica()
    message = str(refused.value)
    assert f"{prefix}{key}" in message and "unused.db" not in message, message
    assert "delete" in message


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param("[1]", id="not-an-object"),
        pytest.param('{"fingerprint": "x", "items": [1]}', id="items-not-an-object"),
    ],
)
def test_a_fleet_config_another_writer_broke_is_named_at_start(
    shared: tuple[Any, str, Callable[[], Runtime]], stored: str
) -> None:
    """JSON of another shape ended the start in `unexpected error: AttributeError` (exit 1)."""
    redis, prefix, open_replica = shared
    redis.set(f"{prefix}replica:someone", '{"id": "someone"}', px=60_000)  # the fleet is live
    redis.set(f"{prefix}fleet:config", stored)
    with pytest.raises(FleetUnavailable) as refused:
        open_replica()
    assert f"{prefix}fleet:config" in str(refused.value) and "delete" in str(refused.value)


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param("this is not json", id="not-json"),
        pytest.param("[1]", id="not-an-object"),
        pytest.param(
            '{"id": "x", "address": "x", "startedAt": "x", "uptimeMs": Infinity, "inFlight": NaN,'
            ' "lastSeen": "x"}',
            id="not-json-numbers",
        ),
        pytest.param('{"id": "x", "inFlight": {"a": 1}}', id="wrong-fields"),
    ],
)
def test_a_replica_key_that_holds_no_heartbeat_stops_no_heartbeat_and_is_not_relayed(
    make_fleet: Callable[..., Fleet], redis_client: Any, prefix: str, stored: str
) -> None:
    """One such key ended every replica's heartbeat task, silently: within 5 s their own keys
    expired and the fleet looked empty (any config could join, the same id twice too). And a key
    with `Infinity` in it went out in every health document, which no JSON client can read."""
    fleet = make_fleet(2)
    a = fleet[0]
    intruder = f"{prefix}replica:intruder"
    redis_client.set(intruder, stored, px=60_000)
    mine = f"{prefix}replica:replica-a"
    for beat in range(3):  # a live replica rewrites its key every second (its lastSeen changes)
        seen = redis_client.get(mine)
        wait_for(lambda s=seen: redis_client.get(mine) not in (None, s), 3, f"heartbeat {beat + 1}")
    body = a.client.get("/api/monitoring/health").text
    assert "Infinity" not in body and "NaN" not in body
    replicas = json.loads(body)["fleet"]["replicas"]
    assert [r["id"] for r in replicas] == ["replica-a", "replica-b"]
    assert all(set(r) == {"id", "address", "startedAt", "uptimeMs", "inFlight", "lastSeen"} for r in replicas)
    assert a.log.read_text().count(f"{intruder} is not a replica's heartbeat") == 1


def test_statistics_another_writer_published_are_not_summed(
    make_fleet: Callable[..., Fleet], redis_client: Any, prefix: str
) -> None:
    """`/api/stats?scope=fleet` sums what the live replicas publish: another writer's windows (not
    numbers, not JSON numbers) are left out as missing, never summed into a 500."""
    fleet = make_fleet(1)
    a = fleet[0]
    redis_client.set(
        f"{prefix}replica:intruder",
        json.dumps(
            {
                "id": "intruder",
                "address": "x",
                "startedAt": "x",
                "uptimeMs": 1,
                "inFlight": 0,
                "lastSeen": "x",
            }
        ),
        px=60_000,
    )
    for windows in ('{"5m": {"alpha-1": ["x"]}}', '{"5m": {"alpha-1": [NaN]}}', '{"5m": 7}', "[]"):
        redis_client.set(f"{prefix}stats:intruder", f'{{"at": 1e300, "windows": {windows}}}', px=60_000)
        answer = a.client.get("/api/stats", params={"scope": "fleet"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["replicas"]["missing"] == ["intruder"], windows


def test_a_probe_lease_that_could_never_expire_is_taken_over(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str], redis_client: Any, prefix: str
) -> None:
    """A `probe:<provider>` key without a TTL (another writer's `SET` without `PX`) is no lease:
    every replica found it taken for ever, and the provider stayed out of service fleet-wide."""
    fake, _ = upstream
    fleet = make_fleet(1, disable_cooling=True)
    a = fleet[0]
    fleet.configure({**NO_WAITING, "providerBreaker": {"local": {"resetTimeoutMs": 1000}}})
    fake.default(Reply("error", status=503))
    a.chat()
    wait_for(lambda: a.breaker()["state"] == "OPEN", 1, "OPEN")
    lease = f"{prefix}probe:alpha"
    redis_client.set(lease, "someone-else:1")  # no PX
    fake.default(Reply("json"))
    wait_for(lambda: a.breaker()["state"] == "HALF_OPEN", 3, "the reset timeout elapsed")
    wait_for(lambda: a.chat().status_code == 200, 3, "a probe is sent", step=0.1)
    a.logged(f"{lease} held a probe lease that could never expire; taken over")


def test_a_replica_key_that_never_expires_does_not_hold_the_fleet_to_its_old_config(
    shared: tuple[Any, str, Callable[[], Runtime]], caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet moves to a new config by stopping every replica, changing the file and starting them
    again: a replica starts on it when no replica is alive. A `replica:*` key without a TTL (another
    writer's: a heartbeat always expires) made the fleet look alive for ever, and every start was
    refused for a config mismatch that named the items, never the key."""
    redis, prefix, open_replica = shared
    redis.set(f"{prefix}replica:ghost", json.dumps({"id": "ghost"}))  # no PX
    redis.set(f"{prefix}fleet:config", json.dumps({"fingerprint": "the old config", "items": {}}))
    runtime = open_replica()
    runtime.store.close()
    assert f"{prefix}replica:ghost never expires" in caplog.text
    assert json.loads(redis.get(f"{prefix}fleet:config"))["fingerprint"] != "the old config"
