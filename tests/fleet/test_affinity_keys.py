"""The fleet's shared pins and owners (proxy/fleet/affinity.py) in-process, on the real Redis: key
names, the order of one key's writes, a lookup that never waits long, and the write-back after an
outage. The replicas' view of the same is tests/fleet/test_affinity.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from proxy.fleet.affinity import LOOKUP_TIMEOUT_S, Affinity, id_key
from tests.fleet.conftest import REDIS_URL, TcpGate


def now() -> float:
    return time.time() * 1000


def affinity(prefix: str, client: Any, lost: list[BaseException] | None = None) -> Affinity:
    return Affinity(prefix, now, lambda: client, (lost if lost is not None else []).append)


def test_a_key_names_a_plain_id_as_is_and_any_other_by_its_hash() -> None:
    assert id_key("resp_abc-1.2:3") == "=resp_abc-1.2:3"
    for odd in ("a b", "x" * 129, "\u00fcber", "*", "", "a\nb", "=resp"):
        key = id_key(odd)
        assert key.startswith("#") and len(key) == 65 and key[1:].isalnum(), odd
    assert id_key("x" * 129) != id_key("x" * 130)


def test_one_keys_writes_land_in_the_order_they_were_made(redis_client: redis.Redis, prefix: str) -> None:
    async def main() -> None:
        client = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
        shared = affinity(prefix, client)
        key = shared.pin_key("s")
        for i in range(50):
            shared.write(key, f"conn-{i}", now() + 60_000, pin=True)
        await shared.settled([key])
        assert json.loads(await client.get(key))["c"] == "conn-49"
        assert 0 < await client.pttl(key) <= 60_000
        assert await shared.read(key) is not None and (await shared.read(key))[0] == "conn-49"  # type: ignore[index]
        await client.aclose()

    asyncio.run(main())


def test_a_pin_that_reaches_redis_after_a_later_one_does_not_replace_it(
    redis_client: redis.Redis, prefix: str
) -> None:
    """Two replicas pin one session at nearly the same time; the earlier pin's write is slower and
    lands second. Redis must keep the later pin, the one every replica's memory tier prefers."""

    async def main() -> None:
        client = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
        first, second = affinity(prefix, client), affinity(prefix, client)
        key = first.pin_key("s")
        made = now()
        second.write(key, "conn-later", made + 60_001, pin=True)
        await second.settled([key])
        first.write(key, "conn-earlier", made + 60_000, pin=True)
        await first.settled([key])
        assert json.loads(await client.get(key))["c"] == "conn-later"
        await client.aclose()

    asyncio.run(main())


def test_a_lookup_on_a_redis_that_does_not_answer_gives_up_quickly(
    gates: Callable[[int], TcpGate], prefix: str
) -> None:
    gate = gates(6379)

    async def main() -> None:
        client = aredis.Redis.from_url(gate.url, decode_responses=True, socket_timeout=5)
        await client.ping()
        gate.cut(drop=True)
        shared = affinity(prefix, client)
        start = time.monotonic()
        assert await shared.read(shared.pin_key("s")) is None
        assert time.monotonic() - start < LOOKUP_TIMEOUT_S + 0.2
        assert await affinity(prefix, None).read(shared.pin_key("s")) is None  # known away: at once
        await client.aclose()

    asyncio.run(main())


def test_what_was_made_while_away_is_written_back_unless_the_fleet_has_later(
    redis_client: redis.Redis, prefix: str
) -> None:
    async def main() -> None:
        client = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
        away: Any = None
        shared = Affinity(prefix, now, lambda: away, [].append)
        t = now()
        shared.write(shared.pin_key("mine"), "c-1", t + 60_000, pin=True)
        shared.write(shared.pin_key("theirs"), "c-1", t + 60_000, pin=True)
        shared.write(shared.owner_key("resp_1"), "c-1", t + 60_000, pin=False)
        shared.write(shared.owner_key("resp_2"), "c-1", t + 60_000, pin=False)
        # Meanwhile another replica pinned "theirs" later, and (impossibly, but say) knows resp_2.
        await client.set(shared.pin_key("theirs"), json.dumps({"c": "c-2", "e": t + 90_000}), px=90_000)
        await client.set(shared.owner_key("resp_2"), json.dumps({"c": "c-2", "e": t + 90_000}), px=90_000)
        away = client
        assert await shared.reconcile() == 2
        assert (await shared.read(shared.pin_key("mine")))[0] == "c-1"  # type: ignore[index]
        assert (await shared.read(shared.pin_key("theirs")))[0] == "c-2"  # type: ignore[index]
        assert (await shared.read(shared.owner_key("resp_1")))[0] == "c-1"  # type: ignore[index]
        assert (await shared.read(shared.owner_key("resp_2")))[0] == "c-2"  # type: ignore[index]
        assert await shared.reconcile() == 0  # written once
        await client.aclose()

    asyncio.run(main())


def test_a_lookup_cancelled_as_its_answer_arrives_stays_cancelled() -> None:
    """The request behind a lookup is cancelled (its client hung up) in the same turn of the loop
    as Redis answers. The lookup must end cancelled: Python 3.11's `asyncio.wait_for` returns the
    answer instead, and the request it belongs to goes on to an upstream nobody is waiting for."""

    async def main() -> None:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        class Answering:
            async def get(self, key: str) -> str:
                return await answer

        shared = affinity("omniroute:test:", Answering())
        lookup = asyncio.create_task(shared.read(shared.pin_key("s")))
        for _ in range(3):  # into the client's `get`
            await asyncio.sleep(0)
        assert not lookup.done()
        answer.set_result(json.dumps({"c": "conn-a", "e": now() + 60_000}))
        lookup.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lookup

    asyncio.run(main())
