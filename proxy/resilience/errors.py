"""Errors the engine raises; the server maps each to one HTTP answer.

OmniRouteError
 ├── AdmissionError            a local decision not to send (never counts against an upstream)
 │    ├── QueueFull            429 RATE_LIMIT_QUEUE_FULL
 │    ├── ExecutionTimeout     504 RATE_LIMIT_EXECUTION_TIMEOUT
 │    └── Withdrawn            no answer of its own: the request falls back to the next candidate
 └── SettingsError             a rejected settings change, with every bad field
"""

from __future__ import annotations

from dataclasses import dataclass


class OmniRouteError(Exception):
    code = "omniroute_error"


class AdmissionError(OmniRouteError):
    code = "admission_error"


class QueueFull(AdmissionError):
    code = "RATE_LIMIT_QUEUE_FULL"


class ExecutionTimeout(AdmissionError):
    code = "RATE_LIMIT_EXECUTION_TIMEOUT"


class Withdrawn(AdmissionError):
    """A queued request whose connection can no longer take it (it started cooling, its model was
    locked, its provider's breaker opened while the request waited): it leaves the queue unsent."""

    code = "withdrawn_from_queue"


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    """Dotted path, e.g. `providerBreaker.apikey.failureThreshold`."""
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


class SettingsError(OmniRouteError):
    code = "invalid_settings"

    def __init__(self, fields: list[FieldError]) -> None:
        self.fields = fields
        super().__init__("; ".join(f"{f.field}: {f.message}" for f in fields))
