"""The settings schema: what each live setting is (path, type, default, range, help), in one table.

Every row of `SCHEMA` is derived from one field of a layer's policy dataclass (`BreakerPolicy`,
`LockoutSettings`...; `proxy/resilience/tunable.py` says how a field declares its range and
help), so a default or a range is written once, where the layer reads it. Validation, the API and
its OpenAPI document, the console's cards, the CLI and the docs' generated tables all read this
table. Wire names are the fields' in camelCase (`providerBreaker.apikey.failureThreshold`), as in
OmniRoute's API. The live document that these rows describe is `proxy/settings.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from proxy import untrusted
from proxy.resilience.breaker import DEFAULT_BREAKER_POLICIES, BreakerPolicy
from proxy.resilience.cooldown import DEFAULT_COOLDOWN_POLICIES, CooldownPolicy
from proxy.resilience.limiter import QueueSettings
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.outcome import PROVIDER_CLASSES, ProviderClass
from proxy.resilience.tunable import HELP, MAX, MIN, is_tunable, tunable
from proxy.resilience.watchdog import WatchdogSettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
        return list(dict.fromkeys(value)), None  # each once, in the order given

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

    def written(self, value: object) -> str:
        """`value` as `parse` reads it back (the CLI's `settings set` form): `true`, `404,429`."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)


_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def _parse_int(raw: str, spec: FieldSpec, original: str) -> int:
    # Only plain decimal digits: int() would also take "1_000" and " +5", which no form field shows.
    # (Past 18 digits no field's range holds it, and past 4,300 int() refuses in its own words.)
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isdecimal() or not digits.isascii() or len(digits.lstrip("0")) > 18:
        raise ValueError(f"{spec.path}: must be {spec.accepted()} (got {untrusted.echo(original)!r})")
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
class PolicySection(Generic[_P]):
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

QUEUE = PolicySection("requestQueue", QueueSettings)
COOLDOWN = {c: PolicySection(f"connectionCooldown.{c}", CooldownPolicy, c) for c in PROVIDER_CLASSES}
BREAKER = {
    c: PolicySection(f"providerBreaker.{c}", BreakerPolicy, c, _BREAKER_ORDER) for c in PROVIDER_CLASSES
}
COMBO_WAIT = PolicySection("comboCooldownWait", ComboWaitSettings)
QUOTA_SHARE = PolicySection("quotaShareConcurrencyLimit", QuotaShareSettings)
WATCHDOG = PolicySection("streamRecovery.throughputWatchdog", WatchdogSettings)
SESSION_AFFINITY = PolicySection("sessionAffinity", SessionAffinitySettings)
LOCKOUT = PolicySection("modelLockout", LockoutSettings)

_POLICY_SECTIONS: tuple[PolicySection[Any], ...] = (
    QUEUE,
    *COOLDOWN.values(),
    *BREAKER.values(),
    COMBO_WAIT,
    QUOTA_SHARE,
    WATCHDOG,
    SESSION_AFFINITY,
    LOCKOUT,
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

BY_PATH: dict[str, FieldSpec] = {spec.path: spec for spec in SCHEMA}
PARTS: dict[str, tuple[str, ...]] = {spec.path: tuple(spec.path.split(".")) for spec in SCHEMA}
ALL_SECTIONS: tuple[str, ...] = tuple(s for group in SECTIONS.values() for s in group)


def _build_tree() -> dict[str, Any]:
    """The schema as a nested dict whose leaves are FieldSpecs: the shape patches are walked against."""
    tree: dict[str, Any] = {}
    for spec in SCHEMA:
        *parents, leaf = PARTS[spec.path]
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = spec
    return tree


TREE = _build_tree()
assert set(TREE) == set(ALL_SECTIONS), "every schema section belongs to exactly one API group"


def field(path: str) -> FieldSpec:
    """The spec of one leaf, e.g. `field("providerBreaker.apikey.failureThreshold")`; KeyError if unknown."""
    return BY_PATH[path]


def defaults() -> dict[str, Any]:
    """The full nested document of every section of both groups, as a fresh copy."""
    doc: dict[str, Any] = {}
    for spec in SCHEMA:
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        set_path(doc, PARTS[spec.path], default)
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


def leaves(patch: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths a nested patch sets, in its order."""
    paths: list[str] = []
    for key, value in patch.items():
        path = f"{prefix}{key}"
        paths.extend(leaves(value, f"{path}.") if isinstance(value, Mapping) else [path])
    return paths


def set_path(doc: dict[str, Any], parts: Iterable[str], value: object) -> None:
    """Write `value` at `parts` in a nested document, making the tables on the way."""
    *parents, leaf = parts
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[leaf] = value
