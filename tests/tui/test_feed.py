"""The collector, the view models and the table diff: cheap ticks, exact rows, few cell writes."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from omniroute_tui import actions, snapshot
from omniroute_tui import format as fmt
from omniroute_tui.feed import Feed, LockoutIndex
from omniroute_tui.snapshot import Row, View
from proxy.resilience.lockout import LockoutSettings
from tests.tui.conftest import settle
from tests.tui.snapshot_app import SECOND, build_runtime, snapshot_app

SIZE = (120, 40)


class _Owner:
    """Stands in for the app when the feed is driven by hand: swallows what it posts."""

    def post_message(self, message: object) -> bool:
        return True

    def call_later(self, callback: object) -> bool:
        return True


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1, "1s"),
        (999, "1s"),
        (5000, "5s"),
        (59_001, "1m 00s"),
        (65_000, "1m 05s"),
        (3_600_000, "1h 00m"),
        (3_725_000, "1h 02m"),
        (90_000_000, "1d 01h"),
    ],
)
def test_durations_read_like_a_stopwatch(ms: float, text: str) -> None:
    assert fmt.duration(ms) == text


def test_countdown_shows_a_dash_when_nothing_is_left() -> None:
    assert fmt.countdown(0) == fmt.countdown(-5) == "—"
    assert fmt.clip("a\nvery   long\terror", 8) == "a very …"


def _row(key: str, value: float, text: str = "") -> Row:
    return Row(key, (key, text), (key, value), fmt.OK, (key,), f"{key} {text}")


def test_select_filters_sorts_and_caps_but_R_targets_every_match() -> None:
    rows = [_row(f"r{i}", float(i % 3), "even" if i % 2 == 0 else "odd") for i in range(10)]
    table = snapshot.select("breakers", rows, View(filter="EVEN", sort=1, reverse=True), limit=3)
    assert [r.key for r in table.rows] == ["r8", "r2", "r4"]  # values 2, 2, 1: ties by key, reversed
    assert table.total == 10
    assert [r.key for r in table.matching] == ["r8", "r2", "r4", "r6", "r0"]


def test_operator_actions_name_their_cli_command() -> None:
    runtime = build_runtime()
    engine = runtime.engine
    cases: list[tuple[actions.Action, tuple[str, ...]]] = [
        (actions.Action("breakers", "reset", (("ollama",),)), ("omniroute reset breaker ollama",)),
        (
            actions.Action("breakers", "reset", (("ollama",), ("openai",)), "all"),
            ("omniroute reset breaker --all",),
        ),
        (actions.Action("connections", "reset", (("groq-1",),)), ("omniroute reset connection groq-1",)),
        (actions.Action("connections", "toggle", (("groq-1",),)), ("omniroute disable groq-1",)),
        (actions.Action("connections", "toggle", (("groq-1",),)), ("omniroute enable groq-1",)),
        (
            actions.Action("lockouts", "reset", (("openai", "openai-main", "gpt-4o"),), "shown"),
            ("omniroute reenable openai/gpt-4o --connection openai-main",),
        ),
        (actions.Action("lockouts", "reset", (), "all"), ("omniroute reenable --all",)),
    ]
    for action, commands in cases:
        result = actions.apply(runtime.read, engine, action)
        assert result.commands == commands
        event = runtime.bus.after(0)[-1]
        assert (event.layer, f"omniroute {event.key}", event.reason) == ("operator", commands[0], "tui")
    assert engine.lockouts.active(engine.clock.now()) == []
    with pytest.raises(KeyError):
        actions.apply(runtime.read, engine, actions.Action("connections", "reset", (("gone",),)))


def test_an_actions_words_count_one_as_one() -> None:
    """ "was CLOSED, 1 failures", "1 lockouts lifted": counted in words as everywhere else."""
    runtime = build_runtime()
    engine = runtime.engine
    breaker = engine.providers["openai"].breaker
    breaker.reset(engine.clock.now())
    breaker.record_failure(engine.clock.now())
    said = actions.apply(runtime.read, engine, actions.Action("breakers", "reset", (("openai",),))).said
    assert said == ("Reset breaker openai (was CLOSED, 1 failure)",)
    for lockout in engine.lockouts.active(engine.clock.now())[1:]:
        engine.reenable(lockout.provider, lockout.model, lockout.connection_id)
    assert len(engine.lockouts.active(engine.clock.now())) == 1
    said = actions.apply(runtime.read, engine, actions.Action("lockouts", "reset", (), "all")).said
    assert said == ("Re-enabled every locked model (1 lockout lifted)",)


async def test_a_tick_builds_nothing_when_nothing_changed() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")  # the Events tab has no countdown
        await settle(pilot)
        assert app.feed.collect() is None
        app.runtime.engine.reset_breakers("groq", source="test")  # an event: rebuild
        built = app.feed.collect()
        assert built is not None and built.table is not None
        assert built.table.rows[0].cells[2] == "omniroute reset breaker groq"
        assert app.feed.collect() is None


async def test_countdowns_move_and_only_changed_rows_are_drawn() -> None:
    app = snapshot_app()
    clock: Any = app.runtime.engine.clock
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        table = app.table("lockouts")
        drawn = table.drawn
        assert app.feed.collect() is None  # same second, no event: nothing to build
        clock.advance(SECOND)
        assert app.feed.collect() is not None
        await settle(pilot)
        assert [r.cells[5] for r in table.rows] == ["19m 29s", "11m 29s", "4m 29s", "2m 14s"]
        assert table.drawn - drawn == 4  # every countdown moved: each row drawn once more


async def test_a_change_redraws_only_its_row() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await settle(pilot)
        table = app.table("breakers")
        before = list(table.rows)
        drawn = table.drawn
        engine.providers["groq"].breaker.record_failure(engine.clock.now())
        app.feed.request()
        await settle(pilot)
        changed = [new.key for old, new in zip(before, table.rows, strict=True) if old is not new]
        assert changed == ["groq"]
        assert table.drawn - drawn == 1
        assert table.rows[-1].cells[3] == "1"  # groq's failure count


async def test_logs_go_to_the_events_tab_not_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        logging.getLogger("uvicorn.error").warning("upstream exploded")
        await pilot.press("6")
        await settle(pilot)
        rows = app.table("events").snapshot.rows  # type: ignore[union-attr]
        assert rows[0].cells[1:] == ("log", "uvicorn.error", "WARNING", "upstream exploded")
    captured = capsys.readouterr()
    assert "upstream exploded" not in captured.out + captured.err


async def test_the_detail_pane_shows_the_selected_rows_history() -> None:
    app = snapshot_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await settle(pilot)
        detail = app.panes["breakers"].detail._detail
        assert detail is not None and detail.title == "ollama · OPEN · probe at 00:10:05"
        assert [line for line, _ in detail.lines[1:]] == [
            "00:09:50  DEGRADED → OPEN  failures",
            "00:09:50  CLOSED → DEGRADED  failures",
        ]
        await pilot.press("3")
        await settle(pilot)
        await pilot.press("down")  # ollama-1: its cooldown history
        await settle(pilot)
        detail = app.panes["connections"].detail._detail
        assert detail is not None and detail.title.startswith("ollama-1 (ollama) · cooling")
        assert sum("active → cooling" in line for line, _ in detail.lines) == 3


def test_the_lockout_index_follows_events_like_a_full_reload() -> None:
    """The incremental index (events re-read their triple, deadlines cut a prefix) must always
    hold exactly what a reload of the whole table would."""
    runtime = build_runtime()
    engine = runtime.engine
    clock: Any = engine.clock
    feed = Feed(_Owner(), runtime.read, url="http://test/v1", live=False)  # type: ignore[arg-type]
    feed.start()
    settings = LockoutSettings(enabled=True)
    rng = random.Random(7)
    connections = list(engine.connections.values())
    for step in range(300):
        roll = rng.random()
        now = clock.now()
        if roll < 0.6:
            conn = rng.choice(connections)
            engine.lockouts.record_failure(
                conn.spec.provider, conn.spec.id, f"m{rng.randrange(20)}", now, settings,
                status=404, reason="not_found", hint_ms=rng.randrange(1, 120) * SECOND,
            )  # fmt: skip
        elif roll < 0.75 and len(engine.lockouts):
            provider, connection, model = rng.choice(engine.lockouts.keys())
            engine.reenable(provider, model, connection, source="test")
        else:
            clock.advance(rng.randrange(1, 30) * SECOND)
        feed._drain()
        index = feed._lockouts(clock.now())
        fresh = LockoutIndex()
        fresh.load(engine.lockouts.active(clock.now()))
        assert [r.key for r in index.rows] == [r.key for r in fresh.rows], step
        assert [r.cells for r in index.rows] == [r.cells for r in fresh.rows], step


async def test_a_long_table_shows_250_rows_and_R_reaches_every_match() -> None:
    app = snapshot_app()
    engine = app.runtime.engine
    settings = LockoutSettings(enabled=True)
    for i in range(300):  # quota locks: one connection keeps only NOT_FOUND_BUDGET not_found ones
        engine.lockouts.record_failure(
            "openai", "openai-main", f"bulk-{i:03d}", engine.clock.now(), settings,
            status=429, reason="rate_limited", hint_ms=(60 + i) * SECOND,
        )  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        table = app.table("lockouts")
        assert len(table.rows) == 250
        assert "304 lockouts · showing the first 250" in app.panes["lockouts"].caption.content.plain  # type: ignore[union-attr]
        await pilot.press("slash", *"bulk", "enter")
        await settle(pilot)
        await pilot.press("R")
        await pilot.pause()
        assert app.screen.question == "Re-enable 300 lockouts (every row the filter shows)?"  # type: ignore[attr-defined]
        await pilot.press("y")
        await settle(pilot)
        assert sorted(str(item["model"]) for item in app.runtime.read.lockouts_api()) == [
            "claude-3-opus",
            "gpt-4o",
            "gpt-4o-mini",
            "llama3:70b",
        ]
