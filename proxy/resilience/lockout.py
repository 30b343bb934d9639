"""Model lockout (resilience.md §3): one missing or quota-limited model must not take its connection down.

The scope is the triple provider:connection:model. A lock is a deadline, so recovery is lazy: once
`expires_at` has passed the triple is eligible again without any timer. The entry itself stays in
the table after it expires, because its failure count and timestamps decide whether the next
failure escalates; it leaves on success decay, on an operator re-enable, or when a full table
prunes it. The table never classifies: the caller decides that an outcome locks (section 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from proxy.resilience.events import Event
from proxy.resilience.timefmt import iso

DEFAULT_LOCKOUT_ERROR_CODES: tuple[int, ...] = (403, 404, 429, 502, 503, 504)
ESCALATION_GRACE_MS = 30 * 60 * 1000
MAX_LOCKOUT_ENTRIES = 10_000
NOT_FOUND = "not_found"
"""The classifier's reason for a 404: the model is not served, whatever name the client chose."""

LOCKED = "locked"
UNLOCKED = "unlocked"


@dataclass(frozen=True, slots=True)
class LockoutSettings:
    """The Model Lockout card. Validation of the accepted ranges belongs to the settings layer."""

    enabled: bool = False
    error_codes: tuple[int, ...] = DEFAULT_LOCKOUT_ERROR_CODES
    """An empty tuple means the default list."""
    base_cooldown_ms: int = 120_000
    max_cooldown_ms: int = 1_800_000
    max_backoff_steps: int = 10
    use_exponential_backoff: bool = True

    def counts(self, status: int) -> bool:
        """Does this status lock the triple? Only when the master switch is on and it is listed."""
        return self.enabled and status in (self.error_codes or DEFAULT_LOCKOUT_ERROR_CODES)

    def cooldown_ms(self, failure_count: int, hint_ms: float | None = None) -> float:
        """Lock length for the `failure_count`-th failure in a row (1-based); an exact hint wins."""
        if hint_ms is not None:
            return float(min(max(hint_ms, 0.0), self.max_cooldown_ms))
        if not self.use_exponential_backoff:
            return float(min(self.base_cooldown_ms, self.max_cooldown_ms))
        exponent = min(max(failure_count - 1, 0), self.max_backoff_steps)
        return float(min(self.base_cooldown_ms * (1 << exponent), self.max_cooldown_ms))


@dataclass(slots=True)
class LockoutEntry:
    provider: str
    connection_id: str
    model: str
    reason: str
    """not_found, rate_limited, forbidden, server_error, quota... (the classifier's word)."""
    status: int | None
    """The last upstream status that locked it (None for a network error or a stall)."""
    failure_count: int
    locked_at: float
    expires_at: float
    last_cooldown_ms: float
    last_failure_at: float

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.connection_id}:{self.model}"

    def is_locked(self, now: float) -> bool:
        return now < self.expires_at

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.expires_at - now)

    def to_api(self, now: float) -> dict[str, object]:
        return {
            "provider": self.provider,
            "connectionId": self.connection_id,
            "model": self.model,
            "reason": self.reason,
            "status": self.status,
            "failureCount": self.failure_count,
            # Rounded up: a triple that is still locked never advertises 0 ms.
            "remainingMs": math.ceil(self.remaining_ms(now)),
            "lockedAt": iso(self.locked_at),
            "expiresAt": iso(self.expires_at),
        }

    def to_record(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "connection_id": self.connection_id,
            "model": self.model,
            "reason": self.reason,
            "status": self.status,
            "failure_count": self.failure_count,
            "locked_at": self.locked_at,
            "expires_at": self.expires_at,
            "last_cooldown_ms": self.last_cooldown_ms,
            "last_failure_at": self.last_failure_at,
        }

    @classmethod
    def from_record(cls, r: Mapping[str, object]) -> LockoutEntry:
        status = r.get("status")
        if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
            raise ValueError(f"lockout record field 'status' must be an integer or null, got {status!r}")
        return cls(
            provider=_as_str(r, "provider"),
            connection_id=_as_str(r, "connection_id"),
            model=_as_str(r, "model"),
            reason=_as_str(r, "reason"),
            status=status,
            failure_count=_as_count(r, "failure_count"),
            locked_at=_as_ms(r, "locked_at"),
            expires_at=_as_ms(r, "expires_at"),
            last_cooldown_ms=_as_ms(r, "last_cooldown_ms"),
            last_failure_at=_as_ms(r, "last_failure_at"),
        )


# Tuples, not "p:c:m" strings: model names contain colons ("llama3:8b"), so joined keys can collide.
_Key = tuple[str, str, str]
_Pair = tuple[str, str]


def _no_emit(event: Event) -> None:
    pass


class LockoutTable:
    """Every lockout, with per-connection and per-model indexes so no request path scans the table."""

    __slots__ = ("_by_connection", "_by_model", "_emit", "_entries", "_max_entries", "_prunable_after")

    def __init__(
        self, *, max_entries: int = MAX_LOCKOUT_ENTRIES, emit: Callable[[Event], None] = _no_emit
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._emit = emit
        self._entries: dict[_Key, LockoutEntry] = {}
        self._by_connection: dict[_Pair, set[_Key]] = {}
        self._by_model: dict[_Pair, set[_Key]] = {}
        # A lower bound on the earliest expires_at in the table: before it, a full table holds
        # only active locks, so there is nothing to prune and no point scanning.
        self._prunable_after = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[str, str, str]]:
        """Every (provider, connection_id, model) in the table, expired ones included; a snapshot."""
        return list(self._entries)

    # -- the request path ------------------------------------------------------------------------

    def is_locked(self, provider: str, connection_id: str, model: str, now: float) -> bool:
        entry = self._entries.get((provider, connection_id, model))
        return entry is not None and now < entry.expires_at

    def keys_for_model(self, provider: str, model: str) -> set[tuple[str, str, str]] | None:
        """The keys of every entry (locked or expired) for one model of one provider, or None: lets
        routing skip the per-connection lookups entirely for the usual model with no lockout."""
        return self._by_model.get((provider, model))

    def get(self, provider: str, connection_id: str, model: str) -> LockoutEntry | None:
        return self._entries.get((provider, connection_id, model))

    def record_failure(
        self,
        provider: str,
        connection_id: str,
        model: str,
        now: float,
        settings: LockoutSettings,
        *,
        status: int | None,
        reason: str,
        hint_ms: float | None = None,
    ) -> LockoutEntry | None:
        """Lock (or escalate). The caller has already decided this outcome locks (it checks
        settings.counts(), or it is a per-model-quota 429 which locks even if 429 is not listed).
        Returns None only when the table is full of active entries."""
        key = (provider, connection_id, model)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self._max_entries and not self._prune(now):
                self._emit(_event(now, key, UNLOCKED, UNLOCKED, "lockout_table_full"))
                return None
            count = 1
        elif now <= entry.last_failure_at + entry.last_cooldown_ms + ESCALATION_GRACE_MS:
            count = entry.failure_count + 1  # failing again soon after the last lock: escalate
        else:
            count = 1  # a failure long after the last one starts over

        cooldown = settings.cooldown_ms(count, hint_ms)
        expires_at = now + cooldown
        was_locked = entry is not None and now < entry.expires_at
        if entry is None:
            entry = LockoutEntry(
                provider, connection_id, model, reason, status, count, now, expires_at, cooldown, now
            )
            self._insert(key, entry)
        else:
            if was_locked:
                # A lock that already lasts longer is kept (a short hint must not cut it).
                expires_at = max(expires_at, entry.expires_at)
            else:
                entry.locked_at = now
            entry.reason = reason
            entry.status = status
            entry.failure_count = count
            entry.expires_at = expires_at
            entry.last_cooldown_ms = cooldown
            entry.last_failure_at = now
        if expires_at < self._prunable_after:
            self._prunable_after = expires_at

        label = reason if status is None else f"{status} {reason}"
        self._emit(
            _event(now, key, LOCKED if was_locked else UNLOCKED, LOCKED, f"{label}, {int(cooldown)}ms")
        )
        return entry

    def record_success(self, provider: str, connection_id: str, model: str, now: float) -> None:
        key = (provider, connection_id, model)
        entry = self._entries.get(key)
        if entry is None:
            return
        # Success decay: a model that serves again earns its way back, even before its timer.
        entry.failure_count //= 2
        if entry.failure_count == 0:
            self._remove(key, entry, now, "success_decay")

    # -- operator --------------------------------------------------------------------------------

    def reenable(self, provider: str, model: str, now: float, connection_id: str | None = None) -> int:
        """Remove one triple, or every lockout of `model` across the provider's connections."""
        if connection_id is not None:
            keys: Iterable[_Key] = ((provider, connection_id, model),)
        else:
            keys = tuple(self._by_model.get((provider, model), ()))
        removed = 0
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._remove(key, entry, now, "operator")
                removed += 1
        return removed

    def reenable_all(self, now: float) -> int:
        entries = list(self._entries.items())
        for key, entry in entries:
            self._remove(key, entry, now, "operator")
        return len(entries)

    # -- views -----------------------------------------------------------------------------------

    def active(self, now: float) -> list[LockoutEntry]:
        """Still locked, longest remaining first."""
        locked = [e for e in self._entries.values() if now < e.expires_at]
        locked.sort(key=_by_expiry_desc)
        return locked

    def for_connection(self, provider: str, connection_id: str, now: float) -> list[LockoutEntry]:
        """The active lockouts of one connection, longest remaining first."""
        entries = self._entries
        keys = self._by_connection.get((provider, connection_id), ())
        locked = [entries[k] for k in keys if now < entries[k].expires_at]
        locked.sort(key=_by_expiry_desc)
        return locked

    def restore(self, entries: Iterable[LockoutEntry]) -> None:
        """Load entries from the store, replacing same-key ones; emits nothing (no transition)."""
        for entry in entries:
            key = (entry.provider, entry.connection_id, entry.model)
            old = self._entries.get(key)
            if old is not None:
                self._unindex(key)
            elif len(self._entries) >= self._max_entries:
                continue  # a store can only overflow if it was written with a larger cap
            self._insert(key, entry)
            if entry.expires_at < self._prunable_after:
                self._prunable_after = entry.expires_at

    # -- internals -------------------------------------------------------------------------------

    def _insert(self, key: _Key, entry: LockoutEntry) -> None:
        self._entries[key] = entry
        self._by_connection.setdefault((key[0], key[1]), set()).add(key)
        self._by_model.setdefault((key[0], key[2]), set()).add(key)

    def _unindex(self, key: _Key) -> None:
        del self._entries[key]
        for index, pair in ((self._by_connection, (key[0], key[1])), (self._by_model, (key[0], key[2]))):
            keys = index[pair]
            keys.discard(key)
            if not keys:  # drop empty buckets, or churned connections and models would leak
                del index[pair]

    def _remove(self, key: _Key, entry: LockoutEntry, now: float, reason: str) -> None:
        self._unindex(key)
        was = LOCKED if now < entry.expires_at else UNLOCKED
        self._emit(_event(now, key, was, UNLOCKED, reason))

    def _prune(self, now: float) -> bool:
        """Make room in a full table by dropping every expired entry; active locks are never dropped.

        One O(n) scan frees all that can be freed, and `_prunable_after` skips the scan while no
        entry can have expired yet, so a table full of active locks costs O(1) per rejected lock.
        """
        if now < self._prunable_after:
            return False
        earliest = math.inf
        expired: list[_Key] = []
        for key, entry in self._entries.items():
            if now >= entry.expires_at:
                expired.append(key)
            elif entry.expires_at < earliest:
                earliest = entry.expires_at
        for key in expired:
            # Expired entries are already unlocked: dropping them is not a transition, no event.
            self._unindex(key)
        self._prunable_after = earliest
        return bool(expired)


def _event(now: float, key: _Key, from_: str, to: str, reason: str) -> Event:
    return Event(
        ts=now, layer="lockout", key=f"{key[0]}:{key[1]}:{key[2]}", from_=from_, to=to, reason=reason
    )


def _by_expiry_desc(entry: LockoutEntry) -> float:
    return -entry.expires_at


def _field(record: Mapping[str, object], key: str) -> object:
    if key not in record:
        raise ValueError(f"lockout record has no {key!r}")
    return record[key]


def _as_str(record: Mapping[str, object], key: str) -> str:
    value = _field(record, key)
    if not isinstance(value, str):
        raise ValueError(f"lockout record field {key!r} must be a string, got {value!r}")
    return value


def _as_count(record: Mapping[str, object], key: str) -> int:
    value = _field(record, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"lockout record field {key!r} must be a non-negative integer, got {value!r}")
    return value


def _as_ms(record: Mapping[str, object], key: str) -> float:
    value = _field(record, key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"lockout record field {key!r} must be a number of ms, got {value!r}")
    return float(value)
