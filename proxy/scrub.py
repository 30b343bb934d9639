"""Secrets out of what an upstream says: the one scrubber.

An upstream may quote the credential it was sent ("Incorrect API key provided: sk-...") in its error
body, its headers or an error event of a stream. Whatever of that text this program keeps or shows
(a connection's `lastError`, an event, a log line, the state file, the answer relayed to the
client) goes through `Scrubber` first, which replaces with `REDACTED`:

- every configured secret (the connections' API keys, `server.api_keys`, the management token),
  as written and as JSON escapes it;
- anything shaped like a credential: `Bearer <token>`, and `sk-...` keys (`sk-ant-...`, `sk-proj-...`).

The shapes are applied only to error text: a successful answer (a completion, a stream's content)
may legitimately hold text of that shape, so there only the configured secrets are replaced, and
those never appear in an honest answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Final

__all__ = ["MIN_SECRET_LENGTH", "REDACTED", "Scrubber", "StreamScrubber", "scrub_shapes"]

REDACTED: Final = "***"
_REDACTED_BYTES: Final = REDACTED.encode()  # (once: every relayed success body is scrubbed)

MIN_SECRET_LENGTH: Final = 8
"""Configured secrets shorter than this are not searched for: replacing every "abc" in a text would
destroy it, and a secret that short protects nothing anyway."""

# `Bearer <b64token>` (RFC 6750) and OpenAI/Anthropic-style keys, as whole words.
_SHAPES: Final = re.compile(
    r"(?P<scheme>\b[Bb][Ee][Aa][Rr][Ee][Rr]\s+)[A-Za-z0-9\-._~+/]{8,}=*"
    r"|(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{8,}"
)


def _shape(match: re.Match[str]) -> str:
    scheme = match.group("scheme")
    return f"{scheme}{REDACTED}" if scheme else REDACTED


def scrub_shapes(text: str) -> str:
    """`text` without anything shaped like a credential (no configured secret needed)."""
    return _SHAPES.sub(_shape, text) if ("sk-" in text or "earer" in text or "EARER" in text) else text


class Scrubber:
    """Replaces the configured `secrets` (and, in error text, credential shapes) with `REDACTED`."""

    __slots__ = ("_bytes", "_text")

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= MIN_SECRET_LENGTH:
                forms.add(secret)
                forms.add(json.dumps(secret)[1:-1])  # as it reads inside a JSON string
        # Longest first, so that a secret containing another is replaced whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._text = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._bytes = re.compile(b"|".join(re.escape(form.encode()) for form in ordered)) if ordered else None

    def __call__(self, text: str) -> str:
        """Error text: the configured secrets and every credential shape replaced."""
        if self._text is not None:
            text = self._text.sub(REDACTED, text)
        return scrub_shapes(text)

    def secrets(self, data: bytes) -> bytes:
        """Content relayed as it came (a success body, a stream's bytes): only the configured
        secrets replaced. Cheap when there are none, or none of them is in `data`."""
        if self._bytes is None:
            return data
        return self._bytes.sub(_REDACTED_BYTES, data)

    def error_bytes(self, data: bytes) -> bytes:
        """An error body relayed to the client: like `__call__`, on bytes that may not be UTF-8."""
        return self(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def finds(self, text: str) -> bool:
        """Does `text` hold anything `__call__` would replace?"""
        return self(text) != text


class StreamScrubber:
    """Scrubs a relayed stream line by line, so that a secret split between two chunks is found too.

    A line is passed on once its end has arrived: an SSE client acts on nothing before the blank
    line that ends an event, so holding a partial line back delays nothing it could read. A line
    that carries an error object (`"error"`, as OpenAI and Anthropic error events do) is error text;
    every other line is content, where only the configured secrets are replaced.
    """

    __slots__ = ("_pending", "_scrubber")

    MAX_PENDING: Final = 64 * 1024
    """A line longer than this is passed on in pieces rather than held in memory whole."""

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be passed on now (possibly nothing)."""
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) <= self.MAX_PENDING:
            self._pending = data
            return b""
        if cut == 0:
            cut = len(data)
        self._pending = data[cut:]
        return self._scrub(data[:cut])

    def flush(self) -> bytes:
        """The rest, at the end of the stream."""
        data, self._pending = self._pending, b""
        return self._scrub(data) if data else b""

    def _scrub(self, data: bytes) -> bytes:
        scrubber = self._scrubber
        if b'"error"' not in data:
            return scrubber.secrets(data)
        return b"".join(
            scrubber.error_bytes(line) if b'"error"' in line else scrubber.secrets(line)
            for line in data.splitlines(keepends=True)
        )
