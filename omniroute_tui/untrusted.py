"""The one boundary for text the program did not write itself.

Model names come from any client of `/v1`; provider, connection and key names from config
files; error messages, event reasons and log lines from upstream bodies. Any of them may hold
an escape sequence (`\\x1b]0;title\\x07` retitles the operator's terminal), a newline or a tab
(which break the rows and columns around them), bidirectional overrides and zero-width
characters (which make a name read as another), or be ten kilobytes long.

`visible()` turns such text into one line of plain, printable characters: every control or
format character is written out as a visible escape (`\\x1b`, `\\u202e`, `↵` for a line break,
`⇥` for a tab), never passed through, and very long text is cut; so is a pile of combining marks,
which draws over the cells around it. The console's read model
(`snapshot.py`) and the CLI's table cells pass every foreign string through it once; widgets
then draw it as plain text (segments, `Text`, `markup=False`), never as markup.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Final

MAX_CHARS: Final = 2_000
"""Longer text is cut (a detail pane shows at most this; a table cell far less)."""

UNICODE_MARKS: Final = {"newline": "↵", "tab": "⇥", "more": "…"}
ASCII_MARKS: Final = {"newline": "\\n", "tab": "\\t", "more": "..."}

_marks: dict[str, str] = UNICODE_MARKS


def use_ascii(ascii_only: bool) -> None:
    """Write the marks for line breaks, tabs and cut text in ASCII (a terminal without UTF-8)."""
    global _marks
    _marks = ASCII_MARKS if ascii_only else UNICODE_MARKS
    _escaped.cache_clear()


MAX_COMBINING: Final = 4
"""The most combining marks (zero-width accents) kept on one character: words stack two or three;
dozens draw over the rows around them."""


def visible(text: str, limit: int = MAX_CHARS) -> str:
    """`text` as one line of printable characters, at most `limit` characters (plus a mark)."""
    if len(text) > limit:
        text = text[:limit] + _marks["more"]
    if text.isascii() and text.isprintable():  # the common case, in C: plain names pay almost nothing
        return text
    return _escaped(text)


def visible_lines(text: str) -> str:
    """`visible()` line by line: a message of several lines (a refused start lists each problem on
    its own) keeps its breaks, and nothing else passes."""
    return "\n".join(visible(line) for line in text.splitlines())


@lru_cache(maxsize=4096)
def _escaped(text: str) -> str:
    out = []
    stacked = MAX_COMBINING  # marks on the character before: none yet, so a first mark sits on nothing
    for ch in text.replace("\r\n", "\n"):
        if unicodedata.category(ch) in _COMBINING:
            stacked += 1
            out.append(ch if stacked <= MAX_COMBINING else _escape(ch))
            continue
        printable = ch.isprintable()
        stacked = 0 if printable else MAX_COMBINING
        out.append(ch if printable else _escape(ch))
    return "".join(out)


_COMBINING: Final = frozenset({"Mn", "Me"})
"""The zero-width combining marks: drawn on the cell before them."""


def _escape(ch: str) -> str:
    if ch == "\n" or ch in "\u2028\u2029":
        return _marks["newline"]
    if ch == "\t":
        return _marks["tab"]
    if unicodedata.category(ch) == "Zs":  # no-break and other-width spaces: harmless, but one cell
        return " "
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
