"""The reconcile rules: one record out of two versions of the same state (docs/fleet.md#reconcile).

A replica that lost Redis kept deciding on its own memory tier; meanwhile the others went on in
Redis. When it is back, each record it changed while away is merged with the one in Redis:

- what this replica decided before an operator reset or re-enabled the record in Redis meanwhile is
  gone: the operator's action cleared it, on every replica (`since_operator`);
- deadlines merge, the later wins (a cooldown, a lockout, an OPEN breaker's period);
- terminal states win over transient ones (`banned`, `expired`, `credits_exhausted` over cooling);
- breaker counts take the larger (failures, open cycles), and the more severe state wins;
- settings take the highest version (in `proxy.fleet.backend`, where versions live).

Pure functions over the layers' records (`to_record()` dicts); None is "no such record".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Record = Mapping[str, Any]

_BREAKER_RANK = {"CLOSED": 0, "DEGRADED": 1, "HALF_OPEN": 2, "OPEN": 3}


def _later(a: object, b: object) -> Any:
    """The larger of two optional numbers (None when both are None)."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)  # type: ignore[call-overload]


def merge_breaker(a: Record | None, b: Record | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b or {})
    rank_a = _BREAKER_RANK.get(str(a.get("state")), 0)
    rank_b = _BREAKER_RANK.get(str(b.get("state")), 0)
    first, second = (a, b) if rank_a >= rank_b else (b, a)
    merged = dict(first)
    merged["failure_count"] = max(int(a.get("failure_count") or 0), int(b.get("failure_count") or 0))
    merged["open_cycle_count"] = max(int(a.get("open_cycle_count") or 0), int(b.get("open_cycle_count") or 0))
    merged["last_failure_at"] = _later(a.get("last_failure_at"), b.get("last_failure_at"))
    merged["last_transition_at"] = _later(a.get("last_transition_at"), b.get("last_transition_at"))
    if merged.get("state") == "OPEN" and second.get("state") == "OPEN":
        # Both opened: the period that ends later wins (its deadline derives from opened_at).
        merged["opened_at"] = _later(a.get("opened_at"), b.get("opened_at"))
    return merged


def merge_connection(a: Record | None, b: Record | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b or {})
    enabled = bool(a.get("enabled", True)) and bool(b.get("enabled", True))  # a disable is an operator's word
    terminal_a, terminal_b = a.get("terminal"), b.get("terminal")
    if terminal_a or terminal_b:
        if terminal_a and terminal_b:
            newer = a if (a.get("last_error_at") or 0) >= (b.get("last_error_at") or 0) else b
        else:
            newer = a if terminal_a else b
        return {**newer, "enabled": enabled}
    newer = a if (a.get("last_error_at") or 0) >= (b.get("last_error_at") or 0) else b
    merged = dict(newer)
    merged["enabled"] = enabled
    merged["rate_limited_until"] = _later(a.get("rate_limited_until"), b.get("rate_limited_until"))
    merged["backoff_level"] = max(int(a.get("backoff_level") or 0), int(b.get("backoff_level") or 0))
    return merged


def merge_lockout(a: Record | None, b: Record | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b or {})
    newer = a if float(a.get("expires_at") or 0) >= float(b.get("expires_at") or 0) else b
    merged = dict(newer)
    merged["failure_count"] = max(int(a.get("failure_count") or 0), int(b.get("failure_count") or 0))
    merged["last_cooldown_ms"] = max(
        float(a.get("last_cooldown_ms") or 0), float(b.get("last_cooldown_ms") or 0)
    )
    merged["last_failure_at"] = _later(a.get("last_failure_at"), b.get("last_failure_at"))
    return merged


MERGES = {"b": merge_breaker, "c": merge_connection, "l": merge_lockout}

_DECIDED_AT = {"b": "last_failure_at", "c": "last_error_at", "l": "last_failure_at"}
"""The field that says when a failure last changed a record of each kind. (A breaker's other
transitions after a reset are its own lazy recovery, or a success, which the reset agrees with.)"""


def since_operator(
    kind: str, local: Record | None, remote: Record | None, acted: float | None
) -> Record | None:
    """`local` as it stands after an operator's reset or re-enable made at `acted` (None: none), as
    Redis holds it in `remote`: when every outcome in `local` came before the action, the action
    cleared them, and `remote` says the rest. A connection keeps its own `enabled` (a disable is
    not cleared by a reset, and merges as usual)."""
    if local is None or acted is None:
        return local
    decided = local.get(_DECIDED_AT[kind])
    if not isinstance(decided, int | float) or decided >= acted:
        return local
    if kind == "c" and remote is not None:
        return {**remote, "enabled": local.get("enabled", True)}
    return remote
