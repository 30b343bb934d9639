"""Yes/no before an action on many rows (`R`), or before `q` would lose something. Single-row
actions never ask."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm-no"),
    ]

    def __init__(self, question: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="dialog-screen")
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="dialog-question", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def ask(self, question: str) -> None:
        """Ask again in other words: what the answer decides has changed while the dialog was up."""
        if question != self.question:
            self.question = question
            self.query_one(".dialog-question", Static).update(question)

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
