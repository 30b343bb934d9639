"""SVG snapshots of every tab and the help screen, at 80×24 and 120×40.

Deterministic: fixed config and engine state on a FakeClock, `clock_frozen=True`, times in UTC,
no server and no traffic. Regenerate after a deliberate change with `pytest --snapshot-update`
and look at the SVGs before committing them.
"""

from __future__ import annotations

import pytest
from textual.pilot import Pilot

from tests.tui.conftest import settle
from tests.tui.snapshot_app import snapshot_app

VIEWS = {
    "overview": "1",
    "breakers": "2",
    "connections": "3",
    "lockouts": "4",
    "settings": "5",
    "events": "6",
    "requests": "7",
    "help": "question_mark",
}

THEN = {"requests": ("j", "j", "j", "j")}
"""Keys after the tab's: the Requests tab's detail shows the oldest request, whose trail has a fallback."""


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_view(view: str, size: tuple[int, int], snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot[object]) -> None:
        await settle(pilot)
        await pilot.press(VIEWS[view], *THEN.get(view, ()))
        await settle(pilot)

    assert snap_compare(snapshot_app(), terminal_size=size, run_before=run_before)
