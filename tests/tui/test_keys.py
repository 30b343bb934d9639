"""Every key binding of the console, driven with Pilot on the fixed-state app.

Assertions are on the engine (did the action happen?), on the events the engine emitted (is it
logged with its CLI command?) and on what the widgets hold, never on timing.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from rich.console import Console
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import Static

from omniroute_tui.app import OmniRouteApp
from omniroute_tui.screens.confirm import ConfirmScreen
from omniroute_tui.screens.filter import FilterScreen
from omniroute_tui.screens.help import HelpScreen, commands, key_catalogue
from omniroute_tui.snapshot import COLUMNS
from tests.tui.conftest import settle
from tests.tui.snapshot_app import attached_snapshot_app, snapshot_app

SIZE = (120, 40)


def operator_events(app: OmniRouteApp) -> list[tuple[str, str]]:
    return [(e.key, e.reason) for e in app.runtime.bus.after(0) if e.layer == "operator"]


def event_keys(app: OmniRouteApp) -> list[str]:
    """The Key column of the Events tab, as shown."""
    return [row.cells[2] for row in app.table("events").snapshot.rows]  # type: ignore[union-attr]


def shown_keys(app: OmniRouteApp, tab: str) -> list[str]:
    return app.table(tab).row_keys


async def open_tab(pilot: Pilot[object], key: str) -> None:
    await pilot.press(key)
    await settle(pilot)


@pytest.mark.parametrize(
    ("key", "tab"),
    [
        ("1", "overview"),
        ("2", "breakers"),
        ("3", "connections"),
        ("4", "lockouts"),
        ("5", "settings"),
        ("6", "events"),
    ],
)
async def test_digits_switch_tabs(key: str, tab: str) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6" if key == "1" else "1")
        await settle(pilot)
        await open_tab(pilot, key)
        assert app.active_tab == tab
        assert app.feed.tab == tab
        if tab in ("breakers", "connections", "lockouts", "events"):
            assert app.focused is app.table(tab)
            assert app.table(tab).rows


async def test_r_resets_the_selected_breaker() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "2")
        assert shown_keys(app, "breakers")[0] == "ollama"  # OPEN sorts first
        assert engine.providers["ollama"].breaker.state(engine.clock.now()).value == "OPEN"
        await pilot.press("r")
        await settle(pilot)
        assert engine.providers["ollama"].breaker.state(engine.clock.now()).value == "CLOSED"
        assert engine.providers["anthropic"].breaker.state(engine.clock.now()).value == "HALF_OPEN"
        assert operator_events(app)[-1] == ("reset breaker ollama", "tui")
        toast = list(app._notifications)[-1]
        assert toast.message == "Reset breaker ollama (was OPEN, 2 failures)"  # what was done, not "Done"
        assert toast.title == "omniroute reset breaker ollama"
        await open_tab(pilot, "6")
        assert "omniroute reset breaker ollama" in event_keys(app)


async def test_r_clears_the_selected_connection() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        assert shown_keys(app, "connections")[0] == "groq-1"
        await pilot.press("r")
        await settle(pilot)
        assert engine.connections["groq-1"].health.status(engine.clock.now()) == "active"
        assert operator_events(app)[-1] == ("reset connection groq-1", "tui")
        row = app.table("connections").snapshot.rows  # type: ignore[union-attr]
        assert {r.key: r.cells[2] for r in row}["groq-1"] == "active"


async def test_e_disables_then_enables_a_connection() -> None:
    app = snapshot_app()
    health = app.runtime.engine.connections["groq-1"].health
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        await pilot.press("e")
        await settle(pilot)
        assert health.enabled is False
        await pilot.press("e")
        await settle(pilot)
        assert health.enabled is True
        assert [k for k, _ in operator_events(app)][-2:] == ["disable groq-1", "enable groq-1"]


async def test_r_reenables_the_selected_lockout() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "4")
        assert shown_keys(app, "lockouts")[0] == "ollama\x1follama-1\x1fllama3:70b"  # longest first
        await pilot.press("r")
        await settle(pilot)
        assert engine.lockouts.get("ollama", "ollama-1", "llama3:70b") is None
        assert len(engine.lockouts.active(engine.clock.now())) == 3
        assert operator_events(app)[-1] == ("reenable ollama/llama3:70b --connection ollama-1", "tui")
        assert "ollama\x1follama-1\x1fllama3:70b" not in shown_keys(app, "lockouts")


async def test_R_asks_and_yes_resets_every_breaker() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "2")
        await pilot.press("R")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert "Reset 4 breakers" in app.screen.question
        await pilot.press("y")
        await settle(pilot)
        now = engine.clock.now()
        assert {p.breaker.state(now).value for p in engine.providers.values()} == {"CLOSED"}
        assert operator_events(app)[-1] == ("reset breaker --all", "tui")
        toast = list(app._notifications)[-1].message
        assert toast.endswith("(1 already so)")  # groq was CLOSED: it does not count as reset


async def test_R_answered_no_changes_nothing() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "4")
        before = len(operator_events(app))
        await pilot.press("R")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        assert len(engine.lockouts.active(engine.clock.now())) == 4
        assert len(operator_events(app)) == before


async def test_slash_filters_and_R_acts_only_on_the_rows_shown() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.screen, FilterScreen)
        await pilot.press(*"ollama", "enter")
        await settle(pilot)
        assert app.feed.views["connections"].filter == "ollama"
        assert shown_keys(app, "connections") == ["ollama-1"]
        await pilot.press("R")
        await pilot.pause()
        assert "Clear 1 connection (every row the filter shows)" in app.screen.question  # type: ignore[attr-defined]
        await pilot.press("y")
        await settle(pilot)
        now = engine.clock.now()
        assert engine.connections["ollama-1"].health.status(now) == "active"
        assert engine.connections["groq-1"].health.status(now) == "expired"  # filtered out: untouched
        assert operator_events(app)[-1] == ("reset connection ollama-1", "tui")
        await pilot.press("slash", "ctrl+u", "enter")  # an empty filter shows every row again
        await settle(pilot)
        assert len(shown_keys(app, "connections")) == 5


async def test_escape_cancels_the_filter() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "2")
        await pilot.press("slash", "x", "escape")
        await settle(pilot)
        assert app.feed.views["breakers"].filter == ""
        assert len(shown_keys(app, "breakers")) == 4


async def test_s_cycles_the_sort_column_and_S_reverses() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "2")
        assert shown_keys(app, "breakers") == ["ollama", "anthropic", "openai", "groq"]  # by state
        await pilot.press("s")
        await settle(pilot)
        assert app.feed.views["breakers"].sort == 3  # failures
        assert shown_keys(app, "breakers") == ["groq", "ollama", "anthropic", "openai"]
        await pilot.press("S")
        await settle(pilot)
        assert app.feed.views["breakers"].reverse is True
        assert shown_keys(app, "breakers") == ["openai", "anthropic", "ollama", "groq"]
        for _ in range(len(COLUMNS["breakers"]) - 2):  # all the way round, to the column after the first
            await pilot.press("s")
        await settle(pilot)
        assert app.feed.views["breakers"].sort == 1
        assert app.feed.views["breakers"].reverse is False


async def test_cursor_follows_its_row_when_the_order_changes() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "2")
        await pilot.press("down")  # anthropic
        await settle(pilot)
        await pilot.press("S")
        await settle(pilot)
        table = app.table("breakers")
        assert table.selected_row is not None and table.selected_row.key == "anthropic"
        assert app.feed.selected["breakers"] == "anthropic"


async def test_p_pauses_and_resumes_live_updates() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await settle(pilot)
        assert app.feed.paused is True
        assert app.status.line_text(0).endswith(" PAUSED")
        # The key bar says what p does now.
        shown = {b.binding.description for b in app.active_bindings.values() if b.binding.show and b.enabled}
        assert "Resume" in shown and "Pause" not in shown
        before = app.feed.last
        app.runtime.engine.providers["groq"].breaker.record_failure(app.runtime.engine.clock.now())
        app.feed._tick()  # a periodic tick while paused builds nothing
        assert app.feed.last is before
        await pilot.press("p")
        await settle(pilot)
        assert app.feed.paused is False
        assert app.status.line_text(0).endswith(" LIVE")
        assert app.feed.last is not before
        shown = {b.binding.description for b in app.active_bindings.values() if b.binding.show and b.enabled}
        assert "Pause" in shown and "Resume" not in shown


async def test_question_mark_lists_every_key() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        console = Console(width=200, file=io.StringIO(), record=True)
        for static in app.screen.query(".help-section").results(Static):
            console.print(static.content)
        text = console.export_text()
        catalogue = key_catalogue(app)
        for binding in type(app).BINDINGS:
            if getattr(binding, "action", None) == "refuse":
                continue  # read-only's answer to the table keys, listed with those keys
            key = binding.key if hasattr(binding, "key") else binding[0]  # type: ignore[index]
            assert any(e.binding.key == key for e in catalogue)
        for entry in catalogue:
            assert (entry.binding.description or entry.binding.action) in text
        for key in ("r", "e", "R", "slash", "s", "S", "p", "question_mark", "q", "ctrl+c", "ctrl+p"):
            assert any(e.binding.key == key for e in catalogue), key
        # The Overview's tiles and lists take keys too (h/l, j/k, enter), and the keys that had no
        # words (escape, ctrl+c, ctrl+p) say what they do.
        scopes = {e.scope for e in catalogue}
        assert {"Overview tiles", "Overview lists"} <= scopes
        for key in ("escape", "ctrl+c", "ctrl+p"):
            [entry] = [e for e in catalogue if e.binding.key == key and e.scope == "Everywhere"]
            assert app.help_for(entry.binding), key
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize(
    ("make", "said"), [(snapshot_app, "Stop the proxy"), (attached_snapshot_app, "goes on")]
)
async def test_help_says_what_q_stops_hosted_and_attached(
    make: Callable[[], OmniRouteApp], said: str
) -> None:
    """Attached, `q` leaves the instance running: help said it stopped the proxy."""
    app = make()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        console = Console(width=200, file=io.StringIO(), record=True)
        for static in app.screen.query(".help-section").results(Static):
            console.print(static.content)
        [quit_line] = [line for line in console.export_text().splitlines() if line.strip().startswith("q ")]
        assert said in quit_line, quit_line
        assert [t for t, help_text, _ in commands(app) if t == "Quit" and said in help_text]


async def test_a_paused_attached_console_stays_still_when_the_instance_changes() -> None:
    """Attached, `p` said PAUSED while every change the stream brought redrew the screen at once
    (a change is drawn without waiting for a tick, which a pause holds back): now a paused console
    draws nothing until it is resumed, or the operator acts."""
    app = attached_snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        drawn: list[object] = []
        collect = app.feed.collect

        def counted(*, force: bool = False) -> object:
            drawn.append(force)
            return collect(force=force)

        app.feed.collect = counted  # type: ignore[method-assign]
        for kind in ("state", "settings", "snapshot"):
            app._remote_changed(kind)
        await pilot.pause()
        assert drawn == []
        await pilot.press("p")  # resumed: drawn at once, with what changed meanwhile
        await pilot.pause()
        assert drawn


async def test_ctrl_p_opens_the_palette_with_every_tab_and_action() -> None:
    app = snapshot_app()
    titles = [title for title, _, _ in commands(app)]
    for tab in ("Overview", "Breakers", "Connections", "Lockouts", "Settings", "Events"):
        assert f"Show the {tab} tab" in titles
    for title in (
        "Breakers: Reset",
        "Breakers: Reset shown",
        "Connections: Clear",
        "Connections: On/off",
        "Lockouts: Re-enable",
        "Lockouts: Re-enable shown",
        "Filter",
        "Sort",
        "Reverse",
        "Pause",
        "Help",
        "Quit",
    ):
        assert title in titles
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"lockouts tab")
        await settle(pilot)  # the palette searches in a worker of its own
        await pilot.press("enter")
        await settle(pilot)
        assert app.active_tab == "lockouts"


async def test_palette_runs_a_table_action_after_naming_its_row() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")  # looking at connections; the palette acts on a breaker
        app.table_action("breakers", "reset")
        await settle(pilot)
        await settle(pilot)
        assert app.active_tab == "breakers"
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Reset breaker ollama (now OPEN)?"
        assert engine.providers["ollama"].breaker.state(engine.clock.now()).value == "OPEN"  # not yet
        await pilot.press("y")
        await settle(pilot)
        assert engine.providers["ollama"].breaker.state(engine.clock.now()).value == "CLOSED"


async def test_palette_row_action_answered_no_changes_nothing() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        app.table_action("connections", "toggle_enabled")
        await settle(pilot)
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith("Enable/disable connection groq-1 of groq (now expired)")
        await pilot.press("n")
        await settle(pilot)
        assert engine.connections["groq-1"].health.enabled


@pytest.mark.parametrize(("keys", "row"), [(("j", "j"), 2), (("G",), -1), (("G", "g"), 0), (("j", "k"), 0)])
async def test_vi_keys_move_in_every_table(keys: tuple[str, ...], row: int) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        table = app.table("connections")
        await pilot.press(*keys)
        await settle(pilot)
        assert table.cursor == (row if row >= 0 else len(table.rows) - 1)


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
async def test_q_and_ctrl_c_quit(key: str) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(key)
        await pilot.pause()
    assert app.return_code == 0
    assert app.feed.live is False


async def test_read_only_disables_every_action() -> None:
    app = snapshot_app(read_only=True)
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        assert "READ-ONLY" in app.status.line_text(0)
        before = len(operator_events(app))
        for tab, keys in (("2", ("r", "R")), ("3", ("r", "e", "R")), ("4", ("r", "R"))):
            await open_tab(pilot, tab)
            offered = {b.binding.action for b in app.screen.active_bindings.values()}
            assert not offered & {"reset", "reset_shown", "toggle_enabled"}  # not on the key bar
            for key in keys:
                await pilot.press(key)
                await settle(pilot)
                assert not isinstance(app.screen, ConfirmScreen)
                # ...and the key is answered, not ignored (found by an operator's trial)
                assert any("read-only mode" in n.message for n in app._notifications), key
                app.clear_notifications()
        titles = [title for title, _, _ in commands(app)]
        assert "Show the Breakers tab" in titles and "Filter" in titles
        for title in ("Breakers: Reset", "Connections: Clear", "Connections: On/off", "Lockouts: Re-enable"):
            assert title not in titles  # the palette does not offer what would be refused
        app.table_action("breakers", "reset")  # a stale palette still reaches the app, which refuses
        await settle(pilot)
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        assert len(operator_events(app)) == before
        assert engine.providers["ollama"].breaker.state(engine.clock.now()).value == "OPEN"
        assert any("read-only mode" in n.message for n in app._notifications)


async def test_settings_fields_do_not_swallow_the_console_keys() -> None:
    from omniroute_tui.cards.fields import IntField, field_id

    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await settle(pilot)
        target = app.query_one(f"#{field_id('requestQueue.maxWaitMs')}", IntField)
        card = next(a for a in target.ancestors if type(a).__name__ == "SettingsCard")
        target.focus()  # where Tab lands: the field, not its input
        await pilot.pause()
        await pilot.press("1")  # a console key: Overview, and the field untouched
        await settle(pilot)
        assert app.active_tab == "overview"
        assert target.value == 15000 and not card.dirty  # type: ignore[attr-defined]
        await pilot.press("5")
        await settle(pilot)
        target.focus()
        await pilot.press("enter")  # edit on purpose
        await pilot.pause()
        assert app.focused is target.input
        assert "Editing requestQueue.maxWaitMs" in card.status  # type: ignore[attr-defined]
        await pilot.press("ctrl+u", "1", "2", "0", "0", "0")
        assert target.value == 12000 and app.active_tab == "settings"
        await pilot.press("escape")  # leaves the field, keeps the draft
        await pilot.pause()
        assert app.focused is target and card.dirty  # type: ignore[attr-defined]
        await pilot.press("p")  # the console's keys work again
        assert app.feed.paused
        await pilot.press("escape")  # a second escape discards the draft
        await pilot.pause()
        assert target.value == 15000 and not card.dirty  # type: ignore[attr-defined]


@pytest.mark.parametrize("tab", ["1", "5"])
async def test_table_keys_are_not_offered_where_there_is_no_table(tab: str) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(tab)
        await settle(pilot)
        offered = {b.binding.action for b in app.screen.active_bindings.values()}  # greyed out too
        assert not offered & {"filter", "sort", "reverse"}
        await pilot.press("2")
        await settle(pilot)
        shown = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
        assert {"filter", "sort", "reverse"} <= shown


async def test_toasts_hide_neither_the_status_lines_nor_the_confirmation() -> None:
    from textual.widgets._toast import Toast

    app = snapshot_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_tab(pilot, "2")
        await pilot.press("r")  # a toast
        await settle(pilot)
        await pilot.press("R")  # and the confirmation, while the toast is up
        await pilot.pause()
        await pilot.pause()
        toasts = [t.region for screen in app.screen_stack for t in screen.query(Toast)]
        assert toasts, "a toast is shown"
        dialog = app.screen.query_one(".dialog").region
        status = app.status.region  # on the main screen, under the dialog's screen
        for region in toasts:
            assert not region.overlaps(dialog), (region, dialog)
            assert not region.overlaps(status), (region, status)


async def test_escape_clears_an_active_filter() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        await pilot.press("slash", "g", "r", "o", "q", "enter")
        await settle(pilot)
        assert shown_keys(app, "connections") == ["groq-1"]
        await pilot.press("escape")
        await settle(pilot)
        assert app.feed.views["connections"].filter == ""
        assert len(shown_keys(app, "connections")) == 5


async def test_events_follow_new_entries_while_the_cursor_is_on_the_newest() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "6")
        table = app.table("events")
        assert table.cursor == 0
        engine.reset_breakers("ollama", source="cli")  # something new happens
        app.feed.request()
        await settle(pilot)
        assert table.cursor == 0 and table.selected_row is not None
        assert table.selected_row.cells[2] == "omniroute reset breaker ollama"  # the newest, followed
        await pilot.press("j")  # moving down stops following
        await settle(pilot)
        held = table.selected_row
        engine.reset_breakers("groq", source="cli")
        app.feed.request()
        await settle(pilot)
        assert table.selected_row is not None and held is not None
        assert table.selected_row.key == held.key and table.cursor == 2


@pytest.mark.parametrize("tab", ["1", "2", "3", "4", "5", "6"])
async def test_the_key_bar_keeps_pause_help_and_quit_at_80_columns(tab: str) -> None:
    from tests.tui.test_hostile import screen_lines

    app = snapshot_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_tab(pilot, tab)
        bar = screen_lines(app)[-1]
        for key in ("p Pause", "? Help", "q Quit", "^p palette"):
            assert key in bar, bar


async def test_ctrl_s_at_80x24_says_saved_where_it_can_be_seen() -> None:
    from omniroute_tui.cards.fields import IntField, field_id

    app = snapshot_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await settle(pilot)
        target = app.query_one(f"#{field_id('requestQueue.maxWaitMs')}", IntField)
        target.focus()
        await pilot.press("enter", "ctrl+u", *"12000", "ctrl+s")
        await settle(pilot)
        assert app.runtime.settings.document("resilience")["requestQueue"]["maxWaitMs"] == 12000
        toast = list(app._notifications)[-1]
        assert toast.message == "Saved Request Queue: requestQueue.maxWaitMs"


async def test_keys_typed_before_the_filter_input_has_focus_reach_it() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "3")
        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.screen, FilterScreen)
        app.set_focus(None)  # as between the screen's arrival and its input taking the focus
        await pilot.press("g", "r", "o", "q", "enter")
        await settle(pilot)
        assert app.feed.views["connections"].filter == "groq"
        assert shown_keys(app, "connections") == ["groq-1"]


@pytest.mark.parametrize("tab", ["breakers", "connections", "lockouts"])
async def test_enter_on_an_event_goes_to_its_row(tab: str) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "6")
        events = app.table("events")
        index = next(i for i, row in enumerate(events.rows) if row.target[:1] == (tab,))
        key = events.rows[index].target[1]
        events.move_to(index)
        await pilot.press("enter")
        await settle(pilot)
        await settle(pilot)
        assert app.active_tab == tab
        selected = app.table(tab).selected_row
        assert selected is not None and selected.key == key


@pytest.mark.parametrize(
    ("box", "tab"), [("cooling", "connections"), ("lockouts", "lockouts"), ("events", None)]
)
async def test_enter_on_an_overview_line_goes_to_its_row(box: str, tab: str | None) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        picklist = getattr(app.overview, box)
        index = next(i for i, target in enumerate(picklist.targets) if len(target) == 2)
        key_tab, key = picklist.targets[index]
        assert tab is None or key_tab == tab
        picklist.focus()
        for _ in range(index):
            await pilot.press("j")
        await pilot.press("enter")
        await settle(pilot)
        await settle(pilot)
        assert app.active_tab == key_tab
        selected = app.table(key_tab).selected_row
        assert selected is not None and selected.key == key


async def test_enter_on_a_breaker_tile_shows_its_breaker() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        bar = app.overview.tiles
        bar.focus()
        await pilot.press("l", "l")  # the third tile
        key = bar.items[2].key
        await pilot.press("enter")
        await settle(pilot)
        await settle(pilot)
        assert app.active_tab == "breakers"
        selected = app.table("breakers").selected_row
        assert selected is not None and selected.key == key


async def test_q_asks_first_when_requests_are_in_flight_and_ctrl_c_does_not() -> None:
    app = snapshot_app()
    assert app.runtime is not None
    app.runtime.engine.stats.in_flight = 3
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "3 requests in flight: quit and stop the proxy?"
        await pilot.press("n")
        await pilot.pause()
        assert app.is_running and not isinstance(app.screen, ConfirmScreen)
        await pilot.press("ctrl+c")  # the way out that never asks
        await pilot.pause()
    assert app.return_code == 0


async def test_the_quit_question_follows_the_requests_still_in_flight() -> None:
    """The count the dialog asks about is live: an operator waiting for requests to finish sees them
    finish, rather than a number that was true when `q` was pressed."""
    app = snapshot_app()
    assert app.runtime is not None
    stats = app.runtime.engine.stats
    stats.in_flight = 3
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        stats.in_flight = 1
        app.feed.request()
        await settle(pilot)
        assert app.screen.question == "1 request in flight: quit and stop the proxy?"
        assert "1 request in flight" in app.screen.query_one(".dialog-question", Static).content
        stats.in_flight = 0
        app.feed.request()
        await settle(pilot)
        assert app.screen.question == "Nothing in flight any more: quit and stop the proxy?"
        await pilot.press("y")
        await pilot.pause()
    assert app.return_code == 0


async def test_the_quit_question_recounts_by_itself_while_the_console_runs() -> None:
    """The live console builds no screen updates while a dialog is open, so a count refreshed only
    by them stood still: the dialog said "6 requests in flight" long after all of them had
    finished (found by a console trial). The question recounts on its own while it is up."""
    import asyncio
    import time

    from omniroute_tui.app import make_app
    from tests.tui.snapshot_app import build_runtime

    runtime = build_runtime()
    app = make_app(runtime)  # live: the feed ticks by itself, as in `omniroute tui`
    stats = runtime.engine.stats
    stats.in_flight = 3
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "3 requests in flight: quit and stop the proxy?"
        stats.in_flight = 0  # they all finished; nobody asks the feed for anything
        deadline = time.monotonic() + 5
        while app.screen.question != "Nothing in flight any more: quit and stop the proxy?":
            assert time.monotonic() < deadline, app.screen.question
            await asyncio.sleep(0.05)
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


async def test_q_asks_first_when_a_settings_card_holds_a_draft() -> None:
    from omniroute_tui.cards import SettingsPane
    from omniroute_tui.cards.fields import IntField

    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_tab(pilot, "5")
        await settle(pilot)
        field = next(f for f in app.query_one(SettingsPane).query(IntField))
        field.input.value = str(int(field.input.value or "0") + 1)
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Unsaved settings (Resilience): quit and stop the proxy?"
        await pilot.press("y")
        await pilot.pause()
    assert app.return_code == 0


async def test_j_and_k_walk_through_a_cards_buttons_to_the_next_card() -> None:
    """`j` stopped on a card's Save button (the buttons had no j/k), so walking the Settings tab by
    keyboard ended at the first card."""
    from textual.widgets import Button

    from omniroute_tui.cards.fields import SettingField

    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await settle(pilot)
        save = app.query(Button).first()
        save.focus()
        await pilot.pause()
        for _ in range(2):
            await pilot.press("j")
            await pilot.pause()
        # Past Save and Reset defaults: on the next card's first field (a switch: its checkbox)
        reached = app.focused
        assert reached is not None and reached is not save
        field = next((a for a in [reached, *reached.ancestors] if isinstance(a, SettingField)), None)
        assert field is not None, reached
        cards = [next(a for a in w.ancestors if type(a).__name__ == "SettingsCard") for w in (save, field)]
        assert cards[0] is not cards[1]
        await pilot.press("k", "k")
        await pilot.pause()
        assert app.focused is save


async def test_the_settings_tab_opens_on_its_first_field_and_offers_discard_only_with_a_draft() -> None:
    """Found by a new-user trial: on entering Settings nothing had the focus, so `j`, `k`, `enter`
    and `i` did nothing until a second Tab, and the key bar offered `esc Discard draft` with no draft."""
    from omniroute_tui.cards.fields import SettingField

    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await settle(pilot)
        first = app.query(SettingField).first()
        assert app.focused is first
        card = next(a for a in first.ancestors if type(a).__name__ == "SettingsCard")
        shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert "discard" not in shown
        await pilot.press("j")  # the field keys work at once
        await pilot.pause()
        assert app.focused is not first and isinstance(app.focused, SettingField)
        await pilot.press("k", "enter", "ctrl+u", "7", "escape")  # a draft
        await settle(pilot)
        assert card.dirty  # type: ignore[attr-defined]
        shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert "discard" in shown
        await pilot.press("1", "5")  # back again: the focus is on the tab's field, not lost
        await settle(pilot)
        assert isinstance(app.focused, SettingField)


async def test_coming_back_to_the_overview_gives_back_its_focus() -> None:
    """Found by an operator's trial: back on the Overview from another tab nothing had the focus, so
    the first Tab landed on the tab bar, and `Tab l l enter` (which opens a breaker on a fresh
    console) silently did nothing. The Overview now gets back what had the focus when it was left,
    else the tab bar as on a fresh console (one Tab from it reaches the tiles)."""
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await open_tab(pilot, "2")
        await open_tab(pilot, "1")
        assert app.focused is not None, "nothing has the focus on the Overview"
        await pilot.press("tab")
        await settle(pilot)
        assert app.focused is app.overview.tiles, app.focused
        await pilot.press("l")
        await open_tab(pilot, "3")
        await open_tab(pilot, "1")
        assert app.focused is app.overview.tiles, app.focused  # where it was, its pick kept
        await pilot.press("l", "enter")
        await settle(pilot)
        await settle(pilot)
        assert app.active_tab == "breakers"
