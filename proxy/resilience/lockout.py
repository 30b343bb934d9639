"""Model lockout: one missing or quota-limited model must not take its connection down.

The rules: docs/resilience.md#model-lockout.

The scope is the triple provider:connection:model. A lock is a deadline, so recovery is lazy: once
`expires_at` has passed the triple is eligible again without any timer. The entry itself stays in
the table after it expires, because its failure count and timestamps decide whether the next
failure escalates; it leaves on success decay, on an operator re-enable, or when a full table
prunes it. The table never classifies: the caller decides that an outcome locks (its classification).

Clients choose model names (`provider/<anything>`), so `not_found` locks are the one kind a client
can mint at will. They share a budget per provider+connection (`NOT_FOUND_BUDGET`): a new one beyond
it evicts that connection's least recently failed `not_found` entry, and a full table makes room
for any new lock by evicting the least recently failed `not_found` entry anywhere. A flood of
made-up names thus costs at most one upstream 404 per evicted name, and never crowds out the locks
that stand for real trouble (rate limits, server errors, forbidden models), which are never evicted.
Every entry that leaves the table behind its caller's back (evicted, pruned, or not restored) is
reported through `on_drop`, so the persisted copy forgets it too.

Long on purpose (about 600 lines): the table's bounds (the `not_found` budget, eviction for room,
pruning) are rules of the lockout, not another layer: they share the entries and the per-model
index and must leave them consistent, so the table and its bounds are read together.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from proxy.resilience.events import Event
from proxy.resilience.tunable import tunable

DEFAULT_LOCKOUT_ERROR_CODES: tuple[int, ...] = (403, 404, 429, 502, 503, 504)
ESCALATION_GRACE_MS = 30 * 60 * 1000
MAX_LOCKOUT_ENTRIES = 10_000
NOT_FOUND = "not_found"
"""The classifier's reason for a 404: the model is not served, whatever name the client chose."""
NOT_FOUND_BUDGET = 100
"""At most this many `not_found` entries per provider+connection; the least recently failed goes first.

A real connection rarely has more than a few dozen models it was asked for by mistake, and a lock
that is evicted costs only one more upstream 404 the next time its name is asked for."""

EVICTED_OVER_BUDGET = "evicted_not_found_budget"
EVICTED_FOR_ROOM = "evicted_table_full"
REFUSED_TABLE_FULL = "lockout_table_full"

LOCKED = "locked"
UNLOCKED = "unlocked"


@dataclass(frozen=True, slots=True)
class LockoutSettings:
    """The Model Lockout card. The ranges are declared here; the settings layer enforces them."""

    enabled: bool = field(
        default=False,
        metadata=tunable(help="Lock a failing model on one connection instead of the whole connection"),
    )
    error_codes: tuple[int, ...] = field(
        default=DEFAULT_LOCKOUT_ERROR_CODES,
        metadata=tunable(
            min=100, max=599, help="Upstream statuses that lock the model (empty = the defaults)"
        ),
    )
    """An empty tuple means the default list."""
    base_cooldown_ms: int = field(
        default=120_000, metadata=tunable(min=5000, max=600_000, help="First lockout of a failing model")
    )
    max_cooldown_ms: int = field(
        default=1_800_000,
        metadata=tunable(
            min=5000, max=3_600_000, help="Cap on an escalated lockout (at least baseCooldownMs)"
        ),
    )
    max_backoff_steps: int = field(
        default=10, metadata=tunable(min=0, max=20, help="Doublings of the lockout for repeated failures")
    )
    use_exponential_backoff: bool = field(
        default=True,
        metadata=tunable(help="Double the lockout for each repeated failure (off: always baseCooldownMs)"),
    )

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
        return event_key(self.provider, self.connection_id, self.model)

    def is_locked(self, now: float) -> bool:
        return now < self.expires_at

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.expires_at - now)

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


@dataclass(frozen=True, slots=True)
class LockoutTableStatus:
    """How full the lockout table is, and what it had to give up to stay within its bounds."""

    size: int
    """Entries held, expired ones included (they keep their escalation history until pruned)."""
    capacity: int
    """`MAX_LOCKOUT_ENTRIES` unless the engine was built with another cap."""
    not_found: int
    """Entries held whose reason is `not_found` (the evictable ones)."""
    not_found_budget: int
    """`NOT_FOUND_BUDGET`: the most `not_found` entries one provider+connection keeps."""
    evicted: int
    """`not_found` entries evicted since the start, to stay in a budget or to make room."""
    refused: int
    """Locks not recorded since the start: the table was full of active locks that are not `not_found`."""

    @property
    def full(self) -> bool:
        """At capacity: a new lock now needs an expired or a `not_found` entry to give way."""
        return self.size >= self.capacity

    def to_api(self) -> dict[str, object]:
        return {
            "size": self.size,
            "capacity": self.capacity,
            "full": self.full,
            "notFound": self.not_found,
            "notFoundBudget": self.not_found_budget,
            "evicted": self.evicted,
            "refused": self.refused,
        }


# Tuples, not "p:c:m" strings: model names contain colons ("llama3:8b"), so joined keys can collide.
_Key = tuple[str, str, str]
_Pair = tuple[str, str]


def _no_emit(event: Event) -> None:
    pass


def _no_drop(key: tuple[str, str, str]) -> None:
    pass


class LockoutTable:
    """Every lockout, with per-connection and per-model indexes so no request path scans the table."""

    __slots__ = (
        "_budget",
        "_by_connection",
        "_by_model",
        "_emit",
        "_entries",
        "_evicted",
        "_max_entries",
        "_not_found",
        "_not_found_lru",
        "_on_drop",
        "_prunable_after",
        "_refused",
    )

    def __init__(
        self,
        *,
        max_entries: int = MAX_LOCKOUT_ENTRIES,
        not_found_budget: int = NOT_FOUND_BUDGET,
        emit: Callable[[Event], None] = _no_emit,
        on_drop: Callable[[tuple[str, str, str]], None] = _no_drop,
    ) -> None:
        """`on_drop(key)` hears of every entry that leaves the table without its caller asking for
        that key (evicted, pruned, or not restored), so a persisted copy can delete it too."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if not_found_budget < 1:
            raise ValueError("not_found_budget must be at least 1")
        self._max_entries = max_entries
        self._budget = not_found_budget
        self._emit = emit
        self._on_drop = on_drop
        self._entries: dict[_Key, LockoutEntry] = {}
        self._by_connection: dict[_Pair, set[_Key]] = {}
        self._by_model: dict[_Pair, set[_Key]] = {}
        # The not_found entries, least recently failed first: per connection (for its budget) and
        # all together (for making room in a full table). OrderedDict: O(1) to refresh and to evict.
        self._not_found: dict[_Pair, OrderedDict[_Key, None]] = {}
        self._not_found_lru: OrderedDict[_Key, None] = OrderedDict()
        self._evicted = 0
        self._refused = 0
        # A lower bound on the earliest expires_at in the table: before it, a full table holds
        # only active locks, so there is nothing to prune and no point scanning.
        self._prunable_after = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[str, str, str]]:
        """Every (provider, connection_id, model) in the table, expired ones included; a snapshot."""
        return list(self._entries)

    def status(self) -> LockoutTableStatus:
        """Size, capacity and what the bounds cost so far; O(1)."""
        return LockoutTableStatus(
            size=len(self._entries),
            capacity=self._max_entries,
            not_found=len(self._not_found_lru),
            not_found_budget=self._budget,
            evicted=self._evicted,
            refused=self._refused,
        )

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
        started_at: float | None = None,
    ) -> LockoutEntry | None:
        """Lock (or escalate). The caller has already decided this outcome locks (it checks
        settings.counts(), or it is a per-model-quota 429 which locks even if 429 is not listed).
        A `not_found` lock may evict another `not_found` entry (see the module docstring).
        Returns None only when the table is full of active entries that are not `not_found`.

        `started_at` is when the failed request was sent (the engine always says); a failure of a
        request sent no later than the lock it finds is a herd failure. None: not known, it counts."""
        key = (provider, connection_id, model)
        entry = self._entries.get(key)
        if (
            started_at is not None
            and entry is not None
            and now < entry.expires_at
            and started_at <= entry.locked_at
        ):
            # Anti-thundering-herd (as for cooldowns; docs/resilience.md#model-lockout): the requests
            # that were in flight when the triple locked fail too; they say nothing new about the
            # model, so they neither count nor escalate nor extend the lock. Only a longer explicit
            # hint does.
            return self._herd_failure(key, entry, now, settings, status, reason, hint_ms)
        not_found = reason == NOT_FOUND
        if entry is None:
            if not_found:
                mine = self._not_found.get((provider, connection_id))
                if mine is not None and len(mine) >= self._budget:
                    self._evict(next(iter(mine)), now, EVICTED_OVER_BUDGET)
            if len(self._entries) >= self._max_entries and not self._make_room(now):
                self._refused += 1
                self._emit(_event(now, key, UNLOCKED, UNLOCKED, REFUSED_TABLE_FULL))
                return None
            count = 1
        elif now <= entry.last_failure_at + entry.last_cooldown_ms + ESCALATION_GRACE_MS:
            count = entry.failure_count + 1  # failing again soon after the last lock: escalate
        else:
            count = 1  # a failure long after the last one starts over

        cooldown = settings.cooldown_ms(count, hint_ms)
        expires_at = now + cooldown
        was_locked = entry is not None and now < entry.expires_at
        was_not_found = entry is not None and entry.reason == NOT_FOUND
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
        if not_found:
            self._track(key, now)  # a new or a repeated failure: now the most recently failed
        elif was_not_found:
            self._untrack(key)  # it locks for a real reason now: no longer evictable

        label = reason if status is None else f"{status} {reason}"
        self._emit(
            _event(now, key, LOCKED if was_locked else UNLOCKED, LOCKED, f"{label}, {int(cooldown)}ms")
        )
        return entry

    def _herd_failure(
        self,
        key: _Key,
        entry: LockoutEntry,
        now: float,
        settings: LockoutSettings,
        status: int | None,
        reason: str,
        hint_ms: float | None,
    ) -> LockoutEntry:
        if hint_ms is None:
            return entry
        cooldown = settings.cooldown_ms(entry.failure_count, hint_ms)
        if now + cooldown <= entry.expires_at:
            return entry  # the later deadline always wins; a shorter hint never cuts a lock
        entry.expires_at = now + cooldown
        # The escalation window follows the lock it extended, so the next real failure after it
        # still escalates.
        entry.last_cooldown_ms = cooldown
        entry.last_failure_at = now
        label = reason if status is None else f"{status} {reason}"
        self._emit(_event(now, key, LOCKED, LOCKED, f"{label}, extended by retry hint to {int(cooldown)}ms"))
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
        """Remove one triple, or every lockout of `model` across the provider's connections: how
        many were still locked (expired entries are forgotten too, and not counted as lifted)."""
        if connection_id is not None:
            keys: Iterable[_Key] = ((provider, connection_id, model),)
        else:
            keys = tuple(self._by_model.get((provider, model), ()))
        removed = 0
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and self._remove(key, entry, now, "operator"):
                removed += 1
        return removed

    def reenable_all(self, now: float) -> int:
        """Remove every entry: how many were still locked (as `reenable`)."""
        lifted = 0
        for key, entry in list(self._entries.items()):
            if self._remove(key, entry, now, "operator"):
                lifted += 1
        return lifted

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
        """Load entries from the store, replacing same-key ones; emits nothing (no transition).

        The bounds hold as for new locks, in order of last failure: a store written with a larger
        cap or budget (or before the budget existed) loses its least recently failed `not_found`
        entries first. Whatever is not kept is reported through `on_drop`.
        """
        for entry in sorted(entries, key=_by_last_failure):
            key = (entry.provider, entry.connection_id, entry.model)
            not_found = entry.reason == NOT_FOUND
            if key in self._entries:
                self._unindex(key)
            elif not_found and len(self._not_found.get((key[0], key[1]), ())) >= self._budget:
                self._evict(next(iter(self._not_found[(key[0], key[1])])), None, EVICTED_OVER_BUDGET)
            if len(self._entries) >= self._max_entries:
                if not self._not_found_lru:
                    self._on_drop(key)  # no room, nothing evictable: the store must forget it
                    continue
                self._evict(next(iter(self._not_found_lru)), None, EVICTED_FOR_ROOM)
            self._insert(key, entry)
            if not_found:
                self._track(key, None)
            if entry.expires_at < self._prunable_after:
                self._prunable_after = entry.expires_at

    def discard(self, provider: str, connection_id: str, model: str) -> None:
        """Forget one triple without an event: another replica removed it, and said so itself."""
        if (provider, connection_id, model) in self._entries:
            self._unindex((provider, connection_id, model))

    # -- internals -------------------------------------------------------------------------------

    def _insert(self, key: _Key, entry: LockoutEntry) -> None:
        self._entries[key] = entry
        self._by_connection.setdefault((key[0], key[1]), set()).add(key)
        self._by_model.setdefault((key[0], key[2]), set()).add(key)

    def _unindex(self, key: _Key) -> None:
        if self._entries.pop(key).reason == NOT_FOUND:
            self._untrack(key)
        for index, pair in ((self._by_connection, (key[0], key[1])), (self._by_model, (key[0], key[2]))):
            keys = index[pair]
            keys.discard(key)
            if not keys:  # drop empty buckets, or churned connections and models would leak
                del index[pair]

    def _track(self, key: _Key, now: float | None) -> None:
        """Mark a not_found entry as the most recently failed, in its connection and overall."""
        pair = (key[0], key[1])
        mine = self._not_found.get(pair)
        if mine is None:
            mine = self._not_found[pair] = OrderedDict()
        mine[key] = None
        mine.move_to_end(key)
        self._not_found_lru[key] = None
        self._not_found_lru.move_to_end(key)
        # Only an existing entry whose reason just became not_found can overflow here: a new one
        # made room before it was inserted. `key` is last, so it is never the one to go.
        while len(mine) > self._budget:
            self._evict(next(iter(mine)), now, EVICTED_OVER_BUDGET)

    def _untrack(self, key: _Key) -> None:
        pair = (key[0], key[1])
        mine = self._not_found[pair]
        del mine[key]
        if not mine:
            del self._not_found[pair]
        del self._not_found_lru[key]

    def _evict(self, key: _Key, now: float | None, reason: str) -> None:
        """Drop a not_found entry to respect a bound. `now` is None at restore, which emits nothing."""
        entry = self._entries[key]
        self._unindex(key)
        self._evicted += 1
        self._on_drop(key)
        if now is not None and now < entry.expires_at:
            # The console and the event log follow lockouts by their events: a lock that ends
            # early must say so, or it would look active until its deadline.
            self._emit(_event(now, key, LOCKED, UNLOCKED, reason))

    def _make_room(self, now: float) -> bool:
        """Free one slot in a full table: expired entries first, else the least recently failed
        not_found entry; False when every entry is an active lock for a real reason."""
        if self._prune(now):
            return True
        if self._not_found_lru:
            self._evict(next(iter(self._not_found_lru)), now, EVICTED_FOR_ROOM)
            return True
        return False

    def _remove(self, key: _Key, entry: LockoutEntry, now: float, reason: str) -> bool:
        """Forget a triple; True when it was still locked. Only that is a transition, told by an
        event: an expired entry was lifted by its timer, and forgetting its escalation history
        changes no state (as `_prune`, which drops such entries without a word)."""
        self._unindex(key)
        if now < entry.expires_at:
            self._emit(_event(now, key, LOCKED, UNLOCKED, reason))
            return True
        return False

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
            self._on_drop(key)
        self._prunable_after = earliest
        return bool(expired)


def event_key(provider: str, connection_id: str, model: str) -> str:
    """A triple as the event bus names it: `provider:connection:model`."""
    return f"{provider}:{connection_id}:{model}"


def triple_of(key: str) -> tuple[str, str, str]:
    """The inverse of `event_key`. Provider and connection ids hold no colon (the config refuses
    them); a model name may (`llama3:70b`), so it is whatever follows the second one."""
    provider, connection_id, model = key.split(":", 2)
    return provider, connection_id, model


def _event(now: float, key: _Key, from_: str, to: str, reason: str) -> Event:
    return Event(ts=now, layer="lockout", key=event_key(*key), from_=from_, to=to, reason=reason)


def _by_expiry_desc(entry: LockoutEntry) -> float:
    return -entry.expires_at


def _by_last_failure(entry: LockoutEntry) -> float:
    return entry.last_failure_at


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
