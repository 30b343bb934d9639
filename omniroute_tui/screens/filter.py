"""`/`: the substring the current table's rows must contain (empty clears the filter)."""

from __future__ import annotations

from typing import ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class FilterScreen(ModalScreen[str | None]):
    """Dismisses with the new filter text, or None when cancelled.

    Keys typed right after `/`, before the input has the focus (a fast typist, a pasted word), are
    not lost: the screen hands them to the input."""

    AUTO_FOCUS = "#filter-input"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="filter-cancel"),
    ]

    def __init__(self, table: str, current: str) -> None:
        super().__init__(classes="dialog-screen")
        self.table = table
        self.current = current
        self._typed_ahead = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                f"Filter {self.table} (substring, any column; empty shows all)", classes="dialog-question"
            )
            yield Input(self.current, placeholder="text to match", id="filter-input")

    def on_key(self, event: events.Key) -> None:
        field = self.query_one("#filter-input", Input)
        if not field.has_focus and event.is_printable and event.character is not None:
            event.stop()
            # What typing into the focused input would do: the first key replaces the old filter
            # (it would be selected), the next ones follow it.
            field.value = field.value + event.character if self._typed_ahead else event.character
            field.cursor_position = len(field.value)
            self._typed_ahead = True
            field.select_on_focus = False  # keep what was typed when the focus arrives
            field.focus()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)
