"""A client's request body, parsed once and sent on as it came, with only its model changed.

A coding agent sends about 400 KB of JSON with every request. Parsing it is needed (the model,
`stream`, and a clear 400 for anything that is not a JSON object), but encoding all of it again
cost several times what the parse does. So `RequestBody.for_model` writes the attempt's model into
the client's own bytes and copies the rest as it came: the upstream reads the same members and
values the client sent (in the client's spacing), with the model the attempt is for.

Where the model goes depends on where the client put it:

- **Last member** (`{..., "model": "a/b"}`): its value is replaced in place.
- **First member** (`{"model": "a/b", ...}`): that member is taken out and the model is written as
  the last member instead. Whatever else the body holds, a JSON reader that takes the last of
  repeated keys (the standard for JavaScript, Python, Go and most servers, and how this proxy read
  the client's body) then reads the attempt's model: a client that repeats `model` further on
  cannot make the upstream see a name of its choosing.
- **Anywhere else** (the OpenAI Python SDK writes `messages` first): the top-level members are
  walked with the standard library's scanner, which says where each one ends. One `model` member
  has its value replaced in place; a body that repeats it is encoded again without it, as before.

The first two are found from the ends of the bytes, in time that does not grow with the body.
A large body's two members the proxy reads are read by simdjson (`_read_members`), which validates
all of it without building its objects. Parsing is otherwise orjson's, several times faster than
the standard library's; whatever orjson refuses
(lone surrogates, nesting past 1,024 levels, a byte order mark, UTF-16) goes to the strict
standard parser (`untrusted.loads`), which decides as it always did, and such a body is encoded
again from that parser's reading (orjson reads integers past 64 bits as floats).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

import orjson
import simdjson

from proxy import untrusted

__all__ = ["RequestBody", "parse"]

_WHITESPACE: Final = b" \t\n\r"
_MODEL_KEY: Final = b'"model"'
_FIRST_MEMBER: Final = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"model"[ \t\n\r]*:[ \t\n\r]*"')
"""A body's start up to the opening quote of its first member's value, when that member is `model`."""
_AFTER_MEMBER: Final = re.compile(rb"[ \t\n\r]*(,[ \t\n\r]*)?")
_COMPACT_HEAD: Final = b'{"model":"'
_SPACED_HEAD: Final = b'{"model": "'
_COMMA: Final = 0x2C
_VIEW_FROM: Final = 64 * 1024
"""A body at least this long is sent on as views of the client's bytes (one copy, when the pieces
are joined); a shorter one is cut into bytes, cheaper to make than views."""
_DUMPED_CACHED: Final = 1024
_prefixes: dict[str, bytes] = {}
"""Model name -> `_compact_prefix`."""
_dumped: dict[str, bytes] = {}
"""Model name -> as a JSON string (`for_model`): the same few names every time; at most
_DUMPED_CACHED of them."""
_BACKSLASH: Final = 0x5C
_QUOTE: Final = 0x22
_DECODER: Final = json.JSONDecoder()
# The standard library's C scanner: one JSON value (or string) from a position, and where it ends.
# Used only on bodies orjson accepted (no NaN there). Typeshed does not declare these attributes,
# which JSONDecoder sets in __init__.
_scan_value: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_scan_string: Callable[[str, int, bool], tuple[str, int]] = _DECODER.parse_string  # type: ignore[attr-defined]


def parse(raw: bytes) -> tuple[Any, bool]:
    """The JSON document in `raw` (ValueError or RecursionError when it is not JSON), and whether it
    is the strict standard parser's reading: orjson reads what it can, the standard parser the rest.

    A large object (`_LAZY_FROM` and up) comes back as a dict of only the members the proxy reads
    (`READ_MEMBERS`), when simdjson can read it (`_read_members`)."""
    if _LAZY_FROM <= len(raw) <= _LAZY_UP_TO:
        members = _read_members(raw)
        if members is not None:
            return members, False
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError:
        return untrusted.loads(raw), True


READ_MEMBERS: Final = ("model", "stream")
"""The members of a request body the proxy reads; the rest it only passes on."""
_LAZY_FROM: Final = 64 * 1024
"""From this size a body is read by simdjson (`_read_members`); below, orjson is the faster."""
_LAZY_UP_TO: Final = 4 * 1024 * 1024
"""simdjson's parser keeps buffers of about four times the largest document it has read, for the
next one: bodies past this size go to orjson, so that one huge request does not hold memory for
the life of the process."""
_BOM: Final = b"\xef\xbb\xbf"
_lazy = simdjson.Parser()
"""One parser, reused (its buffers are the point): a document is read and let go before anything
else runs on the loop."""


def _read_members(raw: bytes) -> dict[str, Any] | None:
    """`READ_MEMBERS` of the object in `raw`, or None when orjson (and the standard parser after it)
    should read the body instead.

    A coding agent's request is 400 KB of JSON, and the proxy reads two of its members. orjson builds
    every one of its thousands of objects to find them (a fifth of what such a request costs the
    proxy); simdjson validates the whole document as strictly (UTF-8, structure, escapes, numbers)
    and builds only what is asked for. Anything where its reading could differ from orjson's goes
    to orjson: a document it refuses, a byte order mark (which simdjson skips and orjson refuses),
    a repeated top-level member (simdjson finds the first, orjson keeps the last), anything but an
    object, and a parser still held (it cannot read while a document of its own is alive).
    """
    if raw.startswith(_BOM):
        return None
    try:
        document = _lazy.parse(raw)
    except (ValueError, RuntimeError, MemoryError):  # not JSON as simdjson reads it; the parser held
        return None
    try:
        if not isinstance(document, simdjson.Object):
            return None
        names = list(document.keys())
        if len(names) != len(set(names)):
            return None
        members: dict[str, Any] = {}
        for name in READ_MEMBERS:
            value = document.get(name)
            # Strings and the rest of JSON's scalars as they are; a nested value only as what it is
            # not (a name or a flag), never as simdjson's view, which would hold the parser.
            if isinstance(value, str | bool | int | float) or value is None:
                members[name] = value
            elif name in names:
                members[name] = ()
        return members
    finally:
        del document


class RequestBody:
    """A parsed request body (a JSON object with a string `model`) that any attempt's model can be
    written into (`for_model`, which cannot fail).

    Raises ValueError or RecursionError when the body cannot be sent on at all: the standard
    encoder, which writes the bodies that cannot be spliced, goes only so deep.
    """

    __slots__ = ("_head", "_rest", "_tail")

    def __init__(self, raw: bytes, document: dict[str, Any], exact: bool) -> None:
        """`document`: `raw` parsed (`parse`); `exact`: whether that was the standard parser.
        (`exact` may be passed by position: a class called with a keyword argument makes a dict
        for it, about 1.2 k instructions on 3.11, and a body is made for every request.)"""
        self._head: tuple[bytes | memoryview, ...] = ()
        self._tail: bytes | memoryview = b""
        self._rest: bytes | None = None
        # Only bytes orjson took are spliced: UTF-8 without a byte order mark, as JSON is sent.
        model = document.get("model")
        split = None if exact or not isinstance(model, str) else _split(raw, model)
        if split is not None:
            self._head, self._tail = split
            return
        read = document if exact else untrusted.loads(raw)
        self._rest = untrusted.dumps({k: v for k, v in read.items() if k != "model"})

    def for_model(self, model: str) -> bytes:
        """The body to send upstream: the client's body with `model` as its model."""
        value = _dumped.get(model)
        if value is None:
            value = untrusted.dumps(model)
            if len(_dumped) < _DUMPED_CACHED:
                _dumped[model] = value
        if self._rest is None:
            return b"".join((*self._head, value, self._tail))  # the one copy of the body
        head = b'{"model": ' + value
        return head + b"}" if self._rest == b"{}" else head + b", " + self._rest[1:]


def _split(raw: bytes, model: str) -> tuple[tuple[bytes | memoryview, ...], bytes | memoryview] | None:
    """(head, tail): the pieces of the body before and after where the model's value goes (views
    of `raw`, not copies), or None when that cannot be told."""
    whole: bytes | memoryview = memoryview(raw) if len(raw) >= _VIEW_FROM else raw
    first = _first_member(raw, model)
    if first is not None and (first[4] or _string_is(raw, first[0], first[1], model)):
        value_start, value_end, rest_start, close, _ = first
        if rest_start == close:  # `{"model": ...}` and nothing else
            return (whole[:value_start],), whole[value_end:]
        # `{` + the other members + `, "model": ` ... `}`: the model last (see the module docstring).
        return (b"{", whole[rest_start:close], b', "model": '), whole[close:]
    span = _last_member_value(raw)
    if span is not None:
        start, end = span
        return ((whole[:start],), whole[end:]) if _string_is(raw, start, end, model) else None
    span = _only_member_value(raw)
    if span is not None:
        start, end = span
        return ((whole[:start],), whole[end:]) if _string_is(raw, start, end, model) else None
    return None


def _string_is(raw: bytes, start: int, end: int, model: str) -> bool:
    """Is raw[start:end] a JSON string that reads `model`?"""
    try:
        return bool(orjson.loads(raw[start:end]) == model)
    except orjson.JSONDecodeError:
        return False


def _skip(raw: bytes, i: int) -> int:
    while i < len(raw) and raw[i] in _WHITESPACE:
        i += 1
    return i


def _skip_back(raw: bytes, i: int) -> int:
    """The index just after the last non-whitespace byte before `i`."""
    while i > 0 and raw[i - 1] in _WHITESPACE:
        i -= 1
    return i


def _escaped(raw: bytes, i: int) -> bool:
    """Is the byte at `i` escaped (preceded by an odd number of backslashes)?"""
    slashes = 0
    while i - 1 - slashes >= 0 and raw[i - 1 - slashes] == _BACKSLASH:
        slashes += 1
    return slashes % 2 == 1


def _first_member(raw: bytes, model: str = "") -> tuple[int, int, int, int, bool] | None:
    """When the object's first member is `"model": "<string>"`: where its value starts and ends,
    where the next member starts (after the comma), where the closing brace is, and whether the
    value is known to read `model` (when it is `model` as it is, without escapes)."""
    prefix = _compact_prefix(model)
    if prefix and raw.startswith(prefix) and raw.endswith(b"}") and raw[len(prefix)] not in _WHITESPACE:
        # `{"model":"<model>",` then the next member at once, and the brace last: what the
        # steps below find for the compact spelling, in one comparison.
        rest = len(prefix)
        return len(_COMPACT_HEAD) - 1, rest - 1, rest, len(raw) - 1, True
    # The two spellings clients use (compact, and Python's json.dumps) without the regex.
    if raw.startswith(_COMPACT_HEAD):
        start = len(_COMPACT_HEAD) - 1
    elif raw.startswith(_SPACED_HEAD):
        start = len(_SPACED_HEAD) - 1
    else:
        head = _FIRST_MEMBER.match(raw)
        if head is None:
            return None
        start = head.end() - 1
    end = start
    plain = _plain(model)
    after_plain = start + 1 + len(plain) if plain is not None else 0
    if plain is not None and raw.startswith(plain, start + 1) and raw[after_plain : after_plain + 1] == b'"':
        # The model's own characters, then a quote: none of them is a backslash, so that quote is
        # the closing one, and a string without escapes reads what it holds.
        end = start + 2 + len(plain)
        known = True
    else:
        while True:  # the closing quote: the first unescaped one
            end = raw.find(b'"', end + 1)
            if end < 0:
                return None
            if not _escaped(raw, end):
                break
        end += 1
        known = False
    size = len(raw)
    close = size - 1 if raw.endswith(b"}") else _skip_back(raw, size) - 1
    follows = raw[end : end + 2]
    if len(follows) == 2 and follows[0] == _COMMA and follows[1] not in _WHITESPACE:
        return start, end, end + 1, close, known  # `,` and the next member at once
    after = _AFTER_MEMBER.match(raw, end)
    if after is None:
        return None
    if after.group(1) is None:  # no comma: the only member
        return (start, end, close, close, known) if after.end() == close else None
    return start, end, after.end(), close, known


def _compact_prefix(model: str) -> bytes:
    """`{"model":"<model>",` when `model` is `_plain`, else empty (kept per name, at most
    _DUMPED_CACHED of them)."""
    prefix = _prefixes.get(model)
    if prefix is None:
        plain = _plain(model)
        prefix = _COMPACT_HEAD + plain + b'",' if plain is not None else b""
        if len(_prefixes) < _DUMPED_CACHED:
            _prefixes[model] = prefix
    return prefix


def _plain(model: str) -> bytes | None:
    """`model` as a JSON string holds it without escapes (printable ASCII, no quote or backslash),
    or None when it may need some."""
    if model and model.isascii() and model.isprintable() and '"' not in model and "\\" not in model:
        return model.encode()
    return None


def _last_member_value(raw: bytes) -> tuple[int, int] | None:
    """When the object's last member is `"model": "<string>"`: where its value starts and ends.

    Read backwards from the closing brace: the last value's closing quote, its opening quote (the
    first unescaped quote before it: inside a string every quote is escaped), the colon, and a key
    that is exactly `"model"` after a comma or the opening brace. In a valid document that is a
    member of the top-level object.
    """
    close = _skip_back(raw, len(raw)) - 1
    if close < 0 or raw[close] != ord("}"):
        return None
    end = _skip_back(raw, close)
    if end == 0 or raw[end - 1] != _QUOTE:
        return None
    start = end - 1
    while True:
        start = raw.rfind(b'"', 0, start)
        if start < 0:
            return None
        if not _escaped(raw, start):
            break
    colon = _skip_back(raw, start)
    if colon == 0 or raw[colon - 1] != ord(":"):
        return None
    key_end = _skip_back(raw, colon - 1)
    key_start = key_end - len(_MODEL_KEY)
    if key_start < 0 or raw[key_start:key_end] != _MODEL_KEY or _escaped(raw, key_start):
        return None
    before = _skip_back(raw, key_start)
    if before == 0 or raw[before - 1] not in b",{":
        return None
    return start, end


def _only_member_value(raw: bytes) -> tuple[int, int] | None:
    """Where the value of the one top-level `model` member is, found by walking the top-level members
    with the standard scanner; None when there is not exactly one or it is not a string."""
    text = raw.decode()  # orjson accepted it: UTF-8
    found: list[tuple[int, int]] = []
    try:
        i = _skip_text(text, 0)
        if text[i : i + 1] != "{":
            return None
        i = _skip_text(text, i + 1)
        while text[i : i + 1] == '"':
            key, i = _scan_string(text, i + 1, True)
            i = _skip_text(text, i)
            if text[i : i + 1] != ":":
                return None
            start = _skip_text(text, i + 1)
            _, end = _scan_value(text, start)
            if key == "model":
                found.append((start, end))
            i = _skip_text(text, end)
            if text[i : i + 1] == ",":
                i = _skip_text(text, i + 1)
    except (ValueError, StopIteration, RecursionError):
        return None
    if len(found) != 1:
        return None
    start, end = found[0]
    if text.isascii():
        return start, end
    # Byte offsets of the characters: only the text before the value and the value itself count.
    byte_start = len(text[:start].encode())
    return byte_start, byte_start + len(text[start:end].encode())


def _skip_text(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i
