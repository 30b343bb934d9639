"""Upstream status restatement: fix gateways that report quota exhaustion wrongly.

The rules: docs/resilience.md#status-restatement.

Some gateways answer a temporary quota exhaustion with 403 or 400 and a tell-tale text. A rule
turns such an answer into the status it means (usually 429) before classification, so the
layers react to what happened rather than to what the gateway said. Rules run in order and the
first match wins; a provider's configured rules come before its built-in ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

MAX_RETRY_AFTER_MS = 24 * 60 * 60 * 1000  # the same ceiling as upstream retry hints (hints.py)


@dataclass(frozen=True, slots=True)
class RestatementRule:
    id: str
    from_statuses: tuple[int, ...]
    to_status: int
    markers: tuple[str, ...]
    """Any one of these in the body (case-insensitive) makes the rule match..."""
    exclude: tuple[str, ...] = ()
    """...unless any one of these is there too."""
    retry_after_ms: int | None = None
    """What the client is told to wait; the engine's own cooldowns and lockouts still follow their rules."""

    def matches(self, status: int, lowered_body: str) -> bool:
        return (
            status in self.from_statuses
            and any(m.lower() in lowered_body for m in self.markers)
            and not any(e.lower() in lowered_body for e in self.exclude)
        )


@dataclass(frozen=True, slots=True)
class Restated:
    status: int
    retry_after_ms: int | None
    rule_id: str


BUILTIN_RULES: Mapping[str, tuple[RestatementRule, ...]] = MappingProxyType(
    {
        # AgentRouter reports an exhausted balance ("额度不足", "insufficient quota") as 403 or 400;
        # "无权访问" ("no access") on the same status is a real permission error and stays as it is.
        "agentrouter": (
            RestatementRule(
                id="agentrouter-quota",
                from_statuses=(403, 400),
                to_status=429,
                markers=("额度不足",),
                exclude=("无权访问",),
                retry_after_ms=60_000,
            ),
        ),
    }
)


def rules_for(provider: str, configured: Sequence[RestatementRule] = ()) -> tuple[RestatementRule, ...]:
    """The provider's configured rules, then its built-in ones; a configured rule with a built-in
    rule's id replaces that built-in (so an operator can correct it)."""
    builtin = BUILTIN_RULES.get(provider.lower(), ())
    if not configured:
        return builtin
    overridden = {rule.id for rule in configured}
    return (*configured, *(rule for rule in builtin if rule.id not in overridden))


def restate(status: int, body: str, rules: Sequence[RestatementRule]) -> Restated | None:
    """The first matching rule's restatement, or None when the answer stands as it is."""
    lowered: str | None = None
    for rule in rules:
        if status not in rule.from_statuses:
            continue  # checked first so a plain error never pays for lowercasing its body
        if lowered is None:
            lowered = body.lower()
        if rule.matches(status, lowered):
            return Restated(rule.to_status, rule.retry_after_ms, rule.id)
    return None


_CONFIG_KEYS = ("id", "from", "to", "markers", "exclude", "retry_after_ms")


def rule_from_config(data: Mapping[str, object]) -> RestatementRule:
    """Build a rule from a config-file table; bad input raises ValueError naming the rule and key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a restatement rule must be a table, got {type(data).__name__}")
    rule_id = data.get("id")
    if not isinstance(rule_id, str) or not rule_id.strip():
        raise ValueError(f"restatement rule: 'id' must be a non-empty string, got {rule_id!r}")
    where = f"restatement rule {rule_id!r}"
    unknown = sorted(str(k) for k in data if k not in _CONFIG_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(_CONFIG_KEYS)})")
    for required in ("from", "to", "markers"):
        if required not in data:
            raise ValueError(f"{where}: {required!r} is required")

    from_statuses = tuple(_status(where, "from", s) for s in _as_list(data["from"]))
    if not from_statuses:
        raise ValueError(f"{where}: 'from' must list at least one status")
    markers = _texts(where, "markers", data["markers"])
    if not markers:
        raise ValueError(f"{where}: 'markers' must list at least one text")

    retry_after = data.get("retry_after_ms")
    if retry_after is not None and (
        not isinstance(retry_after, int)
        or isinstance(retry_after, bool)
        or not 0 <= retry_after <= MAX_RETRY_AFTER_MS
    ):
        raise ValueError(
            f"{where}: 'retry_after_ms' must be whole ms from 0 to {MAX_RETRY_AFTER_MS}, got {_said(retry_after)}"
        )
    return RestatementRule(
        id=rule_id,
        from_statuses=from_statuses,
        to_status=_error_status(where, data["to"]),
        markers=markers,
        exclude=_texts(where, "exclude", data.get("exclude", ())),
        retry_after_ms=retry_after,
    )


def _as_list(value: object) -> list[object]:
    # A lone value is accepted where a list is expected: `from = 403` means `from = [403]`.
    return list(value) if isinstance(value, list | tuple) else [value]


def _status(where: str, key: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 599:
        raise ValueError(f"{where}: {key!r} must hold HTTP statuses from 100 to 599, got {_said(value)}")
    return value


def _error_status(where: str, value: object) -> int:
    """`to`: a rule restates which error an upstream's is, and the client is answered with it and the
    upstream's body; a 1xx, 204 or 304 cannot carry a body, and a 2xx or 3xx would not be an error."""
    if not isinstance(value, int) or isinstance(value, bool) or not 400 <= value <= 599:
        raise ValueError(f"{where}: 'to' must be an error status from 400 to 599, got {_said(value)}")
    return value


def _said(value: object) -> str:
    """A value quoted in a message; an integer of thousands of digits cannot be written out
    (CPython refuses past 4,300 of them)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "an integer far out of range"
    return repr(value)


def _texts(where: str, key: str, value: object) -> tuple[str, ...]:
    texts: list[str] = []
    for text in _as_list(value):
        if not isinstance(text, str) or not text:
            raise ValueError(f"{where}: {key!r} must hold non-empty strings, got {text!r}")
        texts.append(text)
    return tuple(texts)
