"""What one upstream attempt produced, in the engine's words (no HTTP library types)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

ProviderClass = Literal["oauth", "apikey", "local"]
PROVIDER_CLASSES: tuple[ProviderClass, ...] = ("oauth", "apikey", "local")


class OutcomeKind(Enum):
    STATUS = "status"
    """The upstream answered with a status code (2xx or an error)."""
    NETWORK_ERROR = "network_error"
    """Connection refused, DNS failure, reset, or a timeout before the response headers."""
    STALL = "stall"
    """The stream stalled after it started (idle timeout or throughput watchdog)."""
    CLIENT_DISCONNECT = "client_disconnect"
    """The client went away; says nothing about the upstream."""
    LOCAL_REJECTION = "local_rejection"
    """Our own queue refused or timed the request out; says nothing about the upstream."""


_STATUS = OutcomeKind.STATUS
"""(Read once: an Enum member read through its class costs a metaclass lookup in Python 3.11.)"""


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """Response headers with lower-case names."""
    body: str = ""
    """Error body text (possibly truncated); empty for successes."""
    error: str = ""
    """A short description for network errors and local rejections."""

    @classmethod
    def ok(cls, status: int = 200) -> Outcome:
        # One per status: an Outcome is immutable, and every successful attempt records one (a
        # frozen dataclass sets each field through object.__setattr__, in Python).
        found = _OK.get(status) if cls is Outcome else None
        if found is None:
            found = cls(OutcomeKind.STATUS, status)
            if cls is Outcome and 200 <= status < 300:
                _OK[status] = found
        return found

    @classmethod
    def http(cls, status: int, body: str = "", headers: Mapping[str, str] | None = None) -> Outcome:
        return cls(OutcomeKind.STATUS, status, {k.lower(): v for k, v in (headers or {}).items()}, body)

    @classmethod
    def network(cls, error: str = "connection refused") -> Outcome:
        return cls(OutcomeKind.NETWORK_ERROR, error=error)

    @classmethod
    def stall(cls, error: str = "stream stalled") -> Outcome:
        return cls(OutcomeKind.STALL, error=error)

    @classmethod
    def disconnect(cls) -> Outcome:
        return cls(OutcomeKind.CLIENT_DISCONNECT, error="client disconnected")

    @classmethod
    def local(cls, error: str) -> Outcome:
        return cls(OutcomeKind.LOCAL_REJECTION, error=error)

    @property
    def is_success(self) -> bool:
        return self.kind is _STATUS and self.status is not None and 200 <= self.status < 300


_OK: dict[int, Outcome] = {}
"""Outcome.ok's answers, by status (2xx only: a handful)."""
