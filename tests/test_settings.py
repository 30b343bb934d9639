"""Settings: the schema, strict atomic PATCH (acceptance case 33), typed views, env overrides."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.resilience.breaker import BreakerPolicy
from proxy.resilience.clock import FakeClock
from proxy.resilience.cooldown import CooldownPolicy
from proxy.resilience.errors import FieldError, SettingsError
from proxy.resilience.events import Event
from proxy.resilience.limiter import QueueSettings
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.watchdog import WatchdogSettings
from proxy.settings import (
    SCHEMA,
    SECTIONS,
    ComboWaitSettings,
    QuotaShareSettings,
    Settings,
    StaleSettingsChange,
    apply_env_overrides,
    defaults,
    field,
)

START = 1_767_225_600_000.0  # FakeClock's default

EXPECTED_DEFAULTS: dict[str, Any] = {
    "requestQueue": {
        "autoEnableApiKeyProviders": True,
        "requestsPerMinute": 100,
        "minTimeBetweenRequestsMs": 200,
        "concurrentRequests": 10,
        "maxWaitMs": 15000,
        "maxQueueDepth": 0,
    },
    "connectionCooldown": {
        "oauth": {"baseCooldownMs": 5000, "maxBackoffSteps": 8, "useUpstreamRetryHints": False},
        "apikey": {"baseCooldownMs": 3000, "maxBackoffSteps": 5, "useUpstreamRetryHints": True},
        "local": {"baseCooldownMs": 2000, "maxBackoffSteps": 3, "useUpstreamRetryHints": False},
    },
    "providerBreaker": {
        "oauth": {"failureThreshold": 8, "degradationThreshold": 5, "resetTimeoutMs": 60000},
        "apikey": {"failureThreshold": 12, "degradationThreshold": 7, "resetTimeoutMs": 30000},
        "local": {"failureThreshold": 2, "degradationThreshold": 1, "resetTimeoutMs": 15000},
    },
    "comboCooldownWait": {"enabled": True, "maxWaitMs": 90000, "maxAttempts": 5, "budgetMs": 300000},
    "quotaShareConcurrencyLimit": {"enabled": True, "queueDepth": 20, "queueTimeoutMs": 30000},
    "streamRecovery": {
        "throughputWatchdog": {
            "enabled": False,
            "warmupMs": 30000,
            "windowMs": 30000,
            "minUsefulBytesPerSecond": 4,
            "minUsefulBytes": 1,
        }
    },
    "sessionAffinity": {"ttlMs": 0},
    "modelLockout": {
        "enabled": False,
        "errorCodes": [403, 404, 429, 502, 503, 504],
        "baseCooldownMs": 120000,
        "maxCooldownMs": 1800000,
        "maxBackoffSteps": 10,
        "useExponentialBackoff": True,
    },
}

# (path, min, max) of every integer field, as docs/resilience.md writes them.
INT_RANGES: list[tuple[str, int, int]] = [
    ("requestQueue.requestsPerMinute", 1, 1_000_000),
    ("requestQueue.minTimeBetweenRequestsMs", 0, 3_600_000),
    ("requestQueue.concurrentRequests", 1, 10_000),
    ("requestQueue.maxWaitMs", 1, 30000),
    ("requestQueue.maxQueueDepth", 0, 100_000),
    *[(f"connectionCooldown.{c}.baseCooldownMs", 0, 86_400_000) for c in ("oauth", "apikey", "local")],
    *[(f"connectionCooldown.{c}.maxBackoffSteps", 0, 32) for c in ("oauth", "apikey", "local")],
    *[(f"providerBreaker.{c}.failureThreshold", 1, 1000) for c in ("oauth", "apikey", "local")],
    *[(f"providerBreaker.{c}.degradationThreshold", 1, 1000) for c in ("oauth", "apikey", "local")],
    *[(f"providerBreaker.{c}.resetTimeoutMs", 1000, 86_400_000) for c in ("oauth", "apikey", "local")],
    ("comboCooldownWait.maxWaitMs", 0, 300000),
    ("comboCooldownWait.maxAttempts", 0, 10),
    ("comboCooldownWait.budgetMs", 0, 300000),
    ("quotaShareConcurrencyLimit.queueDepth", 0, 100),
    ("quotaShareConcurrencyLimit.queueTimeoutMs", 0, 600000),
    ("streamRecovery.throughputWatchdog.warmupMs", 0, 600000),
    ("streamRecovery.throughputWatchdog.windowMs", 1000, 600000),
    ("streamRecovery.throughputWatchdog.minUsefulBytesPerSecond", 1, 1_000_000),
    ("streamRecovery.throughputWatchdog.minUsefulBytes", 1, 1_000_000),
    ("sessionAffinity.ttlMs", 0, 86_400_000),
    ("modelLockout.baseCooldownMs", 5000, 600000),
    ("modelLockout.maxCooldownMs", 5000, 3_600_000),
    ("modelLockout.maxBackoffSteps", 0, 20),
]
BOOL_PATHS = [
    "requestQueue.autoEnableApiKeyProviders",
    *[f"connectionCooldown.{c}.useUpstreamRetryHints" for c in ("oauth", "apikey", "local")],
    "comboCooldownWait.enabled",
    "quotaShareConcurrencyLimit.enabled",
    "streamRecovery.throughputWatchdog.enabled",
    "modelLockout.enabled",
    "modelLockout.useExponentialBackoff",
]


def nested(path: str, value: object) -> dict[str, Any]:
    """`nested("a.b.c", 1)` -> `{"a": {"b": {"c": 1}}}`: a PATCH body touching one field."""
    *parents, leaf = path.split(".")
    body: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        body = {part: body}
    return body


def group_of(path: str) -> str:
    return "settings" if path.startswith("modelLockout.") else "resilience"


def make(events: list[Event] | None = None) -> Settings:
    sink = events if events is not None else []
    return Settings(clock=FakeClock(), emit=sink.append)


# -- schema and defaults --------------------------------------------------------------------------


def test_every_default_is_present_and_equal_to_the_spec() -> None:
    assert defaults() == EXPECTED_DEFAULTS
    assert make().document() == EXPECTED_DEFAULTS


def test_schema_covers_every_leaf_once_with_its_range() -> None:
    assert len(SCHEMA) == 43
    assert len({spec.path for spec in SCHEMA}) == 43
    assert sorted((s.path, s.min, s.max) for s in SCHEMA if s.kind == "int") == sorted(INT_RANGES)
    assert sorted(s.path for s in SCHEMA if s.kind == "bool") == sorted(BOOL_PATHS)
    errors = field("modelLockout.errorCodes")
    assert (errors.kind, errors.min, errors.max) == ("int_list", 100, 599)
    assert all(spec.help for spec in SCHEMA)


def test_field_lookup_and_unknown_field() -> None:
    assert field("providerBreaker.apikey.failureThreshold").default == 12
    with pytest.raises(KeyError):
        field("providerBreaker.apikey.nope")


def test_defaults_is_a_fresh_copy() -> None:
    doc = defaults()
    doc["modelLockout"]["errorCodes"].append(999)
    doc["requestQueue"]["maxWaitMs"] = 1
    assert defaults() == EXPECTED_DEFAULTS


def test_groups_serve_their_sections() -> None:
    settings = make()
    assert SECTIONS["settings"] == ("modelLockout",)
    assert list(settings.document("settings")) == ["modelLockout"]
    assert list(settings.document("resilience")) == [
        "requestQueue",
        "connectionCooldown",
        "providerBreaker",
        "comboCooldownWait",
        "quotaShareConcurrencyLimit",
        "streamRecovery",
        "sessionAffinity",
    ]
    with pytest.raises(ValueError, match="unknown settings group 'nope'"):
        settings.document("nope")


def test_document_is_a_deep_copy() -> None:
    settings = make()
    doc = settings.document()
    doc["providerBreaker"]["apikey"]["failureThreshold"] = 99
    doc["modelLockout"]["errorCodes"].clear()
    assert settings.document() == EXPECTED_DEFAULTS


# -- case 33 and strictness -----------------------------------------------------------------------


def test_case_33_one_invalid_field_rejects_the_whole_patch() -> None:
    events: list[Event] = []
    settings = make(events)
    calls: list[Settings] = []
    settings.add_listener(calls.append)
    before = settings.document()
    patch = {
        "providerBreaker": {"apikey": {"failureThreshold": 20, "resetTimeoutMs": 500}},
        "requestQueue": {"maxQueueDepth": 50},
    }
    with pytest.raises(SettingsError) as caught:
        settings.patch(patch, "resilience")
    assert caught.value.fields == [
        FieldError("providerBreaker.apikey.resetTimeoutMs", "must be an integer between 1000 and 86400000")
    ]
    assert settings.document() == before
    assert settings.breaker_policy("apikey") == BreakerPolicy(7, 12, 30000)
    assert events == []
    assert calls == []


def test_validate_changes_nothing_and_returns_the_merged_document() -> None:
    events: list[Event] = []
    settings = make(events)
    merged, errors = settings.validate({"sessionAffinity": {"ttlMs": 60000}}, "resilience")
    assert errors == []
    assert merged["sessionAffinity"] == {"ttlMs": 60000}
    assert merged["modelLockout"] == EXPECTED_DEFAULTS["modelLockout"]
    assert settings.session_ttl_ms() == 0
    assert events == []


@pytest.mark.parametrize(
    ("patch", "group", "field_path"),
    [
        ({"nope": {}}, "resilience", "nope"),
        ({"modelLockout": {"enabled": True}}, "resilience", "modelLockout"),  # the other group's section
        ({"providerBreaker": {"apikey": {"enabled": True}}}, "resilience", "providerBreaker.apikey.enabled"),
        ({"providerBreaker": {"vertex": {}}}, "resilience", "providerBreaker.vertex"),
        ({"requestQueue": {"maxwaitms": 100}}, "resilience", "requestQueue.maxwaitms"),
        ({"modelLockout": {"errorCode": [404]}}, "settings", "modelLockout.errorCode"),
        ({"requestQueue": {}}, "settings", "requestQueue"),
    ],
)
def test_unknown_section_or_key_is_rejected(patch: dict[str, Any], group: str, field_path: str) -> None:
    settings = make()
    with pytest.raises(SettingsError) as caught:
        settings.patch(patch, group)
    assert caught.value.fields == [FieldError(field_path, "unknown key")]
    assert settings.document() == EXPECTED_DEFAULTS


def test_a_section_that_is_not_an_object_is_rejected() -> None:
    _, errors = make().validate({"providerBreaker": {"apikey": 12}, "sessionAffinity": []}, "resilience")
    assert errors == [
        FieldError("providerBreaker.apikey", "must be an object"),
        FieldError("sessionAffinity", "must be an object"),
    ]


def test_a_patch_that_is_not_an_object_is_rejected() -> None:
    _, errors = make().validate([1, 2], "resilience")  # type: ignore[arg-type]
    assert errors == [FieldError("", "must be an object")]


@pytest.mark.parametrize("value", [True, False, "5", 5.0, 1.5, None, [5], {"v": 5}])
def test_an_int_field_takes_only_ints(value: object) -> None:
    _, errors = make().validate({"providerBreaker": {"local": {"failureThreshold": value}}}, "resilience")
    assert errors == [
        FieldError("providerBreaker.local.failureThreshold", "must be an integer between 1 and 1000")
    ]


@pytest.mark.parametrize("value", [1, 0, "true", "false", None, 1.0, [True]])
def test_a_bool_field_takes_only_bools(value: object) -> None:
    _, errors = make().validate({"modelLockout": {"enabled": value}}, "settings")
    assert errors == [FieldError("modelLockout.enabled", "must be true or false")]


@pytest.mark.parametrize(("path", "low", "high"), INT_RANGES)
def test_each_int_bound_is_inclusive_and_one_past_it_is_rejected(path: str, low: int, high: int) -> None:
    settings = make()
    group = group_of(path)
    message = f"must be an integer between {low} and {high}"
    for bad in (low - 1, high + 1):
        _, errors = settings.validate(nested(path, bad), group)
        assert FieldError(path, message) in errors, bad
    for good in (low, high):
        _, errors = settings.validate(nested(path, good), group)
        # A bound may still break a cross-field rule (degradation 1000 vs failure 12), never its range.
        assert FieldError(path, message) not in errors, good
        assert all(e.message.startswith("must be") and "integer between" not in e.message for e in errors)


@pytest.mark.parametrize("path", BOOL_PATHS)
def test_every_bool_field_flips(path: str) -> None:
    settings = make()
    flipped = not field(path).default
    settings.patch(nested(path, flipped), group_of(path))
    node: Any = settings.document()
    for part in path.split("."):
        node = node[part]
    assert node is flipped


# -- cross-field rules ----------------------------------------------------------------------------


def test_degradation_must_stay_below_failure() -> None:
    settings = make()
    _, errors = settings.validate({"providerBreaker": {"apikey": {"degradationThreshold": 12}}}, "resilience")
    assert errors == [
        FieldError("providerBreaker.apikey.degradationThreshold", "must be lower than failureThreshold (12)")
    ]
    _, errors = settings.validate({"providerBreaker": {"apikey": {"degradationThreshold": 11}}}, "resilience")
    assert errors == []


def test_cross_field_rules_use_the_merged_document() -> None:
    settings = make()
    # Only failureThreshold changes, below the stored degradationThreshold (7): blamed on what changed.
    with pytest.raises(SettingsError) as caught:
        settings.patch({"providerBreaker": {"apikey": {"failureThreshold": 7}}}, "resilience")
    assert caught.value.fields == [
        FieldError("providerBreaker.apikey.failureThreshold", "must be greater than degradationThreshold (7)")
    ]
    # Both move together: fine, although each alone would break the rule.
    settings.patch(
        {"providerBreaker": {"local": {"failureThreshold": 40, "degradationThreshold": 30}}}, "resilience"
    )
    assert settings.breaker_policy("local") == BreakerPolicy(30, 40, 15000)
    # The other classes keep their own thresholds.
    assert settings.breaker_policy("oauth") == BreakerPolicy(5, 8, 60000)


def test_max_cooldown_must_be_at_least_base_cooldown() -> None:
    settings = make()
    _, errors = settings.validate({"modelLockout": {"maxCooldownMs": 60000}}, "settings")
    assert errors == [FieldError("modelLockout.maxCooldownMs", "must be at least baseCooldownMs (120000)")]
    _, errors = settings.validate(
        {"modelLockout": {"baseCooldownMs": 600000, "maxCooldownMs": 300000}}, "settings"
    )
    assert errors == [FieldError("modelLockout.baseCooldownMs", "must be at most maxCooldownMs (300000)")]
    _, errors = settings.validate({"modelLockout": {"maxCooldownMs": 120000}}, "settings")
    assert errors == []  # equal is allowed


def test_combo_budget_must_cover_one_wait_unless_either_is_zero() -> None:
    settings = make()
    _, errors = settings.validate({"comboCooldownWait": {"budgetMs": 60000}}, "resilience")
    assert errors == [FieldError("comboCooldownWait.budgetMs", "must be at least maxWaitMs (90000), or 0")]
    for ok in ({"budgetMs": 0}, {"budgetMs": 90000}, {"maxWaitMs": 0, "budgetMs": 1000}):
        _, errors = settings.validate({"comboCooldownWait": ok}, "resilience")
        assert errors == [], ok


def test_a_field_out_of_range_skips_its_cross_field_rule() -> None:
    _, errors = make().validate({"providerBreaker": {"oauth": {"failureThreshold": 0}}}, "resilience")
    assert errors == [
        FieldError("providerBreaker.oauth.failureThreshold", "must be an integer between 1 and 1000")
    ]


def test_several_bad_fields_are_all_listed() -> None:
    settings = make()
    patch = {
        "requestQueue": {"maxWaitMs": 30001, "concurrentRequests": "10", "surprise": 1},
        "connectionCooldown": {"local": {"useUpstreamRetryHints": 1}},
        "providerBreaker": {"oauth": {"degradationThreshold": 9}},
        "streamRecovery": {"throughputWatchdog": {"windowMs": 999}},
    }
    with pytest.raises(SettingsError) as caught:
        settings.patch(patch, "resilience")
    assert caught.value.fields == [
        FieldError("requestQueue.maxWaitMs", "must be an integer between 1 and 30000"),
        FieldError("requestQueue.concurrentRequests", "must be an integer between 1 and 10000"),
        FieldError("requestQueue.surprise", "unknown key"),
        FieldError("connectionCooldown.local.useUpstreamRetryHints", "must be true or false"),
        FieldError(
            "streamRecovery.throughputWatchdog.windowMs", "must be an integer between 1000 and 600000"
        ),
        FieldError("providerBreaker.oauth.degradationThreshold", "must be lower than failureThreshold (8)"),
    ]
    assert caught.value.fields[0].to_dict() == {
        "field": "requestQueue.maxWaitMs",
        "message": "must be an integer between 1 and 30000",
    }
    assert settings.document() == EXPECTED_DEFAULTS


# -- errorCodes -----------------------------------------------------------------------------------

CODES_MESSAGE = "must be a list of at most 20 integers between 100 and 599"


def test_error_codes_empty_list_is_stored_as_the_default() -> None:
    settings = make()
    settings.patch({"modelLockout": {"errorCodes": [429]}}, "settings")
    assert settings.lockout().error_codes == (429,)
    document = settings.patch({"modelLockout": {"errorCodes": []}}, "settings")
    assert document["modelLockout"]["errorCodes"] == [403, 404, 429, 502, 503, 504]
    assert settings.lockout().error_codes == (403, 404, 429, 502, 503, 504)


def test_error_codes_given_twice_are_kept_once_in_the_order_given() -> None:
    settings = make()
    document = settings.patch({"modelLockout": {"errorCodes": [429, 404, 429, 404, 404]}}, "settings")
    assert document["modelLockout"]["errorCodes"] == [429, 404]
    assert settings.lockout().error_codes == (429, 404)


def test_error_codes_accepts_up_to_20_items_within_100_599() -> None:
    settings = make()
    codes = [100, *range(500, 518), 599]
    assert len(codes) == 20
    settings.patch({"modelLockout": {"errorCodes": codes}}, "settings")
    assert settings.document("settings")["modelLockout"]["errorCodes"] == codes


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (list(range(500, 521)), CODES_MESSAGE + " (got 21 items)"),
        ([404, 99], CODES_MESSAGE + " (item 1 is 99)"),
        ([600], CODES_MESSAGE + " (item 0 is 600)"),
        ([404, "429"], CODES_MESSAGE + " (item 1 is '429')"),
        ([True], CODES_MESSAGE + " (item 0 is True)"),
        ([404.0], CODES_MESSAGE + " (item 0 is 404.0)"),
        (404, CODES_MESSAGE),
        ("404,429", CODES_MESSAGE),
        (None, CODES_MESSAGE),
    ],
)
def test_error_codes_rejects(value: object, message: str) -> None:
    settings = make()
    with pytest.raises(SettingsError) as caught:
        settings.patch({"modelLockout": {"errorCodes": value}}, "settings")
    assert caught.value.fields == [FieldError("modelLockout.errorCodes", message)]
    assert settings.lockout().error_codes == (403, 404, 429, 502, 503, 504)


# -- a good change ----------------------------------------------------------------------------------


def test_a_good_patch_deep_merges_one_value_and_emits_one_event_per_changed_leaf() -> None:
    events: list[Event] = []
    clock = FakeClock()
    settings = Settings(clock=clock, emit=events.append)
    calls: list[Settings] = []
    settings.add_listener(calls.append)
    clock.advance(1500)

    document = settings.patch({"providerBreaker": {"local": {"resetTimeoutMs": 1000}}}, "resilience")

    expected = {k: v for k, v in EXPECTED_DEFAULTS.items() if k != "modelLockout"}
    expected["providerBreaker"] = {
        **expected["providerBreaker"],
        "local": {**expected["providerBreaker"]["local"]},
    }
    expected["providerBreaker"]["local"]["resetTimeoutMs"] = 1000
    assert document == expected
    assert settings.document("settings") == {"modelLockout": EXPECTED_DEFAULTS["modelLockout"]}
    assert events == [
        Event(
            ts=START + 1500,
            layer="settings",
            key="providerBreaker.local.resetTimeoutMs",
            from_="15000",
            to="1000",
            reason="patch",
        )
    ]
    assert calls == [settings]


def test_events_list_each_changed_leaf_and_skip_unchanged_ones() -> None:
    events: list[Event] = []
    settings = make(events)
    settings.patch(
        {
            "modelLockout": {
                "enabled": True,
                "errorCodes": [404],
                "maxBackoffSteps": 10,  # the same value: no event
            }
        },
        "settings",
    )
    assert [(e.key, e.from_, e.to, e.reason) for e in events] == [
        ("modelLockout.enabled", "off", "on", "patch"),
        ("modelLockout.errorCodes", "403, 404, 429, 502, 503, 504", "404", "patch"),
    ]


def test_a_patch_that_changes_nothing_emits_nothing_and_notifies_nobody() -> None:
    events: list[Event] = []
    settings = make(events)
    calls: list[Settings] = []
    settings.add_listener(calls.append)
    settings.patch({"requestQueue": {"maxWaitMs": 15000}}, "resilience")
    settings.patch({}, "resilience")
    assert events == []
    assert calls == []


def test_every_listener_runs_even_if_one_raises() -> None:
    settings = make()
    seen: list[int] = []

    def broken(_: Settings) -> None:
        raise RuntimeError("listener bug")

    settings.add_listener(broken)
    settings.add_listener(lambda s: seen.append(s.session_ttl_ms()))
    with pytest.raises(RuntimeError, match="listener bug"):
        settings.patch({"sessionAffinity": {"ttlMs": 5000}}, "resilience")
    assert seen == [5000]
    assert settings.session_ttl_ms() == 5000  # the change itself was valid and is live


# -- reset_section --------------------------------------------------------------------------------


def test_a_prepared_change_is_not_live_until_committed() -> None:
    events: list[Event] = []
    settings = make(events)
    change = settings.prepare({"sessionAffinity": {"ttlMs": 5000}}, "resilience")

    assert change.changed == ("sessionAffinity.ttlMs",)
    assert change.document["sessionAffinity"] == {"ttlMs": 5000}
    assert settings.session_ttl_ms() == 0 and events == []

    assert settings.commit(change)["sessionAffinity"] == {"ttlMs": 5000}
    assert settings.session_ttl_ms() == 5000
    assert [(e.key, e.to) for e in events] == [("sessionAffinity.ttlMs", "5000")]


def test_a_change_prepared_on_an_older_version_is_refused_not_applied() -> None:
    """Committing it would silently undo the change that went live in between."""
    settings = make()
    stale = settings.prepare({"sessionAffinity": {"ttlMs": 5000}}, "resilience")
    settings.patch({"requestQueue": {"maxQueueDepth": 3}}, "resilience")

    with pytest.raises(StaleSettingsChange):
        settings.commit(stale)

    assert settings.session_ttl_ms() == 0
    assert settings.queue().max_queue_depth == 3


def test_prepare_rejects_like_patch() -> None:
    settings = make()
    with pytest.raises(SettingsError):
        settings.prepare({"sessionAffinity": {"ttlMs": -1}}, "resilience")
    with pytest.raises(KeyError):
        settings.prepare_reset("nope")


def test_reset_section_brings_the_defaults_back_with_events() -> None:
    events: list[Event] = []
    settings = make(events)
    settings.patch(
        {"providerBreaker": {"apikey": {"failureThreshold": 20}, "oauth": {"resetTimeoutMs": 5000}}},
        "resilience",
    )
    settings.patch({"requestQueue": {"maxQueueDepth": 3}}, "resilience")
    events.clear()

    document = settings.reset_section("providerBreaker")

    assert document["providerBreaker"] == EXPECTED_DEFAULTS["providerBreaker"]
    assert document["requestQueue"]["maxQueueDepth"] == 3  # other sections untouched
    assert [(e.key, e.from_, e.to, e.reason) for e in events] == [
        ("providerBreaker.oauth.resetTimeoutMs", "5000", "60000", "reset"),
        ("providerBreaker.apikey.failureThreshold", "20", "12", "reset"),
    ]


def test_reset_a_subsection_and_the_settings_group() -> None:
    settings = make()
    settings.patch(
        {"connectionCooldown": {"apikey": {"maxBackoffSteps": 9}, "local": {"maxBackoffSteps": 9}}},
        "resilience",
    )
    settings.patch({"modelLockout": {"enabled": True, "baseCooldownMs": 5000}}, "settings")

    settings.reset_section("connectionCooldown.apikey")
    assert settings.cooldown_policy("apikey") == CooldownPolicy(3000, 5, True)
    assert settings.cooldown_policy("local") == CooldownPolicy(2000, 9, False)

    assert settings.reset_section("modelLockout") == {"modelLockout": EXPECTED_DEFAULTS["modelLockout"]}
    assert settings.lockout() == LockoutSettings()


@pytest.mark.parametrize("section", ["nope", "providerBreaker.vertex", "sessionAffinity.ttlMs", ""])
def test_reset_an_unknown_section_raises_key_error(section: str) -> None:
    with pytest.raises(KeyError):
        make().reset_section(section)


# -- typed views ----------------------------------------------------------------------------------


def test_typed_views_match_the_defaults() -> None:
    settings = make()
    assert settings.breaker_policy("oauth") == BreakerPolicy(5, 8, 60000)
    assert settings.breaker_policy("apikey") == BreakerPolicy(7, 12, 30000)
    assert settings.breaker_policy("local") == BreakerPolicy(1, 2, 15000)
    assert settings.cooldown_policy("oauth") == CooldownPolicy(5000, 8, False)
    assert settings.cooldown_policy("apikey") == CooldownPolicy(3000, 5, True)
    assert settings.cooldown_policy("local") == CooldownPolicy(2000, 3, False)
    assert settings.lockout() == LockoutSettings(
        False, (403, 404, 429, 502, 503, 504), 120000, 1800000, 10, True
    )
    assert settings.queue() == QueueSettings(True, 100, 200, 10, 15000, 0)
    assert settings.watchdog() == WatchdogSettings(False, 30000, 30000, 4, 1)
    assert settings.combo_wait() == ComboWaitSettings(True, 90000, 5, 300000)
    assert settings.quota_share() == QuotaShareSettings(True, 20, 30000)
    assert settings.session_ttl_ms() == 0


def test_typed_views_are_cached_until_a_change_and_then_reflect_it() -> None:
    settings = make()
    first = settings.queue()
    assert settings.queue() is first
    settings.patch({"requestQueue": {"maxQueueDepth": 2, "concurrentRequests": 1}}, "resilience")
    assert settings.queue() is not first
    assert settings.queue() == QueueSettings(True, 100, 200, 1, 15000, 2)
    settings.patch(
        {"streamRecovery": {"throughputWatchdog": {"enabled": True, "warmupMs": 1000}}}, "resilience"
    )
    assert settings.watchdog() == WatchdogSettings(True, 1000, 30000, 4, 1)
    settings.patch(
        {"quotaShareConcurrencyLimit": {"queueDepth": 0}, "sessionAffinity": {"ttlMs": 60000}}, "resilience"
    )
    assert settings.quota_share() == QuotaShareSettings(True, 0, 30000)
    assert settings.session_ttl_ms() == 60000


@pytest.mark.parametrize(
    ("patch", "active"),
    [
        ({}, True),
        ({"enabled": False}, False),
        ({"maxWaitMs": 0}, False),
        ({"maxAttempts": 0}, False),
        ({"budgetMs": 0}, True),  # the budget at 0 waives the budget rule; the per-wait limits still hold
    ],
)
def test_combo_wait_active(patch: dict[str, Any], active: bool) -> None:
    settings = make()
    settings.patch({"comboCooldownWait": patch}, "resilience")
    assert settings.combo_wait().active is active


# -- construction from a stored document ----------------------------------------------------------


def test_a_stored_document_fills_missing_keys_with_defaults() -> None:
    settings = Settings(
        {"providerBreaker": {"apikey": {"failureThreshold": 30}}, "modelLockout": {"enabled": True}}
    )
    assert settings.breaker_policy("apikey") == BreakerPolicy(7, 30, 30000)
    assert settings.lockout().enabled is True
    assert settings.document()["requestQueue"] == EXPECTED_DEFAULTS["requestQueue"]


def test_a_stored_document_round_trips() -> None:
    original = make()
    original.patch({"sessionAffinity": {"ttlMs": 1234}}, "resilience")
    original.patch({"modelLockout": {"errorCodes": [404]}}, "settings")
    assert Settings(original.document()).document() == original.document()


def test_an_invalid_stored_document_raises() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings({"providerBreaker": {"local": {"failureThreshold": 1}}, "legacy": True})
    assert caught.value.fields == [
        FieldError("legacy", "unknown key"),
        FieldError("providerBreaker.local.failureThreshold", "must be greater than degradationThreshold (1)"),
    ]


# -- environment overrides ------------------------------------------------------------------------


def test_env_overrides_win_over_the_stored_document() -> None:
    stored = {"requestQueue": {"maxWaitMs": 2000}}
    env = {
        "RATE_LIMIT_MAX_WAIT_MS": "25000",
        "RATE_LIMIT_MAX_QUEUE_DEPTH": " 40 ",
        "STREAM_THROUGHPUT_WATCHDOG_ENABLED": "TRUE",
        "UNRELATED": "x",
    }
    doc, warnings = apply_env_overrides(stored, env)
    assert warnings == []
    assert doc == {
        "requestQueue": {"maxWaitMs": 25000, "maxQueueDepth": 40},
        "streamRecovery": {"throughputWatchdog": {"enabled": True}},
    }
    assert stored == {"requestQueue": {"maxWaitMs": 2000}}  # the input is not modified
    settings = Settings(doc)
    assert settings.queue().max_wait_ms == 25000
    assert settings.queue().max_queue_depth == 40
    assert settings.watchdog().enabled is True


def test_env_false_turns_the_watchdog_off() -> None:
    doc, warnings = apply_env_overrides(
        {"streamRecovery": {"throughputWatchdog": {"enabled": True}}},
        {"STREAM_THROUGHPUT_WATCHDOG_ENABLED": "false"},
    )
    assert warnings == []
    assert doc == {"streamRecovery": {"throughputWatchdog": {"enabled": False}}}


def test_invalid_env_values_are_ignored_with_a_warning() -> None:
    env = {
        "RATE_LIMIT_MAX_WAIT_MS": "15s",
        "RATE_LIMIT_MAX_QUEUE_DEPTH": "100001",
        "STREAM_THROUGHPUT_WATCHDOG_ENABLED": "maybe",
    }
    doc, warnings = apply_env_overrides(defaults(), env)
    assert doc == EXPECTED_DEFAULTS
    assert warnings == [
        "ignoring RATE_LIMIT_MAX_WAIT_MS='15s': requestQueue.maxWaitMs:"
        " must be an integer between 1 and 30000 (got '15s')",
        "ignoring RATE_LIMIT_MAX_QUEUE_DEPTH='100001': requestQueue.maxQueueDepth:"
        " must be an integer between 0 and 100000",
        "ignoring STREAM_THROUGHPUT_WATCHDOG_ENABLED='maybe': streamRecovery.throughputWatchdog.enabled:"
        " must be true or false (got 'maybe')",
    ]


@pytest.mark.parametrize("value", ["", "   ", "1.5", "-1", "1e3", "0x10"])
def test_env_values_that_are_not_plain_decimal_ints_are_ignored(value: str) -> None:
    doc, warnings = apply_env_overrides({}, {"RATE_LIMIT_MAX_QUEUE_DEPTH": value})
    assert doc == {}
    assert len(warnings) == (0 if not value.strip() else 1)


# -- parsing typed text (CLI `settings set`) ------------------------------------------------------


def test_field_parse_reads_cli_text() -> None:
    assert field("providerBreaker.apikey.failureThreshold").parse("20") == 20
    assert field("modelLockout.enabled").parse("on") is True
    assert field("modelLockout.errorCodes").parse("404, 429") == [404, 429]
    assert field("modelLockout.errorCodes").parse("") == [403, 404, 429, 502, 503, 504]
    with pytest.raises(
        ValueError, match=r"^providerBreaker.apikey.failureThreshold: must be an integer between 1"
    ):
        field("providerBreaker.apikey.failureThreshold").parse("0")


@pytest.mark.parametrize("digits", [19, 5_000])
def test_a_number_no_range_holds_is_refused_with_the_range_not_pythons_words(digits: int) -> None:
    """Past 4,300 digits `int()` refused in its own words (`sys.set_int_max_str_digits`), naming
    neither the field nor its range, and the message quoted every digit (found by a trial)."""
    with pytest.raises(ValueError) as refused:
        field("requestQueue.maxWaitMs").parse("9" * digits)
    said = str(refused.value)
    assert said.startswith("requestQueue.maxWaitMs: must be an integer between 1 and 30000"), said
    assert "set_int_max_str_digits" not in said and len(said) < 400
    assert field("requestQueue.maxWaitMs").parse("0" * 30 + "5") == 5  # leading zeros are no size
