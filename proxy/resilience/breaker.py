"""Provider circuit breaker: one per provider, skips a provider that keeps failing.

The rules: docs/resilience.md#provider-circuit-breaker.

CLOSED ─failures─▶ DEGRADED ─failures─▶ OPEN ─timeout─▶ HALF_OPEN ─probe ok─▶ CLOSED
   ▲                  │                   ▲                 │
   └────recovered─────┘                   └───probe failed──┘

The breaker never classifies: the caller reports only provider-level outcomes (see classify.py) and says
whether the request was the half-open probe. There is no timer and no lock: an OPEN breaker
becomes HALF_OPEN on the first read after its timeout (lazy recovery), and every method runs to
completion without awaiting, so concurrent asyncio tasks cannot interleave inside one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from proxy.resilience.events import Event
from proxy.resilience.outcome import PROVIDER_CLASSES, ProviderClass
from proxy.resilience.tunable import tunable


class BreakerState(Enum):
    CLOSED = "CLOSED"
    """Traffic flows."""
    DEGRADED = "DEGRADED"
    """Traffic flows, but failures are piling up."""
    OPEN = "OPEN"
    """Routing skips the provider until the effective reset timeout has elapsed."""
    HALF_OPEN = "HALF_OPEN"
    """One probe request at a time decides between CLOSED and OPEN."""


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    # Defaults differ by provider class: DEFAULT_BREAKER_POLICIES below.
    degradation_threshold: int = field(
        metadata=tunable(
            min=1, max=1000, help="Net failures that mark {a_who} provider DEGRADED (below failureThreshold)"
        )
    )
    failure_threshold: int = field(
        metadata=tunable(min=1, max=1000, help="Net failures that open {a_who} provider's breaker")
    )
    reset_timeout_ms: int = field(
        metadata=tunable(
            min=1000,
            max=86_400_000,
            help="How long an open {who} breaker blocks before a probe (x2 per cycle after 3, up to x16)",
        )
    )


DEFAULT_BREAKER_POLICIES: dict[ProviderClass, BreakerPolicy] = {
    "oauth": BreakerPolicy(degradation_threshold=5, failure_threshold=8, reset_timeout_ms=60_000),
    "apikey": BreakerPolicy(degradation_threshold=7, failure_threshold=12, reset_timeout_ms=30_000),
    "local": BreakerPolicy(degradation_threshold=1, failure_threshold=2, reset_timeout_ms=15_000),
}


class Admission(Enum):
    ALLOW = "allow"
    """CLOSED or DEGRADED: send normally."""
    PROBE = "probe"
    """HALF_OPEN: this request took the single probe slot; report it with `probe=breaker.probe_ticket`
    read right after `admit()`."""
    REJECT = "reject"
    """OPEN, or HALF_OPEN with the probe slot taken: skip the provider."""


@dataclass(frozen=True, slots=True)
class Transition:
    ts: float
    from_state: BreakerState
    to_state: BreakerState
    reason: str


HISTORY_SIZE = 20
MAX_TIMEOUT_MULTIPLIER_EXPONENT = 4  # ×16
CYCLES_AT_BASE_TIMEOUT = 3

_CLOSED = BreakerState.CLOSED
_DEGRADED = BreakerState.DEGRADED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_ALLOW, _PROBE, _REJECT = Admission.ALLOW, Admission.PROBE, Admission.REJECT


def _no_emit(event: Event) -> None:
    pass


def escalated_reset_timeout_ms(base_ms: float, open_cycles: int) -> float:
    """The reset timeout after `open_cycles` open cycles: cycles 1-3 use the profile's timeout;
    each further cycle doubles it, up to ×16."""
    exponent = min(MAX_TIMEOUT_MULTIPLIER_EXPONENT, max(0, open_cycles - CYCLES_AT_BASE_TIMEOUT))
    return float(base_ms * (1 << exponent))


class CircuitBreaker:
    __slots__ = (
        "_emit",
        "_open_until",
        "_probe_owner",
        "_probe_tickets",
        "_probe_until",
        "_state",
        "failure_count",
        "history",
        "last_failure_at",
        "last_transition_at",
        "open_cycle_count",
        "opened_at",
        "policy",
        "probe_timeout_ms",
        "provider",
        "provider_class",
    )

    def __init__(
        self,
        provider: str,
        provider_class: ProviderClass,
        policy: BreakerPolicy,
        *,
        probe_timeout_ms: float = 120_000,
        emit: Callable[[Event], None] = _no_emit,
    ) -> None:
        self.provider = provider
        self.provider_class: ProviderClass = provider_class
        self.policy = policy
        self.probe_timeout_ms = probe_timeout_ms
        self.failure_count = 0
        self.open_cycle_count = 0
        self.opened_at: float | None = None
        self.last_failure_at: float | None = None
        self.last_transition_at: float | None = None
        self.history: deque[Transition] = deque(maxlen=HISTORY_SIZE)
        self._emit = emit
        self._state = _CLOSED
        # Absolute deadlines, so the per-request checks are a single comparison.
        self._open_until = 0.0  # meaningful only while OPEN
        # The HALF_OPEN probe slot: held while `_probe_until` (a lease) is set and not past. The
        # slot belongs to one ticket: only the outcome of the request that holds that ticket
        # settles it, so a stale probe can never settle (or free) a newer probe's slot.
        self._probe_until: float | None = None
        self._probe_owner = 0  # the ticket of the probe that holds or last held the slot; 0 = none
        self._probe_tickets = 0

    # -- reads (each one applies lazy recovery) ------------------------------------------------

    def state(self, now: float) -> BreakerState:
        if self._state is _OPEN and now >= self._open_until:
            self._transition(now, _HALF_OPEN, "timeout_elapsed")
        return self._state

    def can_execute(self, now: float) -> bool:
        state = self._state
        if state is _CLOSED or state is _DEGRADED:  # (nothing for state() to move on: the usual case)
            return True
        state = self.state(now)
        if state is _HALF_OPEN:
            return self._probe_slot_free(now)
        return state is not _OPEN

    def retry_after_ms(self, now: float) -> float:
        if self.state(now) is _OPEN:
            return self._open_until - now
        return 0.0

    def effective_reset_timeout_ms(self) -> float:
        return escalated_reset_timeout_ms(self.policy.reset_timeout_ms, self.open_cycle_count)

    # -- the request path ------------------------------------------------------------------------

    def admit(self, now: float) -> Admission:
        state = self._state
        if state is _CLOSED or state is _DEGRADED:
            return _ALLOW
        if state is _OPEN:
            if now < self._open_until:
                return _REJECT
            self._transition(now, _HALF_OPEN, "timeout_elapsed")
        if self._probe_slot_free(now):
            self._probe_tickets += 1
            self._probe_owner = self._probe_tickets
            self._probe_until = now + self.probe_timeout_ms
            return _PROBE
        return _REJECT

    @property
    def probe_ticket(self) -> int:
        """The ticket of the probe `admit()` just let in (0 when no probe holds the slot)."""
        return self._probe_owner if self._probe_until is not None else 0

    def record_success(self, now: float, *, probe: int = 0) -> bool:
        """`probe`: the ticket of the request if it was admitted as the probe, else 0. Returns
        whether the breaker changed (a success on a closed breaker without failures does not)."""
        state = self._state
        if state is _CLOSED or state is _DEGRADED:
            if self.failure_count > 0:
                self.failure_count -= 1
                self._follow_count(now, "recovered")
                return True
            return False
        if self._owns_probe(probe):
            self.failure_count = 0
            self.open_cycle_count = 0
            self.opened_at = None
            self._free_probe()
            self._transition(now, _CLOSED, "probe_succeeded")
            return True
        # Otherwise a late answer of a request sent before the breaker opened, or of a probe that
        # lost its slot: it says nothing about the provider now, so it must not close the breaker.
        return False

    def record_failure(self, now: float, *, probe: int = 0) -> None:
        state = self._state
        if state is _CLOSED or state is _DEGRADED:
            self.failure_count += 1
            self.last_failure_at = now
            self._follow_count(now, "failures")
        elif self._owns_probe(probe):
            self.failure_count += 1
            self.last_failure_at = now
            self._open(now, "probe_failed")
        # Otherwise a late failure while OPEN/HALF_OPEN: it must neither extend the timeout nor
        # bump the cycle count, or a burst of in-flight failures would lengthen the outage.

    def release_probe(self, now: float, probe: int) -> None:
        """The probe ended without a verdict (disconnect, 4xx, local rejection): free its slot."""
        if self._owns_probe(probe):
            self._free_probe()

    def hold_probe(self, probe: int) -> None:
        """The probe waits in our own queues (its queue place, its connection's slot): its owner is
        alive and will settle it on every path, so the lease does not run out meanwhile."""
        if self._owns_probe(probe):
            self._probe_until = math.inf

    def renew_probe(self, now: float, probe: int) -> None:
        """A sign of life of the probe (dispatched, headers, a chunk relayed): its lease starts over.

        The lease (`probe_timeout_ms`, the upstream's first-byte timeout) only frees the slot of a
        probe that stopped making progress, so a long stream never lets a second probe in."""
        if self._owns_probe(probe):
            self._probe_until = now + self.probe_timeout_ms

    # -- operator and settings -------------------------------------------------------------------

    def reset(self, now: float, reason: str = "operator") -> None:
        self.state(now)  # an expired OPEN breaker is HALF_OPEN, and its event says so
        was_clean = self._state is _CLOSED and self.failure_count == 0 and self.open_cycle_count == 0
        self.failure_count = 0
        self.open_cycle_count = 0
        self.opened_at = None
        self._free_probe()
        if not was_clean:  # resetting a clean breaker changes nothing, so it says nothing
            self._transition(now, _CLOSED, reason)

    def set_policy(self, policy: BreakerPolicy, now: float) -> None:
        self.policy = policy
        if self._state is _CLOSED or self._state is _DEGRADED:
            self._follow_count(now, "policy_changed")
        elif self._state is _OPEN and self.opened_at is not None:
            self._open_until = self.opened_at + self.effective_reset_timeout_ms()
            self.state(now)  # a shortened timeout may already have elapsed

    # -- views -----------------------------------------------------------------------------------

    def to_record(self) -> dict[str, object]:
        # The raw state, not state(now): persistence must not trigger transitions. The deadline
        # is not stored; it is derived from opened_at and the policy in force at load time.
        return {
            "provider": self.provider,
            "provider_class": self.provider_class,
            "state": self._state.value,
            "failure_count": self.failure_count,
            "open_cycle_count": self.open_cycle_count,
            "opened_at": self.opened_at,
            "last_failure_at": self.last_failure_at,
            "last_transition_at": self.last_transition_at,
        }

    @classmethod
    def from_record(
        cls,
        record: Mapping[str, object],
        policy: BreakerPolicy,
        *,
        probe_timeout_ms: float = 120_000,
        emit: Callable[[Event], None] = _no_emit,
    ) -> CircuitBreaker:
        provider_class = _field(record, "provider_class")
        if provider_class not in PROVIDER_CLASSES:
            raise ValueError(f"unknown provider class {provider_class!r}")
        breaker = cls(
            _as_str(record, "provider"),
            provider_class,
            policy,
            probe_timeout_ms=probe_timeout_ms,
            emit=emit,
        )
        state = _as_str(record, "state")
        if state not in BreakerState.__members__:
            raise ValueError(f"unknown breaker state {state!r}")
        breaker._state = BreakerState(state)
        breaker.failure_count = _as_int(record, "failure_count")
        breaker.open_cycle_count = _as_int(record, "open_cycle_count")
        breaker.opened_at = _as_time(record, "opened_at")
        breaker.last_failure_at = _as_time(record, "last_failure_at")
        breaker.last_transition_at = _as_time(record, "last_transition_at")
        if breaker._state is _OPEN:
            if breaker.opened_at is None:
                raise ValueError("an OPEN breaker record needs opened_at")
            breaker._open_until = breaker.opened_at + breaker.effective_reset_timeout_ms()
        # A HALF_OPEN record comes back with its probe slot free: the probe died with the process.
        return breaker

    # -- shared state (several replicas, one breaker) -------------------------------------------

    def load_record(self, record: Mapping[str, object]) -> None:
        """Take the state of `record` (another replica's transition) in place; emits nothing.

        The probe slot this replica holds survives while the breaker stays HALF_OPEN (the probe
        is still ours to settle); any other state ends it. ValueError (nothing changes) for a bad
        record, as for `from_record`."""
        other = CircuitBreaker.from_record(record, self.policy, probe_timeout_ms=self.probe_timeout_ms)
        self._state = other._state
        self.failure_count = other.failure_count
        self.open_cycle_count = other.open_cycle_count
        self.opened_at = other.opened_at
        self.last_failure_at = other.last_failure_at
        self.last_transition_at = other.last_transition_at
        self._open_until = other._open_until
        if self._state is not _HALF_OPEN:
            self._free_probe()

    def hold_probe_elsewhere(self, until: float) -> None:
        """Another replica holds the fleet's probe until `until` (its lease): this one sends none
        meanwhile. Its outcome reaches this breaker as a state change, not through a ticket."""
        self._probe_until = until
        self._probe_owner = 0

    # -- internals -------------------------------------------------------------------------------

    def _probe_slot_free(self, now: float) -> bool:
        # A probe that stops making progress (a lost task) loses its slot when its lease runs
        # out, so the breaker cannot stay stuck in HALF_OPEN.
        return self._probe_until is None or now >= self._probe_until

    def _owns_probe(self, probe: int) -> bool:
        # The slot's owner is the last probe admitted; until another probe takes it, a lapsed
        # owner may still settle it (nobody else is probing), but a stale ticket never can.
        return probe != 0 and probe == self._probe_owner and self._state is _HALF_OPEN

    def _free_probe(self) -> None:
        self._probe_until = None
        self._probe_owner = 0

    def _follow_count(self, now: float, reason: str) -> None:
        """In CLOSED/DEGRADED the state is a function of the failure count."""
        count = self.failure_count
        if count >= self.policy.failure_threshold:
            self._open(now, reason)
        elif count >= self.policy.degradation_threshold:
            if self._state is not _DEGRADED:
                self._transition(now, _DEGRADED, reason)
        elif self._state is not _CLOSED:
            self._transition(now, _CLOSED, reason)

    def _open(self, now: float, reason: str) -> None:
        self.open_cycle_count += 1
        self.opened_at = now
        self._open_until = now + self.effective_reset_timeout_ms()
        self._free_probe()
        self._transition(now, _OPEN, reason)

    def _transition(self, now: float, to: BreakerState, reason: str) -> None:
        old = self._state
        self._state = to
        self.last_transition_at = now
        self.history.append(Transition(now, old, to, reason))
        self._emit(
            Event(ts=now, layer="breaker", key=self.provider, from_=old.value, to=to.value, reason=reason)
        )


def _field(record: Mapping[str, object], key: str) -> object:
    if key not in record:
        raise ValueError(f"breaker record has no {key!r}")
    return record[key]


def _as_str(record: Mapping[str, object], key: str) -> str:
    value = _field(record, key)
    if not isinstance(value, str):
        raise ValueError(f"breaker record field {key!r} must be a string, got {value!r}")
    return value


def _as_int(record: Mapping[str, object], key: str) -> int:
    value = _field(record, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"breaker record field {key!r} must be a non-negative integer, got {value!r}")
    return value


def _as_time(record: Mapping[str, object], key: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"breaker record field {key!r} must be epoch ms or null, got {value!r}")
    return float(value)
