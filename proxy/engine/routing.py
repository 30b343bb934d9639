"""Routing: which target and connection takes a request now, or why none can.

`select` is the hot path: it reads each layer's state through its own methods (lazy recovery
applies), takes the first target with an eligible connection and returns an `Attempt`; only when
nothing is eligible does `explain` walk the candidates again to say why, one `Skip` each. The rules:
docs/resilience.md#routing-and-fallback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.engine.decisions import Attempt, NoTarget, Skip
from proxy.engine.layers import EnginePart, Layers
from proxy.engine.specs import ConnectionRuntime, ProviderRuntime, Target
from proxy.resilience.breaker import Admission, BreakerState
from proxy.resilience.limiter import RequestLimiter
from proxy.resilience.lockout import NOT_FOUND

# How long a HALF_OPEN provider whose probe is in flight is expected to stay blocked, for the
# purpose of "when will something recover": the probe usually settles within a second or two.
PROBE_RECOVERY_ESTIMATE_MS = 1000.0


_REJECT, _PROBE = Admission.REJECT, Admission.PROBE  # (read once: see proxy.engine.outcomes)


class Routing(EnginePart):
    def __init__(self, layers: Layers) -> None:
        super().__init__(layers)
        self._round_robin: dict[str, int] = {}

    def select(
        self,
        targets: Sequence[Target],
        *,
        tried: Iterable[str] = (),
        session: str | None = None,
        prefer: str | None = None,
    ) -> Attempt | NoTarget:
        """Pick the first target with an eligible connection (docs/resilience.md#routing-and-fallback).

        Skips a provider whose breaker rejects, then picks a connection that is enabled, not
        cooling, not terminal and not locked for the model: the connection id `prefer` names (where
        the conversation a request continues lives) or else a live session pin first, then free
        concurrency slots, the lowest `priority`, the least recently used. `tried` holds
        connection ids this request already attempted.
        """
        now = self.clock.now()
        tried_set = set(tried) if tried else None
        lockouts = self.lockouts
        pinned: ConnectionRuntime | None = None
        pinned_id = prefer
        if pinned_id is None and session is not None:
            pinned_id = self.pins.connection_for(session, now)
        if pinned_id is not None:
            pinned = self.connections.get(pinned_id)
        for target in targets:
            provider = self.providers.get(target.provider)
            if provider is None:
                continue
            breaker = provider.breaker
            if not breaker.can_execute(now):
                continue
            model = target.model
            locked_keys = lockouts.keys_for_model(target.provider, model)
            best: ConnectionRuntime | None = None
            best_free = False
            best_priority = 0
            best_used = 0.0
            for conn in provider.connections:  # sorted by priority
                priority = conn.priority
                if best_free and pinned is None and priority > best_priority:
                    break  # nothing later can beat a free connection with a lower priority number
                cid = conn.id
                if target.connection_id is not None and cid != target.connection_id:
                    continue
                if tried_set is not None and cid in tried_set:
                    continue
                if not conn.health.is_eligible(now):
                    continue
                if locked_keys and lockouts.is_locked(target.provider, cid, model, now):
                    continue
                if conn is pinned:
                    best = conn
                    break
                sem = conn.semaphore
                free = sem is None or sem.has_free_slot()
                if (
                    best is None
                    or (free and not best_free)
                    or (
                        free == best_free
                        and (
                            priority < best_priority
                            or (priority == best_priority and conn.last_used < best_used)
                        )
                    )
                ):
                    best, best_free, best_priority, best_used = conn, free, priority, conn.last_used
            if best is None:
                continue
            admission = breaker.admit(now)
            if admission is _REJECT:
                continue
            best.in_flight += 1
            best.last_used = now
            if admission is _PROBE:
                return Attempt(target, provider, best, True, now, best is pinned, breaker.probe_ticket)
            return Attempt(target, provider, best, False, now, best is pinned)
        return NoTarget(tuple(self._explain(targets, tried_set or set(), now)))

    def explain(self, targets: Sequence[Target], tried: set[str]) -> list[Skip]:
        """Why each of `targets` (or one of its connections) cannot take a request now; `tried` holds
        the connection ids the request already attempted. For the request trail's skips."""
        return list(self._explain(targets, tried, self.clock.now()))

    def _explain(self, targets: Sequence[Target], tried: set[str], now: float) -> Iterable[Skip]:
        """The slow path: why each target was skipped (only computed when nothing was eligible)."""
        for target in targets:
            name = str(target)
            provider = self.providers.get(target.provider)
            if provider is None:
                yield Skip(name, None, "unknown_provider", None, False)
                continue
            state = provider.breaker.state(now)
            if state is BreakerState.OPEN:
                yield Skip(name, None, "circuit_open", now + provider.breaker.retry_after_ms(now), True)
                continue
            if state is BreakerState.HALF_OPEN and not provider.breaker.can_execute(now):
                yield Skip(name, None, "probe_in_flight", now + PROBE_RECOVERY_ESTIMATE_MS, True)
                continue
            candidates = [
                c
                for c in provider.connections
                if target.connection_id is None or c.spec.id == target.connection_id
            ]
            if not candidates:
                yield Skip(name, target.connection_id, "no_connection", None, False)
            for conn in candidates:
                cid = conn.spec.id
                status = conn.health.status(now)
                entry = self.lockouts.get(target.provider, cid, target.model)
                # What blocks a connection now matters more than whether this request tried it:
                # a connection that just failed and is cooling is worth waiting for.
                if status == "cooling":
                    yield Skip(name, cid, "cooling", conn.health.rate_limited_until, True)
                elif status != "active":
                    yield Skip(name, cid, status, None, False)
                elif entry is not None and entry.remaining_ms(now) > 0:
                    waitable = entry.reason not in (NOT_FOUND, "model_not_found", "quota")
                    yield Skip(name, cid, "locked", entry.expires_at, waitable, entry.reason)
                elif cid in tried:
                    yield Skip(name, cid, "already_tried", None, False)

    def order_targets(self, name: str, strategy: str, targets: Sequence[Target]) -> list[Target]:
        """Combo order for one request: as written (`priority`) or rotated (`round-robin`)."""
        if strategy != "round-robin" or len(targets) < 2:
            return list(targets)
        start = self._round_robin.get(name, 0) % len(targets)
        self._round_robin[name] = start + 1
        return [*targets[start:], *targets[:start]]

    def limiter_for(self, conn: ConnectionRuntime, provider: ProviderRuntime) -> RequestLimiter | None:
        """The request-queue limiter of a connection, if the limiter applies to it
        (docs/resilience.md#request-queue)."""
        enabled = provider.spec.rate_limit
        if enabled is None:
            # The class first: a provider of another class needs no look at the settings.
            enabled = (
                provider.spec.provider_class == "apikey"
                and self.settings.queue().auto_enable_api_key_providers
            )
        if not enabled:
            return None
        if conn.limiter is None:
            conn.limiter = RequestLimiter(self.settings.queue(), self.clock)
        return conn.limiter

    def still_eligible(self, attempt: Attempt) -> bool:
        """May an attempt that waited in its connection's request queue still be sent?

        Not when, while it waited, the connection started cooling or became terminal or disabled,
        its model was locked on it, or (unless it is the probe) its provider's breaker opened:
        `select` would not pick it now, and sending it would only add to what the upstream refuses.
        """
        now = self.clock.now()
        conn = attempt.connection
        if not conn.health.is_eligible(now):
            return False
        target = attempt.target
        if len(self.lockouts) and self.lockouts.is_locked(target.provider, conn.id, target.model, now):
            return False
        return attempt.probe or attempt.provider.breaker.state(now) is not BreakerState.OPEN
