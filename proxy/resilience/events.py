"""State-change events and the one in-process bus that fans them out.

Every layer returns the events its transitions produce; the engine publishes them here. The TUI,
the management API (`GET /api/events`) and the log all read this bus, so they agree on what
happened and in which order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Literal

Layer = Literal["breaker", "connection", "lockout", "settings", "operator", "state"]
"""`state`: the shared state backend was lost or is back (docs/fleet.md#when-redis-is-away)."""


@dataclass(frozen=True, slots=True)
class Event:
    """`{ts, layer, key, from, to, reason}`; `seq` is stamped by the bus (0 until published)."""

    ts: float
    layer: Layer
    key: str
    from_: str
    to: str
    reason: str
    seq: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "layer": self.layer,
            "key": self.key,
            "from": self.from_,
            "to": self.to,
            "reason": self.reason,
        }


Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous fan-out plus a ring of the most recent events.

    Subscribers run inline on the publishing thread, so they must be cheap (append to a queue,
    set a dirty flag). A subscriber that raises breaks nothing: the error is swallowed so one
    bad observer cannot stall the request path.
    """

    def __init__(self, capacity: int = 1000) -> None:
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._subscribers: list[Subscriber] = []
        self._seq = 0

    @property
    def last_seq(self) -> int:
        return self._seq

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def publish(self, event: Event) -> None:
        self._seq += 1
        # The constructor, not dataclasses.replace (which costs twice as much): this runs for every
        # transition of every layer, twice per request in a flood of made-up model names.
        stamped = Event(event.ts, event.layer, event.key, event.from_, event.to, event.reason, self._seq)
        self._ring.append(stamped)
        for subscriber in tuple(self._subscribers):
            # An observer must never break the request path.
            with suppress(Exception):
                subscriber(stamped)

    def publish_all(self, events: list[Event]) -> None:
        for event in events:
            self.publish(event)

    def after(self, seq: int) -> list[Event]:
        """Events with a sequence number greater than `seq`, oldest first."""
        return [e for e in self._ring if e.seq > seq]
