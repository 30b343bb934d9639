"""The cheap line-drawn widgets: what they say, and that a live tick costs the event loop one frame."""

from __future__ import annotations

from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.strip import Strip

from omniroute_tui.snapshot import Tile
from omniroute_tui.widgets.header import BARS, sparkline
from omniroute_tui.widgets.lines import LinesView, line
from omniroute_tui.widgets.overview import TileBar
from proxy.resilience.lockout import LockoutSettings
from tests.tui.conftest import settle
from tests.tui.snapshot_app import SECOND, snapshot_app

SIZE = (120, 40)


@pytest.mark.parametrize(
    ("rates", "levels"),
    [
        ((), [0] * 4),
        ((0, 0, 0, 0), [0] * 4),
        ((5,), [0] * 4),
        ((0, 1, 2, 3), [0, 2, 5, 7]),
        ((0, 9, 0, 0, 0, 0, 0, 3), [7, 0, 0, 2]),  # each bar is the busiest second of its share
        ((4, 8), [0, 0, 7, 7]),  # fewer seconds than bars: each second spans bars
    ],
)
def test_sparkline_levels(rates: tuple[int, ...], levels: list[int]) -> None:
    bars = sparkline(rates, width=4)
    assert [level for _, level in bars] == levels
    assert [bar for bar, _ in bars] == [BARS[level] for level in levels]


class _Box(App[None]):
    def compose(self) -> ComposeResult:
        yield LinesView(id="box")


async def test_lines_view_cuts_long_lines_and_grows_with_its_lines() -> None:
    app = _Box()
    async with app.run_test(size=(20, 5)) as pilot:
        box = app.query_one(LinesView)
        box.show([line("short"), (("a very long ", "bold"), ("line of text", "red"))])
        await pilot.pause()
        assert box.size.height == 2
        drawn = ["".join(s.text for s in box.render_line(y)) for y in range(2)]
        assert drawn == ["short".ljust(20), "a very long line of…"]
        box.show([line("one")])
        await pilot.pause()
        assert box.size.height == 1
        assert box.plain == "one"


async def test_header_says_where_how_busy_and_what_is_wrong() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        title, counts = app.status.line_text(0), app.status.line_text(1)
        assert title.startswith(" omniroute ") and "http://127.0.0.1:20128/v1" in title
        assert title.endswith(" LIVE")
        assert "OPEN 1" in counts and "cooling 2" in counts and "lockouts 4" in counts


def _with_lockouts(n: int) -> Any:
    app = snapshot_app()
    engine = app.runtime.engine
    now = engine.clock.now()
    for i in range(n):
        engine.lockouts.record_failure(
            "openai", "openai-main", f"model-{i:03d}", now, LockoutSettings(enabled=True), status=404,
            reason="not_found", hint_ms=600_000 - i * 1000,
        )  # fmt: skip
    return app


async def test_a_countdown_tick_is_one_frame() -> None:
    """Textual re-renders every widget under a dirty region whole, so a tick whose changed rows
    were spread over several frames would cost the proxy's event loop several times over."""
    app = _with_lockouts(30)  # a screenful of countdowns
    clock: Any = app.runtime.engine.clock
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        compositor = app.screen._compositor
        frames: list[int] = []
        render = compositor.render_update

        def counting(*args: Any, **kwargs: Any) -> Any:
            frames.append(len(compositor._dirty_regions))
            return render(*args, **kwargs)

        compositor.render_update = counting  # type: ignore[method-assign]
        clock.advance(SECOND)
        app.feed.request()
        await settle(pilot)
        assert len(frames) == 1
        table = app.table("lockouts")
        assert [row.cells[5] for row in table.rows[:2]] == ["19m 29s", "11m 29s"]


async def test_only_the_rows_on_screen_count_down_and_a_scroll_catches_up() -> None:
    app = _with_lockouts(120)
    clock: Any = app.runtime.engine.clock
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        table = app.table("lockouts")

        def row(model: str) -> Any:
            return next(r for r in table.rows if r.cells[2] == model)

        last = row("model-119")  # 8m 01s: near the bottom, far below the screen
        assert last.cells[5] == "8m 01s"
        clock.advance(SECOND)
        app.feed.request()
        await settle(pilot)
        assert table.rows[0].cells[5] == "19m 29s"  # on screen: moved
        assert row("model-119") is last  # far below the screen: not even rebuilt
        await pilot.press("end")
        await settle(pilot)
        assert row("model-119").cells[5] == "8m 00s"  # scrolled into view: fresh at once
        assert table.rows[0].cells[5] == "19m 29s"  # scrolled out: left as it was


async def test_the_detail_pane_drops_the_title_of_a_row_that_is_gone() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await settle(pilot)
        pane = app.panes["connections"]
        assert "groq-1" in str(pane.detail.border_title)
        await pilot.press("slash", "z", "z", "z", "enter")  # a filter that keeps no row
        await settle(pilot)
        assert app.table("connections").rows == []
        assert str(pane.detail.border_title) == "Details"


def test_captions_count_in_words() -> None:
    from omniroute_tui.snapshot import TableSnapshot, View
    from omniroute_tui.widgets.panes import caption

    one = TableSnapshot("lockouts", (), View(sort=5), 1, ())
    assert caption(one).plain.startswith("1 lockout · ")
    many = TableSnapshot("connections", (), View(sort=2), 1200, ())
    assert caption(many).plain.startswith("1,200 connections · ")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ('401: {"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}',
         "401 Incorrect API key provided"),
        ('429 {"error": {"message": "Rate limit reached for gpt-4o", "code": "rate_limit_exceeded"', "429 Rate limit reached for gpt-4o"),
        ('400: {"error": "model \\"x\\" not found"}', '400 model "x" not found'),
        ('503: [{"error": {"code": 503, "message": "overloaded"}}]', "503 overloaded"),
        ('404: {"detail": "Not Found"}', "404 Not Found"),
        ("connection refused", "connection refused"),
        ("502: <html>bad gateway</html>", "502: <html>bad gateway</html>"),
        ('500: {"unrelated": 1}', '500: {"unrelated": 1}'),
    ],
)  # fmt: skip
def test_errors_read_as_their_message(raw: str, shown: str) -> None:
    from omniroute_tui.format import readable_error

    assert readable_error(raw) == shown


class _Tiles(App[None]):
    def compose(self) -> ComposeResult:
        yield TileBar(id="tiles")


def _tile(name: str, latency: str = "") -> Tile:
    return Tile(name, "CLOSED", "0/12", "ok", name, latency)


async def test_breaker_tiles_that_grow_wrap_onto_a_row_the_bar_grows_for() -> None:
    """Six providers fit one row while they have no traffic; their latency sparklines widen them, a
    sixth no longer fits at 120 columns and goes to a second row, which must be on screen (it was
    drawn into a bar still three lines tall: a breaker tile, OPEN or not, out of sight)."""
    names = ["healthy", "flaky", "ratelimited", "models", "twokeys", "claude"]
    app = _Tiles()
    async with app.run_test(size=SIZE) as pilot:
        bar = app.query_one(TileBar)
        bar.show_tiles(tuple(_tile(n) for n in names), relayout=True)
        await settle(pilot)
        assert bar.size.height == 3
        bar.show_tiles(tuple(_tile(n, "       █▂▂▂▁ 70 ms") for n in names), relayout=False)
        await settle(pilot)
        assert bar.size.height == 6
        shown = "\n".join(strip.text for strip in bar.render_lines(bar.region.reset_offset))
        assert all(name in shown for name in names)
        bar.show_tiles(tuple(_tile(n) for n in names), relayout=False)  # the traffic stopped
        await settle(pilot)
        assert bar.size.height == 3


async def test_a_tile_that_changes_repaints_its_own_row_of_tiles_not_the_bar() -> None:
    """Under traffic one provider's latency moves every second: the console repaints on the loop
    the proxy serves from, so only that tile's row of the bar is drawn again."""
    names = [f"provider-{n:02d}" for n in range(12)]
    app = _Tiles()
    async with app.run_test(size=(80, 24)) as pilot:
        bar = app.query_one(TileBar)
        bar.show_tiles(tuple(_tile(n, "▁▂ 70 ms") for n in names), relayout=True)
        await settle(pilot)
        assert bar.size.height > 6  # more than two rows of tiles
        drawn: list[int] = []
        render_line = bar.render_line

        def spy(y: int) -> Strip:
            drawn.append(y)
            return render_line(y)

        bar.render_line = spy  # type: ignore[method-assign]
        row = next(y // 3 for y in range(bar.size.height) if names[-1] in bar.render_line(y).text)
        assert row > 0
        drawn.clear()
        bar.show_tiles(
            (*(_tile(n, "▁▂ 70 ms") for n in names[:-1]), _tile(names[-1], "▂▁ 71 ms")), relayout=False
        )
        await settle(pilot)
        assert sorted(set(drawn)) == [3 * row, 3 * row + 1, 3 * row + 2]
        assert "71 ms" in bar.render_line(3 * row + 2).text


@pytest.mark.parametrize("width", [80, 100])
async def test_at_80_columns_the_counts_line_keeps_every_count_and_the_rate_line_gives_way(
    width: int,
) -> None:
    """The sparkline is what a narrow terminal can spare: the counts (open breakers, cooling,
    lockouts, requests and failures) are what the operator reads."""
    app = snapshot_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await settle(pilot)
        counts = app.status.line_text(1)
        assert len(counts.rstrip()) <= width and "…" not in counts, counts
        assert counts.rstrip().endswith("failed"), counts
        assert "OPEN 1" in counts and "cooling 2" in counts and "lockouts 4" in counts
        bars = sum(c in BARS for c in counts)
        assert bars == 20 if width >= 100 else 6 <= bars < 20


def test_the_connection_detail_reads_a_wrapped_error_as_the_table_does() -> None:
    """Found by an operator's trial: the table said `503 the model server is overloaded`, its detail
    pane the raw JSON wrapper. The detail now leads with the same words, then the text as it came."""
    from omniroute_tui import snapshot
    from tests.tui.snapshot_app import build_runtime

    runtime = build_runtime()
    raw = '503: {"error": {"message": "the model server is overloaded", "type": "server_error"}}'
    runtime.engine.connections["openai-main"].health.last_error = raw
    read = runtime.read
    now = read.now()
    (conn,) = [c for c in read.connections(now) if c.id == "openai-main"]
    lines = [text for text, _ in snapshot.connection_detail(conn, [], []).lines]
    assert lines[:2] == ["last error: 503 the model server is overloaded", f"as it came: {raw}"]
