"""The Requests tab with Pilot: alive requests on top, `f` for failures only, the trail in words in
the detail pane, and a client's model name shown as text, never as terminal control."""

from __future__ import annotations

from omniroute_tui.app import OmniRouteApp
from omniroute_tui.snapshot import TableSnapshot
from tests.tui.conftest import settle
from tests.tui.snapshot_app import build_runtime, snapshot_app

SIZE = (120, 40)


def shown(app: OmniRouteApp) -> TableSnapshot:
    snapshot = app.table("requests").snapshot
    assert snapshot is not None
    return snapshot


async def test_alive_on_top_then_newest_first_and_f_keeps_the_failures() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await settle(pilot)
        rows = shown(app).rows
        assert [r.cells[5] for r in rows] == ["streaming", "waiting", "401 invalid_api_key", "200", "200"]
        assert [r.key[:4] for r in rows] == ["0005", "0004", "0003", "0002", "0001"]
        offered = lambda: {b.binding.description for b in app.screen.active_bindings.values() if b.enabled}  # noqa: E731
        assert "Failures" in offered() and "All requests" not in offered()
        await pilot.press("f")
        await settle(pilot)
        assert [r.key[:4] for r in shown(app).rows] == ["0003"]
        assert shown(app).notice is not None
        # the key bar says what `f` does now (found by an operator's trial: `f Failures` while on)
        assert "All requests" in offered() and "Failures" not in offered()
        await pilot.press("f")
        await settle(pilot)
        assert len(shown(app).rows) == 5
        assert "Failures" in offered()


async def test_a_capped_column_takes_the_room_a_wide_window_has_to_spare() -> None:
    # The status cap (18) cut "401 invalid_api_key" to "401 invalid_api_k…" even at 120 columns,
    # with a fifth of the window empty to its right (found by an operator's trial). At 80 columns
    # there is no room to spare: the snapshots hold the cap there.
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await settle(pilot)
        table = app.table("requests")
        header = "".join(s.text for s in table.render_line(0))
        failed = "".join(s.text for s in table.render_line(3))
        assert failed[header.index("Status") :].split("  ")[0] == "401 invalid_api_key"


async def test_columns_fit_beside_the_scrollbar_that_many_rows_bring() -> None:
    """With the capped columns taking the spare room, a table whose rows outgrow the window ran two
    cells under the vertical scrollbar that appeared after the fit (no resize is sent for it): the
    last column was cut to "Token" and a horizontal scrollbar appeared (the demo's screenshot)."""
    app = snapshot_app()
    trail = app.runtime.trail
    assert trail is not None
    for n in range(60):
        record = trail.begin(f"{n:04x}f00dfeedbeef", "127.0.0.1", "chat/completions")
        record.model_asked = "ratelimited/gpt-4o-mini-with-a-long-name"
        trail.end(record, 404)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await settle(pilot)
        table = app.table("requests")
        assert table.show_vertical_scrollbar
        assert table.virtual_size.width <= table.scrollable_content_region.width
        assert "Tokens" in "".join(s.text for s in table.render_line(0))


async def test_the_detail_pane_tells_the_trail_in_words() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7", "j")
        await settle(pilot)
        detail = shown(app).detail
        assert detail is not None and detail.title.startswith("0004a1b2c3d4e5f6 · coding · waiting")
        await pilot.press("j", "j")
        await settle(pilot)
        detail = shown(app).detail
        assert detail is not None
        assert [text for text, _ in detail.lines][:4] == [
            "openai-main  skipped  cooling 12 s (429 rate_limited)",
            "anthropic/claude-3-opus  skipped  breaker OPEN, probe in 8 s",
            "waited 1.3 s  nothing eligible; waited for ollama-1 (cooling)",
            "ollama-1  200 in 3.4 s, TTFT 1.6 s, 380 tokens",
        ]
        await pilot.press("j")
        await settle(pilot)
        detail = shown(app).detail
        assert detail is not None
        assert detail.lines[0][0] == "openai-main  429 in 180 ms (rate_limited) → fallback"


async def test_a_streaming_request_says_where_it_streams_from() -> None:
    """Its attempt is in flight (recorded when it ends): the row and the detail still name the
    connection (found by an operator's trial: `Went to —`, no line at all)."""
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await settle(pilot)
        row = shown(app).rows[0]
        assert (row.cells[3], row.cells[4], row.cells[5]) == ("ollama/ollama-1", "1", "streaming")
        detail = shown(app).detail
        assert detail is not None and detail.lines[0][0] == "ollama-1  streaming"


async def test_a_clients_model_name_is_text_not_terminal_control() -> None:
    runtime = build_runtime()
    trail = runtime.trail
    assert trail is not None
    record = trail.begin("ffffa1b2c3d4e5f6", "127.0.0.1", "chat/completions")
    record.model_asked = "evil\x1b]0;pwned\x07\nmodel"
    record.message = "upstream said \x1b[31mred"
    trail.end(record, 400)
    app = OmniRouteApp(runtime, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await settle(pilot)
        row = next(r for r in shown(app).rows if r.key.startswith("ffff"))
        assert "\x1b" not in row.cells[2] and "\\x1b" in row.cells[2] and "\n" not in row.cells[2]
        app.table("requests").select_key(row.key)
        await settle(pilot)
        detail = shown(app).detail
        assert detail is not None
        assert all("\x1b" not in text for text, _ in detail.lines) and "\x1b" not in detail.title
