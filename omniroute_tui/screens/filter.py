"""`/`: the substring the current table's rows must contain (empty clears the filter)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class FilterScreen(ModalScreen[str | None]):
    """Dismisses with the new filter text, or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="filter-cancel"),
    ]

    def __init__(self, table: str, current: str) -> None:
        super().__init__(classes="dialog-screen")
        self.table = table
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                f"Filter {self.table} (substring, any column; empty shows all)", classes="dialog-question"
            )
            yield Input(self.current, placeholder="text to match", id="filter-input")

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)
