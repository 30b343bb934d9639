"""The five live tables: keyed rows that diff snapshots instead of rebuilding, drawn line by line.

Why not `DataTable`: its render caches are keyed by one table-wide update counter, so a single
`update_cell` (a countdown moving) re-renders every visible cell through Rich's full layout
pipeline. Measured here: 50–150 ms per countdown tick for 22 visible rows, in the event loop the
proxy serves from, which alone breaks the p99 bar. This widget keeps DataTable's contract (rows
keyed, diffed, never cleared; the cursor follows its row key) with the Line API: a row is one
styled segment per line, cached by row object, so after a diff only the rows whose object
changed are drawn again, and drawing one costs microseconds.

The snapshot arrives filtered and sorted (`snapshot.arrange`), so the table only follows its
order. Keys on a table post `ActionRequested` upward; the table never calls the engine.
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from omniroute_tui.actions import Action, Scope, Table, Verb
from omniroute_tui.format import ROW_COLOURS
from omniroute_tui.snapshot import COLUMNS, Row, TableSnapshot

ROW_STYLES: dict[str, Style] = {name: Style.parse(colour) for name, colour in ROW_COLOURS.items()}
PADDING = 1
"""Blank cells on each side of every cell."""
CELL_CACHE = 20_000
"""Padded cells remembered per table before the memo starts over."""


class ResourceTable(ScrollView, can_focus=True):
    """One table of the engine; subclasses name their table and their keys."""

    TABLE: ClassVar[str]
    NOUN: ClassVar[str] = "row"
    FOLLOWS_TOP: ClassVar[bool] = False
    """A cursor on the first row stays on the first row as new rows arrive (like `tail -f`)."""

    CHANGES: ClassVar[frozenset[str]] = frozenset({"reset", "reset_shown", "toggle_enabled"})
    """The actions that change the instance: neither offered nor done in read-only mode."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"resource-table--header", "resource-table--cursor"}

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor(-1)", "Previous row", show=False, id="cursor-up"),
        Binding("down,j", "cursor(1)", "Next row", show=False, id="cursor-down"),
        Binding("pageup,ctrl+b", "page(-1)", "Page up", show=False, id="cursor-page-up"),
        Binding("pagedown,ctrl+f", "page(1)", "Page down", show=False, id="cursor-page-down"),
        Binding("home,g", "jump(0)", "First row", show=False, id="cursor-first"),
        Binding("end,G", "jump(-1)", "Last row", show=False, id="cursor-last"),
        Binding("left", "scroll_left", "Scroll left", show=False, id="scroll-left"),
        Binding("right", "scroll_right", "Scroll right", show=False, id="scroll-right"),
    ]

    class ActionRequested(Message):
        """The operator asked for an action on the selected row, or on every row shown."""

        def __init__(self, table: ResourceTable, action: Action) -> None:
            super().__init__()
            self.table = table
            self.action = action

        @property
        def control(self) -> ResourceTable:
            return self.table

    class Selected(Message):
        """The row under the cursor is now `key` (None: the table is empty)."""

        def __init__(self, table: ResourceTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> ResourceTable:
            return self.table

    class Scrolled(Message):
        """The rows `window` (start, stop) of the table are now on screen."""

        def __init__(self, table: ResourceTable, window: tuple[int, int]) -> None:
            super().__init__()
            self.table = table
            self.window = window

        @property
        def control(self) -> ResourceTable:
            return self.table

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._window: tuple[int, int] | None = None
        self.snapshot: TableSnapshot | None = None
        self.rows: list[Row] = []
        """In display order."""
        self._index: dict[str, int] = {}
        self._columns = COLUMNS[self.TABLE]
        self._widths = [max(cell_len(c.label), c.width or 0) + 2 * PADDING for c in self._columns]
        self._measured: dict[str, tuple[Row, tuple[int, ...]]] = {}
        """Each held row's cell widths, by key, for as long as the row object is the same."""
        self._layout = 0
        """Bumped whenever the column widths change: every cached line is stale then."""
        self.cursor = 0
        self._announced: str | None = None
        self._lines: dict[str, tuple[Row, bool, int, Strip]] = {}
        self._styles: dict[str, Style] | None = None
        self.drawn = 0
        """Rows drawn so far (not served from the line cache): what a diff costs."""
        self._cells: dict[tuple[str, int], str] = {}
        """Padded cell text by (text, width): between two ticks most cells of a changed row
        (all but its countdown) are the same text again."""

    # -- reads -------------------------------------------------------------------------------------

    @property
    def selected_row(self) -> Row | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    @property
    def row_keys(self) -> list[str]:
        return [row.key for row in self.rows]

    # -- applying a snapshot -----------------------------------------------------------------------

    def apply(self, snapshot: TableSnapshot) -> None:
        """Follow the snapshot: rows keyed, the cursor on the same key, only changed rows redrawn."""
        before = self.selected_row
        old = self.snapshot
        changed = old is None or old.view != snapshot.view or len(self.rows) != len(snapshot.rows)
        rows = list(snapshot.rows)
        current = self.rows
        for i, row in enumerate(rows):
            if i < len(current) and (current[i] is row or current[i] == row):
                rows[i] = current[i]  # an equal row keeps its object, and so its drawn line
            else:
                changed = True
        self.snapshot = snapshot
        if not changed:
            return
        previous, cursor, scroll = self.rows, self.cursor, self.scroll_offset
        self.rows = rows
        self._index = {row.key: i for i, row in enumerate(self.rows)}
        relaid = self._relay(
            self._fit(rows, snapshot.view.sort), force=old is None or old.view != snapshot.view
        )
        for key in self._lines.keys() - self._index.keys():
            del self._lines[key]
        for key in self._measured.keys() - self._index.keys():
            del self._measured[key]
        if self.FOLLOWS_TOP and cursor == 0:
            self.cursor = 0
        elif before is not None and before.key in self._index:
            self.cursor = self._index[before.key]
        self.cursor = max(0, min(self.cursor, len(self.rows) - 1))
        self._scroll_to_cursor()
        if relaid or len(previous) != len(rows) or self.cursor != cursor or self.scroll_offset != scroll:
            self.refresh()
        else:
            # The same rows in the same places, some of them changed (a countdown moved): repaint
            # only their lines, all in the next frame. (Not spread over frames: Textual's
            # compositor re-renders every widget under a dirty region whole, so each extra frame
            # costs about as much as the first one; bench/tui.py.)
            top = int(self.scroll_y)
            bottom = min(top + max(self.size.height - 1, 0), len(rows))
            self._repaint([i - top + 1 for i in range(top, bottom) if rows[i] is not previous[i]])
        self._announce()

    def _fit(self, rows: list[Row], sorted_by: int) -> list[int]:
        """Column widths for these rows: each as wide as its widest cell among the rows held, at
        least its label (with the sort arrow on the sorted column), at most its cap unless the
        window has room to spare. Recomputed from the rows, never only grown: a long name
        filtered out gives its room back."""
        measured = self._measured
        found = [cell_len(c.label) for c in self._columns]
        found[sorted_by] += 2  # " ▲"
        cells: list[tuple[int, ...]] = []
        for row in rows:
            cached = measured.get(row.key)
            if cached is None or cached[0] is not row:
                cached = measured[row.key] = (row, tuple(cell_len(text) for text in row.cells))
            cells.append(cached[1])
        # Each column's widest, in C (`map` takes one iterable per row): a table of 10,000 lockouts
        # is fitted again every second its countdowns move, on the loop the proxy serves from.
        if cells:  # (`max` of one number alone would take it for a sequence)
            found = list(map(max, found, *cells))
        widths = [
            (max(column.width, n) if column.width is not None else min(n, column.cap)) + 2 * PADDING
            for column, n in zip(self._columns, found, strict=True)
        ]
        # A cap keeps one long value from pushing the other columns off a narrow window; where the
        # window has room to spare, the capped columns take it, up to their widest cell, in order.
        window = self._room(len(rows))
        spare = window - sum(widths)
        for i, (column, n) in enumerate(zip(self._columns, found, strict=True)):
            if spare <= 0:
                break
            if column.width is None and n > column.cap:
                grown = min(spare, n - column.cap)
                widths[i] += grown
                spare -= grown
        # The last column ends at the window's edge when it would run past it: its cells end in
        # `…` there, rather than be cut mid-word by the edge (a long event reason). Never narrower
        # than its label: what the window cannot hold at all is scrolled to, as before.
        last = len(widths) - 1
        if self._columns[last].width is None:
            room = window - sum(widths[:last])
            least = cell_len(self._columns[last].label) + (2 if sorted_by == last else 0) + 2 * PADDING
            widths[last] = min(widths[last], max(room, least))
        return widths

    def _room(self, rows: int) -> int:
        """The width the columns may fill: the window's, less the vertical scrollbar's when the rows
        need one. (`size` counts the scrollbar's cells, and a scrollbar that appears after a fit
        sends no resize: columns fitted to the whole width would then run under it.)"""
        width = self.size.width
        if rows + 1 > self.size.height:  # (+1: the header line)
            width -= self.styles.scrollbar_size_vertical
        return width

    def _repaint(self, lines: list[int]) -> None:
        """Mark `lines` (ascending, 0 is the header) dirty, as few regions as there are runs."""
        if not lines:
            return
        width = self.size.width
        start = end = lines[0]
        for y in lines[1:]:
            if y != end + 1:
                self.refresh(Region(0, start, width, end - start + 1))
                start = y
            end = y
        self.refresh(Region(0, start, width, end - start + 1))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._announce_window()

    def on_resize(self) -> None:
        # The last column's room is the window's.
        if self.snapshot is not None and self._relay(self._fit(self.rows, self.snapshot.view.sort)):
            self.refresh()
        self._announce_window()

    def _relay(self, widths: list[int], *, force: bool = False) -> bool:
        """Take these column widths (and the rows' count) as the table's size; True if the columns
        changed, or `force`: every cached line is stale then."""
        relaid = force or widths != self._widths
        if relaid:
            self._widths = widths
            self._layout += 1
        self.virtual_size = Size(sum(widths), len(self.rows) + 1)
        return relaid

    def _announce_window(self) -> None:
        top = int(self.scroll_y)
        window = (top, top + max(self.size.height - 1, 0))  # the header takes a line
        if window != self._window:
            self._window = window
            self.post_message(self.Scrolled(self, window))

    def _announce(self) -> None:
        row = self.selected_row
        key = row.key if row is not None else None
        if key != self._announced:
            self._announced = key
            self.post_message(self.Selected(self, key))

    # -- drawing -----------------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._layout += 1

    def on_focus(self) -> None:
        self._restyle()

    def on_blur(self) -> None:
        self._restyle()

    def _restyle(self) -> None:
        # The cursor's style depends on focus: every cached line must be drawn again.
        self._styles = None
        self._layout += 1
        self.refresh()

    def _style(self, name: str) -> Style:
        styles = self._styles
        if styles is None:
            base = self.rich_style
            styles = {
                "base": base,
                "header": base + self.get_component_rich_style("resource-table--header"),
                "cursor": self.get_component_rich_style("resource-table--cursor", partial=True),
                **{key: base + style for key, style in ROW_STYLES.items()},
            }
            self._styles = styles
        return styles[name]

    def _line(self, cells: tuple[str, ...], style: Style) -> Strip:
        padded = self._cells
        if len(padded) > CELL_CACHE:
            padded.clear()
        parts = []
        for text, width in zip(cells, self._widths, strict=False):
            part = padded.get((text, width))
            if part is None:
                room = width - 2 * PADDING
                fitted = text if cell_len(text) <= room else set_cell_size(text, max(room - 1, 0)) + "…"
                part = padded[text, width] = " " * PADDING + set_cell_size(fitted, room) + " " * PADDING
            parts.append(part)
        line = "".join(parts)
        return Strip([Segment(line, style)], sum(self._widths[: len(cells)]))

    def _header(self) -> Strip:
        view = self.snapshot.view if self.snapshot is not None else None
        labels = tuple(
            c.label + ((" ▼" if view.reverse else " ▲") if view is not None and view.sort == i else "")
            for i, c in enumerate(self._columns)
        )
        return self._line(labels, self._style("header"))

    def _row_line(self, row: Row, cursor: bool) -> Strip:
        cached = self._lines.get(row.key)
        if cached is not None and cached[0] is row and cached[1] == cursor and cached[2] == self._layout:
            return cached[3]
        self.drawn += 1
        style = self._style(row.style)
        if cursor:
            style += self._style("cursor")
        strip = self._line(row.cells, style)
        self._lines[row.key] = (row, cursor, self._layout, strip)
        return strip

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self._style("base")  # `rich_style` walks the DOM: too dear to ask for every line
        if y == 0:
            strip = self._header()
        else:
            index = y - 1 + scroll_y
            if index >= len(self.rows):
                return Strip.blank(width, base)
            strip = self._row_line(self.rows[index], index == self.cursor)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    # -- moving the cursor -------------------------------------------------------------------------

    def select_key(self, key: str) -> bool:
        """Put the cursor on the row `key`; False when the table does not hold it."""
        index = self._index.get(key)
        if index is None:
            return False
        self.move_to(index)
        return True

    def move_to(self, index: int) -> None:
        if not self.rows:
            return
        index = max(0, min(index, len(self.rows) - 1))
        if index != self.cursor:
            self.cursor = index
            self.refresh()
        self._scroll_to_cursor()
        self._announce()

    def _scroll_to_cursor(self) -> None:
        visible = max(self.size.height - 1, 1)  # the header takes a line
        top = int(self.scroll_y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def action_cursor(self, step: int) -> None:
        self.move_to(self.cursor + step)

    def action_page(self, step: int) -> None:
        self.move_to(self.cursor + step * max(self.size.height - 2, 1))

    def action_jump(self, index: int) -> None:
        self.move_to(index if index >= 0 else len(self.rows) - 1)

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self.move_to(int(self.scroll_y) + event.y - 1)

    # -- actions (posted upward; the app decides and runs them) ------------------------------------

    def request(self, verb: Verb, *, every_row: bool, ask: bool = False) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            return
        scope: Scope
        label = ""
        if every_row:
            targets = tuple(row.target for row in snapshot.matching)
            scope = "shown" if snapshot.view.filter.strip() else "all"
        else:
            row = self.selected_row
            if row is None:
                self.notify(f"No {self.NOUN} selected", severity="warning")
                return
            targets, scope = (row.target,), "row"
            label = self.row_label(row)
        if not targets:
            self.notify(f"No {self.NOUN}s shown", severity="warning")
            return
        table: Table = self.TABLE  # type: ignore[assignment]
        action = Action(table, verb, targets, scope, ask=ask, label=label)
        self.post_message(self.ActionRequested(self, action))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Read-only: the action keys would do nothing, so they are not offered (the status line
        # says READ-ONLY); the app refuses any action that still arrives (a palette opened before).
        if action in self.CHANGES:
            return not getattr(self.app, "read_only", False)
        return True

    def row_label(self, row: Row) -> str:
        """The selected row in words, for a question about it."""
        return row.cells[0]

    def action_reset(self) -> None:
        self.request("reset", every_row=False)

    def action_reset_shown(self) -> None:
        self.request("reset", every_row=True)

    def action_toggle_enabled(self) -> None:
        self.request("toggle", every_row=False)


class BreakersTable(ResourceTable):
    TABLE = "breakers"
    NOUN = "breaker"

    def row_label(self, row: Row) -> str:
        return f"{row.cells[0]} (now {row.cells[2]})"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "r",
            "reset",
            "Reset",
            tooltip="Reset the selected provider's breaker to CLOSED",
            id="reset-breaker",
        ),
        Binding(
            "R",
            "reset_shown",
            "Reset shown",
            tooltip="Reset every breaker shown (asks first)",
            id="reset-breakers",
        ),
    ]


class ConnectionsTable(ResourceTable):
    TABLE = "connections"
    NOUN = "connection"

    def row_label(self, row: Row) -> str:
        return f"{row.cells[1]} of {row.cells[0]} (now {row.cells[2]})"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "r",
            "reset",
            "Clear",
            tooltip="Clear the cooldown or terminal state of the selected connection",
            id="reset-connection",
        ),
        Binding(
            "e",
            "toggle_enabled",
            "On/off",
            tooltip="Enable or disable the selected connection",
            id="toggle-connection",
        ),
        Binding(
            "R",
            "reset_shown",
            "Clear shown",
            tooltip="Clear every connection shown (asks first)",
            id="reset-connections",
        ),
    ]


class LockoutsTable(ResourceTable):
    TABLE = "lockouts"
    NOUN = "lockout"

    def row_label(self, row: Row) -> str:
        return f"{row.cells[0]}/{row.cells[2]} on {row.cells[1]} ({row.cells[5]} left)"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "reset", "Re-enable", tooltip="Lift the selected model lockout", id="reenable-model"),
        Binding(
            "R",
            "reset_shown",
            "Re-enable shown",
            tooltip="Lift every lockout shown (asks first)",
            id="reenable-models",
        ),
    ]


class EventsTable(ResourceTable):
    TABLE = "events"
    NOUN = "event"
    FOLLOWS_TOP = True  # newest first: on the newest row, the cursor follows what happens next
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter",
            "go_to",
            "Go to",
            tooltip="Show the breaker, connection or lockout of this event",
            id="event-go-to",
        ),
    ]

    class GoTo(Message):
        """Show row `key` of tab `tab` (an event's breaker, connection or lockout)."""

        def __init__(self, tab: str, key: str) -> None:
            super().__init__()
            self.tab = tab
            self.key = key

    def action_go_to(self) -> None:
        row = self.selected_row
        if row is None or len(row.target) != 2:
            self.notify("This event has no row to go to", severity="warning")
            return
        self.post_message(self.GoTo(*row.target))


class RequestsTable(ResourceTable):
    TABLE = "requests"
    NOUN = "request"
    FOLLOWS_TOP = True  # alive, then newest first: on the top row, the cursor follows new traffic
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "f",
            "failures",
            "Failures",
            tooltip="Show only failed requests",
            id="requests-failures",
        ),
        # One key: the key bar says what it does now (as `p` Pause / Resume).
        Binding("f", "all_requests", "All requests", tooltip="Show every request again", id="requests-all"),
    ]

    class FailuresToggled(Message):
        """The operator asked to show only failures, or everything again (`f`)."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("failures", "all_requests"):
            only = bool(getattr(getattr(self.app, "feed", None), "failures_only", False))
            return only == (action == "all_requests")
        return super().check_action(action, parameters)

    def action_failures(self) -> None:
        self.post_message(self.FailuresToggled())

    def action_all_requests(self) -> None:
        self.post_message(self.FailuresToggled())


TABLE_CLASSES: tuple[type[ResourceTable], ...] = (
    BreakersTable,
    ConnectionsTable,
    LockoutsTable,
    EventsTable,
    RequestsTable,
)
