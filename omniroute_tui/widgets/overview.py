"""The Overview tab: the three layers at a glance.

Breaker tiles (coloured by state, the state written out), the worst connections, the longest
lockouts and the latest events. Each section re-renders only when its part of the snapshot changed;
the three lists are `LinesView`s, whose countdowns repaint without a Rich layout pass.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.columns import Columns
from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from omniroute_tui import format as fmt
from omniroute_tui.snapshot import Overview, Row, Tile
from omniroute_tui.widgets.lines import Line, LinesView, line

TILE_NAME = 20
"""Cells of a provider name on its tile: a longer one ends in "…", so tiles stay side by side."""


class OverviewPane(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: Overview | None = None
        self.tiles = Static("", id="tiles")
        self.cooling = LinesView(id="overview-cooling", classes="overview-box")
        self.lockouts = LinesView(id="overview-lockouts", classes="overview-box")
        self.events = LinesView(id="overview-events", classes="overview-box")
        self.cooling.border_title = "Connections needing attention"
        self.lockouts.border_title = "Longest lockouts"
        self.events.border_title = "Recent events"

    def compose(self) -> ComposeResult:
        yield self.tiles
        with Horizontal(id="overview-lists"):
            yield self.cooling
            yield self.lockouts
        yield self.events

    def apply(self, overview: Overview) -> None:
        old, self._shown = self._shown, overview
        # A box is laid out again only when its number of lines changed; a countdown ticking in
        # place is a repaint.
        if old is None or old.tiles != overview.tiles:
            relayout = old is None or [t.provider for t in old.tiles] != [t.provider for t in overview.tiles]
            self.tiles.update(tiles(overview.tiles), layout=relayout)
        if old is None or old.cooling != overview.cooling:
            self.cooling.show(rows(overview.cooling, "every connection is active", (16, 8, 7, 60)))
        if old is None or old.cooling_total != overview.cooling_total:
            self.cooling.border_subtitle = f"{overview.cooling_total:,} not active"
        if old is None or old.lockouts != overview.lockouts:
            self.lockouts.show(rows(overview.lockouts, "no model is locked out", (30, 7, 16, 16)))
        if old is None or old.lockout_total != overview.lockout_total:
            self.lockouts.border_subtitle = f"{overview.lockout_total:,} active"
        if old is None or old.events != overview.events:
            self.events.show(rows(overview.events, "nothing has happened yet", (8, 10, 26, 18, 60)))


def tiles(items: tuple[Tile, ...]) -> RenderableType:
    """Two-line blocks: the provider, then its state written out (and how long, or how close)."""
    if not items:
        return Text("No providers configured.", style="dim")
    blocks = []
    for t in items:
        status = f"{t.state} {t.text}"
        provider = fmt.clip(t.provider, TILE_NAME)
        width = max(cell_len(provider), len(status)) + 2
        style = fmt.TILE_COLOURS[t.style]
        blocks.append(
            Text.assemble(
                (f" {set_cell_size(provider, width - 1)}\n", f"{style} bold"),
                (f" {status:<{width - 1}}", style),
            )
        )
    return Columns(blocks, padding=(0, 1))


def rows(items: tuple[Row, ...], empty: str, caps: tuple[int, ...]) -> list[Line]:
    """Aligned lines, each column as wide as its widest value up to its cap (the box cuts a line
    longer than itself with "…")."""
    if not items:
        return [line(empty, "dim")]
    widths = [min(cap, max(len(row.cells[i]) for row in items)) for i, cap in enumerate(caps)]
    return [
        line(
            " ".join(
                fmt.clip(cell, width).ljust(width) if cell else fmt.NONE.ljust(width)
                for cell, width in zip(row.cells, widths, strict=True)
            ).rstrip(),
            fmt.ROW_COLOURS[row.style],
        )
        for row in items
    ]
