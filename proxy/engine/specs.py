"""What the engine is built from (a provider, a connection, a target) and what it holds for each.

`ProviderSpec` and `ConnectionSpec` come from the config; `ProviderRuntime` and `ConnectionRuntime`
are the engine's live record of each: the layers' objects (breaker, health, semaphore, limiter) and
the counters routing reads. The read model reads these; nothing outside the engine writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.cooldown import ConnectionHealth
from proxy.resilience.limiter import RequestLimiter
from proxy.resilience.outcome import ProviderClass
from proxy.resilience.restate import RestatementRule, rules_for
from proxy.resilience.semaphore import ConnectionSemaphore


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    id: str
    provider_class: ProviderClass
    per_model_quota: bool
    rate_limit: bool | None = None
    """None: follow `requestQueue.autoEnableApiKeyProviders` (on for apikey providers)."""
    restate: tuple[RestatementRule, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectionSpec:
    id: str
    provider: str
    name: str = ""
    priority: int = 100
    max_concurrent: int | None = None
    enabled: bool = True
    disable_cooling: bool = False
    fingerprint: str = ""
    """Changes when the credential changes; a changed credential clears a terminal state."""
    masked_key: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    provider: str
    model: str
    connection_id: str | None = None
    name: str = field(init=False, repr=False, compare=False)
    """`provider/model`, as `str()` writes it: made once, since every attempt writes it down (a
    `__str__` call and an f-string per read), while a target is made once per route."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"{self.provider}/{self.model}")

    def __str__(self) -> str:
        return self.name


class ConnectionRuntime:
    """Everything the engine tracks for one connection."""

    __slots__ = ("health", "id", "in_flight", "last_used", "limiter", "priority", "semaphore", "spec")

    def __init__(
        self, spec: ConnectionSpec, health: ConnectionHealth, semaphore: ConnectionSemaphore | None = None
    ) -> None:
        self.spec = spec
        self.id = spec.id
        self.priority = spec.priority
        self.health = health
        self.semaphore = semaphore
        self.limiter: RequestLimiter | None = None
        self.in_flight = 0
        self.last_used = 0.0

    def recheck(self) -> None:
        """Have what waits for this connection (a slot, a request-queue turn) ask whether it is
        still wanted: what no longer is leaves at once (Withdrawn)."""
        if self.semaphore is not None:
            self.semaphore.recheck()
        if self.limiter is not None:
            self.limiter.recheck()


class ProviderRuntime:
    __slots__ = ("breaker", "connections", "rules", "spec")

    def __init__(self, spec: ProviderSpec, breaker: CircuitBreaker) -> None:
        self.spec = spec
        self.breaker = breaker
        self.connections: list[ConnectionRuntime] = []
        self.rules = rules_for(spec.id, spec.restate)
