"""stdout is data, stderr is for people: `emit` writes one or the other form of a view, `note` talks.

With `--json` the management API's answer goes to stdout unchanged and nothing else does, so
`omniroute breakers --json | jq` always works. Without it, a Rich renderable is built and printed
(Rich's table modules are imported only then). Cell helpers turn API values into short human
text ("1m 05s", "3s ago") the way the console does (`omniroute_tui.format`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from omniroute_tui import format as fmt
from omniroute_tui.untrusted import visible
from proxy.resilience.timefmt import epoch_ms

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

__all__ = [
    "STATE_STYLES",
    "ago",
    "cell",
    "console",
    "duration",
    "emit",
    "epoch_ms",
    "note",
    "state_cell",
    "table",
    "wide",
]

STATE_STYLES: dict[str, str] = {
    **{state: fmt.ROW_COLOURS[cls] for state, cls in fmt.BREAKER_STYLES.items()},
    **{state: fmt.ROW_COLOURS[cls] for state, cls in fmt.CONNECTION_STYLES.items()},
    "healthy": fmt.ROW_COLOURS[fmt.OK],
    "degraded": fmt.ROW_COLOURS[fmt.WARN],
}
"""Colour per state, the console's (`omniroute_tui.format`); the state is always written out too."""

_PIPE_WIDTH = 200
"""Rich wraps to 80 columns when stdout is not a terminal; a pipe (grep, less -S) wants whole rows."""


def emit(data: object, *, json_: bool, human: Callable[[], RenderableType | None]) -> None:
    """Print a view: `data` as JSON, or what `human()` renders (None: nothing on stdout)."""
    if json_:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    renderable = human()
    if renderable is not None:
        console().print(renderable)


def note(text: str) -> None:
    """A message for the person at the terminal, on stderr (never mixed into the data), one line."""
    sys.stderr.write(visible(text) + "\n")
    sys.stderr.flush()


def console() -> Console:
    from rich.console import Console

    width = None
    if not sys.stdout.isatty():
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdecimal() else _PIPE_WIDTH
    return Console(width=width, highlight=False, soft_wrap=False)


KEPT_WIDTH = 48
"""The most cells a kept column takes: a longer name ends in "…". Some of these names are whatever
a client sent (a model), and one that never wraps would otherwise take the whole width. On a
terminal narrower than 4 x KEPT_WIDTH a kept column takes at most a quarter of it (and at least
KEPT_MIN_WIDTH cells), so that the columns after it stay readable."""
KEPT_MIN_WIDTH = 16


def kept_width() -> int:
    return max(KEPT_MIN_WIDTH, min(KEPT_WIDTH, console().width // 4))


def table(*columns: str, keep: int = 1, title: str | None = None) -> Table:
    """A borderless table; its first `keep` columns (the names people look for) never wrap, and
    stop at `kept_width()` cells."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(
        # (a title may quote the instance, as `stats` does its window: text, never Rich markup)
        title=Text(visible(title)) if title is not None else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
        pad_edge=False,
    )
    kept = kept_width()
    for index, header in enumerate(columns):
        if index < keep:
            t.add_column(header, no_wrap=True, overflow="ellipsis", max_width=kept)
        else:
            t.add_column(header)
    return t


def wide() -> bool:
    """Is there room for a descriptive column (a terminal of at least 150 columns, or a pipe)?"""
    return console().width >= 150


def cell(value: object, style: str = "") -> Text:
    """A table cell; text from the API is never read as Rich markup. None is shown as a dash."""
    from rich.text import Text

    if value is None or value == "":
        return Text(fmt.NONE, style="dim")
    return Text(visible(str(value)), style=style)


def state_cell(state: str) -> Text:
    return cell(state, STATE_STYLES.get(state, ""))


def duration(ms: float | None) -> str:
    """Milliseconds as the console writes them (`42s`, `1m 05s`, `2h 03m`); a dash when nothing is left."""
    return fmt.countdown(ms) if ms is not None else fmt.NONE


def ago(iso: str | None, now_ms: float | None = None) -> str:
    """`3m 20s ago` for an API timestamp, measured from `now_ms` (the instance's clock) or this machine's."""
    at = epoch_ms(iso)
    if at is None:
        return fmt.NONE
    now = now_ms if now_ms is not None else time.time() * 1000
    elapsed = now - at
    return "just now" if elapsed < 1000 else f"{duration(elapsed)} ago"
