"""Untrusted text never reaches the terminal raw, and never crashes the console.

Model names come from any client, error texts from upstream bodies, names from config files. Each
test puts hostile strings into the engine (or sends them through the real proxy), renders every
tab as the terminal would receive it, and checks what comes out: no crash, no control byte, every
line exactly the screen's width, columns where the header says they are.
"""

from __future__ import annotations

import io
import logging
import unicodedata

import httpx
import pytest
from rich.cells import cell_len
from rich.console import Console

from omniroute_tui import untrusted
from omniroute_tui.app import OmniRouteApp, make_app
from omniroute_tui.untrusted import visible
from proxy import serve
from proxy.resilience.events import Event
from proxy.resilience.lockout import LockoutSettings
from proxy.runtime import Runtime
from proxy.store import MemoryStore
from tests.fakes import FakeUpstream, Reply
from tests.fakes import serve as serve_upstream
from tests.tui.conftest import settle
from tests.tui.snapshot_app import CONFIG, MINUTE, build_runtime, load_fixed_config
from tests.tui.test_lifecycle import wait_until

MARKUP = "weird/m-[link=http://evil]y[/link]"
HOSTILE = (
    MARKUP,
    "m-\x1b]0;PWNED\x07title",
    "m-\x1b[2J\x1b[31mred",
    "two\nlines",
    "tab\there",
    "bell\x07\x08\x0b\x0c\rcr",
    "c1-\x9b31m",
    "rtl-\u202egnp.exe",
    "zero\u200bwidth\u200d\ufeff",
    "lone-\ud800-surrogate",
    "[bold red]not bold[/]",
    "x" * 10_000,
)
TABS = ("1", "2", "3", "4", "5", "6")


def screen_lines(app: OmniRouteApp) -> list[str]:
    """The screen as the terminal receives it, less the cursor moves and styles."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system=None,
        record=True,
        legacy_windows=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=False).split("\n")[:height]


def assert_clean(app: OmniRouteApp, where: str) -> list[str]:
    width, height = app.size
    lines = screen_lines(app)
    assert len(lines) == height, where
    for y, line in enumerate(lines):
        bad = [ch for ch in line if not ch.isprintable() and ch != " "]
        assert not bad, f"{where}: raw characters {bad!r} on line {y}: {line!r}"
        assert cell_len(line) == width, f"{where}: line {y} is {cell_len(line)} cells, not {width}"
    return lines


def hostile_runtime() -> Runtime:
    """The fixed-state runtime, plus a lockout, an error, an event and a log line per hostile string."""
    runtime = build_runtime()
    engine = runtime.engine
    now = runtime.clock.now()
    lockout = LockoutSettings(enabled=True)
    for i, text in enumerate(HOSTILE):
        engine.lockouts.record_failure(
            "ollama",
            "ollama-1",
            text,
            now,
            lockout,
            status=404,
            reason="not_found",
            hint_ms=(30 - i) * MINUTE,
        )
        runtime.bus.publish(
            Event(now, "lockout", f"ollama:ollama-1:{text}", "unlocked", "locked", f"404 {text}")
        )
    engine.connections["openai-main"].health.last_error = "\n".join(HOSTILE)
    return runtime


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)])
async def test_every_tab_shows_hostile_text_as_visible_escapes(size: tuple[int, int]) -> None:
    app = make_app(hostile_runtime(), clock_frozen=True)
    async with app.run_test(size=size) as pilot:
        logging.getLogger("omniroute").warning("upstream said: %s", "\x1b]0;PWNED\x07 [b]x[/b]\nsecond")
        for tab in TABS:
            await pilot.press(tab)
            await settle(pilot)
            assert_clean(app, f"tab {tab}")
            if tab in "2346":
                walk = len(HOSTILE) + 2 if tab == "4" and size == (120, 40) else 3
                for _ in range(walk):  # the detail pane follows the cursor over each row
                    await pilot.press("down")
                    await settle(pilot)
                    assert_clean(app, f"tab {tab}, row {app.table(app.active_tab).cursor}")
        assert app.is_running


async def test_a_model_name_with_markup_does_not_kill_the_console() -> None:
    runtime = build_runtime()
    runtime.engine.lockouts.record_failure(
        "ollama",
        "ollama-1",
        MARKUP,
        runtime.clock.now(),
        LockoutSettings(enabled=True),
        status=404,
        reason="not_found",
        hint_ms=60 * MINUTE,  # the longest: first row of the default view
    )
    app = make_app(runtime, clock_frozen=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await settle(pilot)
        pane = app.panes["lockouts"]
        assert app.table("lockouts").selected_row is not None
        assert app.table("lockouts").selected_row.cells[2] == MARKUP  # literal, not a link
        assert f"ollama/{MARKUP} on ollama-1" in "\n".join(screen_lines(app))  # the pane's title
        assert pane.detail.border_title is not None
    assert app.return_code in (None, 0)


async def test_columns_stay_where_the_header_says() -> None:
    app = make_app(hostile_runtime(), clock_frozen=True)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("4")
        await settle(pilot)
        table = app.table("lockouts")
        header = "".join(s.text for s in table.render_line(0))
        x = header.index("Expires at")
        rows = ["".join(s.text for s in table.render_line(y)) for y in range(1, len(table.rows) + 1)]
        assert len(rows) > len(HOSTILE)
        for row in rows:  # each row's deadline (HH:MM:SS) under its label, whatever came before it
            assert row[x : x + 8].count(":") == 2, row


def test_visible_escapes_every_control_and_format_character() -> None:
    for ch in map(chr, [*range(0, 32), 0x7F, *range(0x80, 0xA0), 0x200B, 0x200E, 0x202E, 0x2066, 0xFEFF]):
        shown = visible(f"a{ch}b")
        assert shown.isprintable(), repr(ch)
        assert shown.startswith("a") and shown.endswith("b")
        assert len(shown) > 2 or unicodedata.category(ch) == "Zs"
    assert visible("two\nlines") == "two↵lines"
    assert visible("a\tb") == "a⇥b"
    assert visible("\x1b]0;x\x07") == "\\x1b]0;x\\x07"
    assert visible("plain-name:7b") == "plain-name:7b"
    assert len(visible("x" * 10_000)) <= 2_001


def test_visible_keeps_a_few_accents_but_escapes_a_pile_of_combining_marks() -> None:
    """Combining marks are printable, and draw on the cell before them: a model of 200 U+0301 drew
    over the cells around it in the CLI's tables, the log and the console (found by a hostile-input
    trial). Words keep theirs (Vietnamese stacks two); a run past MAX_COMBINING, or one with nothing
    to sit on, is written out."""
    for word in ("café", "Tiếng Việt", "नमस्ते", "שָׁלוֹם", "cafe\u0301"):
        assert visible(word) == word
    zalgo = "a" + "\u0301" * 200 + "b"
    shown = visible(zalgo)
    assert shown.startswith("a" + "\u0301" * untrusted.MAX_COMBINING + "\\u0301")
    assert shown.endswith("b") and shown.count("\u0301") == untrusted.MAX_COMBINING
    assert visible("\u0301x") == "\\u0301x"  # nothing before it to combine with: not the cell before


LONG = "p" * 200
LONG_CONFIG = (
    CONFIG
    + f"""
[providers.{LONG}]
class = "local"
base_url = "http://127.0.0.1:9/v1"

[[providers.{LONG}.connections]]
id = "{LONG}-conn"
"""
)


def long_runtime() -> Runtime:
    from proxy.resilience.clock import FakeClock

    return Runtime(load_fixed_config(LONG_CONFIG), MemoryStore(), clock=FakeClock(), env={})


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_a_long_name_does_not_push_every_other_column_off_screen(size: tuple[int, int]) -> None:
    app = make_app(long_runtime(), clock_frozen=True)
    async with app.run_test(size=size) as pilot:
        for tab, label in (("2", "State"), ("3", "Status")):
            await pilot.press(tab)
            await settle(pilot)
            table = app.table(app.active_tab)
            header = "".join(s.text for s in table.render_line(0))
            assert label in header, header  # the columns after the long one are on screen
            assert any(LONG[:10] in line and "…" in line for line in screen_lines(app))
        await pilot.press("1")
        await settle(pilot)
        tiles = [line for line in screen_lines(app) if "openai" in line and "anthropic" in line]
        assert tiles, "the breaker tiles are laid side by side, not one per row"


async def test_widths_follow_the_rows_shown_and_sorting_never_widens() -> None:
    app = make_app(long_runtime(), clock_frozen=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("2")
        await settle(pilot)
        table = app.table("breakers")
        wide = table.virtual_size.width
        for _ in range(len(table._columns)):  # a full cycle of sort columns, back to the first
            await pilot.press("s")
            await settle(pilot)
        assert app.feed.views["breakers"].sort == 2
        assert table.virtual_size.width == wide
        app.feed.views["breakers"] = type(app.feed.views["breakers"])("openai", 2, False)
        app.feed.request()
        await settle(pilot)
        header = "".join(s.text for s in table.render_line(0))
        assert header.index("Class") <= len(" Provider ") + 1  # shrunk to the rows shown


@pytest.mark.parametrize("tab", TABS)
async def test_a_small_terminal_keeps_the_table_header_and_three_rows(tab: str) -> None:
    app = make_app(build_runtime(), clock_frozen=True)
    async with app.run_test(size=(40, 12)) as pilot:
        await pilot.press(tab)
        await settle(pilot)
        assert_clean(app, f"40x12 tab {tab}")
        if app.active_tab in ("breakers", "connections", "lockouts", "events"):
            table = app.table(app.active_tab)
            assert table.region.height >= 4, f"{app.active_tab}: {table.region}"


async def test_a_hostile_model_name_through_the_real_proxy_and_console() -> None:
    fake = FakeUpstream("hostile")
    fake.default(Reply("error", status=404))
    with serve_upstream(fake.app) as live:
        config = load_fixed_config(
            f"""
[providers.local]
class = "local"
base_url = "{live.url}/v1"

[[providers.local.connections]]
id = "local-1"
"""
        )
        runtime = Runtime(config, MemoryStore(), env={})
        runtime.settings.patch({"modelLockout": {"enabled": True, "errorCodes": [404]}}, "settings")
        sock = serve.bind_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        app = make_app(runtime, serve_sock=sock, clock_frozen=True)
        host = app.host
        assert host is not None
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: host.server is not None and host.server.started)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for model in HOSTILE[:6]:
                    answer = await client.post(
                        "/v1/chat/completions",
                        json={"model": f"local/{model}", "messages": [{"role": "user", "content": "hi"}]},
                    )
                    assert answer.status_code == 404, answer.text  # the upstream's, never a 429
                await pilot.press("4")
                await settle(pilot)
                assert len(app.table("lockouts").rows) == 6
                for _ in range(7):
                    await pilot.press("down")
                    await settle(pilot)
                    assert_clean(app, "lockouts through the proxy")
                await pilot.press("6")
                await settle(pilot)
                assert_clean(app, "events through the proxy")
                health = await client.get("/api/monitoring/health")
                assert health.status_code == 200  # the proxy still serves
            assert app.is_running
            await pilot.press("q")
            await wait_until(pilot, lambda: host.task is not None and host.task.done())
        assert app.return_code == 0


async def test_the_lockouts_tab_says_when_client_chosen_names_were_evicted() -> None:
    runtime = build_runtime()
    engine = runtime.engine
    status = engine.lockout_table_status()
    lockout = LockoutSettings(enabled=True)
    now = runtime.clock.now()
    for i in range(status.not_found_budget + 3):  # three more made-up names than one connection keeps
        engine.lockouts.record_failure(
            "ollama", "ollama-1", f"made-up-{i}", now + i, lockout, status=404, reason="not_found"
        )
    app = make_app(runtime, clock_frozen=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("4")
        await settle(pilot)
        caption = "\n".join(screen_lines(app))
        evicted = engine.lockout_table_status().evicted
        assert evicted == 4  # the three, and the fixed state's own not_found lock on ollama-1
        assert "4 not-found locks evicted (at most 100 per connection)" in caption
        assert (
            engine.lockouts.get("anthropic", "anthropic-1", "claude-3-opus") is not None
        )  # a real one stays


def test_a_full_table_is_said_in_red() -> None:
    from omniroute_tui.snapshot import lockout_notice
    from proxy.resilience.lockout import LockoutTableStatus

    assert lockout_notice(LockoutTableStatus(12, 10_000, 3, 100, 0, 0)) is None
    text, style = lockout_notice(LockoutTableStatus(10_000, 10_000, 0, 100, 0, 7)) or ("", "")
    assert text == "table full (10,000 of 10,000) · 7 new locks not recorded" and style == "bad"


@pytest.mark.parametrize("width", [40, 50, 60])
async def test_a_narrow_key_bar_ends_with_the_palette_hint_and_nothing_after_it(width: int) -> None:
    """Found by an operator's trial at 40x12: when the key bar is too narrow for its keys, a letter
    of a key it could not fit is drawn after the palette hint, in the last column: `^p palettel`
    on Requests, `^p palettei` on Settings, `^p paletteq` on Events, `^p paletteP` on Connections."""
    app = make_app(build_runtime(), clock_frozen=True)
    async with app.run_test(size=(width, 24)) as pilot:
        for tab in ("1", "2", "3", "4", "5", "6", "7"):
            await pilot.press(tab)
            await settle(pilot)
            bar = screen_lines(app)[-1]
            assert bar.rstrip().endswith("^p palette"), f"{width} cells, tab {tab}: {bar!r}"


@pytest.mark.parametrize("width", [120, 110])
async def test_the_last_column_ends_at_the_windows_edge_with_an_ellipsis(width: int) -> None:
    """Found by an operator's trial at 120 columns: an event's Reason ran past the window and was
    cut mid-word by its edge (`cooldown 4000ms (le`), with nothing to say more was there. The last
    column now ends at the edge, its long cells with `…`; a resize refits it."""
    app = make_app(build_runtime(), clock_frozen=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("6")
        await settle(pilot)
        await pilot.resize_terminal(width, 40)
        await settle(pilot)
        await settle(pilot)
        [line] = [line for line in screen_lines(app) if "groq-1" in line and "expired" in line]
        assert "expired: 401" in line and line.rstrip(" │▐▌█▊▎▍▏▋▉").endswith("…"), line
