"""What the operator's terminal can do: whether the console may start, and in which characters.

The console is full-screen, with mouse capture and colour; a terminal that says it cannot do that
(`TERM=dumb`, Emacs' shell, a pipe instead of a tty) gets a clear refusal that points at the
headless server and the CLI instead of a screen of escape codes. A terminal whose locale is not
UTF-8 gets the console drawn in ASCII: every character Textual, Rich or the console would send
outside ASCII (box borders, blocks, arrows, ellipses, and any name in another script) is written
as an ASCII look-alike of the same width, at the one place output leaves the process (the
driver's `write`, `omniroute_tui.driver.AsciiDriver`), so nothing drawn anywhere can slip past it.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from typing import IO, Any

from rich.cells import get_character_cell_size

DUMB_TERMINALS = frozenset({"", "dumb", "unknown"})


def refusal(
    env: Mapping[str, str], *streams: tuple[str, IO[Any] | None], attached: str | None = None
) -> str | None:
    """Why the full-screen console cannot run here, or None when it can. `streams`: (name, stream)
    pairs that must all be terminals (stdin for keys; stdout and stderr, which Textual draws on).
    `attached`: the URL of the running instance it was to attach to (the advice is then to watch
    that one, not to start one)."""
    watch = "`omniroute status`, `omniroute breakers`, `omniroute connections` and `omniroute lockouts`"
    if attached is not None:
        instead = f"watch {attached} with {watch} (with --url), or `omniroute events --follow`"
    else:
        instead = f"run the proxy headless with `omniroute serve` and watch it with {watch}"
    if os.name == "posix" and env.get("TERM", "") in DUMB_TERMINALS:
        return f"the console needs a full-screen terminal, and TERM={env.get('TERM', '')!r} is not one; {instead}"
    for name, stream in streams:
        if stream is None or not stream.isatty():
            return f"the console needs a terminal, and its {name} is not one; {instead}"
    return None


def wants_ascii(env: Mapping[str, str]) -> bool:
    """True unless the locale's character set is UTF-8 (LC_ALL, then LC_CTYPE, then LANG, as C does).
    Only on POSIX: elsewhere the console's terminal is a UTF-8 one whatever the environment says."""
    if os.name != "posix":
        return False
    locale = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or "C"
    charset = locale.partition(".")[2].partition("@")[0].lower().replace("-", "")
    return charset != "utf8"


# -- ASCII output -----------------------------------------------------------------------------------

_LOOK_ALIKES = {
    **dict.fromkeys("─━┄┅┈┉╌╍═╴╶╸╺╼╾", "-"),
    **dict.fromkeys("│┃┆┇┊┋╎╏║╵╷╹╻╽╿▏▕▎▍▌▋▊▉▐", "|"),
    **dict.fromkeys("┌┍┎┏┐┑┒┓└┕┖┗┘┙┚┛├┝┞┟┠┡┢┣┤┥┦┧┨┩┪┫┬┭┮┯┰┱┲┳┴┵┶┷┸┹┺┻┼┽┾┿╀╁╂╃╄╅╆╇╈╉╊╋", "+"),
    **dict.fromkeys("╒╓╔╕╖╗╘╙╚╛╜╝╞╟╠╡╢╣╤╥╦╧╨╩╪╫╬╭╮╯╰", "+"),
    **dict.fromkeys("▁▂▃", "_"),
    **dict.fromkeys("▄▅▆", "="),
    **dict.fromkeys("▇█▓▒░■", "#"),
    **dict.fromkeys("▔▀", "^"),
    "▲": "^",
    "▼": "v",
    "▶": ">",
    "◀": "<",
    "→": ">",
    "←": "<",
    "↑": "^",
    "↓": "v",
    "·": ".",
    "•": "*",
    "…": ".",
    "—": "-",
    "–": "-",
    "“": '"',
    "”": '"',
    "‘": "'",
    "’": "'",
    "↵": "/",
    "⇥": ">",
    "✓": "+",
    "✔": "+",
    "✗": "x",
    "✘": "x",
    "×": "x",
    "∞": "~",
    "⏎": "/",
    "\u00a0": " ",
}


class _AsciiTable(dict[int, str]):
    """`str.translate` table: a look-alike per known character, `?` (one per cell) for the rest."""

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        if code < 0x80:
            out = ch
        elif ch in _LOOK_ALIKES:
            out = _LOOK_ALIKES[ch]
        else:
            decomposed = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            cells = get_character_cell_size(ch)
            out = decomposed if len(decomposed) == cells and decomposed.isprintable() else "?" * cells
        self[code] = out
        return out


_TABLE = _AsciiTable()


def to_ascii(text: str) -> str:
    """`text` with every non-ASCII character replaced by ASCII of the same width in cells."""
    return text if text.isascii() else text.translate(_TABLE)
