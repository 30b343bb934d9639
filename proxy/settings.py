"""The live settings document: strict atomic validation, typed views, environment overrides.

What each setting is (path, type, default, range, help) is the schema, `proxy/schema.py`, derived
from the layers' policy dataclasses; its names are re-exported here, where most readers look.

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

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.errors import FieldError, SettingsError
from proxy.resilience.events import Event
from proxy.resilience.outcome import ProviderClass
from proxy.schema import (
    ALL_SECTIONS,
    BREAKER,
    BY_PATH,
    COMBO_WAIT,
    COOLDOWN,
    INT_LIST_MAX_ITEMS,
    LOCKOUT,
    ORDER_RULES,
    PARTS,
    QUEUE,
    QUOTA_SHARE,
    SCHEMA,
    SECTIONS,
    TREE,
    WATCHDOG,
    ComboWaitSettings,
    FieldSpec,
    OrderRule,
    PolicySection,
    QuotaShareSettings,
    SessionAffinitySettings,
    defaults,
    field,
    leaves,
    set_path,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from proxy.resilience.breaker import BreakerPolicy
    from proxy.resilience.cooldown import CooldownPolicy
    from proxy.resilience.limiter import QueueSettings
    from proxy.resilience.lockout import LockoutSettings
    from proxy.resilience.watchdog import WatchdogSettings

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
    "SettingsContended",
    "StaleSettingsChange",
    "apply_env_overrides",
    "defaults",
    "field",
    "leaves",
]


def _no_emit(event: Event) -> None:
    pass


_V = TypeVar("_V")
_P = TypeVar("_P", bound="DataclassInstance")


class StaleSettingsChange(RuntimeError):
    """`Settings.commit` of a change prepared on a document version that is no longer live."""


class SettingsContended(RuntimeError):
    """A change that met a newer document on every try (proxy/runtime.py, SETTINGS_TRIES): not
    saved, nothing changed. Sending it again is safe."""


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
            merged, errors = self._merge(values, ALL_SECTIONS)
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
        set_path(patch, parts, node)
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
        allowed = {name: TREE[name] for name in sections}
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
        return self._policy(BREAKER[cls])

    def cooldown_policy(self, cls: ProviderClass) -> CooldownPolicy:
        return self._policy(COOLDOWN[cls])

    # The views read for every request look their cached view up first, in one call.

    def lockout(self) -> LockoutSettings:
        found = self._version.views.get(LOCKOUT.prefix)
        return cast("LockoutSettings", found) if found is not None else self._policy(LOCKOUT)

    def queue(self) -> QueueSettings:
        found = self._version.views.get(QUEUE.prefix)
        return cast("QueueSettings", found) if found is not None else self._policy(QUEUE)

    def watchdog(self) -> WatchdogSettings:
        found = self._version.views.get(WATCHDOG.prefix)
        return cast("WatchdogSettings", found) if found is not None else self._policy(WATCHDOG)

    def combo_wait(self) -> ComboWaitSettings:
        return self._policy(COMBO_WAIT)

    def quota_share(self) -> QuotaShareSettings:
        found = self._version.views.get(QUOTA_SHARE.prefix)
        return cast("QuotaShareSettings", found) if found is not None else self._policy(QUOTA_SHARE)

    def _policy(self, section: PolicySection[_P]) -> _P:
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
            value = BY_PATH[path].parse(text)
        except ValueError as exc:
            warnings.append(f"ignoring {name}={text!r}: {exc}")
            continue
        set_path(result, PARTS[path], value)
    return result, warnings


# ---------------------------------------------------------------------------------------------
# Small document helpers.


def _sections_of(group: str | None) -> tuple[str, ...]:
    if group is None:
        return ALL_SECTIONS
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
    for part in PARTS[path]:
        node = node[part]
    return node


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
