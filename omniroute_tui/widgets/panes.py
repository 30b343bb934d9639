"""What a tab holds: a table tab (caption, live table, the selected row's history), or the Settings cards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from omniroute_tui import format as fmt
from omniroute_tui.snapshot import COLUMNS, Detail, TableSnapshot
from omniroute_tui.untrusted import visible
from omniroute_tui.widgets.tables import ResourceTable

if TYPE_CHECKING:
    from omniroute_tui.cards.card import SettingsSource


class DetailPanel(Static):
    """The history of the row under the cursor (breaker transitions, a connection's events...)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, classes="detail")
        self._detail: Detail | None = None
        self.border_title = "Details"

    def show(self, detail: Detail | None) -> None:
        if detail == self._detail and self._detail is not None:
            return
        self._detail = detail
        if detail is None:  # no row (filtered away, or its entry ended): no stale title either
            self.border_title = "Details"
            self.update(Text("Select a row to see its history.", style="dim"), layout=False)
            return
        text = Text()
        for line, style in detail.lines:
            text.append(line + "\n", style=fmt.ROW_COLOURS[style])
        text.rstrip()
        self.border_title = Text(detail.title)  # a str would be read as markup
        self.update(text, layout=False)  # the pane's height is set by CSS, whatever it holds


class TablePane(Vertical):
    """Caption, table and detail for one table; `apply` takes that table's snapshot."""

    def __init__(self, table: ResourceTable, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="table-pane")
        self.table = table
        self.caption = Static("", classes="caption")
        self.detail = DetailPanel()
        self._caption: Text | None = None

    def compose(self) -> ComposeResult:
        yield self.caption
        yield self.table
        yield self.detail

    def apply(self, snapshot: TableSnapshot) -> None:
        self.table.apply(snapshot)
        self.detail.show(snapshot.detail)
        text = caption(snapshot)
        if text != self._caption:  # a repaint costs more than the comparison
            self._caption = text
            self.caption.update(text, layout=False)  # always one line


def caption(snapshot: TableSnapshot) -> Text:
    view = snapshot.view
    column = COLUMNS[snapshot.name][view.sort].label
    matched = len(snapshot.matching)
    text = Text()
    text.append(fmt.counted(snapshot.total, snapshot.name.removesuffix("s")), style="bold")
    if view.filter.strip():
        shown = visible(view.filter.strip(), limit=40)
        text.append(f" · filter “{shown}”: {fmt.count(matched)} match", style="yellow")
    if len(snapshot.rows) < matched:
        text.append(f" · showing the first {fmt.count(len(snapshot.rows))}", style="yellow")
    if snapshot.notice is not None:  # before the sort order: a narrow caption cuts its end
        notice, style = snapshot.notice
        text.append(f" · {notice}", style=fmt.ROW_COLOURS[style])
    text.append(f" · sorted by {column} {'▼' if view.reverse else '▲'}", style="dim")
    return text


def settings_pane(source: SettingsSource, read_only: bool) -> Widget:
    """The Settings tab's cards, or a note when this build has none."""
    try:
        from omniroute_tui.cards import SettingsPane
    except ImportError:
        return Static("Settings cards are not available in this build.", id="settings-missing")
    pane: Widget = SettingsPane(source, read_only=read_only)
    return pane
