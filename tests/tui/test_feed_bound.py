"""The console feed's queue of unseen events is bounded, and a feed that overflowed while paused (or
behind a dialog) still shows exactly what a feed that never paused shows (issue #9, item 10).

Events and log lines are queued by the bus subscriber and the log handler and only drained by a
tick, which is skipped while the console is paused or a modal is open: an operator who pauses and
walks away must not make the process grow for as long as the proxy serves.
"""

from __future__ import annotations

import random
from typing import Any

from omniroute_tui.feed import HISTORY, PENDING_LIMIT, Feed
from proxy.resilience.lockout import LockoutSettings
from tests.tui.snapshot_app import SECOND, build_runtime


class _Owner:
    """Stands in for the app when the feed is driven by hand: swallows what it posts."""

    def post_message(self, message: object) -> bool:
        return True

    def call_later(self, callback: object) -> bool:
        return True


def _feed(runtime: Any) -> Feed:
    feed = Feed(_Owner(), runtime.read, url="http://test/v1", live=False)  # type: ignore[arg-type]
    feed.start()
    return feed


def test_a_paused_feed_stays_bounded_and_catches_up_exactly_when_resumed() -> None:
    runtime = build_runtime()
    engine = runtime.engine
    clock: Any = engine.clock
    paused, live = _feed(runtime), _feed(runtime)
    paused.paused = True
    settings = LockoutSettings(enabled=True)
    rng = random.Random(11)
    connections = list(engine.connections.values())
    high_water = 0
    for step in range(6 * PENDING_LIMIT):
        roll = rng.random()
        now = clock.now()
        if roll < 0.3:
            conn = rng.choice(connections)
            engine.lockouts.record_failure(
                conn.spec.provider, conn.spec.id, f"m{rng.randrange(40)}", now, settings,
                status=429, reason="rate_limited", hint_ms=rng.randrange(1, 600) * SECOND,
            )  # fmt: skip
        elif roll < 0.4 and len(engine.lockouts):
            provider, connection, model = rng.choice(engine.lockouts.keys())
            engine.reenable(provider, model, connection, source="test")
        elif roll < 0.8:
            paused.log("omniroute", "INFO", f"line {step}")
            live.log("omniroute", "INFO", f"line {step}")
        else:
            clock.advance(rng.randrange(1, 5) * SECOND)
        paused._tick()  # paused: builds nothing, drains nothing
        live.collect()
        high_water = max(high_water, len(paused._pending))

    assert high_water <= PENDING_LIMIT
    paused.paused = False
    resumed = paused.collect(force=True)
    assert resumed is not None
    live.collect(force=True)
    now = clock.now()
    # Every lockout is shown, including those whose events the bound dropped...
    assert [r.key for r in paused.lockouts.rows] == [r.key for r in live.lockouts.rows]
    assert [r.cells for r in paused.lockouts.rows] == [r.cells for r in live.lockouts.rows]
    assert len(paused.lockouts.rows) == len(engine.lockouts.active(now))
    # ...and the Events tab holds the same last HISTORY entries as a feed that never paused.
    assert len(paused.history) == HISTORY
    assert [e.row.cells for e in paused.history] == [e.row.cells for e in live.history]


def test_a_log_flood_from_another_thread_is_bounded_too() -> None:
    runtime = build_runtime()
    feed = _feed(runtime)
    feed.paused = True
    for i in range(10 * PENDING_LIMIT):
        feed.log("uvicorn.error", "WARNING", f"flood {i}")
    assert len(feed._pending) == PENDING_LIMIT
    feed.paused = False
    feed.collect(force=True)
    assert feed.history[-1].row.cells[-1].endswith(f"flood {10 * PENDING_LIMIT - 1}")


def test_lockouts_whose_events_were_dropped_still_show_after_the_overflow() -> None:
    """The few lockout events that the bound dropped cannot be replayed: the index reloads whole."""
    runtime = build_runtime()
    engine = runtime.engine
    feed = _feed(runtime)
    feed.collect(force=True)
    before = len(feed.lockouts.rows)
    feed.paused = True
    now = engine.clock.now()
    settings = LockoutSettings(enabled=True)
    for i in range(10):
        engine.lockouts.record_failure(
            "openai", "openai-main", f"new-{i}", now, settings,
            status=429, reason="rate_limited", hint_ms=600 * SECOND,
        )  # fmt: skip
    for i in range(2 * PENDING_LIMIT):  # pushes those ten events out of the queue
        feed.log("omniroute", "INFO", f"line {i}")
    feed.paused = False
    feed.collect(force=True)
    assert len(feed.lockouts.rows) == before + 10
    assert {f"new-{i}" for i in range(10)} <= {e.model for e, _ in feed.lockouts.entries.values()}
