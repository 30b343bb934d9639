r"""Secrets out of what an upstream says: the one scrubber.

An upstream may quote the credential it was sent ("Incorrect API key provided: sk-...") in its error
body, its headers or an error event of a stream. Whatever of that text this program keeps or shows
(a connection's `lastError`, an event, a log line, the state file, the answer relayed to the
client) goes through `Scrubber` first, which replaces with `REDACTED`:

- every configured secret (the connections' API keys, `server.api_keys`, the management token),
  as written and however a JSON encoder may escape it: each character as itself, as `\uXXXX`
  (either case), or as its short escape (`\"`, `\\`, `\/`), in any mix: Python escapes `"`
  and `\`, PHP also `/`, Go `<`, `>` and `&`, and an encoder may escape every character; and
  percent-encoded, as an upstream quoting the URL it was sent writes it (`%2F`, `%2f`);
- anything shaped like a credential: `Bearer <token>`, and `sk-...` keys (`sk-ant-...`, `sk-proj-...`).

The shapes are applied only to error text: a successful answer (a completion, a stream's content)
may legitimately hold text of that shape, so there only the configured secrets are replaced, and
those never appear in an honest answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote

__all__ = ["MIN_SECRET_LENGTH", "REDACTED", "Scrubber", "StreamScrubber", "scrub_shapes"]

REDACTED: Final = "***"
_REDACTED_BYTES: Final = REDACTED.encode()  # (once: every relayed success body is scrubbed)

_LITERALS_UP_TO: Final = 16
"""Up to this many secrets, content is searched for them one by one (`Scrubber.secrets`); past it,
one regex is cheaper than that many scans."""

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

    __slots__ = ("_bytes", "_bytes_any", "_literals", "_text", "reach")

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so that a secret containing another is replaced whole.
        ordered = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self.reach = max((_widest(s) for s in ordered), default=0)
        """The most bytes one written secret can span (each character in its longest form): text
        cut short of its end by this much cannot end inside one (`StreamScrubber`)."""
        # Error text in any case: an upstream may quote the key upper-cased, and there a false
        # match costs nothing (it is replaced in an error message, not in content).
        self._text = (
            re.compile("|".join(_escaped_any_way(s, any_case=True) for s in ordered), re.IGNORECASE)
            if ordered
            else None
        )
        self._bytes_any = re.compile(_escaped_any_way_bytes(ordered)) if ordered else None
        # Content (every relayed success body and stream line) is first searched for the secrets
        # as most encoders write them (`_escaped_usual_ways`), and for an escape only some write
        # (`\u`, `\/`): every other way of writing a secret holds one (a secret has no control
        # characters). Only content where one is found is searched with the pattern for every
        # mix of escapes, which costs several times more.
        # (and as URL encoders write it: `%2F` for `/`)
        percent = [form for s in ordered for form in _percent_forms(s)]
        usual = b"|".join(
            [
                *(_escaped_usual_ways(s).encode() for s in ordered),
                *(re.escape(f).encode() for f in percent),
                rb"\\[u/]",
            ]
        )
        self._bytes = re.compile(usual) if ordered else None
        # The same search as substring tests, when the secrets are few and hold no `"` or `\`
        # (which encoders write two ways): `in` scans at memchr's speed, where the regex engine
        # tests every byte against the first characters of the alternatives (2.2 µs on a 255-byte
        # answer with two keys against 1.1 µs).
        self._literals: tuple[bytes, ...] | None = None
        if ordered and len(ordered) <= _LITERALS_UP_TO and not any('"' in s or "\\" in s for s in ordered):
            self._literals = tuple(s.encode() for s in [*ordered, *percent])

    def __call__(self, text: str) -> str:
        """Error text: the configured secrets and every credential shape replaced."""
        if self._text is not None:
            text = self._text.sub(REDACTED, text)
        return scrub_shapes(text)

    def secrets(self, data: bytes) -> bytes:
        """Content relayed as it came (a success body, a stream's bytes): only the configured
        secrets replaced. Cheap when there are none, or none of them is in `data`."""
        if self._bytes is None or self._bytes_any is None:
            return data
        literals = self._literals
        if literals is not None:
            for literal in literals:
                if literal in data:
                    return self._bytes_any.sub(_REDACTED_BYTES, data)
            # The escapes only some encoders write (one byte looked for first: a scan for a single
            # byte is the fastest there is, and most answers hold no backslash at all).
            if b"\\" in data and (b"\\u" in data or b"\\/" in data):
                return self._bytes_any.sub(_REDACTED_BYTES, data)
            return data
        if self._bytes.search(data) is None:
            return data
        return self._bytes_any.sub(_REDACTED_BYTES, data)

    def error_bytes(self, data: bytes) -> bytes:
        """An error body relayed to the client: like `__call__`, on bytes that may not be UTF-8."""
        return self(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def finds(self, text: str) -> bool:
        """Does `text` hold anything `__call__` would replace?"""
        return self(text) != text


_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
"""A character and its two-character JSON escape (RFC 8259, "Strings"), as the text holds it."""


def _escaped_any_way(secret: str, *, any_case: bool = False) -> str:
    r"""A pattern for `secret` as written or as any JSON encoder may have escaped any of its
    characters (each one on its own: as itself, `\uXXXX` in either case, or its short escape).
    Every form is ASCII but the characters themselves, so it also works on UTF-8 bytes.
    `any_case`: also each letter's `\uXXXX` in its other case (the pattern is compiled to ignore
    case, which covers every other form)."""
    parts = []
    for char in secret:
        # Longest first: a secret ending in `\` must take `\u005c` whole, not its backslash alone.
        cases = dict.fromkeys([char, char.swapcase()] if any_case and len(char.swapcase()) == 1 else [char])
        forms = ["".join(_unicode_escape(unit) for unit in _utf16(case)) for case in cases]
        if not char.isalnum() or not char.isascii():  # (what URL encoders encode)
            forms.append("".join(_percent_escape(byte) for byte in char.encode("utf-8", "surrogatepass")))
        if char in _SHORT_ESCAPES:
            forms.append(re.escape(_SHORT_ESCAPES[char]))
        forms.append(re.escape(char))
        parts.append(f"(?:{'|'.join(forms)})")
    return "".join(parts)


def _widest(secret: str) -> int:
    """The longest way `_escaped_any_way` and `_percent_forms` may write `secret`, in bytes."""
    return sum(
        max(
            6 * len(_utf16(char)),
            3 * len(char.encode("utf-8", "surrogatepass")),
            len(_SHORT_ESCAPES.get(char, "")),
        )
        for char in secret
    )


def _escaped_usual_ways(secret: str) -> str:
    r"""A pattern for `secret` as written, or with its `"` and `\` escaped as JSON must (`\"`,
    `\\`) and everything else as written: what most encoders write (UTF-8 as is)."""
    return "".join(
        f"(?:{re.escape(_SHORT_ESCAPES[char])}|{re.escape(char)})" if char in '"\\' else re.escape(char)
        for char in secret
    )


def _escaped_any_way_bytes(secrets: list[str]) -> bytes:
    return "|".join(map(_escaped_any_way, secrets)).encode()


def _percent_forms(secret: str) -> list[str]:
    """`secret` as URL encoders write it, where that differs from it: every character but letters,
    digits and `-._~` percent-encoded, or all but `/` too, in upper- and lower-case hex."""
    forms: set[str] = set()
    for safe in ("", "/"):
        encoded = quote(secret, safe=safe, errors="surrogatepass")
        if encoded != secret:
            forms.add(encoded)
            forms.add(re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), encoded))
    return sorted(forms, key=len, reverse=True)


def _percent_escape(byte: int) -> str:
    """A pattern for `%XX` of one byte, its hex digits in either case."""
    return "%" + "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{byte:02x}")


def _unicode_escape(unit: int) -> str:
    r"""A pattern for `\uXXXX` of one UTF-16 code unit, its hex digits in either case."""
    digits = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{unit:04x}")
    return re.escape("\\") + "u" + digits


def _utf16(char: str) -> list[int]:
    r"""The UTF-16 code units JSON's `\u` escapes write for `char` (two for one past the BMP)."""
    code = ord(char)
    if code < 0x10000:
        return [code]
    code -= 0x10000
    return [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]


class StreamScrubber:
    """Scrubs a relayed stream event by event, so that a secret split between two chunks is found too.

    An event is passed on once the blank line that ends it has arrived: an SSE client acts on
    nothing before it, so holding the rest back delays nothing it could read, and a stream that
    breaks off mid-event leaves the client no half event for the proxy's own closing event to be
    glued to (`drop_partial`). A line that carries an error object (`"error"`, as OpenAI and
    Anthropic error events do) is error text; every other line is content, where only the
    configured secrets are replaced.
    """

    __slots__ = ("_pending", "_scrubber")

    MAX_PENDING: Final = 64 * 1024
    """An event longer than this is passed on in pieces rather than held in memory whole."""

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be passed on now (possibly nothing)."""
        data = self._pending + chunk if self._pending else chunk
        cut = _events_end(data)
        if cut == 0 and len(data) <= self.MAX_PENDING:
            self._pending = data
            return b""
        if cut == 0:
            # A huge event: on in pieces, each cut at a line's end where it can be (no secret
            # holds one), else short of the end by as much as a secret can span, so that none is
            # passed on in two pieces, each too short to be found.
            cut = data.rfind(b"\n") + 1 or max(len(data) - self._scrubber.reach, 0)
        self._pending = data[cut:]
        return self._scrub(data[:cut]) if cut else b""

    def flush(self) -> bytes:
        """The rest, at the end of the stream."""
        data, self._pending = self._pending, b""
        return self._scrub(data) if data else b""

    def drop_partial(self) -> None:
        """Forget an event that never ended (the upstream broke off inside it): the client gets
        the proxy's closing event instead, whole."""
        self._pending = b""

    def _scrub(self, data: bytes) -> bytes:
        scrubber = self._scrubber
        if b'"error"' not in data:
            return scrubber.secrets(data)
        return b"".join(
            scrubber.error_bytes(line) if b'"error"' in line else scrubber.secrets(line)
            for line in data.splitlines(keepends=True)
        )


def _events_end(data: bytes) -> int:
    """Where the last complete SSE event in `data` ends (after its blank line), or 0: a line's end
    followed by an empty line, in LF or CRLF."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
