"""The live settings document: one declarative schema, strict atomic validation, typed views.

Every tunable of the resilience layers is one `FieldSpec` in `SCHEMA`, derived from one field of
the layer's policy dataclass (`BreakerPolicy`, `LockoutSettings`...), where its default, range and
help are written (`proxy/resilience/tunable.py`). Validation, the API, the TUI cards, the CLI help
and the docs' tables all read `SCHEMA`, so a default or a range is written down once. Wire names
are the fields' in camelCase (`providerBreaker.apikey.failureThreshold`), as in OmniRoute's API.

A change is strict and atomic: `Settings.patch()` deep-merges a partial document into a copy,
checks every touched field (type, range) and every cross-field rule on the *merged* result, and
either swaps the whole document in one assignment or raises `SettingsError` listing every bad
field and changes nothing. Readers never see a half-applied change.

A change that must survive a restart is split in two: `prepare()` validates and returns the merged
document without applying it, the caller writes that document to disk, and `commit()` makes it
live only then (refusing it if another change went live in between). `Runtime.patch_settings`
does this for the API and the console, one change at a time, so memory never runs ahead of disk.

Readers on the hot path use the typed views (`breaker_policy()`, `queue()`...): they are built
once per document version and cached, so calling them per request costs a dict lookup.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from proxy import untrusted
from proxy.resilience.breaker import DEFAULT_BREAKER_POLICIES, BreakerPolicy
from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.cooldown import DEFAULT_COOLDOWN_POLICIES, CooldownPolicy
from proxy.resilience.errors import FieldError, SettingsError
from proxy.resilience.events import Event
from proxy.resilience.limiter import QueueSettings
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.outcome import PROVIDER_CLASSES, ProviderClass
from proxy.resilience.tunable import HELP, MAX, MIN, is_tunable, tunable
from proxy.resilience.watchdog import WatchdogSettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ENV_OVERRIDES",
    "INT_LIST_MAX_ITEMS",
    "ORDER_RULES",
    "SCHEMA",
    "SECTIONS",
    "ComboWaitSettings",
    "FieldSpec",
    "OrderRule",
    "QuotaShareSettings",
    "SessionAffinitySettings",
    "Settings",
    "SettingsChange",
    "StaleSettingsChange",
    "apply_env_overrides",
    "defaults",
    "field",
]

Kind = Literal["bool", "int", "int_list"]

INT_LIST_MAX_ITEMS = 20
"""An `int_list` holds at most this many items; an empty list means (is stored as) the default."""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One leaf of the settings document. For `int_list`, `min`/`max` bound each item."""

    path: str
    kind: Kind
    default: object
    min: int | None
    max: int | None
    help: str

    @property
    def name(self) -> str:
        """The last path segment (`failureThreshold`), as shown in messages and card labels."""
        return self.path.rsplit(".", 1)[-1]

    def accepted(self) -> str:
        """What the field accepts, in the words every error message uses."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "int":
            return f"an integer between {self.min} and {self.max}"
        return f"a list of at most {INT_LIST_MAX_ITEMS} integers between {self.min} and {self.max}"

    def check(self, value: object) -> tuple[object, str | None]:
        """(normalised value, None) when valid, else (value, message naming the accepted range).

        JSON types are taken literally: `1` is not a bool, `true`, `1.5`, `5.0` and `"5"` are not ints.
        """
        if self.kind == "bool":
            return (value, None) if type(value) is bool else (value, "must be true or false")
        if self.kind == "int":
            if type(value) is int and _in_range(value, self.min, self.max):
                return value, None
            return value, f"must be {self.accepted()}"
        if not isinstance(value, list | tuple):
            return value, f"must be {self.accepted()}"
        if not value:  # the card's "no codes" means "the defaults", never "lock nothing ever"
            return list(self.default) if isinstance(self.default, tuple | list) else [], None
        if len(value) > INT_LIST_MAX_ITEMS:
            return value, f"must be {self.accepted()} (got {len(value)} items)"
        for index, item in enumerate(value):
            if type(item) is not int or not _in_range(item, self.min, self.max):
                return value, f"must be {self.accepted()} (item {index} is {untrusted.echo(repr(item))})"
        return list(value), None

    def parse(self, text: str) -> object:
        """Read a value typed on a command line or in an environment variable; ValueError if invalid.

        `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`) for bools, decimal digits for ints,
        comma-separated integers for lists (an empty string is the empty list, i.e. the default).
        """
        raw = text.strip()
        parsed: object
        if self.kind == "bool":
            lowered = raw.lower()
            if lowered in _TRUE_WORDS:
                parsed = True
            elif lowered in _FALSE_WORDS:
                parsed = False
            else:
                raise ValueError(f"{self.path}: must be true or false (got {text!r})")
        elif self.kind == "int":
            parsed = _parse_int(raw, self, text)
        else:
            parsed = [_parse_int(part.strip(), self, text) for part in raw.split(",")] if raw else []
        value, message = self.check(parsed)
        if message is not None:
            raise ValueError(f"{self.path}: {message}")
        return value


_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def _parse_int(raw: str, spec: FieldSpec, original: str) -> int:
    # Only plain decimal digits: int() would also take "1_000" and " +5", which no form field shows.
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isdecimal() or not digits.isascii():
        raise ValueError(f"{spec.path}: must be {spec.accepted()} (got {original!r})")
    return int(raw)


def _in_range(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


# ---------------------------------------------------------------------------------------------
# The policies of the sections no layer module owns (the others live with their layers).


@dataclass(frozen=True, slots=True)
class ComboWaitSettings:
    enabled: bool = dataclasses.field(
        default=True,
        metadata=tunable(
            help="Wait out short cooldowns instead of answering 429 when every target is cooling"
        ),
    )
    max_wait_ms: int = dataclasses.field(
        default=90_000,
        metadata=tunable(
            min=0, max=300_000, help="Longest single wait for a target to recover (0 = never wait)"
        ),
    )
    max_attempts: int = dataclasses.field(
        default=5, metadata=tunable(min=0, max=10, help="Waits per request before giving up (0 = never wait)")
    )
    budget_ms: int = dataclasses.field(
        default=300_000,
        metadata=tunable(
            min=0, max=300_000, help="Total waiting allowed per request (at least maxWaitMs; 0 = never wait)"
        ),
    )

    @property
    def active(self) -> bool:
        """Either limit at 0 turns waiting off, whatever `enabled` says."""
        return self.enabled and self.max_wait_ms > 0 and self.max_attempts > 0


@dataclass(frozen=True, slots=True)
class QuotaShareSettings:
    enabled: bool = dataclasses.field(
        default=True,
        metadata=tunable(help="Hold requests to a connection with max_concurrent to that many in flight"),
    )
    queue_depth: int = dataclasses.field(
        default=20,
        metadata=tunable(
            min=0,
            max=100,
            help="Requests waiting for a slot before the next one goes ahead without (fail-open)",
        ),
    )
    queue_timeout_ms: int = dataclasses.field(
        default=30_000,
        metadata=tunable(
            min=0, max=600_000, help="Longest wait for a slot before going ahead without one (fail-open)"
        ),
    )


@dataclass(frozen=True, slots=True)
class SessionAffinitySettings:
    ttl_ms: int = dataclasses.field(
        default=0,
        metadata=tunable(
            min=0, max=86_400_000, help="How long a client session stays pinned to one connection (0 = off)"
        ),
    )


# ---------------------------------------------------------------------------------------------
# The schema: one row per leaf, in the order the API returns them and the cards show them. Each
# row is derived from a field of a layer's policy dataclass (`proxy/resilience/tunable.py`): the
# default, the range and the help are written there, once; the wire name is the field's in camelCase.

_CLASS_LABEL: dict[ProviderClass, str] = {"oauth": "OAuth", "apikey": "API-key", "local": "local"}
_A_CLASS: dict[ProviderClass, str] = {"oauth": "an OAuth", "apikey": "an API-key", "local": "a local"}
"""The label with its article: "a" or "an" goes by the sound of the word, which no rule on letters gets right."""


_P = TypeVar("_P", bound="DataclassInstance")


@dataclass(frozen=True, slots=True)
class _PolicySection(Generic[_P]):
    """One section of the document and the policy dataclass it is read into."""

    prefix: str
    policy: type[_P]
    per_class: ProviderClass | None = None
    """For a policy whose defaults differ by provider class: whose defaults (`DEFAULT_..._POLICIES`)."""
    order: tuple[str, ...] | None = None
    """The fields in the order the API and the cards show them, when it is not the dataclass's own."""

    def fields(self) -> list[dataclasses.Field[Any]]:
        by_name = {f.name: f for f in dataclasses.fields(self.policy) if is_tunable(f)}
        return [by_name[name] for name in self.order] if self.order else list(by_name.values())

    def default(self, f: dataclasses.Field[Any]) -> object:
        if self.per_class is None:
            return f.default
        return getattr(_PER_CLASS_DEFAULTS[self.policy][self.per_class], f.name)

    def specs(self) -> list[FieldSpec]:
        specs = []
        for f in self.fields():
            default = self.default(f)
            help_text: str = f.metadata[HELP]
            if self.per_class is not None:
                help_text = help_text.format(who=_CLASS_LABEL[self.per_class], a_who=_A_CLASS[self.per_class])
            path = f"{self.prefix}.{_camel(f.name)}"
            specs.append(
                FieldSpec(path, _kind(default), default, f.metadata[MIN], f.metadata[MAX], help_text)
            )
        return specs

    def view(self, doc: Mapping[str, Any]) -> _P:
        """The section of a document as its policy dataclass (a list becomes a tuple: views are frozen)."""
        section = _get_section(doc, self.prefix)
        values = {f.name: section[_camel(f.name)] for f in self.fields()}
        return self.policy(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


_PER_CLASS_DEFAULTS: dict[type[Any], Mapping[ProviderClass, object]] = {
    BreakerPolicy: DEFAULT_BREAKER_POLICIES,
    CooldownPolicy: DEFAULT_COOLDOWN_POLICIES,
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _kind(default: object) -> Kind:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    assert isinstance(default, tuple), "a setting is a bool, an int or a tuple of ints"
    return "int_list"


def _get_section(doc: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    node: Any = doc
    for part in prefix.split("."):
        node = node[part]
    return cast(Mapping[str, Any], node)


# The breaker's dataclass keeps its positional order (degradation first), while the card and the API
# read "opens at" before "degraded at".
_BREAKER_ORDER = ("failure_threshold", "degradation_threshold", "reset_timeout_ms")

_QUEUE = _PolicySection("requestQueue", QueueSettings)
_COOLDOWN = {c: _PolicySection(f"connectionCooldown.{c}", CooldownPolicy, c) for c in PROVIDER_CLASSES}
_BREAKER = {
    c: _PolicySection(f"providerBreaker.{c}", BreakerPolicy, c, _BREAKER_ORDER) for c in PROVIDER_CLASSES
}
_COMBO_WAIT = _PolicySection("comboCooldownWait", ComboWaitSettings)
_QUOTA_SHARE = _PolicySection("quotaShareConcurrencyLimit", QuotaShareSettings)
_WATCHDOG = _PolicySection("streamRecovery.throughputWatchdog", WatchdogSettings)
_SESSION_AFFINITY = _PolicySection("sessionAffinity", SessionAffinitySettings)
_LOCKOUT = _PolicySection("modelLockout", LockoutSettings)

_POLICY_SECTIONS: tuple[_PolicySection[Any], ...] = (
    _QUEUE,
    *_COOLDOWN.values(),
    *_BREAKER.values(),
    _COMBO_WAIT,
    _QUOTA_SHARE,
    _WATCHDOG,
    _SESSION_AFFINITY,
    _LOCKOUT,
)

SCHEMA: tuple[FieldSpec, ...] = tuple(spec for section in _POLICY_SECTIONS for spec in section.specs())

SECTIONS: dict[str, tuple[str, ...]] = {
    "resilience": (
        "requestQueue",
        "connectionCooldown",
        "providerBreaker",
        "comboCooldownWait",
        "quotaShareConcurrencyLimit",
        "streamRecovery",
        "sessionAffinity",
    ),
    "settings": ("modelLockout",),
}
"""API group -> the top-level sections it serves (`/api/resilience`, `/api/settings`)."""

_BY_PATH: dict[str, FieldSpec] = {spec.path: spec for spec in SCHEMA}
_PARTS: dict[str, tuple[str, ...]] = {spec.path: tuple(spec.path.split(".")) for spec in SCHEMA}
_ALL_SECTIONS: tuple[str, ...] = tuple(s for group in SECTIONS.values() for s in group)


def _build_tree() -> dict[str, Any]:
    """The schema as a nested dict whose leaves are FieldSpecs: the shape patches are walked against."""
    tree: dict[str, Any] = {}
    for spec in SCHEMA:
        *parents, leaf = _PARTS[spec.path]
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = spec
    return tree


_TREE = _build_tree()
assert set(_TREE) == set(_ALL_SECTIONS), "every schema section belongs to exactly one API group"


def field(path: str) -> FieldSpec:
    """The spec of one leaf, e.g. `field("providerBreaker.apikey.failureThreshold")`; KeyError if unknown."""
    return _BY_PATH[path]


def defaults() -> dict[str, Any]:
    """The full nested document of every section of both groups, as a fresh copy."""
    doc: dict[str, Any] = {}
    for spec in SCHEMA:
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        _set(doc, _PARTS[spec.path], default)
    return doc


# ---------------------------------------------------------------------------------------------
# Cross-field rules: all of them say "low must stay below (or at most) high".


@dataclass(frozen=True, slots=True)
class OrderRule:
    """`low < high` (strict) or `low <= high`; with `zero_exempt`, a 0 on either side waives it."""

    low: str
    high: str
    strict: bool
    zero_exempt: bool = False

    def holds(self, low: int, high: int) -> bool:
        if self.zero_exempt and (low == 0 or high == 0):
            return True
        return low < high if self.strict else low <= high

    def message_for_low(self, high: int) -> str:
        name = self.high.rsplit(".", 1)[-1]
        text = f"must be lower than {name} ({high})" if self.strict else f"must be at most {name} ({high})"
        return text + ", or 0" if self.zero_exempt else text

    def message_for_high(self, low: int) -> str:
        name = self.low.rsplit(".", 1)[-1]
        text = f"must be greater than {name} ({low})" if self.strict else f"must be at least {name} ({low})"
        return text + ", or 0" if self.zero_exempt else text


ORDER_RULES: tuple[OrderRule, ...] = (
    *(
        OrderRule(f"providerBreaker.{c}.degradationThreshold", f"providerBreaker.{c}.failureThreshold", True)
        for c in PROVIDER_CLASSES
    ),
    OrderRule("comboCooldownWait.maxWaitMs", "comboCooldownWait.budgetMs", False, zero_exempt=True),
    OrderRule("modelLockout.baseCooldownMs", "modelLockout.maxCooldownMs", False),
)


def _no_emit(event: Event) -> None:
    pass


_V = TypeVar("_V")


class StaleSettingsChange(RuntimeError):
    """`Settings.commit` of a change prepared on a document version that is no longer live."""


class _Version:
    """One immutable document plus the typed views built from it.

    Swapping the whole object in one assignment keeps the cache consistent with its document: a
    reader that raced a patch fills the cache of the version it read, which is then dropped.
    """

    __slots__ = ("doc", "views")

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.views: dict[object, object] = {}


@dataclass(frozen=True, slots=True)
class SettingsChange:
    """A validated change that is not live yet (`Settings.prepare` -> write it -> `Settings.commit`)."""

    document: dict[str, Any]
    """The whole document after the change (every section of both groups): what goes to disk."""
    group: str
    reason: str
    """`patch` or `reset`, as its events say."""
    changed: tuple[str, ...]
    """The leaves whose value differs from the version it was prepared on."""
    base: _Version
    """That version: commit refuses the change if another one went live in between."""


class Settings:
    """The live settings document. All mutation goes through patch(); readers get typed policies."""

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        clock: Clock | None = None,
        emit: Callable[[Event], None] = _no_emit,
    ) -> None:
        """`values` is a stored document (any subset; missing keys take their defaults).

        It is validated like a patch of every section: an invalid stored document raises
        SettingsError, and the caller decides whether to start on defaults instead.
        """
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._emit = emit
        self._listeners: list[Callable[[Settings], None]] = []
        # Serialises writers only (readers take `_version` as is); patch() holds it from the merge
        # to the swap, so two memory-only changes cannot be merged onto the same version.
        self._lock = threading.Lock()
        self._version = _Version(defaults())
        if values:
            merged, errors = self._merge(values, _ALL_SECTIONS)
            if errors:
                raise SettingsError(errors)
            self._version = _Version(merged)

    # -- reading ---------------------------------------------------------------------------

    def document(self, group: str | None = None) -> dict[str, Any]:
        """A deep copy of one group's sections ("resilience", "settings") or of everything (None)."""
        doc = self._version.doc
        return {name: _copy(doc[name]) for name in _sections_of(group)}

    # -- changing --------------------------------------------------------------------------

    def validate(self, patch: Mapping[str, Any], group: str) -> tuple[dict[str, Any], list[FieldError]]:
        """Deep-merge `patch` (any subset of the group's sections and keys) into a copy of the document and
        check it: unknown keys (a section or key not in that group: "unknown key"), types, ranges, and the
        cross-field rules on the MERGED document. Returns (merged full document, errors); changes nothing.
        Every bad field is listed with its dotted path and a message naming what it accepts."""
        return self._merge(patch, _sections_of(group))

    def patch(self, patch: Mapping[str, Any], group: str) -> dict[str, Any]:
        """Apply a partial document atomically and return the group's document after it.

        Raises SettingsError (every bad field) and changes nothing when any field is invalid. Else one
        `settings` event per changed leaf, then the listeners, in that order. Memory only: a change
        that must survive a restart goes through `Runtime.patch_settings` (prepare, write, commit).
        """
        with self._lock:
            change = self.prepare(patch, group)
            old = self._swap(change)
        self._announce(change, old)
        return self.document(group)

    def reset_section(self, section: str) -> dict[str, Any]:
        """Load the defaults back into one section (`providerBreaker`, `modelLockout`) or any subtree of
        one (`providerBreaker.apikey`); returns that section's group document. KeyError if unknown."""
        with self._lock:
            change = self.prepare_reset(section)
            old = self._swap(change)
        self._announce(change, old)
        return self.document(change.group)

    def prepare(self, patch: Mapping[str, Any], group: str, *, reason: str = "patch") -> SettingsChange:
        """Validate a partial document against the live one and return the change, NOT applied yet.

        SettingsError (every bad field) if invalid. The caller writes `change.document` to disk and
        only then calls `commit(change)`, so memory never runs ahead of what a restart would load.
        """
        base = self._version  # one read: the merge and `base` must be the same version
        merged, errors = self._merge(patch, _sections_of(group), base.doc)
        if errors:
            raise SettingsError(errors)
        changed = tuple(spec.path for spec in SCHEMA if _get(base.doc, spec.path) != _get(merged, spec.path))
        return SettingsChange(merged, group, reason, changed, base)

    def prepare_reset(self, section: str) -> SettingsChange:
        """`prepare` for `reset_section`: KeyError if `section` is not a section or subtree of one."""
        parts = tuple(section.split("."))
        node: Any = defaults()
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                raise KeyError(section)
            node = node[part]
        if not isinstance(node, dict):
            raise KeyError(section)  # a single leaf is set with patch(), not "reset"
        patch: dict[str, Any] = {}
        _set(patch, parts, node)
        group = next(g for g, names in SECTIONS.items() if parts[0] in names)
        return self.prepare(patch, group, reason="reset")

    def commit(self, change: SettingsChange) -> dict[str, Any]:
        """Make a prepared change live; returns its group's document after it.

        StaleSettingsChange (and nothing changes) if the document moved since `prepare`: the change
        was merged onto a version that is gone, so applying it would silently undo the other change.
        Then one `settings` event per changed leaf, then the listeners, in that order.
        """
        with self._lock:
            if self._version is not change.base:
                raise StaleSettingsChange("the settings changed since this change was prepared")
            old = self._swap(change)
        self._announce(change, old)
        return self.document(change.group)

    def _swap(self, change: SettingsChange) -> dict[str, Any] | None:
        """Make `change` the live version (the caller holds `_lock`); the old document, None if no-op."""
        if not change.changed:
            return None
        old = self._version.doc
        self._version = _Version(change.document)
        return old

    def _announce(self, change: SettingsChange, old: dict[str, Any] | None) -> None:
        # Outside the lock: a listener may read the settings, and events reach any subscriber.
        if old is None:
            return
        now = self._clock.now()
        for path in change.changed:
            from_, to = _get(old, path), _get(change.document, path)
            self._emit(
                Event(
                    ts=now, layer="settings", key=path, from_=said(from_), to=said(to), reason=change.reason
                )
            )
        self._notify()

    def add_listener(self, fn: Callable[[Settings], None]) -> None:
        """`fn(settings)` runs after every successful change (the engine re-applies its policies)."""
        self._listeners.append(fn)

    def _notify(self) -> None:
        # Every listener runs even if one fails: the change is already live, and a listener that
        # skipped it would leave its layer on stale policies. The first failure is re-raised after.
        first_error: Exception | None = None
        for listener in tuple(self._listeners):
            try:
                listener(self)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def _merge(
        self, patch: Mapping[str, Any], sections: tuple[str, ...], base: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], list[FieldError]]:
        merged = _copy(self._version.doc if base is None else base)
        errors: list[FieldError] = []
        if not isinstance(patch, Mapping):
            return merged, [FieldError("", "must be an object")]
        allowed = {name: _TREE[name] for name in sections}
        touched: list[str] = []
        _merge_into(merged, patch, allowed, "", touched, errors)
        bad = {error.field for error in errors}
        touched_set = set(touched)
        for rule in ORDER_RULES:
            if rule.low in bad or rule.high in bad or rule.low.split(".", 1)[0] not in allowed:
                continue
            low, high = _get(merged, rule.low), _get(merged, rule.high)
            if rule.holds(low, high):
                continue
            # Blame the field the caller just changed, so "failureThreshold 5" reports failureThreshold.
            if rule.high in touched_set and rule.low not in touched_set:
                errors.append(FieldError(rule.high, rule.message_for_high(low)))
            else:
                errors.append(FieldError(rule.low, rule.message_for_low(high)))
        return merged, errors

    # -- typed views (cached per document version) -----------------------------------------

    def _view(self, key: object, build: Callable[[dict[str, Any]], _V]) -> _V:
        version = self._version
        try:
            return cast(_V, version.views[key])
        except KeyError:
            view = build(version.doc)
            version.views[key] = view
            return view

    def breaker_policy(self, cls: ProviderClass) -> BreakerPolicy:
        return self._policy(_BREAKER[cls])

    def cooldown_policy(self, cls: ProviderClass) -> CooldownPolicy:
        return self._policy(_COOLDOWN[cls])

    def lockout(self) -> LockoutSettings:
        return self._policy(_LOCKOUT)

    def queue(self) -> QueueSettings:
        return self._policy(_QUEUE)

    def watchdog(self) -> WatchdogSettings:
        return self._policy(_WATCHDOG)

    def combo_wait(self) -> ComboWaitSettings:
        return self._policy(_COMBO_WAIT)

    def quota_share(self) -> QuotaShareSettings:
        return self._policy(_QUOTA_SHARE)

    def _policy(self, section: _PolicySection[_P]) -> _P:
        return self._view(section.prefix, section.view)

    def session_ttl_ms(self) -> int:
        ttl: int = self._version.doc["sessionAffinity"]["ttlMs"]
        return ttl


# ---------------------------------------------------------------------------------------------
# Environment overrides (applied once at start, on top of the stored document).

ENV_OVERRIDES: dict[str, str] = {
    "RATE_LIMIT_MAX_WAIT_MS": "requestQueue.maxWaitMs",
    "RATE_LIMIT_MAX_QUEUE_DEPTH": "requestQueue.maxQueueDepth",
    "STREAM_THROUGHPUT_WATCHDOG_ENABLED": "streamRecovery.throughputWatchdog.enabled",
}
"""Environment variable -> settings field it overrides."""


def apply_env_overrides(doc: dict[str, Any], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Return a copy of `doc` with the environment's overrides set, plus one warning per ignored value.

    Env wins over the stored document at start. A value that does not parse or is out of the field's
    range is ignored with a warning (never a crash); an empty value counts as unset.
    """
    result = _copy(doc)
    warnings: list[str] = []
    for name, path in ENV_OVERRIDES.items():
        text = env.get(name)
        if text is None or not text.strip():
            continue
        try:
            value = _BY_PATH[path].parse(text)
        except ValueError as exc:
            warnings.append(f"ignoring {name}={text!r}: {exc}")
            continue
        _set(result, _PARTS[path], value)
    return result, warnings


# ---------------------------------------------------------------------------------------------
# Small document helpers.


def _sections_of(group: str | None) -> tuple[str, ...]:
    if group is None:
        return _ALL_SECTIONS
    try:
        return SECTIONS[group]
    except KeyError:
        raise ValueError(f"unknown settings group {group!r} (expected one of {sorted(SECTIONS)})") from None


def _merge_into(
    target: dict[str, Any],
    patch: Mapping[str, Any],
    tree: Mapping[str, Any],
    prefix: str,
    touched: list[str],
    errors: list[FieldError],
) -> None:
    """Walk `patch` against the schema `tree`, writing each leaf into `target` (valid or not)."""
    for key, value in patch.items():
        path = f"{prefix}{key}"
        node = tree.get(key) if isinstance(key, str) else None
        if node is None:
            errors.append(FieldError(path, "unknown key"))
        elif isinstance(node, FieldSpec):
            normalised, message = node.check(value)
            target[key] = normalised
            touched.append(path)
            if message is not None:
                errors.append(FieldError(path, message))
        elif not isinstance(value, Mapping):
            errors.append(FieldError(path, "must be an object"))
        else:
            _merge_into(target.setdefault(key, {}), value, node, path + ".", touched, errors)


def _get(doc: Mapping[str, Any], path: str) -> Any:
    node: Any = doc
    for part in _PARTS[path]:
        node = node[part]
    return node


def _set(doc: dict[str, Any], parts: Iterable[str], value: object) -> None:
    *parents, leaf = parts
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[leaf] = value


def _copy(node: Any) -> Any:
    """Deep copy of a JSON-shaped document (dicts, lists, scalars); much cheaper than copy.deepcopy."""
    if isinstance(node, dict):
        return {key: _copy(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_copy(item) for item in node]
    return node


def said(value: object) -> str:
    """A setting's value as an event says it to people: `on`/`off`, `403, 404`, not Python's repr."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)
