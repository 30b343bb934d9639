"""The seam between the engine and a shared state backend (several replicas, one state).

The engine keeps deciding everything on its own in-memory layers (the memory tier: the request
path reads nothing else). With a shared backend attached (`Engine.shared`), it also hands the
backend each decision as an *operation*: a function that applies the same change to a layer
object. The backend re-applies that operation to the state it holds for the whole fleet, so a
decision made on a stale local view is re-decided on the current shared one (the optimistic
"compare version, retry on conflict" of docs/fleet.md), and the layers' own rules (anti-herd,
later deadline wins, one OPEN per cycle) hold fleet-wide without being written twice.

Nothing here knows how the state is shared: `proxy.fleet` implements this protocol on Redis.
Without a backend (`Engine.shared is None`, the SQLite default) none of this runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from proxy.resilience.classify import BreakerEffect

if TYPE_CHECKING:
    from proxy.engine import Attempt
    from proxy.resilience.breaker import CircuitBreaker
    from proxy.resilience.cooldown import ConnectionHealth
    from proxy.resilience.events import Event
    from proxy.resilience.lockout import LockoutTable

ConnectionOp = Callable[["ConnectionHealth"], object]
"""Applies one change to a connection's health (a success, a failure, a reset...)."""
LockoutOp = Callable[["LockoutTable"], object]
"""Applies one change to a lockout table that holds (at most) the one triple it concerns."""


class SharedState(Protocol):
    def publishes(self, event: Event) -> bool:
        """True when the backend delivers `event` to every replica's bus itself (through its change
        feed), so the engine must not publish it too; False when the engine publishes it as usual
        (a derived transition such as lazy recovery, or the backend is unreachable: fail-open)."""
        ...

    def breaker(self, provider: str, effect: BreakerEffect, now: float, *, probe: bool) -> None:
        """An outcome's effect on a provider's breaker; `probe`: the attempt was the HALF_OPEN probe.
        Called before the engine applies it locally."""
        ...

    def reset_breaker(self, provider: str, now: float) -> None:
        """An operator reset of one breaker. Called before the engine applies it locally."""
        ...

    def connection(self, connection_id: str, op: ConnectionOp, *, by_operator: bool = False) -> None:
        """A change to one connection's health. Called before the engine applies `op` locally.
        `by_operator`: an operator's reset, which clears what every outcome decided before it did,
        on any replica: one still on its way to the shared state may not undo it."""
        ...

    def lockout(self, key: tuple[str, str, str], op: LockoutOp, *, by_operator: bool = False) -> None:
        """A change to one (provider, connection, model) lockout. Called before the engine applies it.
        `by_operator`: an operator's re-enable, as for `connection`."""
        ...

    def probe_alive(self, provider: str) -> None:
        """The probe this replica holds made progress: its fleet-wide lease starts over."""
        ...

    async def take_probe(self, attempt: Attempt) -> bool:
        """Before an attempt admitted as the HALF_OPEN probe is sent: take the fleet's one probe.
        False: another replica holds it; the attempt is withdrawn and must not be sent."""
        ...

    def pinned(self, session: str, connection_id: str, expires_at: float) -> None:
        """A session was pinned (or refreshed) on this replica after a success (already applied
        locally): share it with the fleet at once. Never blocks: the write runs on its own."""
        ...

    async def refresh_pin(self, session: str) -> None:
        """Before a session's request is routed: take the fleet's current pin for it into the memory
        tier (`Engine.adopt_pin`), so that a session another replica moved is followed. Bounded by
        a short timeout; with the backend away the memory tier's pin stands (fail-open)."""
        ...

    async def settled(self, session: str | None, response_ids: Sequence[str] = ()) -> None:
        """Wait, briefly, until this replica's writes of `session`'s pin and of the owners of
        `response_ids` have reached the fleet: called before the answer that made them is
        complete, so the client's next request, on any replica, finds them."""
        ...


def apply_breaker_effect(breaker: CircuitBreaker, effect: BreakerEffect, now: float, ticket: int) -> None:
    """What `Engine.record` does to a breaker for one outcome (`ticket`: the probe's, else 0)."""
    if effect is BreakerEffect.SUCCESS:
        breaker.record_success(now, probe=ticket)
    elif effect is BreakerEffect.FAILURE:
        breaker.record_failure(now, probe=ticket)
    elif ticket:
        breaker.release_probe(now, ticket)


def reenable_op(key: tuple[str, str, str], now: float) -> LockoutOp:
    """The operator's re-enable of one triple, as an operation."""
    provider, connection_id, model = key
    return lambda table: table.reenable(provider, model, now, connection_id)
