"""Connection cooldown: skip one bad credential while the provider's other connections serve.

One `ConnectionHealth` per connection (docs/resilience.md#connection-cooldown). Transient failures
cool it with an exponential backoff (or the upstream's own retry hint); terminal states (`banned`, `expired`,
`credits_exhausted`) last until an operator reset or a credential change, never until a success;
`disabled` is the operator's switch and sits on top of everything else. Recovery is lazy: a deadline in the past
simply reads as `active`, so no timer ever runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from proxy.resilience.events import Event
from proxy.resilience.outcome import ProviderClass
from proxy.resilience.tunable import tunable
from proxy.scrub import scrub_shapes

ConnectionStatus = Literal["active", "cooling", "banned", "expired", "credits_exhausted", "disabled"]
TerminalStatus = Literal["banned", "expired", "credits_exhausted"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"banned", "expired", "credits_exhausted"})

# Narrows a plain string to the literal type without a cast.
_TERMINAL: dict[str, TerminalStatus] = {
    "banned": "banned",
    "expired": "expired",
    "credits_exhausted": "credits_exhausted",
}


@dataclass(frozen=True, slots=True)
class CooldownPolicy:
    # Defaults differ by provider class: DEFAULT_COOLDOWN_POLICIES below.
    base_cooldown_ms: int = field(
        metadata=tunable(
            min=0,
            max=86_400_000,
            help="First cooldown of a failing {who} connection, doubled per level (0 = never cool)",
        )
    )
    """First cooldown; 0 turns cooling off for the class (errors are still recorded)."""
    max_backoff_steps: int = field(
        metadata=tunable(
            min=0, max=32, help="Highest backoff level of {a_who} connection (cooldown <= base * 2^steps)"
        )
    )
    """Highest backoff level, so the longest cooldown is base * 2 ** max_backoff_steps."""
    use_upstream_retry_hints: bool = field(
        metadata=tunable(help="Let Retry-After and rate-limit reset hints set {who} cooldowns")
    )
    """Let an upstream hint (Retry-After and friends) replace the computed cooldown."""


DEFAULT_COOLDOWN_POLICIES: dict[ProviderClass, CooldownPolicy] = {
    "oauth": CooldownPolicy(base_cooldown_ms=5000, max_backoff_steps=8, use_upstream_retry_hints=False),
    "apikey": CooldownPolicy(base_cooldown_ms=3000, max_backoff_steps=5, use_upstream_retry_hints=True),
    "local": CooldownPolicy(base_cooldown_ms=2000, max_backoff_steps=3, use_upstream_retry_hints=False),
}

# Error text can quote the credential back ("Incorrect API key provided: sk-..."); events are shown
# everywhere, so the text is scrubbed (again: the engine scrubs what it is given) and kept short.
_REASON_TEXT_LIMIT = 60


def _no_emit(event: Event) -> None:
    pass


class ConnectionHealth:
    """The cooldown state of one connection; every status change is emitted as an event."""

    __slots__ = (
        "_emit",
        "backoff_level",
        "connection_id",
        "enabled",
        "error_code",
        "last_error",
        "last_error_at",
        "last_error_type",
        "provider",
        "rate_limited_until",
        "terminal",
    )

    def __init__(
        self,
        connection_id: str,
        provider: str,
        *,
        enabled: bool = True,
        emit: Callable[[Event], None] = _no_emit,
    ) -> None:
        self.connection_id = connection_id
        self.provider = provider
        self.enabled = enabled
        self.terminal: TerminalStatus | None = None
        self.rate_limited_until: float | None = None
        self.backoff_level = 0
        self.last_error: str | None = None
        self.last_error_type: str | None = None
        self.error_code: int | None = None
        self.last_error_at: float | None = None
        self._emit = emit

    # -- reads (lazy: an expired deadline simply reads as active) ---------------------------------

    def status(self, now: float) -> ConnectionStatus:
        if not self.enabled:
            return "disabled"
        if self.terminal is not None:
            return self.terminal
        if self.rate_limited_until is not None and self.rate_limited_until > now:
            return "cooling"
        return "active"

    def is_eligible(self, now: float) -> bool:
        until = self.rate_limited_until
        return self.enabled and self.terminal is None and (until is None or until <= now)

    def remaining_ms(self, now: float) -> float:
        until = self.rate_limited_until
        if until is None or until <= now:
            return 0.0
        return until - now

    # -- outcomes ---------------------------------------------------------------------------------

    def record_failure(
        self,
        now: float,
        policy: CooldownPolicy,
        *,
        error: str,
        error_type: str,
        code: int | None,
        hint_ms: float | None = None,
        disable_cooling: bool = False,
    ) -> float:
        """Transient failure (network/5xx/429). Returns the cooldown applied in ms (0 when none)."""
        if self.terminal is not None:
            # The verdict stands, and so do its words: a failure of a request that was in flight
            # when it came must not replace why the key went terminal, which the operator reads
            # to fix it. (Nor may any cooldown overwrite a terminal state.)
            return 0.0
        self.last_error = error
        self.last_error_type = error_type
        self.error_code = code
        self.last_error_at = now
        # Base 0 and disable_cooling both mean "record, never cool".
        if disable_cooling or policy.base_cooldown_ms <= 0:
            return 0.0
        hint = hint_ms if policy.use_upstream_retry_hints else None
        until = self.rate_limited_until
        if until is not None and until > now:
            # Anti-thundering-herd: the requests that were in flight when the cooldown started
            # fail too; they must not bump the level or move the deadline. Only a hint that asks
            # for a later deadline wins.
            if hint is not None and now + hint > until:
                self.rate_limited_until = now + hint
                self.backoff_level = 0
                self._transition(now, "cooling", "cooling", "extended by retry hint")
                return hint
            return 0.0
        old = self.status(now)
        if hint is not None:
            cooldown = max(0.0, hint)
            self.backoff_level = 0
            reason = f"retry hint {cooldown:.0f}ms"
        else:
            # A level persisted under a larger max_backoff_steps still obeys today's cap.
            level = min(self.backoff_level, policy.max_backoff_steps)
            cooldown = float(policy.base_cooldown_ms * (1 << level))
            self.backoff_level = min(level + 1, policy.max_backoff_steps)
            reason = f"cooldown {cooldown:.0f}ms (level {self.backoff_level})"
        if cooldown <= 0.0:  # the upstream said "retry now": nothing to cool
            return 0.0
        self.rate_limited_until = now + cooldown
        new = self.status(now)
        if new != old:
            self._transition(now, old, new, reason)
        return cooldown

    def mark_terminal(self, now: float, status: str, *, error: str, code: int | None) -> None:
        terminal = _TERMINAL.get(status)
        if terminal is None:
            raise ValueError(f"not a terminal status: {status!r}")
        old = self.status(now)
        self.terminal = terminal
        self.rate_limited_until = None
        self.last_error = error
        self.last_error_type = terminal
        self.error_code = code
        self.last_error_at = now
        new = self.status(now)
        if new != old:
            self._transition(now, old, new, _terminal_reason(terminal, code, error))

    def record_success(self, now: float) -> None:
        # Hot path: a healthy connection has nothing to clear, so return before touching anything.
        # A terminal connection takes no traffic, so a success it reports comes from a request that
        # was already in flight when the verdict came: it says nothing about the credential now,
        # and only an operator reset or a credential change ends a terminal state
        # (docs/resilience.md#terminal-states).
        if self.terminal is not None or (
            self.last_error_at is None and self.rate_limited_until is None and self.backoff_level == 0
        ):
            return
        old = self.status(now)
        self._clear()
        new = self.status(now)
        if new != old:
            self._transition(now, old, new, "success")

    # -- operator ---------------------------------------------------------------------------------

    def reset(self, now: float, reason: str = "operator") -> None:
        """Clear cooldown, terminal state, backoff and error fields; `enabled` is kept."""
        changed = (
            self.terminal is not None
            or self.rate_limited_until is not None
            or self.backoff_level != 0
            or self.last_error_at is not None
            or self.last_error is not None
        )
        old = self.status(now)
        self._clear()
        # An operator action is always visible in the log when it changed anything, even when
        # the displayed status stays the same (a disabled connection, a past cooldown).
        if changed:
            self._transition(now, old, self.status(now), reason)

    def set_enabled(self, enabled: bool, now: float) -> None:
        if enabled == self.enabled:
            return
        old = self.status(now)
        self.enabled = enabled
        self._transition(now, old, self.status(now), "operator")

    # -- persistence ------------------------------------------------------------------------------

    def to_record(self) -> dict[str, object]:
        """JSON-serialisable raw fields; status is derived from them at read time."""
        return {
            "connection_id": self.connection_id,
            "provider": self.provider,
            "enabled": self.enabled,
            "terminal": self.terminal,
            "rate_limited_until": self.rate_limited_until,
            "backoff_level": self.backoff_level,
            "last_error": self.last_error,
            "last_error_type": self.last_error_type,
            "error_code": self.error_code,
            "last_error_at": self.last_error_at,
        }

    def load_record(self, record: Mapping[str, object]) -> None:
        """Restore the raw fields in place (identity fields are ignored); emits nothing.

        Missing keys take their cleared value; a value of the wrong type raises ValueError and
        leaves the object unchanged.
        """
        terminal_raw = _opt(record, "terminal", str)
        terminal = None if terminal_raw is None else _TERMINAL.get(terminal_raw)
        if terminal_raw is not None and terminal is None:
            raise ValueError(f"terminal: not a terminal status: {terminal_raw!r}")
        enabled = _opt(record, "enabled", bool)
        until = _opt_float(record, "rate_limited_until")
        level = _opt(record, "backoff_level", int)
        last_error = _opt(record, "last_error", str)
        last_error_type = _opt(record, "last_error_type", str)
        error_code = _opt(record, "error_code", int)
        last_error_at = _opt_float(record, "last_error_at")
        if level is not None and level < 0:
            raise ValueError(f"backoff_level: negative: {level}")
        # Every value is checked before anything is assigned: a bad record changes nothing.
        self.enabled = self.enabled if enabled is None else enabled
        self.terminal = terminal
        self.rate_limited_until = until
        self.backoff_level = level or 0
        self.last_error = last_error
        self.last_error_type = last_error_type
        self.error_code = error_code
        self.last_error_at = last_error_at

    # -- internals --------------------------------------------------------------------------------

    def _clear(self) -> None:
        self.terminal = None
        self.rate_limited_until = None
        self.backoff_level = 0
        self.last_error = None
        self.last_error_type = None
        self.error_code = None
        self.last_error_at = None

    def _transition(self, now: float, from_: str, to: str, reason: str) -> None:
        self._emit(
            Event(ts=now, layer="connection", key=self.connection_id, from_=from_, to=to, reason=reason)
        )


def _terminal_reason(status: str, code: int | None, error: str) -> str:
    text = scrub_shapes(" ".join(error.split()))
    if len(text) > _REASON_TEXT_LIMIT:
        text = text[: _REASON_TEXT_LIMIT - 3] + "..."
    # The error text usually starts with the status code already ("401: ..."): say it once.
    head = f"{status}:" if code is None or text.startswith(str(code)) else f"{status}: {code}"
    return f"{head} {text}" if text else head.rstrip(":")


_T = TypeVar("_T")


def _opt(record: Mapping[str, object], key: str, kind: type[_T]) -> _T | None:
    value = record.get(key)
    if value is None:
        return None
    # bool is an int subclass: an int field must not accept True, a bool field must not accept 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _opt_float(record: Mapping[str, object], key: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: expected a number, got {type(value).__name__}")
    return float(value)
