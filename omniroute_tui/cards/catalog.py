"""What each settings card edits and what it tells the operator: data, no widgets.

A card is a list of blocks; a block is one settings subtree (`requestQueue`) plus the three lines
that explain its layer (Scope / Trigger / Effect, as in docs/resilience.md). The fields themselves are
never listed here: they are read from `proxy.settings.SCHEMA` by prefix, so a field added to the
schema shows up on its card with its default and range, and a range is written down only once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.resilience.outcome import PROVIDER_CLASSES, ProviderClass
from proxy.settings import SCHEMA, FieldSpec, field

__all__ = [
    "CARDS",
    "CLASS_LABELS",
    "Block",
    "CardSpec",
    "Explainer",
    "format_default",
    "format_range",
    "get_path",
    "nest",
]

CLASS_LABELS: dict[ProviderClass, str] = {"oauth": "OAuth", "apikey": "API key", "local": "Local"}
"""Column headings of the Resilience card, in `PROVIDER_CLASSES` order."""


@dataclass(frozen=True, slots=True)
class Explainer:
    scope: str
    trigger: str
    effect: str


@dataclass(frozen=True, slots=True)
class Block:
    """One settings subtree on a card. `per_class`: the subtree has one copy per provider class
    (`providerBreaker.oauth...`), shown as a grid with a column per class."""

    prefix: str
    explainer: Explainer
    title: str | None = None
    per_class: bool = False

    def specs(self) -> tuple[FieldSpec, ...]:
        """Every schema field of the block, in schema order (all classes, for a per-class block)."""
        return tuple(spec for spec in SCHEMA if spec.path.startswith(self.prefix + "."))

    def row_names(self) -> tuple[str, ...]:
        """For a per-class block: the field names, one grid row each."""
        first = PROVIDER_CLASSES[0]
        return tuple(spec.name for spec in SCHEMA if spec.path.startswith(f"{self.prefix}.{first}."))

    def cell(self, name: str, cls: ProviderClass) -> FieldSpec:
        return field(f"{self.prefix}.{cls}.{name}")


@dataclass(frozen=True, slots=True)
class CardSpec:
    id: str
    """Widget id suffix: the card is `#card-<id>`."""
    title: str
    group: str
    """The API group whose PATCH this card goes through: "resilience" or "settings"."""
    blocks: tuple[Block, ...]

    def specs(self) -> tuple[FieldSpec, ...]:
        return tuple(spec for block in self.blocks for spec in block.specs())


CARDS: tuple[CardSpec, ...] = (
    CardSpec(
        "resilience",
        "Resilience",
        "resilience",
        (
            Block(
                "connectionCooldown",
                Explainer(
                    scope="one connection (one key, account or server) of a provider",
                    trigger="a 429, 408, 5xx or network error from that connection",
                    effect="the connection is skipped for baseCooldownMs × 2^level (or the upstream's "
                    "retry hint) while the provider's other connections serve",
                ),
                title="Connection Cooldown",
                per_class=True,
            ),
            Block(
                "providerBreaker",
                Explainer(
                    scope="a whole provider",
                    trigger="408/5xx/network errors (net of successes) reaching the thresholds",
                    effect="DEGRADED at degradationThreshold; at failureThreshold the provider is skipped "
                    "until the reset timeout, then one probe decides",
                ),
                title="Provider Circuit Breaker",
                per_class=True,
            ),
        ),
    ),
    CardSpec(
        "model-lockout",
        "Model Lockout",
        "settings",
        (
            Block(
                "modelLockout",
                Explainer(
                    scope="one model on one connection (provider:connection:model)",
                    trigger="an upstream status listed in errorCodes (a 429 on a per-model-quota provider), "
                    "while enabled",
                    effect="that model is skipped on that connection for baseCooldownMs, doubled on repeats "
                    "up to maxCooldownMs; its other models keep serving",
                ),
            ),
        ),
    ),
    CardSpec(
        "request-queue",
        "Request Queue",
        "resilience",
        (
            Block(
                "requestQueue",
                Explainer(
                    scope="each connection of an API-key provider (others opt in with rate_limit = true)",
                    trigger="every request dispatched to that connection",
                    effect="paced to requestsPerMinute and concurrentRequests; a full queue answers 429 "
                    "RATE_LIMIT_QUEUE_FULL, a dispatch past maxWaitMs 504; never an upstream failure",
                ),
            ),
        ),
    ),
    CardSpec(
        "combo-cooldown-wait",
        "Combo Cooldown Wait",
        "resilience",
        (
            Block(
                "comboCooldownWait",
                Explainer(
                    scope="one request whose every target is cooling, locked or OPEN",
                    trigger="nothing eligible, for a short transient reason",
                    effect="waits for the earliest recovery and dispatches again, within maxWaitMs per "
                    "wait, maxAttempts and budgetMs; else 429 with Retry-After",
                ),
            ),
        ),
    ),
    CardSpec(
        "quota-share",
        "Quota-share Concurrency",
        "resilience",
        (
            Block(
                "quotaShareConcurrencyLimit",
                Explainer(
                    scope="a connection that declares max_concurrent",
                    trigger="more requests for it than max_concurrent at once",
                    effect="the extra requests wait in line (queueDepth, queueTimeoutMs); when the line is "
                    "full or the wait times out they go ahead anyway (fail-open)",
                ),
            ),
        ),
    ),
    CardSpec(
        "stream-watchdog",
        "Stream Watchdog",
        "resilience",
        (
            Block(
                "streamRecovery.throughputWatchdog",
                Explainer(
                    scope="one streamed response",
                    trigger="after warmupMs plus one windowMs, less assistant text in the window than "
                    "minUsefulBytesPerSecond or minUsefulBytes",
                    effect="the stream is aborted: before its first byte it falls back to the next target, "
                    "after it ends with an error event and [DONE]",
                ),
            ),
        ),
    ),
    CardSpec(
        "session-affinity",
        "Session Affinity",
        "resilience",
        (
            Block(
                "sessionAffinity",
                Explainer(
                    scope="one client session (X-Session-Id, x-codex-session-id, x-omniroute-session)",
                    trigger="a request carrying a session header",
                    effect="it goes to the same connection for ttlMs (0 = off); a pinned connection that "
                    "becomes ineligible is replaced",
                ),
            ),
        ),
    ),
)


def format_default(spec: FieldSpec) -> str:
    """The default as the card shows it: `on`/`off`, `15,000`, `403, 404, 429`."""
    default = spec.default
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, int):
        return f"{default:,}"
    if isinstance(default, tuple | list):
        return ", ".join(str(item) for item in default)
    return str(default)


def format_range(spec: FieldSpec) -> str:
    """The accepted range, short (`1–1,000`); the full wording is `spec.accepted()`."""
    if spec.kind == "bool":
        return "on/off"
    bounds = f"{spec.min:,}–{spec.max:,}"
    return bounds if spec.kind == "int" else f"codes {bounds}"


def get_path(doc: Mapping[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        node = node[part]
    return node


def nest(values: Mapping[str, object]) -> dict[str, Any]:
    """`{"a.b.c": 1}` -> `{"a": {"b": {"c": 1}}}`: a PATCH body from dotted paths."""
    doc: dict[str, Any] = {}
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc
