"""App-wide messages. Widget-specific ones are nested on their widget (`ResourceTable.ActionRequested`)."""

from __future__ import annotations

from textual.message import Message

from omniroute_tui.snapshot import Snapshot


class SnapshotReady(Message):
    """The feed collected a new view of the engine; the app hands its parts down to the widgets."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class TerminalGone(Message):
    """The console's terminal went away (omniroute_tui.driver): nobody can see it or press `q` now."""
