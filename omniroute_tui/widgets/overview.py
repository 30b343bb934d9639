"""The Overview tab: the three layers at a glance.

Breaker tiles (coloured by state, the state written out), the worst connections, the longest
lockouts and the latest events. Each section re-renders only when its part of the snapshot changed;
the three lists are `LinesView`s, whose countdowns repaint without a Rich layout pass.
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from omniroute_tui import format as fmt
from omniroute_tui.snapshot import Overview, Row, Tile
from omniroute_tui.widgets.lines import Line, LinesView, line
from omniroute_tui.widgets.tables import EventsTable


class PickList(LinesView, can_focus=True):
    """An Overview list whose lines lead somewhere: up/down (j/k) pick a line, enter shows its row
    in its tab (a connection, a lockout, an event's breaker/connection/lockout)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("down,j", "pick(1)", "Next", show=False, id="overview-next"),
        Binding("up,k", "pick(-1)", "Previous", show=False, id="overview-previous"),
        Binding("enter", "go_to", "Go to", tooltip="Show this line's row in its tab", id="overview-go-to"),
    ]

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.targets: tuple[tuple[str, ...], ...] = ()
        self.picked = 0

    def show_rows(self, lines: list[Line], targets: tuple[tuple[str, ...], ...]) -> None:
        self.targets = targets
        self.picked = min(self.picked, max(len(targets) - 1, 0))
        self.show(lines)

    def action_pick(self, step: int) -> None:
        if self.targets:
            self.picked = max(0, min(self.picked + step, len(self.targets) - 1))
            self.refresh()

    def action_go_to(self) -> None:
        target = self.targets[self.picked] if self.picked < len(self.targets) else ()
        if len(target) == 2:
            self.post_message(EventsTable.GoTo(*target))

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        if self.has_focus and y == self.picked and self.targets:
            return strip.apply_style(Style(reverse=True))
        return strip

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()


class TileBar(Widget, can_focus=True):
    """The breaker tiles: left/right (h/l) pick one when focused, enter shows its breaker.

    As many tiles to a row as the width holds, and as many rows as that takes: the bar is laid out
    again whenever that number of rows changes (tiles widen as their latency appears, or a state's
    words get longer), so that no tile is ever drawn below the bar's last line.

    Drawn with the Line API, a row of tiles at a time: under traffic a provider's latency moves
    every second, and only the rows whose tiles changed are drawn again (the console draws on the
    loop the proxy serves from: the whole bar of twenty tiles took about a millisecond)."""

    DEFAULT_CSS = "TileBar { height: auto; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right,l", "pick(1)", "Next", show=False, id="tiles-next"),
        Binding("left,h", "pick(-1)", "Previous", show=False, id="tiles-previous"),
        Binding("enter", "go_to", "Go to", tooltip="Show this provider's breaker", id="tiles-go-to"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: tuple[Tile, ...] = ()
        self.picked = 0
        self._placed: tuple[int, tuple[Tile, ...], list[list[_PlacedTile]]] = (0, (), [])
        """The rows of tiles as last placed: (width, tiles, rows)."""
        self._drawn: dict[int, tuple[object, list[Strip]]] = {}
        """Per row of tiles, what it showed and its three lines."""

    def show_tiles(self, items: tuple[Tile, ...], *, relayout: bool) -> None:
        width = self.content_size.width
        before = self._rows(width)
        self.items = items
        self.picked = min(self.picked, max(len(items) - 1, 0))
        after = self._rows(width)
        if relayout or len(after) != len(before) or not after:
            self._draw(relayout=True)
            return
        changed = [r for r, (old, new) in enumerate(zip(before, after, strict=True)) if old != new]
        if changed:
            self.refresh(*(Region(0, 3 * r, width, 3) for r in changed))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return tiles_height(self.items, width)

    def _rows(self, width: int) -> list[list[_PlacedTile]]:
        placed_width, placed_items, rows = self._placed
        if placed_width != width or placed_items is not self.items:
            rows = _tile_rows(self.items, width)
            self._placed = (width, self.items, rows)
        return rows

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if not self.items:
            if y:
                return Strip.blank(width, base)
            return Strip([Segment("No providers configured.", base + Style.parse("dim"))]).adjust_cell_length(
                width, base
            )
        rows = self._rows(width)
        r, n = divmod(y, 3)
        if r >= len(rows):
            return Strip.blank(width, base)
        picked = self.picked if self.has_focus else None
        shows = (rows[r], picked if any(i == picked for i, *_ in rows[r]) else None, base)
        drawn = self._drawn.get(r)
        if drawn is None or drawn[0] != shows:
            console = self.app.console
            lines = [
                Strip(Segment.apply_style(_tile_line(rows[r], k, picked).render(console), base))
                .crop(0, width)
                .adjust_cell_length(width, base)
                for k in range(3)
            ]
            drawn = self._drawn[r] = (shows, lines)
        return drawn[1][n]

    def _draw(self, relayout: bool = False) -> None:
        self._drawn.clear()
        self.refresh(layout=relayout)

    def action_pick(self, step: int) -> None:
        if self.items:
            self.picked = max(0, min(self.picked + step, len(self.items) - 1))
            self._draw()

    def action_go_to(self) -> None:
        if self.picked < len(self.items):
            self.post_message(EventsTable.GoTo("breakers", self.items[self.picked].key))

    def on_focus(self) -> None:
        self._draw()

    def on_blur(self) -> None:
        self._draw()


TILE_NAME = 20
"""Cells of a provider name on its tile: a longer one ends in "…", so tiles stay side by side."""


class OverviewPane(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: Overview | None = None
        self.tiles = TileBar(id="tiles")
        self.cooling = PickList(id="overview-cooling", classes="overview-box")
        self.lockouts = PickList(id="overview-lockouts", classes="overview-box")
        self.events = PickList(id="overview-events", classes="overview-box")
        self.cooling.border_title = "Connections needing attention"
        self.lockouts.border_title = "Longest lockouts"
        self.events.border_title = "Recent events"
        self.replicas = Static("", id="overview-replicas")
        self.replicas.display = False  # a fleet's only (docs/fleet.md)

    def compose(self) -> ComposeResult:
        yield self.tiles
        yield self.replicas
        with Horizontal(id="overview-lists"):
            yield self.cooling
            yield self.lockouts
        yield self.events

    def apply(self, overview: Overview) -> None:
        old, self._shown = self._shown, overview
        # A box is laid out again only when its number of lines changed; a countdown ticking in
        # place is a repaint.
        if old is None or old.replicas != overview.replicas:
            self.replicas.display = bool(overview.replicas)
            self.replicas.update(Text(overview.replicas))
        if old is None or old.tiles != overview.tiles:
            relayout = old is None or [t.provider for t in old.tiles] != [t.provider for t in overview.tiles]
            self.tiles.show_tiles(overview.tiles, relayout=relayout)
        if old is None or old.cooling != overview.cooling:
            self.cooling.show_rows(
                rows(overview.cooling, "every connection is active", (16, 8, 7, 60)),
                tuple(row.target for row in overview.cooling),
            )
        if old is None or old.cooling_total != overview.cooling_total:
            self.cooling.border_subtitle = f"{overview.cooling_total:,} not active"
        if old is None or old.lockouts != overview.lockouts:
            self.lockouts.show_rows(
                rows(overview.lockouts, "no model is locked out", (30, 7, 16, 16)),
                tuple(row.target for row in overview.lockouts),
            )
        if old is None or old.lockout_total != overview.lockout_total:
            self.lockouts.border_subtitle = f"{overview.lockout_total:,} active"
        if old is None or old.events != overview.events:
            self.events.show_rows(
                rows(overview.events, "nothing has happened yet", (8, 10, 26, 18, 60)),
                tuple(row.target for row in overview.events),
            )


def _tile_lines(t: Tile) -> tuple[str, str, str]:
    return fmt.clip(t.provider, TILE_NAME), f"{t.state} {t.text}", t.latency or "no traffic"


_PlacedTile = tuple[int, Tile, tuple[str, str, str], int]
"""A tile in its row: its index, the tile, its three lines, its width (its widest line and a cell of
margin either side)."""


def _tile_rows(items: tuple[Tile, ...], width: int) -> list[list[_PlacedTile]]:
    """The tiles in rows, left to right, as many to a row as `width` holds (one cell between two)."""
    rows: list[list[_PlacedTile]] = [[]]
    used = 0
    for i, t in enumerate(items):
        lines = _tile_lines(t)
        size = max(cell_len(text) for text in lines) + 2
        if rows[-1] and used + 1 + size > width:
            rows.append([])
            used = 0
        used += size + (1 if rows[-1] else 0)
        rows[-1].append((i, t, lines, size))
    return rows


def tiles_height(items: tuple[Tile, ...], width: int) -> int:
    """The lines `tiles` takes at `width`: three per row of tiles (one for "No providers")."""
    return 3 * len(_tile_rows(items, width)) if items else 1


def _tile_line(row: list[_PlacedTile], n: int, picked: int | None) -> Text:
    """Line `n` of a row of tiles, each tile three lines: the provider, its state written out (and
    how long, or how close), and its p50 latency over the last minute as a sparkline; the `picked`
    one (keyboard focus) drawn in reverse."""
    out = Text(no_wrap=True, overflow="crop")
    for k, (i, t, lines, size) in enumerate(row):
        style = fmt.TILE_COLOURS[t.style] + (" reverse underline" if i == picked else "")
        if k:
            out.append(" ")
        out.append(f" {set_cell_size(lines[n], size - 2)} ", f"{style} bold" if n == 0 else style)
    return out


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
