"""Console tests: every clock reading is rendered in UTC so snapshots match on any machine."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from textual.pilot import Pilot


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def settle(pilot: Pilot[object]) -> None:
    """Let the action workers finish and the feed's requested snapshot reach the widgets."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()
