"""The live stream's hub without a server: what it computes for the kinds its clients asked for."""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy import stream
from proxy import trail as trail_module
from proxy.readmodel import LockoutView, RequestView
from proxy.runtime import Runtime
from proxy.trail import RequestRecord
from tests.tui.snapshot_app import build_runtime


def finish(runtime: Runtime, count: int) -> list[str]:
    """`count` requests that begin and end now; their ids."""
    trail = runtime.trail
    assert trail is not None
    ids = []
    for n in range(count):
        record = trail.begin(f"fresh-{n}", "127.0.0.1", "chat/completions")
        trail.end(record, 200)
        ids.append(record.id)
    return ids


class ViewCount:
    """Counts the request views built from now on: an alive record's (`RequestRecord.view`) and a
    finished one's (`proxy.trail.finished_view`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built = 0
        view = RequestRecord.view
        view_finished = trail_module.finished_view

        def counted(record: RequestRecord, now: float | None = None) -> RequestView:
            self.built += 1
            return view(record, now)

        def counted_finished(kept: trail_module.Finished) -> RequestView:
            self.built += 1
            return view_finished(kept)

        monkeypatch.setattr(RequestRecord, "view", counted)
        monkeypatch.setattr(trail_module, "finished_view", counted_finished)


def kinds_of(wire: list[bytes]) -> list[str]:
    return [
        line.split(b": ", 1)[1].decode()
        for chunk in wire
        for line in chunk.split(b"\n")
        if line.startswith(b"event:")
    ]


async def drain(messages: object, count: int) -> list[bytes]:
    """The next `count` SSE messages (one write may carry several)."""
    got: list[bytes] = []
    while len(got) < count:
        chunk = await asyncio.wait_for(messages.__anext__(), 1)  # type: ignore[attr-defined]
        got.extend(m + b"\n\n" for m in chunk.split(b"\n\n") if m)
    assert len(got) == count, f"{len(got)} messages, expected {count}"
    return got


async def test_finished_records_are_sent_newest_first_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "REQUESTS_PER_TICK", 2)
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"request"}))
    await drain(messages, 2)  # retry, snapshot
    ids = finish(runtime, 5)
    views = ViewCount(monkeypatch)
    hub._poll_requests()  # one tick's worth, at once
    assert views.built == 2  # views (and their JSON) only for what is sent, not for the three older ones
    sent = await drain(messages, 2)
    assert kinds_of(sent) == ["request", "request"]
    assert [json.loads(chunk.split(b"data: ", 1)[1])["id"] for chunk in sent] == ids[-2:]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(messages.__anext__(), 0.3)  # the three older ones are not sent
    await messages.aclose()
    hub.close()


async def test_a_client_gets_only_the_kinds_it_asked_for_and_nothing_is_read_for_the_others() -> None:
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"event"}))
    await drain(messages, 2)  # retry, snapshot
    assert hub._requests_due is None and hub._counters_due is None  # the trail is never read
    finish(runtime, 3)
    runtime.engine.reset_breakers(None, source="test")  # an operator event, and breaker rows
    hub.flush()
    got: list[bytes] = []
    with pytest.raises(TimeoutError):
        while True:
            got.append(await asyncio.wait_for(messages.__anext__(), 0.3))
    assert got and set(kinds_of(got)) == {"event"}  # breaker events and the operator's; no state, no request
    await messages.aclose()
    hub.close()


async def test_counters_come_once_a_second_to_who_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "COUNTERS_S", 0.05)
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"counters"}))
    await drain(messages, 2)
    [chunk] = await drain(messages, 1)
    assert kinds_of([chunk]) == ["counters"]
    data = json.loads(chunk.split(b"data: ", 1)[1])
    assert data == runtime.read.counters_api()
    assert set(data) == {"uptimeMs", "requests", "lockoutTable", "stateBackend"}
    await messages.aclose()
    hub.close()


async def test_a_long_queue_goes_out_in_batches_with_the_loop_served_between() -> None:
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"event"}))
    await drain(messages, 2)  # retry, snapshot
    for n in range(2 * stream.WRITE_BATCH + 3):
        hub._publish("event", lambda n=n: {"n": n})
    first = await asyncio.wait_for(messages.__anext__(), 1)
    served: list[str] = []
    asyncio.get_running_loop().call_soon(served.append, "other work")
    second = await asyncio.wait_for(messages.__anext__(), 1)
    assert served == ["other work"]  # it ran before the second batch was encoded
    third = await asyncio.wait_for(messages.__anext__(), 1)
    sizes = [chunk.count(b"event: event") for chunk in (first, second, third)]
    assert sizes == [stream.WRITE_BATCH, stream.WRITE_BATCH, 3]
    await messages.aclose()
    hub.close()


async def test_a_client_is_pinged_after_ping_s_of_silence_and_not_before() -> None:
    """One timer checks every client's silence (no timeout per wait); the checks are driven here."""
    runtime = build_runtime()
    hub = runtime.stream
    quiet = hub.messages(None, frozenset({"settings"}))
    busy = hub.messages(None, frozenset({"event"}))
    await drain(quiet, 2)  # retry, snapshot
    await drain(busy, 2)
    for _ in range(stream.PING_CHECKS - 1):
        hub._silences()
    hub._publish("event", lambda: {"n": 1})
    assert kinds_of(await drain(busy, 1)) == ["event"]
    hub._silences()  # PING_S of silence for `quiet`; a fraction of it for `busy`
    assert kinds_of(await drain(quiet, 1)) == ["ping"]
    pending = asyncio.ensure_future(busy.__anext__())  # type: ignore[attr-defined]
    for _ in range(10):
        await asyncio.sleep(0)  # the loop's turns: nothing to send `busy` yet
    assert not pending.done()
    for _ in range(stream.PING_CHECKS - 1):
        hub._silences()
    assert kinds_of([await asyncio.wait_for(pending, 1)]) == ["ping"]
    for messages in (quiet, busy):
        await messages.aclose()
    hub.close()


async def test_a_ping_never_carries_an_id_ahead_of_a_message_still_to_be_sent() -> None:
    """A client resuming from a ping's id is sent only what came after it: so a ping that falls
    due while messages wait for this client must come after them, not be numbered past them."""
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"event"}))
    await drain(messages, 2)  # retry, snapshot
    for n in range(2 * stream.WRITE_BATCH):
        hub._publish("event", lambda n=n: {"n": n})
    chunks = [await asyncio.wait_for(messages.__anext__(), 1)]  # the first batch is out
    hub._publish("event", lambda: {"n": "late"})  # queued while the batches are written
    for _ in range(stream.PING_CHECKS):
        hub._silences()  # and a ping falls due meanwhile
    while b"event: ping" not in chunks[-1]:
        chunks.append(await asyncio.wait_for(messages.__anext__(), 1))
    ids = [
        int(line.rsplit(b"-", 1)[1])
        for chunk in chunks
        for line in chunk.split(b"\n")
        if line.startswith(b"id: ")
    ]
    assert ids == sorted(ids), ids
    assert b'"late"' in b"".join(chunks)  # sent before the ping that says it was
    await messages.aclose()
    hub.close()


def test_a_snapshot_builds_views_only_of_the_records_it_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """An attach is served on the proxy's loop: a snapshot views the SNAPSHOT_REQUESTS newest
    finished records it carries and the alive ones, not the whole ring (2,000 by default)."""
    monkeypatch.setattr(stream, "SNAPSHOT_REQUESTS", 3)
    runtime = build_runtime()
    ids = finish(runtime, 10)
    trail = runtime.trail
    assert trail is not None
    trail.begin("still-running", "127.0.0.1", "chat/completions")
    alive = set(trail.alive)
    views = ViewCount(monkeypatch)
    requests = runtime.stream.snapshot_data()["requests"]
    assert [r["id"] for r in requests["recent"]] == ids[-3:]  # the newest, oldest first
    assert {r["id"] for r in requests["alive"]} == alive
    assert views.built == 3 + len(alive)
    runtime.stream.close()


def test_a_snapshot_renders_each_lockout_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The health document a snapshot carries lists the lockouts its `lockouts` lists: one rendering
    serves both (it is the costliest part of a snapshot with many lockouts)."""
    runtime = build_runtime()
    running = len(runtime.read.lockouts(runtime.read.now()))
    assert running > 1
    rendered = 0
    to_api = LockoutView.to_api

    def counted(view: LockoutView, now: float) -> dict[str, object]:
        nonlocal rendered
        rendered += 1
        return to_api(view, now)

    monkeypatch.setattr(LockoutView, "to_api", counted)
    data = runtime.stream.snapshot_data()
    assert rendered == running
    assert data["lockouts"] == data["health"]["lockouts"] == runtime.read.lockouts_api()
    assert len(data["lockouts"]) == running
    runtime.stream.close()


async def test_a_client_owed_a_snapshot_costs_no_request_views_and_then_follows_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that stopped reading and overflowed its queue is owed a snapshot, which will say
    everything: while that is all it is owed, no record is viewed for it. Once it reads again it
    gets the snapshot, then the records that end after it."""
    monkeypatch.setattr(stream, "CLIENT_QUEUE", 2)
    runtime = build_runtime()
    hub = runtime.stream
    messages = hub.messages(None, frozenset({"request"}))
    await drain(messages, 2)  # retry, snapshot
    finish(runtime, 3)
    hub._poll_requests()  # three records for a queue of two: it overflows, a snapshot is owed
    ids = finish(runtime, 4)
    views = ViewCount(monkeypatch)
    hub._poll_requests()
    assert views.built == 0
    got = await drain(messages, 1)
    assert kinds_of(got) == ["snapshot"]
    recent = json.loads(got[0].split(b"data: ", 1)[1])["requests"]["recent"]
    assert [r["id"] for r in recent][-4:] == ids
    later = finish(runtime, 1)
    hub._poll_requests()
    got = await drain(messages, 1)
    assert kinds_of(got) == ["request"]
    assert json.loads(got[0].split(b"data: ", 1)[1])["id"] == later[0]
    await messages.aclose()
    hub.close()
