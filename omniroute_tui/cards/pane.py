"""The Settings tab: every settings card, in a scrollable grid that uses the width it gets."""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.containers import Container, VerticalScroll
from textual.events import Resize
from textual.message import Message
from textual.widgets import Static

from omniroute_tui.cards.card import READ_ONLY_NOTE, SettingsCard, SettingsSource
from omniroute_tui.cards.catalog import CARDS
from proxy.readmodel import Event

__all__ = ["CARD_MIN_WIDTH", "SettingsPane"]

CARD_MIN_WIDTH = 80
"""A grid column per this many cells: one column up to 159 wide, two from 160, three from 240."""


class SettingsPane(VerticalScroll):
    """The cards of docs/console.md#the-settings-tab. It reads and patches the settings of its
    source (the hosted runtime, or an attached instance), and follows their events."""

    DEFAULT_CSS = """
    SettingsPane {
        height: 1fr;
        & > .read-only-banner { background: $warning-muted; color: $text; padding: 0 1; }
        & > #settings-cards {
            layout: grid;
            grid-size: 1;
            grid-rows: auto;
            grid-gutter: 0 1;
            height: auto;
        }
    }
    """

    class _LiveChanged(Message):
        """The settings changed somewhere (posted from the event bus, possibly off the UI thread)."""

    def __init__(
        self,
        source: SettingsSource,
        *,
        read_only: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.source = source
        self.read_only = read_only
        # The fields take focus (and scroll into view); the pane itself only when read-only, where it is
        # the one thing left to scroll with the keyboard. A focused pane also makes every blur restyle
        # all its descendants.
        self.can_focus = read_only
        self._unsubscribe: Callable[[], None] | None = None
        self._refresh_pending = False

    def compose(self) -> ComposeResult:
        if self.read_only:
            yield Static(READ_ONLY_NOTE, classes="read-only-banner")
        with Container(id="settings-cards"):
            for spec in CARDS:
                yield SettingsCard(spec, self.source, read_only=self.read_only)

    @property
    def cards(self) -> list[SettingsCard]:
        return list(self.query(SettingsCard))

    def card(self, card_id: str) -> SettingsCard:
        """One card by its catalog id (`resilience`, `model-lockout`, ...)."""
        return self.query_one(f"#card-{card_id}", SettingsCard)

    def on_mount(self) -> None:
        self._unsubscribe = self.source.subscribe(self._on_event)

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_event(self, event: Event) -> None:
        # Runs on the publisher's thread, inline: only flag and post (post_message is thread-safe).
        # One patch emits an event per changed leaf; they collapse into one refresh.
        if event.layer == "settings" and not self._refresh_pending:
            self._refresh_pending = True
            self.post_message(self._LiveChanged())

    @on(_LiveChanged)
    def _live_changed(self, event: _LiveChanged) -> None:
        event.stop()
        self._refresh_pending = False
        for card in self.cards:
            card.refresh_live()

    def on_resize(self, event: Resize) -> None:
        columns = max(1, min(3, event.size.width // CARD_MIN_WIDTH))
        grid = self.query_one("#settings-cards", Container)
        if grid.styles.grid_size_columns != columns:
            grid.styles.grid_size_columns = columns
            self.card("resilience").styles.column_span = min(columns, 2)
