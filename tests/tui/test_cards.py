"""The Settings tab's cards, driven with Pilot against a real Runtime on a SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import Button, Input

from omniroute_tui.cards import CARDS, SettingsCard, SettingsPane
from omniroute_tui.cards.card import RuntimeSettings
from omniroute_tui.cards.catalog import format_default, format_range, get_path, nest
from omniroute_tui.cards.fields import (
    BoolField,
    CodeListField,
    IntField,
    SettingField,
    clamp,
    field_id,
    parse_int,
)
from proxy.config import load_config
from proxy.resilience.clock import FakeClock
from proxy.runtime import Runtime
from proxy.settings import SCHEMA, SECTIONS, defaults, field
from proxy.store import SqliteStore

CONFIG = """
[providers.local1]
class = "local"
base_url = "http://127.0.0.1:9/v1"

[[providers.local1.connections]]
id = "local1-1"
"""


class Instance:
    """A Runtime on a SQLite file, reopened at the end to read what was persisted."""

    def __init__(self, tmp_path: Path) -> None:
        config_path = tmp_path / "config.toml"
        config_path.write_text(CONFIG)
        config_path.chmod(0o600)
        self.db = tmp_path / "s.db"
        self.runtime = Runtime(
            load_config(config_path, {}, explicit=True), SqliteStore(self.db), clock=FakeClock(), env={}
        )

    def live(self, path: str) -> Any:
        return get_path(self.runtime.settings.document(), path)

    def persisted(self) -> dict[str, Any] | None:
        """Close the runtime's store, reopen the file and return the stored settings document."""
        self.runtime.store.close()
        store = SqliteStore(self.db)
        try:
            return store.load().settings
        finally:
            store.close()


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[Instance]:
    inst = Instance(tmp_path)
    yield inst
    inst.runtime.store.close()


class CardsApp(App[None]):
    def __init__(self, runtime: Runtime, *, read_only: bool = False) -> None:
        super().__init__()
        self.runtime = runtime
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        yield SettingsPane(RuntimeSettings(self.runtime), read_only=self.read_only)


@asynccontextmanager
async def running(
    instance: Instance, *, read_only: bool = False, size: tuple[int, int] = (80, 24)
) -> AsyncIterator[tuple[Pilot[None], SettingsPane, list[Message]]]:
    messages: list[Message] = []
    app = CardsApp(instance.runtime, read_only=read_only)
    async with app.run_test(size=size, message_hook=messages.append) as pilot:
        await pilot.pause()
        yield pilot, app.query_one(SettingsPane), messages


def saved(messages: list[Message]) -> list[SettingsCard.Saved]:
    """The Saved messages, once each (the hook sees a bubbling message at every level)."""
    unique = {id(m): m for m in messages if isinstance(m, SettingsCard.Saved)}
    return list(unique.values())


def card_of(pane: SettingsPane, path: str) -> SettingsCard:
    return next(card for card in pane.cards if path in card.fields)


def field_at(pane: SettingsPane, path: str) -> SettingField:
    return pane.query_one(f"#{field_id(path)}", SettingField)


async def type_into(
    pilot: Pilot[None], pane: SettingsPane, path: str, text: str, *, keys: bool = False
) -> IntField:
    """Focus an integer field and replace its text (focus stays in the field).

    With `keys`, clear it and type `text` key by key; else set the text at once, which posts the
    same `Input.Changed` as the last keystroke would (each keystroke re-lays out the screen, so
    typing everything key by key would make this file several times slower)."""
    target = field_at(pane, path)
    assert isinstance(target, IntField)
    target.input.focus()
    await pilot.pause()
    if keys:
        target.input.clear()
        await pilot.press(*text)
    else:
        target.input.value = text
    await pilot.pause()
    return target


async def save(pilot: Pilot[None]) -> None:
    await pilot.press("ctrl+s")
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def first_int(card_id: str) -> str:
    spec = next(spec for card in CARDS if card.id == card_id for spec in card.specs() if spec.kind == "int")
    return spec.path


def other_valid(path: str) -> int:
    """A valid value different from the default."""
    spec = field(path)
    assert isinstance(spec.default, int) and spec.min is not None and spec.max is not None
    return spec.default + 1 if spec.default < spec.max else spec.default - 1


CARD_IDS = [card.id for card in CARDS]

# One edit per card: for the two-group Resilience card, a grid cell of each group.
VALID_EDITS: dict[str, dict[str, int]] = {
    "resilience": {
        "providerBreaker.local.resetTimeoutMs": 20000,
        "connectionCooldown.oauth.maxBackoffSteps": 4,
    },
    "model-lockout": {"modelLockout.baseCooldownMs": 60000},
    "request-queue": {"requestQueue.requestsPerMinute": 250},
    "combo-cooldown-wait": {"comboCooldownWait.maxAttempts": 3},
    "quota-share": {"quotaShareConcurrencyLimit.queueDepth": 50},
    "stream-watchdog": {"streamRecovery.throughputWatchdog.windowMs": 5000},
    "session-affinity": {"sessionAffinity.ttlMs": 60000},
}


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_every_schema_field_is_on_exactly_one_card_of_its_api_group() -> None:
    seen = [spec.path for card in CARDS for spec in card.specs()]
    assert sorted(seen) == sorted(spec.path for spec in SCHEMA)
    for card in CARDS:
        for spec in card.specs():
            assert spec.path.split(".")[0] in SECTIONS[card.group]


def test_model_lockout_saves_through_settings_and_the_others_through_resilience() -> None:
    groups = {card.id: card.group for card in CARDS}
    assert groups.pop("model-lockout") == "settings"
    assert set(groups.values()) == {"resilience"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", 12),
        (" 7 ", 7),
        ("-3", -3),
        ("", None),
        ("-", None),
        ("1_000", None),
        ("+5", None),
        ("1.5", None),
    ],
)
def test_parse_int_reads_plain_decimal_digits_only(text: str, expected: int | None) -> None:
    assert parse_int(text) == expected


def test_clamp_names_the_bound_and_the_schema_reason() -> None:
    spec = field("providerBreaker.apikey.failureThreshold")
    assert clamp(spec, 12) == (12, None)
    assert clamp(spec, 5000) == (1000, "clamped to 1000: must be an integer between 1 and 1000")
    assert clamp(spec, 0) == (1, "clamped to 1: must be an integer between 1 and 1000")


def test_defaults_and_ranges_are_formatted_from_the_schema() -> None:
    assert format_default(field("requestQueue.requestsPerMinute")) == "100"
    assert format_range(field("requestQueue.requestsPerMinute")) == "1–1,000,000"
    assert format_default(field("modelLockout.enabled")) == "off"
    assert format_default(field("modelLockout.errorCodes")) == "403, 404, 429, 502, 503, 504"
    assert format_range(field("modelLockout.errorCodes")) == "codes 100–599"


def test_nest_builds_a_patch_body_from_dotted_paths() -> None:
    assert nest({"a.b.c": 1, "a.b.d": 2, "e": 3}) == {"a": {"b": {"c": 1, "d": 2}}, "e": 3}


# ---------------------------------------------------------------------------------------------
# Layout


async def test_every_card_shows_scope_trigger_effect_and_each_field_its_default_and_range(
    instance: Instance,
) -> None:
    async with running(instance) as (_, pane, _):
        assert [card.id for card in pane.cards] == [f"card-{card_id}" for card_id in CARD_IDS]
        for card in pane.cards:
            text = " ".join(str(static.render()) for static in card.query(".explainer"))
            assert "Scope: " in text and "Trigger: " in text and "Effect: " in text
            for path, widget in card.fields.items():
                spec = field(path)
                hint = str(widget.query_one(".hint").render())
                assert f"default {format_default(spec)}" in hint
                # A grid cell leaves the range to its row heading.
                row = widget.parent
                assert row is not None
                shown = hint if "-cell" not in widget.classes else str(row.query_one(".row-name").render())
                assert format_range(spec) in shown, path
        assert card_of(pane, "requestQueue.maxWaitMs").id == "card-request-queue"


async def test_the_resilience_card_is_a_grid_of_fields_by_class(instance: Instance) -> None:
    async with running(instance, size=(100, 40)) as (_, pane, _):
        card = pane.card("resilience")
        heads = [str(s.render()) for s in card.query(".col-head")]
        assert heads == ["OAuth", "API key", "Local"] * 2
        row = field_at(pane, "providerBreaker.oauth.failureThreshold").parent
        cells = [w.spec.path for w in row.query(SettingField)]  # type: ignore[union-attr]
        assert cells == [f"providerBreaker.{c}.failureThreshold" for c in ("oauth", "apikey", "local")]
        xs = [field_at(pane, p).region.x for p in cells]
        assert xs == sorted(xs) and len(set(xs)) == 3


async def test_the_pane_fits_80x24_by_scrolling_and_flows_cards_into_columns_when_wide(
    instance: Instance,
) -> None:
    async with running(instance, size=(80, 24)) as (_, pane, _):
        assert all(card.region.right <= 80 for card in pane.cards)
        assert pane.virtual_size.height > 24  # scrolls rather than squeezing
        assert len({card.region.x for card in pane.cards}) == 1
    async with running(instance, size=(200, 50)) as (_, pane, _):
        assert len({card.region.x for card in pane.cards}) == 2
        assert pane.card("resilience").region.width > 150  # the wide card spans both columns


# ---------------------------------------------------------------------------------------------
# Saving


async def test_on_every_card_a_valid_draft_saves_live_and_persists(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, messages):
        for card_id, edits in VALID_EDITS.items():
            for path, value in edits.items():
                await type_into(pilot, pane, path, str(value))
            card = pane.card(card_id)
            assert card.dirty and "Unsaved draft" in card.status, card_id
            await save(pilot)
            for path, value in edits.items():
                assert instance.live(path) == value, path
            assert not card.dirty and card.status == "Saved.", card_id
        assert [(m.card.id, m.patch) for m in saved(messages)] == [
            (f"card-{card_id}", nest(edits)) for card_id, edits in VALID_EDITS.items()
        ]
    stored = instance.persisted()
    assert stored is not None
    for edits in VALID_EDITS.values():
        for path, value in edits.items():
            assert get_path(stored, path) == value, path


async def test_a_switch_saves_its_new_state(instance: Instance) -> None:
    path = "streamRecovery.throughputWatchdog.enabled"
    async with running(instance) as (pilot, pane, _):
        switch = field_at(pane, path)
        assert isinstance(switch, BoolField) and switch.value is False
        switch.checkbox.focus()
        await pilot.press("space")
        await pilot.pause()
        assert switch.value is True and str(switch.checkbox.label) == "on"
        await save(pilot)
        assert instance.live(path) is True
    stored = instance.persisted()
    assert stored is not None and get_path(stored, path) is True


async def test_j_k_and_the_arrows_move_off_a_switch_as_off_any_field(instance: Instance) -> None:
    """On a switch, `j` did nothing and `down` scrolled the card: the focus looked stuck, and an
    operator pressing enter to get out toggled it."""
    path = "streamRecovery.throughputWatchdog.enabled"
    async with running(instance) as (pilot, pane, _):
        switch = field_at(pane, path)
        assert isinstance(switch, BoolField)
        for down, up in (("j", "k"), ("down", "up")):
            switch.checkbox.focus()
            await pilot.pause()
            await pilot.press(down)
            await pilot.pause()
            moved = pane.app.focused
            assert moved is not None and moved is not switch.checkbox, down
            assert switch not in moved.ancestors_with_self, down
            await pilot.press(up)
            await pilot.pause()
            assert pane.app.focused is switch.checkbox, up
        assert switch.value is False  # and nothing was toggled on the way


async def test_only_the_changed_fields_are_sent(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, messages):
        await type_into(pilot, pane, "requestQueue.maxQueueDepth", "7")
        await save(pilot)
        (message,) = saved(messages)
        assert message.patch == {"requestQueue": {"maxQueueDepth": 7}}
        assert message.document == instance.runtime.settings.document("resilience")


async def test_saving_an_unchanged_card_changes_nothing(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        target = field_at(pane, "sessionAffinity.ttlMs")
        assert isinstance(target, IntField)
        target.input.focus()
        await save(pilot)
        assert pane.card("session-affinity").status.startswith("Nothing to save")
    assert instance.persisted() is None


# ---------------------------------------------------------------------------------------------
# Invalid values


async def test_on_every_card_an_out_of_range_value_is_flagged_as_typed_and_clamped_on_leaving(
    instance: Instance,
) -> None:
    async with running(instance) as (pilot, pane, _):
        for card_id in CARD_IDS:
            path = first_int(card_id)
            spec = field(path)
            assert spec.max is not None
            target = await type_into(pilot, pane, path, str(spec.max + 1), keys=True)
            assert target.message == f"must be {spec.accepted()}", path  # as typed, before leaving
            assert target.input.has_class("-invalid"), path
            await pilot.press("tab")
            await pilot.pause()
            assert target.value == spec.max, path
            assert target.input.value == str(spec.max), path
            assert target.message == f"clamped to {spec.max}: must be {spec.accepted()}", path
            assert instance.live(path) == spec.default, path  # clamping saves nothing


async def test_a_value_below_the_minimum_is_clamped_up(instance: Instance) -> None:
    path = "providerBreaker.apikey.resetTimeoutMs"
    async with running(instance) as (pilot, pane, _):
        target = await type_into(pilot, pane, path, "5")
        await pilot.press("enter")
        await pilot.pause()
        assert target.value == 1000
        assert target.message == "clamped to 1000: must be an integer between 1000 and 86400000"


async def test_a_field_deleted_key_by_key_is_restored_to_its_value_before_the_edit(
    instance: Instance,
) -> None:
    """Deleting 5000 one backspace at a time passes through 500, 50 and 5, each a valid value: left
    empty, the field was "restored to 5" (and a save would have sent 5), not to 5000."""
    path = "requestQueue.concurrentRequests"
    async with running(instance) as (pilot, pane, _):
        target = await type_into(pilot, pane, path, "")
        target.input.value = "10"  # the live value, as it was shown
        await pilot.pause()
        await pilot.press("end", "backspace", "backspace")
        await pilot.pause()
        assert target.value is None
        await pilot.press("enter")
        await pilot.pause()
        assert target.value == 10
        assert target.message.startswith("restored to 10:")


async def test_a_value_that_is_not_a_whole_number_is_refused_not_silently_changed(
    instance: Instance,
) -> None:
    """Typed key by key, `2.5` became `25` (the dot dropped without a word) and could be saved: ten
    times what was meant. It is flagged as typed and, on leaving, the value before the edit is back."""
    path = "requestQueue.concurrentRequests"
    async with running(instance) as (pilot, pane, _):
        target = await type_into(pilot, pane, path, "2.5", keys=True)
        assert target.input.value == "2.5"
        assert target.value is None and target.message == "must be an integer between 1 and 10000"
        await pilot.press("enter")
        await pilot.pause()
        assert target.value == 10
        assert target.message == "restored to 10: must be an integer between 1 and 10000"


async def test_an_emptied_field_is_restored_on_leaving(instance: Instance) -> None:
    path = "requestQueue.concurrentRequests"
    async with running(instance) as (pilot, pane, _):
        target = await type_into(pilot, pane, path, "")
        assert target.value is None and target.message == "must be an integer between 1 and 10000"
        await pilot.press("tab")
        await pilot.pause()
        assert target.value == 10
        assert target.message.startswith("restored to 10:")


async def test_an_out_of_range_value_saved_without_leaving_is_rejected_by_the_api_validation(
    instance: Instance,
) -> None:
    path = "comboCooldownWait.maxAttempts"
    async with running(instance) as (pilot, pane, _):
        target = await type_into(pilot, pane, path, "99")
        await save(pilot)
        assert target.message == "must be an integer between 0 and 10"
        assert pane.card("combo-cooldown-wait").status.startswith("Not saved")
        assert instance.live(path) == 5
    assert instance.persisted() is None


@pytest.mark.parametrize(
    ("card_id", "path", "text", "message"),
    [
        (
            "resilience",
            "providerBreaker.apikey.degradationThreshold",
            "12",
            "must be lower than failureThreshold (12)",
        ),
        (
            "model-lockout",
            "modelLockout.maxCooldownMs",
            "60000",
            "must be at least baseCooldownMs (120000)",
        ),
        (
            "combo-cooldown-wait",
            "comboCooldownWait.budgetMs",
            "1000",
            "must be at least maxWaitMs (90000), or 0",
        ),
    ],
)
async def test_a_cross_field_error_shows_on_the_field_and_saves_nothing(
    instance: Instance, card_id: str, path: str, text: str, message: str
) -> None:
    async with running(instance) as (pilot, pane, messages):
        target = await type_into(pilot, pane, path, text)
        assert target.message == ""  # in range on its own
        await save(pilot)
        assert target.message == message
        card = pane.card(card_id)
        assert card.status == "Not saved: 1 field rejected. Nothing changed."
        assert card.dirty and target.value == int(text)  # the draft stays for fixing
        assert instance.live(path) == field(path).default
        assert not saved(messages)
    assert instance.persisted() is None


async def test_a_cross_field_error_is_fixed_in_the_same_draft(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        await type_into(pilot, pane, "providerBreaker.local.degradationThreshold", "4")
        await save(pilot)
        assert instance.live("providerBreaker.local.degradationThreshold") == 1
        await type_into(pilot, pane, "providerBreaker.local.failureThreshold", "5")
        await save(pilot)
        assert instance.live("providerBreaker.local") == {
            "failureThreshold": 5,
            "degradationThreshold": 4,
            "resetTimeoutMs": 15000,
        }


# ---------------------------------------------------------------------------------------------
# Reset defaults and escape


async def test_on_every_card_reset_defaults_fills_the_draft_and_saves_only_on_ctrl_s(
    instance: Instance,
) -> None:
    changed = {first_int(card.id): other_valid(first_int(card.id)) for card in CARDS}
    for spec in CARDS:
        path = first_int(spec.id)
        await instance.runtime.patch_settings(nest({path: changed[path]}), spec.group)
    async with running(instance) as (pilot, pane, _):
        for card_id in CARD_IDS:
            path = first_int(card_id)
            card = pane.card(card_id)
            target = field_at(pane, path)
            assert isinstance(target, IntField)
            assert target.value == changed[path], path
            card.query_one(".reset-defaults", Button).press()
            await pilot.pause()
            assert target.value == field(path).default, path
            assert card.draft() == {p: get_path(defaults(), p) for p in card.fields}, card_id
            assert card.dirty and instance.live(path) == changed[path], path  # live unchanged until saved
            target.input.focus()
            await save(pilot)
            assert instance.live(path) == field(path).default, path
            assert not card.dirty, card_id
    assert instance.runtime.settings.document() == defaults()


async def test_on_every_card_escape_leaves_the_field_and_a_second_discards_the_draft(
    instance: Instance,
) -> None:
    async with running(instance) as (pilot, pane, _):
        for card_id in CARD_IDS:
            path = first_int(card_id)
            target = await type_into(pilot, pane, path, str(other_valid(path)))
            card = pane.card(card_id)
            assert card.dirty, card_id
            await pilot.press("escape")
            await pilot.pause()
            assert pilot.app.focused is target and card.dirty, card_id  # out of the input, draft kept
            await pilot.press("escape")
            await pilot.pause()
            assert target.value == field(path).default, card_id
            assert not card.dirty and target.message == "", card_id
            assert card.status.startswith("Draft discarded"), card_id
            assert instance.live(path) == field(path).default, card_id


async def test_escape_also_discards_a_reset_defaults_draft(instance: Instance) -> None:
    await instance.runtime.patch_settings({"sessionAffinity": {"ttlMs": 5000}}, "resilience")
    async with running(instance) as (pilot, pane, _):
        card = pane.card("session-affinity")
        card.query_one(".reset-defaults", Button).press()
        await pilot.pause()
        assert field_at(pane, "sessionAffinity.ttlMs").value == 0
        card.query_one(".reset-defaults", Button).focus()
        await pilot.press("escape")
        await pilot.pause()
        assert field_at(pane, "sessionAffinity.ttlMs").value == 5000
        assert instance.live("sessionAffinity.ttlMs") == 5000


# ---------------------------------------------------------------------------------------------
# The error-code list


async def test_error_codes_are_added_and_removed_then_saved(instance: Instance) -> None:
    async with running(instance, size=(80, 40)) as (pilot, pane, _):
        codes = field_at(pane, "modelLockout.errorCodes")
        assert isinstance(codes, CodeListField)
        assert codes.value == [403, 404, 429, 502, 503, 504]
        codes.code_input.focus()
        await pilot.press("4", "1", "8", "enter")
        await pilot.pause()
        assert codes.value == [403, 404, 429, 502, 503, 504, 418]
        assert codes.code_input.value == ""
        await pilot.press("7", "0", "0")
        await pilot.click(codes.query_one(".add", Button))
        await pilot.pause()
        assert codes.message == "not added: each code must be an integer between 100 and 599"
        assert 700 not in codes.value
        codes.code_input.focus()
        codes.code_input.clear()
        await pilot.press("4", ".", "2")  # not 42, silently: no code at all
        assert codes.code_input.value == "4.2"
        await pilot.press("enter")
        await pilot.pause()
        assert codes.message == "not added: each code must be an integer between 100 and 599"
        assert codes.value == [403, 404, 429, 502, 503, 504, 418]
        codes.code_input.value = "429"
        await pilot.click(codes.query_one(".add", Button))
        await pilot.pause()
        assert codes.message == "429 is already in the list"
        codes.codes_list.focus()
        codes.codes_list.highlighted = 1  # 404
        await pilot.press("delete")
        await pilot.pause()
        assert codes.value == [403, 429, 502, 503, 504, 418]
        codes.codes_list.highlighted = 0
        await pilot.click(codes.query_one(".remove", Button))
        await pilot.pause()
        assert codes.value == [429, 502, 503, 504, 418]
        assert pane.card("model-lockout").dirty
        codes.codes_list.focus()
        await save(pilot)
        assert instance.live("modelLockout.errorCodes") == [429, 502, 503, 504, 418]
    stored = instance.persisted()
    assert stored is not None and stored["modelLockout"]["errorCodes"] == [429, 502, 503, 504, 418]


async def test_an_emptied_code_list_saves_as_the_defaults(instance: Instance) -> None:
    await instance.runtime.patch_settings({"modelLockout": {"errorCodes": [404]}}, "settings")
    async with running(instance, size=(80, 40)) as (pilot, pane, _):
        codes = field_at(pane, "modelLockout.errorCodes")
        assert isinstance(codes, CodeListField) and codes.value == [404]
        codes.codes_list.focus()
        await pilot.press("delete")
        await pilot.pause()
        assert codes.value == [] and codes.message == "no codes: saving uses the defaults"
        await save(pilot)
        assert instance.live("modelLockout.errorCodes") == [403, 404, 429, 502, 503, 504]
        assert codes.value == [403, 404, 429, 502, 503, 504]


async def test_an_emptied_code_list_keeps_the_cards_buttons_inside_its_border(instance: Instance) -> None:
    # After an add, a save and every code deleted one by one, the empty list was counted a row
    # taller than it was drawn: the card ended a row early, its Save and Reset buttons under its
    # bottom border.
    async with running(instance) as (pilot, pane, _):
        card = pane.card("model-lockout")
        codes = field_at(pane, "modelLockout.errorCodes")
        assert isinstance(codes, CodeListField)
        codes.code_input.focus()
        await pilot.press("4", "1", "8", "enter")
        await save(pilot)
        codes.codes_list.focus()
        for _ in codes.value:
            await pilot.press("delete")
            await pilot.pause()
        assert codes.value == [] and codes.message == "no codes: saving uses the defaults"
        inside = card.region.shrink(card.styles.gutter)
        for button in card.query(".actions Button"):
            assert inside.contains_region(button.region), (button.label, button.region, inside)


async def test_the_code_list_holds_at_most_twenty_codes(instance: Instance) -> None:
    async with running(instance, size=(80, 40)) as (_, pane, _):
        codes = field_at(pane, "modelLockout.errorCodes")
        assert isinstance(codes, CodeListField)
        for code in range(520, 534):  # 6 defaults + 14
            assert codes.add_code(str(code))
        assert len(codes.value) == 20
        assert not codes.add_code("540")
        assert codes.message == "not added: at most 20 codes"


# ---------------------------------------------------------------------------------------------
# Following external changes; read-only


async def test_a_card_without_a_draft_follows_an_api_change(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        await instance.runtime.patch_settings(
            {"providerBreaker": {"oauth": {"resetTimeoutMs": 90000}}}, "resilience"
        )
        await pilot.pause()
        assert field_at(pane, "providerBreaker.oauth.resetTimeoutMs").value == 90000
        assert not pane.card("resilience").dirty


async def test_a_card_with_a_draft_keeps_it_when_the_api_changes_the_settings(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        draft = await type_into(pilot, pane, "requestQueue.requestsPerMinute", "300")
        await instance.runtime.patch_settings({"requestQueue": {"maxQueueDepth": 9}}, "resilience")
        await pilot.pause()
        card = pane.card("request-queue")
        assert draft.value == 300
        assert field_at(pane, "requestQueue.maxQueueDepth").value == 0  # the draft is kept whole
        assert "Changed elsewhere meanwhile" in card.status and "requestQueue.maxQueueDepth" in card.status
        await pilot.press("escape", "escape")  # leave the field, then discard the draft
        await pilot.pause()
        assert field_at(pane, "requestQueue.maxQueueDepth").value == 9
        assert draft.value == 100


async def test_saving_a_card_never_writes_back_what_changed_elsewhere(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        card = pane.card("model-lockout")
        await type_into(pilot, pane, "modelLockout.baseCooldownMs", "60000")
        # meanwhile, `omniroute settings set modelLockout.maxCooldownMs 900000` from another terminal
        await instance.runtime.patch_settings({"modelLockout": {"maxCooldownMs": 900000}}, "settings")
        await pilot.pause()
        other = field_at(pane, "modelLockout.maxCooldownMs")
        assert "changed elsewhere to 900000" in other.message
        assert "modelLockout.maxCooldownMs" in card.status
        card.action_save()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert instance.live("modelLockout.baseCooldownMs") == 60000
        assert instance.live("modelLockout.maxCooldownMs") == 900000  # not written back
        assert other.value == 900000 and not card.dirty


async def test_a_field_edited_here_and_changed_elsewhere_is_saved_only_when_asked_twice(
    instance: Instance,
) -> None:
    """The status line promised that a change made elsewhere is "not overwritten by a save", and
    ctrl+s then wrote the operator's value over it when they had edited the same field: the first
    save now names the conflict and changes nothing; a second one writes the operator's value."""
    async with running(instance) as (pilot, pane, _):
        card = pane.card("model-lockout")
        await type_into(pilot, pane, "modelLockout.baseCooldownMs", "60000")
        await instance.runtime.patch_settings({"modelLockout": {"baseCooldownMs": 90000}}, "settings")
        await pilot.pause()
        assert "not overwritten" not in card.status
        assert "modelLockout.baseCooldownMs" in card.status
        card.action_save()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert "Not saved" in card.status and "ctrl+s again" in card.status
        assert instance.live("modelLockout.baseCooldownMs") == 90000
        card.action_save()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert instance.live("modelLockout.baseCooldownMs") == 60000
        assert not card.dirty


async def test_the_changed_elsewhere_warning_stays_after_a_rejected_save(instance: Instance) -> None:
    async with running(instance) as (pilot, pane, _):
        card = pane.card("model-lockout")
        await type_into(pilot, pane, "modelLockout.baseCooldownMs", "600000")  # > maxCooldownMs below
        await instance.runtime.patch_settings({"modelLockout": {"maxCooldownMs": 300000}}, "settings")
        await pilot.pause()
        card.action_save()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert "Not saved" in card.status
        assert "modelLockout.maxCooldownMs" in card.status  # the reason is still named
        assert instance.live("modelLockout.baseCooldownMs") == 120000


async def test_read_only_disables_every_field_and_says_why(instance: Instance) -> None:
    async with running(instance, read_only=True) as (pilot, pane, messages):
        assert "--read-only" in str(pane.query_one(".read-only-banner").render())
        for card in pane.cards:
            assert "--read-only" in card.status
            assert all(widget.disabled for widget in card.fields.values())
            assert all(button.is_disabled for button in card.query(Button))
        assert all(i.is_disabled for i in pane.query(Input))
        await pilot.press("tab", "1", "ctrl+s")
        assert pilot.app.focused is pane  # nothing in a card can take focus; the pane still scrolls
        await pilot.pause()
        pane.card("request-queue").action_save()
        await pilot.app.workers.wait_for_complete()
        assert not saved(messages)
        assert instance.runtime.settings.document() == defaults()
    assert instance.persisted() is None
