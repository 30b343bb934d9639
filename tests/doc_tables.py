"""The tables of docs/ that the code already holds: rendered from it, so the docs cannot drift.

A generated block in a Markdown file sits between two HTML comments, which a code host does not
show:

    <!-- generated: settings providerBreaker -->
    | setting | oauth | apikey | local | accepted |
    ...
    <!-- end generated -->

`python -m tests.doc_tables` rewrites every block of docs/*.md from the code (run it after changing
a default, a range, an environment override or one of the limits below); `tests/test_docs.py` fails
when a block differs from what this module renders. Block kinds:

- `settings PREFIX`: the settings under PREFIX, from `proxy.settings.SCHEMA` (one column per
  provider class for `connectionCooldown` and `providerBreaker`);
- `settings-env`: the environment overrides (`proxy.settings.ENV_OVERRIDES`);
- `settings-rules`: the cross-field rules (`proxy.settings.ORDER_RULES`);
- `limits GROUP`: fixed limits that are constants in the code, not settings (`LIMITS` below).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.resilience.outcome import PROVIDER_CLASSES
from proxy.settings import ENV_OVERRIDES, INT_LIST_MAX_ITEMS, ORDER_RULES, SCHEMA, FieldSpec

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<name>[^>]*?) -->\n)(?P<body>.*?)(?P<close><!-- end generated -->)",
    re.DOTALL,
)

PER_CLASS = ("connectionCooldown", "providerBreaker")
"""Sections with one copy of every field per provider class, shown as one column per class."""


# ---------------------------------------------------------------------------------------------
# Values as the docs write them.


def duration(ms: float) -> str:
    """`90000` → `90 s`, `1800000` → `30 min`, `86400000` → `24 h`, `250` → `250 ms`."""
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{int(ms // size)} {unit}"
    if ms >= 1000:
        return f"{ms / 1000:g} s"
    return f"{ms:g} ms"


def default_of(spec: FieldSpec) -> str:
    value = spec.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return "`" + ",".join(str(v) for v in value) + "`"
    assert isinstance(value, int)
    if spec.name.endswith("Ms") and value >= 1000:
        return f"`{value}` ({duration(value)})"
    return f"`{value}`"


def accepted_of(spec: FieldSpec) -> str:
    if spec.kind == "bool":
        return "`true` / `false`"
    assert spec.min is not None and spec.max is not None
    if spec.kind == "int_list":
        return f"up to {INT_LIST_MAX_ITEMS} statuses, each {spec.min}–{spec.max}; empty = the default"
    bounds = f"{spec.min:,}–{spec.max:,}"
    if spec.name.endswith("Ms") and spec.max >= 1000:
        bounds += f" ({duration(spec.max)})"
    return bounds


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# ---------------------------------------------------------------------------------------------
# Settings.


def settings_table(prefix: str) -> str:
    if prefix in PER_CLASS:
        return _per_class_table(prefix)
    specs = [s for s in SCHEMA if s.path.startswith(prefix + ".")]
    if not specs:
        raise ValueError(f"no setting under {prefix!r}")
    lines = [_row(["setting", "default", "accepted", "what it does"]), _row(["---"] * 4)]
    lines += [_row([f"`{s.path}`", default_of(s), accepted_of(s), s.help]) for s in specs]
    return "\n".join(lines)


def _per_class_table(prefix: str) -> str:
    first = PROVIDER_CLASSES[0]
    names = [s.name for s in SCHEMA if s.path.startswith(f"{prefix}.{first}.")]
    by_path = {s.path: s for s in SCHEMA}
    header = ["setting", *(f"`{cls}`" for cls in PROVIDER_CLASSES), "accepted"]
    lines = [_row(header), _row(["---"] * len(header))]
    for name in names:
        cells = [default_of(by_path[f"{prefix}.{cls}.{name}"]) for cls in PROVIDER_CLASSES]
        accepted = {accepted_of(by_path[f"{prefix}.{cls}.{name}"]) for cls in PROVIDER_CLASSES}
        assert len(accepted) == 1, f"{prefix}.*.{name}: the classes accept different ranges"
        lines.append(_row([f"`{prefix}.<class>.{name}`", *cells, accepted.pop()]))
    return "\n".join(lines)


def env_table() -> str:
    lines = [_row(["environment variable", "sets", "accepted"]), _row(["---"] * 3)]
    by_path = {s.path: s for s in SCHEMA}
    for name, path in ENV_OVERRIDES.items():
        spec = by_path[path]
        accepted = (
            "`true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`)"
            if spec.kind == "bool"
            else accepted_of(spec)
        )
        lines.append(_row([f"`{name}`", f"`{path}`", accepted]))
    return "\n".join(lines)


def rules_table() -> str:
    lines = [_row(["rule", "note"]), _row(["---"] * 2)]
    for rule in ORDER_RULES:
        op = "<" if rule.strict else "<="
        note = "either may be 0 (which turns waiting off)" if rule.zero_exempt else ""
        lines.append(_row([f"`{rule.low}` {op} `{rule.high}`", note]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Fixed limits: constants in the code, one row each, read where they are defined.


@dataclass(frozen=True, slots=True)
class Limit:
    """One row: `name` in `module` (or what `read` computes from the module), shown with `shown`."""

    what: str
    module: str
    name: str
    shown: Callable[[object], str]
    read: Callable[[object], object] | None = None

    def value(self) -> object:
        module = importlib.import_module(self.module)
        return self.read(module) if self.read is not None else getattr(module, self.name)

    @property
    def where(self) -> str:
        return self.module.replace(".", "/") + ".py"


def _ms(value: object) -> str:
    assert isinstance(value, int | float)
    return duration(float(value))


def _s(value: object) -> str:
    assert isinstance(value, int | float)
    return duration(float(value) * 1000)


def _count(value: object) -> str:
    assert isinstance(value, int)
    return f"{value:,}"


def _times(value: object) -> str:
    assert isinstance(value, int)
    return f"×{value}"


def _bytes(value: object) -> str:
    assert isinstance(value, int)
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


def _power_of_two(module: object) -> object:
    return 1 << getattr(module, "MAX_TIMEOUT_MULTIPLIER_EXPONENT")  # noqa: B009


def _capacity_default(module: object) -> object:
    return inspect.signature(getattr(module, "EventBus").__init__).parameters["capacity"].default  # noqa: B009


BREAKER, LOCKOUT = "proxy.resilience.breaker", "proxy.resilience.lockout"

LIMITS: dict[str, tuple[Limit, ...]] = {
    "resilience": (
        Limit("open cycles at the profile's reset timeout (each further cycle doubles it)", BREAKER,
              "CYCLES_AT_BASE_TIMEOUT", _count),
        Limit("cap on the reset timeout's growth", BREAKER, "MAX_TIMEOUT_MULTIPLIER_EXPONENT", _times,
              _power_of_two),
        Limit("transitions each breaker keeps for the console's detail pane", BREAKER, "HISTORY_SIZE", _count),
        Limit("Retry-After estimate while a HALF_OPEN probe is in flight", "proxy.engine.routing",
              "PROBE_RECOVERY_ESTIMATE_MS", _ms),
        Limit("longest upstream retry hint believed", "proxy.resilience.hints", "MAX_HINT_MS", _ms),
        Limit("lockout escalation window after a lock ends", LOCKOUT, "ESCALATION_GRACE_MS", _ms),
        Limit("lockout table capacity", LOCKOUT, "MAX_LOCKOUT_ENTRIES", _count),
        Limit("`not_found` locks kept per provider + connection", LOCKOUT, "NOT_FOUND_BUDGET", _count),
        Limit("slack added to a cooldown-aware wait", "proxy.pipeline", "WAIT_SLACK_MS", _ms),
        Limit("longest `retry_after_ms` of a restatement rule", "proxy.resilience.restate",
              "MAX_RETRY_AFTER_MS", _ms),
    ),
    "api": (
        Limit("largest request line and headers, any route (else 431)", "proxy.protocol", "HEAD_LIMIT", _bytes),
        Limit("longest a request line and headers may take to arrive (else 408, or a close when nothing came)",
              "proxy.protocol", "HEAD_TIMEOUT_S", _s),
        Limit("largest `/v1/*` request body (else 413)", "proxy.pipeline", "MAX_BODY_BYTES", _bytes),
        Limit("longest silence while a `/v1/*` body arrives (else 408)", "proxy.pipeline",
              "BODY_IDLE_TIMEOUT_S", _s),
        Limit("largest management request body (else 413)", "proxy.manage", "MAX_BODY_BYTES", _bytes),
        Limit("upstream error body read for classification", "proxy.upstream", "MAX_ERROR_BODY", _bytes),
        Limit("how long an upstream's `/v1/models` list is cached", "proxy.router", "MODEL_LIST_TTL_S", _s),
        Limit("events kept for `GET /api/events`", "proxy.resilience.events", "EventBus", _count,
              _capacity_default),
    ),
    "operations": (
        Limit("grace for in-flight requests on a clean stop", "proxy.serve", "SHUTDOWN_GRACE_S", _s),
        Limit("how often engine state is handed to the store", "proxy.runtime", "PERSIST_INTERVAL_S", _s),
        Limit("how often the store's writer commits a batch", "proxy.store", "_BATCH_INTERVAL_S", _s),
        Limit("how often a lasting write failure is logged again", "proxy.store", "_REPEAT_LOG_S", _s),
        Limit("how long a start retries a state lock held for a moment", "proxy.statelock",
              "ACQUIRE_PATIENCE_S", _s),
        Limit("how long a start waits for an instance on its state file that is stopping", "proxy.statelock",
              "STOP_PATIENCE_S", _s),
    ),
}  # fmt: skip


def limits_table(group: str) -> str:
    lines = [_row(["limit", "value", "defined in"]), _row(["---"] * 3)]
    for limit in LIMITS[group]:
        lines.append(_row([limit.what, limit.shown(limit.value()), f"`{limit.where}`"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Blocks.


def render(name: str) -> str:
    """The body of the block called `name` (without the comments around it)."""
    kind, _, arg = name.partition(" ")
    if kind == "settings":
        return settings_table(arg)
    if kind == "settings-env" and not arg:
        return env_table()
    if kind == "settings-rules" and not arg:
        return rules_table()
    if kind == "limits":
        return limits_table(arg)
    raise ValueError(f"unknown generated block {name!r}")


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, body) of every generated block in a Markdown text; body without its final newline."""
    return [(m["name"], m["body"].rstrip("\n")) for m in BLOCK.finditer(text)]


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: f"{m['open']}{render(m['name'])}\n{m['close']}", text)


def main() -> int:
    changed = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        new = regenerate(text)
        if new != text:
            path.write_text(new)
            changed.append(path.relative_to(ROOT))
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print("docs/ tables are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
