"""Text that came from outside (a client's body, header or path; an upstream's answer): read
strictly, quoted briefly, written back without breaking.

- `loads`: JSON as RFC 8259 has it. Python's parser also takes `NaN`, `Infinity` and `-Infinity`,
  which no other JSON reader does: forwarded upstream they make a body the upstream cannot parse,
  so they are refused here like any other malformed JSON. So is a number that would come out
  that way (`1e999` reads as infinity), and an integer too long for CPython to convert
  (`Unsendable`: legal JSON this program cannot pass on as written).
- `dumps`: JSON bytes for any document a client can send. A lone surrogate (`"\\ud800"`) is legal
  JSON and decodes to a `str` that UTF-8 cannot encode; it is written back escaped, as it came.
- `read_answer`: an upstream's JSON as the clients' own libraries read it (NaN and Infinity, as
  Python's json writes them, included): a proxy must call an answer good or garbled as its clients
  would, not more strictly.
- `echo`: a piece of the client's input quoted in an answer, at most `ECHO_LIMIT` characters, so
  that an answer never grows with what a client sends.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any, Final

import orjson

__all__ = [
    "ECHO_LIMIT",
    "MODEL_LIMIT",
    "MODEL_TOO_LONG",
    "NOT_JSON",
    "SESSION_LIMIT",
    "Unsendable",
    "dumps",
    "echo",
    "is_text",
    "loads",
    "read_answer",
]

ECHO_LIMIT: Final = 200
"""The most characters of a client's input that any answer quotes back."""
MODEL_LIMIT: Final = 256
"""The longest `model` a request may name. A name is kept (the request trail, lockouts, the log,
the state file): one of megabytes, which a body of up to 32 MiB can hold, names no model and would
be kept whole in every one of them."""
MODEL_TOO_LONG: Final = f"`model` is longer than {MODEL_LIMIT} characters; no model is named so"
SESSION_LIMIT: Final = 256
"""The longest session id kept as it came: a session is kept (a pin, in memory and the state file,
for `sessionAffinity.ttlMs`); a longer one is kept as its digest."""


def no_constant(name: str) -> Any:
    """`json.loads`'s `parse_constant`: NaN and Infinity are Python's reading, not JSON (a client
    of what is passed on, or printed, could not read them)."""
    raise ValueError(f"{name} is not valid JSON")


class Unsendable(ValueError):
    """Legal JSON that cannot be passed on as the client wrote it: its message says why."""


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # infinite (a float's own NaN never comes from a JSON number)
        raise Unsendable(f"the number {echo(text)} is too large to pass on (it reads as infinity)")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # CPython converts at most sys.get_int_max_str_digits() digits (4,300)
        raise Unsendable(f"an integer of {len(text):,} digits is too long to pass on") from None


TOO_DEEP: Final = "JSON nested deeper than the proxy reads (about 1,000 levels)"
"""Legal JSON refused for its depth: orjson stops at 1,024 levels, the standard parser near the
interpreter's recursion limit."""


class TooDeep(ValueError):
    """Legal JSON nested deeper than the parsers go (`TOO_DEEP`): not malformed, and not the
    parser's words about recursion."""

    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


class RepeatedKey(ValueError):
    """An object that names one member twice (`loads(..., unique=True)`): which one was meant is a
    guess, and a parser's guess (the last) can hide the other, refused, one."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {echo(key)!r} is given twice in one object")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return found


def loads(raw: bytes | str, *, unique: bool = False) -> Any:
    """Parse JSON, refusing `NaN` and `Infinity`. ValueError when it is not JSON; UnicodeDecodeError
    is a ValueError; and so are `TooDeep` for nesting deeper than the parser goes, `Unsendable` for a
    number that cannot be written back as it came and, with `unique`, `RepeatedKey` for an object
    that repeats a member."""
    try:
        return json.loads(
            raw,
            parse_constant=no_constant,
            parse_float=_finite,
            parse_int=_integer,
            object_pairs_hook=_unique if unique else None,
        )
    except RecursionError:
        raise TooDeep() from None


NOT_JSON: Final = object()
"""What `read_answer` returns for text that is not JSON."""


def read_answer(content: bytes | str) -> object:
    """The JSON document an upstream sent, or NOT_JSON. orjson first: it is several times faster and
    refuses only what the standard parser may still read (NaN, Infinity). Integers past 64 bits it
    reads as floats, as JavaScript clients do."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return NOT_JSON


def dumps(data: Any) -> bytes:
    """`data` as compact-enough UTF-8 JSON bytes, whatever strings it holds.

    Non-ASCII text is written as UTF-8 (a third of the size of `\\uXXXX` escapes for most scripts);
    only a document holding a lone surrogate, which UTF-8 cannot encode, is written with every
    non-ASCII character escaped instead. Both are the same JSON document.
    """
    if type(data) is str:
        # What json.dumps writes for a lone string (JSONEncoder.encode calls these two), without
        # the encoder object it builds per call for ensure_ascii=False: every attempt writes its
        # model this way.
        try:
            return encode_basestring(data).encode()
        except UnicodeEncodeError:
            return encode_basestring_ascii(data).encode()
    try:
        # orjson writes the same document (compact) in a tenth of the time: every error answer and
        # management document goes this way. It refuses what JSON's standard writer takes or
        # escapes: a lone surrogate, an integer past 64 bits, a key that is not a string.
        return orjson.dumps(data)
    except TypeError:  # (orjson.JSONEncodeError is one)
        pass
    text = json.dumps(data, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(data, ensure_ascii=True).encode()


def is_text(value: str) -> bool:
    """Is `value` encodable as UTF-8, i.e. free of lone surrogates? (A name must be; content need not.)"""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def echo(text: str) -> str:
    """`text` as an answer may quote it: at most `ECHO_LIMIT` characters, then an ellipsis."""
    if len(text) <= ECHO_LIMIT:
        return text
    return text[:ECHO_LIMIT] + f"… ({len(text)} characters)"
