"""Immutable view models of the instance, and the pure functions that build them from its read model.

A `Snapshot` is everything one redraw needs, already formatted: rows of strings with their sort
keys and a style class, so widgets only copy text into cells and never read the instance. Rows are
frozen, so the tables can diff the previous snapshot against the next one by identity first and
by value second, and touch only the cells that changed.

The builders here are pure (the read model's views + `now` in, view models out; they never touch
the engine itself); `feed.py` decides when to call them and caches what does not change between
ticks.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from omniroute_tui import format as fmt
from omniroute_tui.untrusted import visible
from proxy.readmodel import (
    BreakerView,
    ConnectionView,
    Event,
    LockoutTableStatus,
    LockoutView,
    Observed,
    RequestView,
    StatsView,
    TransitionView,
)
from proxy.resilience.timefmt import epoch_ms

SortKey = float | str

ROW_LIMIT: Final = 250
"""Rows a table holds at most: a terminal shows a few dozen, and each shown row costs a countdown
format and a diff every tick. The filter (`/`) reaches every row; `R` acts on every row the
filter keeps, shown or not (the caption says when rows are left out)."""

OVERVIEW_ROWS: Final = 5
OVERVIEW_EVENTS: Final = 40
"""As many as the Recent events box can show on a tall terminal; the box clips the rest."""
DETAIL_EVENTS: Final = 20


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int | None = None
    """At least this many cells wide: for cells that change every second (countdowns), so columns
    never jitter. None: as wide as the widest value held, up to `cap`."""
    cap: int = 32
    """At most this many cells: a longer value ends in "…" (the detail pane shows it whole), so one
    long name cannot push every other column off the screen."""


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    cells: tuple[str, ...]
    sort_keys: tuple[SortKey, ...]
    style: str
    """A style class from `format` (ok, warn, bad, probe, off, info)."""
    target: tuple[str, ...] = ()
    """What an action on this row acts on: (provider,), (connection id,), (provider, connection, model)."""
    search: str = ""
    """Lower-cased text the `/` filter matches."""


@dataclass(frozen=True, slots=True)
class View:
    """How the operator looks at one table: filter text, sort column, direction."""

    filter: str = ""
    sort: int = 0
    reverse: bool = False


@dataclass(frozen=True, slots=True)
class Detail:
    title: str
    lines: tuple[tuple[str, str], ...]
    """(text, style class) per line, newest history first."""


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    name: str
    rows: tuple[Row, ...]
    """Filtered, sorted, at most ROW_LIMIT."""
    view: View
    total: int
    """Rows before the filter."""
    matching: tuple[Row, ...]
    """Every row the filter keeps, in order, shown or not: what `R` acts on."""
    detail: Detail | None = None
    notice: tuple[str, str] | None = None
    """(text, style class) the caption adds: something the operator must know about the table."""


@dataclass(frozen=True, slots=True)
class Tile:
    provider: str
    state: str
    text: str
    style: str
    key: str = ""
    """The provider's id: its row on the Breakers tab."""
    latency: str = ""
    """A sparkline of its p50 latency over the last minute and the p50 now (empty: no traffic)."""


@dataclass(frozen=True, slots=True)
class Overview:
    tiles: tuple[Tile, ...]
    cooling: tuple[Row, ...]
    lockouts: tuple[Row, ...]
    events: tuple[Row, ...]
    lockout_total: int = 0
    cooling_total: int = 0
    replicas: str = ""
    """The Replicas line of a fleet (docs/fleet.md): each replica's id, address, uptime, in-flight
    requests and when it was last seen; empty without a fleet."""


@dataclass(frozen=True, slots=True)
class Header:
    url: str
    version: str
    uptime: str
    rates: tuple[int, ...]
    rate_now: str
    requests: str
    open_breakers: int
    cooling: int
    lockouts: int
    live: bool
    read_only: bool
    replica: str = ""
    stale: bool = False
    """An attached console whose stream is down: what it shows is what the instance said last."""
    """The fleet replica the console is attached to (empty without a fleet)."""
    state: str = ""
    """What is wrong with the state backend (`redis lost`), empty when nothing is."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One redraw. `table` / `overview` are None when that part did not change since the last one."""

    header: Header
    tab: str
    table: TableSnapshot | None = None
    overview: Overview | None = None
    moving: bool = False
    """Something on screen counts down, so the next tick must rebuild even without events."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the event history: a bus event or a log record, formatted once."""

    row: Row
    layer: str
    key: str
    """The bus key (`provider:connection:model` for a lockout), to find a row's history."""


# -- columns (docs/console.md) --------------------------------------------------------------------

COLUMNS: Final[dict[str, tuple[Column, ...]]] = {
    "breakers": (
        Column("provider", "Provider"),
        Column("class", "Class"),
        Column("state", "State", 9),
        Column("failures", "Failures"),
        Column("thresholds", "Degraded/opens at"),
        Column("retry", "Retry in", 8),
        Column("cycles", "Open cycles"),
        Column("last_failure", "Last failure"),
        Column("p50", "p50 5m"),
        Column("errors", "Errors 5m"),
    ),
    "connections": (
        Column("provider", "Provider"),
        Column("connection", "Connection"),
        Column("status", "Status"),
        Column("cooldown", "Cooldown", 8),
        Column("backoff", "Backoff"),
        Column("error", "Last error"),
        Column("code", "Code"),
        Column("in_flight", "In-flight/max"),
        Column("p50", "p50 5m"),
        Column("errors", "Errors 5m"),
    ),
    "lockouts": (
        Column("provider", "Provider"),
        Column("connection", "Connection"),
        Column("model", "Model", cap=40),
        Column("reason", "Reason"),
        Column("failures", "Failures"),
        Column("remaining", "Remaining", 9),
        Column("expires", "Expires at"),
    ),
    "events": (
        Column("time", "Time"),
        Column("layer", "Layer"),
        Column("key", "Key", cap=40),
        Column("change", "From → to"),
        Column("reason", "Reason", cap=60),
    ),
    "requests": (
        Column("time", "Time"),
        Column("id", "Id"),
        # Capped so that the nine columns fit 120 cells; the detail pane shows each value whole.
        Column("model", "Model", cap=18),
        Column("went_to", "Went to", cap=20),
        Column("attempts", "Attempts"),
        Column("status", "Status", cap=18),
        Column("duration", "Duration", 8),
        Column("ttft", "TTFT"),
        Column("tokens", "Tokens"),
    ),
}

DEFAULT_VIEWS: Final[dict[str, View]] = {
    "breakers": View(sort=2),  # worst state first
    "connections": View(sort=2),
    "lockouts": View(sort=5, reverse=True),  # longest remaining first
    "events": View(sort=0, reverse=True),  # newest first
    "requests": View(sort=0, reverse=True),  # alive on top, then newest first
}

_BREAKER_RANK = {"OPEN": 0, "HALF_OPEN": 1, "DEGRADED": 2, "CLOSED": 3}
_CONNECTION_RANK = {
    "banned": 0,
    "expired": 0,
    "credits_exhausted": 0,
    "cooling": 1,
    "disabled": 2,
    "active": 3,
}


def _search(*parts: str) -> str:
    return " ".join(parts).lower()


# -- breakers -------------------------------------------------------------------------------------


def _traffic_cells(stats: StatsView | None) -> tuple[tuple[str, str], tuple[float, float]]:
    """The p50 and error-rate cells (5 minutes) of a breaker or connection row, and their sort keys."""
    if stats is None or not stats.requests:
        return (fmt.NONE, fmt.NONE), (-1.0, -1.0)
    cells = fmt.traffic(stats.requests, stats.p50_ms, stats.error_rate)
    return cells, (stats.p50_ms or 0.0, stats.error_rate or 0.0)


def breaker_row(b: BreakerView, stats: StatsView | None = None) -> Row:
    (p50, errors), (p50_key, errors_key) = _traffic_cells(stats)
    state = b.state
    retry = b.retry_after_ms
    pid = visible(b.provider)
    cls = b.provider_class
    last = b.last_failure_at
    return Row(
        key=b.provider,
        cells=(
            pid,
            cls,
            state,
            str(b.failures),
            f"{b.degradation_threshold} / {b.failure_threshold}",
            fmt.countdown(retry),
            str(b.open_cycles),
            fmt.clock_time(last),
            p50,
            errors,
        ),
        sort_keys=(
            pid,
            cls,
            float(_BREAKER_RANK[state]),
            float(b.failures),
            float(b.failure_threshold),
            retry,
            float(b.open_cycles),
            last or 0.0,
            p50_key,
            errors_key,
        ),
        style=fmt.BREAKER_STYLES[state],
        target=(b.provider,),
        search=_search(pid, cls, state),
    )


def breaker_detail(b: BreakerView, history: Sequence[TransitionView], now: float) -> Detail:
    lines: list[tuple[str, str]] = [
        (
            f"failures {b.failures} · degraded at {b.degradation_threshold} · opens at "
            f"{b.failure_threshold} · reset timeout {fmt.duration(b.reset_timeout_ms)} · "
            f"open cycles {b.open_cycles}",
            fmt.INFO,
        ),
    ]
    if not history:
        lines.append(("no transitions yet", fmt.OFF))
    for t in reversed(history):
        lines.append(
            (
                f"{fmt.clock_time(t.ts)}  {t.from_state} → {t.to_state}  {visible(t.reason)}",
                fmt.BREAKER_STYLES[t.to_state],
            )
        )
    # Instants, not countdowns: the row above counts down, and a detail that changed every
    # second would be repainted every second for nothing.
    suffix = f" · probe at {fmt.clock_time(now + b.retry_after_ms)}" if b.retry_after_ms > 0 else ""
    return Detail(f"{visible(b.provider)} · {b.state}{suffix}", tuple(lines))


# -- connections ----------------------------------------------------------------------------------


def connection_row(c: ConnectionView, stats: StatsView | None = None) -> Row:
    (p50, errors), (p50_key, errors_key) = _traffic_cells(stats)
    status = c.status
    left = c.remaining_ms
    provider, cid = visible(c.provider), visible(c.id)
    return Row(
        key=c.id,
        cells=(
            provider,
            cid,
            status,
            fmt.countdown(left),
            str(c.backoff_level),
            fmt.clip(fmt.readable_error(c.last_error), 32),
            str(c.error_code) if c.error_code is not None else fmt.NONE,
            fmt.in_flight(c.in_flight, c.max_concurrent),
            p50,
            errors,
        ),
        sort_keys=(
            c.provider,
            c.id,
            float(_CONNECTION_RANK[status]),
            left,
            float(c.backoff_level),
            c.last_error or "",
            float(c.error_code or 0),
            float(c.in_flight),
            p50_key,
            errors_key,
        ),
        style=fmt.CONNECTION_STYLES[status],
        target=(c.id,),
        search=_search(provider, cid, visible(c.name), status, visible(c.last_error or "")),
    )


def connection_detail(c: ConnectionView, locks: Sequence[LockoutView], history: Iterable[Entry]) -> Detail:
    """`locks`: the connection's running lockouts (the first three are shown)."""
    status = c.status
    lines: list[tuple[str, str]] = []
    if c.last_error:
        # As the table writes it (`503 the model server is overloaded`), then as it came, if the
        # upstream wrapped it (the wrapper can hold more than its message).
        readable = fmt.readable_error(c.last_error) or c.last_error
        lines.append((f"last error: {fmt.clip(readable, 200)}", fmt.CONNECTION_STYLES[status]))
        if readable != c.last_error:
            lines.append((f"as it came: {fmt.clip(c.last_error, 200)}", fmt.INFO))
        code = f" · code {c.error_code}" if c.error_code is not None else ""
        lines.append(
            (
                f"error type {visible(c.last_error_type or fmt.NONE)}{code} · at {fmt.clock_time(c.last_error_at)}",
                fmt.INFO,
            )
        )
    until = f"cooling until {fmt.clock_time(c.rate_limited_until)}" if c.remaining_ms > 0 else "not cooling"
    lines.append(
        (
            f"{until} · backoff level {c.backoff_level} · "
            f"priority {c.priority} · key {visible(c.masked_key or fmt.NONE)}",
            fmt.INFO,
        )
    )
    for lock in locks[:3]:
        lines.append(
            (
                f"locked model {visible(lock.model)} ({visible(lock.reason)}) "
                f"until {fmt.clock_time(lock.expires_at)}",
                fmt.WARN,
            )
        )
    lines.extend(_history_lines(history, "connection", c.id))
    enabled = "" if c.enabled or status == "disabled" else " · disabled"  # (said once)
    return Detail(f"{visible(c.id)} ({visible(c.provider)}) · {status}{enabled}", tuple(lines))


# -- lockouts -------------------------------------------------------------------------------------

LOCKOUT_REMAINING = 5
"""The Remaining column of a lockout row (its sort key is the deadline)."""


def lockout_key(provider: str, connection: str, model: str) -> str:
    return f"{provider}\x1f{connection}\x1f{model}"


def lockout_template(entry: LockoutView) -> Row:
    """Everything but the countdown, which `with_remaining` fills in for the rows on screen."""
    reason = visible(entry.reason if entry.status is None else f"{entry.reason} ({entry.status})")
    provider, cid, model = visible(entry.provider), visible(entry.connection_id), visible(entry.model)
    return Row(
        key=lockout_key(entry.provider, entry.connection_id, entry.model),
        cells=(
            provider,
            cid,
            model,
            reason,
            str(entry.failure_count),
            "",
            fmt.clock_time(entry.expires_at),
        ),
        sort_keys=(
            entry.provider,
            entry.connection_id,
            entry.model,
            reason,
            float(entry.failure_count),
            entry.expires_at,  # remaining time orders like the deadline, and the deadline is static
            entry.expires_at,
        ),
        style=fmt.WARN,
        target=(entry.provider, entry.connection_id, entry.model),
        search=_search(provider, cid, model, reason),
    )


def lockout_notice(status: LockoutTableStatus) -> tuple[str, str] | None:
    """What the Lockouts caption says about the table's bounds: full, locks not recorded, not-found
    locks evicted (each connection keeps at most `not_found_budget` of them)."""
    parts = []
    if status.full:
        parts.append(f"table full ({fmt.count(status.size)} of {fmt.count(status.capacity)})")
    if status.refused:
        parts.append(f"{fmt.count(status.refused)} new locks not recorded")
    if status.evicted:
        parts.append(
            f"{fmt.count(status.evicted)} not-found locks evicted "
            f"(at most {fmt.count(status.not_found_budget)} per connection)"
        )
    if not parts:
        return None
    return " · ".join(parts), fmt.BAD if status.full or status.refused else fmt.WARN


def with_remaining(template: Row, expires_at: float, now: float) -> Row:
    c = template.cells
    cells = (*c[:LOCKOUT_REMAINING], fmt.countdown(expires_at - now), *c[LOCKOUT_REMAINING + 1 :])
    return Row(template.key, cells, template.sort_keys, template.style, template.target, template.search)


def lockout_detail(entry: LockoutView, history: Iterable[Entry]) -> Detail:
    status = f" ({entry.status})" if entry.status is not None else ""
    lines: list[tuple[str, str]] = [
        (
            f"reason {visible(entry.reason)}{status} · failures in a row {entry.failure_count} · "
            f"last lock {fmt.duration(entry.last_cooldown_ms)}",
            fmt.WARN,
        ),
        (
            f"locked at {fmt.clock_time(entry.locked_at)} · expires at {fmt.clock_time(entry.expires_at)}",
            fmt.INFO,
        ),
    ]
    lines.extend(_history_lines(history, "lockout", f"{entry.provider}:{entry.connection_id}:{entry.model}"))
    return Detail(
        f"{visible(entry.provider)}/{visible(entry.model)} on {visible(entry.connection_id)}", tuple(lines)
    )


# -- requests -------------------------------------------------------------------------------------

ALIVE_FIRST: Final = 1e14
"""Added to an alive request's Time sort key: newest-first puts every alive request on top."""
_REQUEST_STYLES: Final = fmt.REQUEST_STATE_STYLES


def request_where(r: RequestView) -> str:
    if not r.attempts:
        return fmt.NONE
    last = r.attempts[-1]
    return visible(f"{last.provider}/{last.connection_id}")


def request_status(r: RequestView) -> str:
    """`200`, `429 all_targets_cooling`, `client gone`, or the alive state (`waiting`)."""
    if r.alive or r.status is None:
        return r.state.replace("_", " ")
    if r.state == "client_gone":
        return "client gone"
    return f"{r.status} {visible(r.code)}" if r.state == "failed" and r.code else str(r.status)


def request_row(r: RequestView, now: float) -> Row:
    """A finished request's row never changes; an alive one's Duration is its age, ticking."""
    alive = r.alive
    duration = (now - r.started_at) if alive else (r.duration_ms or 0.0)
    model = visible(r.model_asked or fmt.NONE)
    went = request_where(r)
    status = request_status(r)
    tokens = r.usage.total_tokens if r.usage is not None else None
    return Row(
        key=r.id,
        cells=(
            fmt.clock_time(r.started_at),
            r.id[:8],
            model,
            went,
            str(len(r.attempts)),
            status,
            fmt.latency(duration),
            fmt.latency(r.ttft_ms),
            fmt.count(tokens) if tokens is not None else fmt.NONE,
        ),
        sort_keys=(
            r.started_at + (ALIVE_FIRST if alive else 0.0),
            r.id,
            model,
            went,
            float(len(r.attempts)),
            status,
            duration,
            r.ttft_ms or 0.0,
            float(tokens or 0),
        ),
        style=_REQUEST_STYLES.get(r.state, fmt.INFO),
        search=_search(model, went, status, r.id, visible(r.client)),
    )


def request_detail(r: RequestView) -> Detail:
    """The trail in words, one line per skip, wait and attempt:
    `key-a  skipped  cooling 12 s (429 rate_limited)` / `key-b  429 in 180 ms → fallback` /
    `ollama-1  200 in 2.1 s, TTFT 340 ms, 512 tokens`."""
    # In the order it happened: what was passed over or waited for before attempt i, then it.
    attempts = len(r.attempts)
    before: list[list[tuple[str, str]]] = [[] for _ in range(attempts + 1)]
    for skip in r.skipped:
        who = visible(skip.connection_id or skip.target)
        before[min(skip.after, attempts)].append((f"{who}  skipped  {visible(skip.reason)}", fmt.WARN))
    for wait in r.waits:
        line = (f"waited {fmt.latency(wait.ms)}  {visible(wait.reason)}", fmt.PROBE)
        before[min(wait.after, attempts)].append(line)
    lines: list[tuple[str, str]] = []
    last = attempts - 1
    for i, a in enumerate(r.attempts):
        lines += before[i]
        if a.outcome == "pending":  # in flight: where it went, and what it is doing there
            lines.append((f"{visible(a.connection_id)}  {visible(a.reason)}", fmt.INFO))
            continue
        status = str(a.status) if a.status is not None else visible(a.reason)
        text = f"{visible(a.connection_id)}  {status} in {fmt.latency(a.duration_ms)}"
        if a.outcome == "ok" and i == last:
            if r.ttft_ms is not None:
                text += f", TTFT {fmt.latency(r.ttft_ms)}"
            if r.usage is not None and r.usage.total_tokens is not None:
                text += f", {fmt.counted(r.usage.total_tokens, 'token')}"
        elif a.status is not None and a.outcome != "ok":
            text += f" ({visible(a.reason.removeprefix(f'{a.status} '))})"
        words = fmt.OUTCOME_WORDS[a.outcome]
        style = fmt.OK if a.outcome == "ok" else fmt.BAD if a.outcome in ("fallback", "returned") else fmt.OFF
        lines.append((f"{text} {words}".rstrip(), style))
    lines += before[attempts]
    if not (r.skipped or r.waits or r.attempts):
        lines.append(("no upstream was tried", fmt.OFF))
    if r.message:
        lines.append((f"answered: {fmt.clip(r.message, 200)}", fmt.BAD))
    size = f"{fmt.count(r.bytes_in)} B in · {fmt.count(r.bytes_out)} B out"
    lines.append(
        (
            f"{visible(r.endpoint)} · {r.route} · {'stream · ' if r.stream else ''}{size} · from {visible(r.client)}",
            fmt.INFO,
        )
    )
    state = request_status(r)
    title = f"{r.id} · {visible(r.model_asked or fmt.NONE)} · {state} · at {fmt.clock_time(r.started_at)}"
    return Detail(title, tuple(lines))


# -- events ---------------------------------------------------------------------------------------


def event_entry(event: Event) -> Entry:
    if event.layer == "operator":
        # The engine names operator actions by their CLI command; the reason is the source.
        key, change, style = visible(f"omniroute {event.key}"), fmt.NONE, fmt.INFO
    else:
        key = visible(event.key.replace("\x1f", ":"))
        change = visible(f"{event.from_} → {event.to}")
        style = fmt.EVENT_STYLES.get(event.to, fmt.INFO)
    reason = visible(event.reason)
    row = Row(
        key=f"e{event.seq:010d}",
        cells=(fmt.clock_time(event.ts), visible(event.layer), key, change, reason),
        sort_keys=(event.ts, event.layer, key, change, reason),
        style=style,
        target=event_target(event.layer, event.key),
        search=_search(event.layer, key, change, reason),
    )
    return Entry(row, event.layer, event.key)


def event_target(layer: str, key: str) -> tuple[str, ...]:
    """Where `enter` on an event goes: (tab, row key) of its breaker, connection or lockout."""
    if layer == "breaker":
        return ("breakers", key)
    if layer == "connection":
        return ("connections", key)
    if layer == "lockout":
        # Provider and connection ids hold no colon (config ids); a model may ("llama3:70b").
        parts = key.split("\x1f") if "\x1f" in key else key.split(":", 2)
        if len(parts) == 3:
            return ("lockouts", lockout_key(*parts))
    return ()


def log_entry(n: int, ts: float, logger: str, level: str, message: str) -> Entry:
    style = fmt.BAD if level in ("ERROR", "CRITICAL") else fmt.WARN if level == "WARNING" else fmt.INFO
    text = fmt.clip(message, 300)
    row = Row(
        key=f"l{n:010d}",
        cells=(fmt.clock_time(ts), "log", visible(logger), visible(level), text),
        sort_keys=(ts, "log", logger, level, text),
        style=style,
        search=_search("log", visible(logger), level, text),
    )
    return Entry(row, "log", logger)


def _history_lines(history: Iterable[Entry], layer: str, key: str) -> list[tuple[str, str]]:
    matching = [e for e in history if e.layer == layer and e.key == key]
    lines = [(f"{e.row.cells[0]}  {e.row.cells[3]}  {e.row.cells[4]}", e.row.style) for e in matching[::-1]]
    return lines[:DETAIL_EVENTS] or [("no events in the recent history", fmt.OFF)]


# -- selection: filter, sort, cap -----------------------------------------------------------------


def arrange(rows: Iterable[Row], view: View) -> list[Row]:
    """Every row the view's filter keeps, in the view's order: (column key, row key), so the order
    is total. The table sorts its own rows by the same key and must land on exactly this order."""
    needle = view.filter.strip().lower()
    kept = [r for r in rows if needle in r.search] if needle else list(rows)
    column = view.sort
    kept.sort(key=lambda row: (row.sort_keys[column], row.key), reverse=view.reverse)
    return kept


def select(
    name: str, rows: Sequence[Row], view: View, *, limit: int = ROW_LIMIT, detail: Detail | None = None
) -> TableSnapshot:
    """The view applied to all rows, the first `limit` of them shown (small tables, rebuilt each tick)."""
    arranged = arrange(rows, view)
    return TableSnapshot(name, tuple(arranged[:limit]), view, len(rows), tuple(arranged), detail)


# -- overview and header --------------------------------------------------------------------------


SPARK_BARS: Final = "▁▂▃▄▅▆▇█"
TILE_SPARK: Final = 12
"""Statistics buckets (5 s each) a tile's latency sparkline covers: the last minute."""


def latency_spark(series: Sequence[float | None]) -> str:
    """One bar per bucket, scaled between the lowest and highest p50 shown; a blank: no request."""
    values = [v for v in series if v is not None]
    if not values:
        return ""
    low, high = min(values), max(values)
    extent = high - low or 1.0
    return "".join(" " if v is None else SPARK_BARS[round((v - low) / extent * 7)] for v in series)


def tile(b: BreakerView, latency: Sequence[float | None] = (), p50: float | None = None) -> Tile:
    if b.state == "OPEN":
        text = fmt.duration(b.retry_after_ms)
    elif b.state == "HALF_OPEN":
        text = "probe"
    else:
        text = f"{b.failures}/{b.failure_threshold}"
    spark = latency_spark(latency)
    # (an attached console is sent no sparkline, only the p50 it polls: that alone, named)
    shown = spark if p50 is None else f"{spark or 'p50'} {fmt.latency(p50)}"
    return Tile(
        visible(b.provider), b.state, text, fmt.BREAKER_STYLES[b.state], key=b.provider, latency=shown
    )


def overview(
    breakers: Iterable[BreakerView],
    unwell: Sequence[ConnectionView],
    history: Iterable[Entry],
    longest: Sequence[LockoutView],
    lockout_total: int,
    now: float,
    latencies: dict[str, tuple[list[float | None], float | None]] | None = None,
    fleet: dict[str, object] | None = None,
) -> Overview:
    """`unwell`: the connections that are not active; `longest`: the running lockouts with the most
    time left, longest first; `latencies`: per provider, its p50 per bucket and its p50 (1 minute)."""
    latencies = latencies or {}
    tiles = tuple(tile(b, *latencies.get(b.provider, ((), None))) for b in breakers)
    worst = heapq.nsmallest(
        OVERVIEW_ROWS, unwell, key=lambda c: (_CONNECTION_RANK[c.status], -c.remaining_ms, c.id)
    )
    cooling = tuple(
        Row(
            key=c.id,
            target=("connections", c.id),
            cells=(
                visible(c.id),
                c.status,
                fmt.countdown(c.remaining_ms),
                fmt.clip(fmt.readable_error(c.last_error), 60),
            ),
            sort_keys=(),
            style=fmt.CONNECTION_STYLES[c.status],
        )
        for c in worst
    )
    lockouts = tuple(
        Row(
            key=e.key,
            target=("lockouts", lockout_key(e.provider, e.connection_id, e.model)),
            cells=(
                visible(f"{e.provider}/{e.model}"),
                fmt.countdown(e.remaining_ms(now)),
                visible(e.connection_id),
                visible(e.reason),
            ),
            sort_keys=(),
            style=fmt.WARN,
        )
        for e in longest[:OVERVIEW_ROWS]
    )
    events = tuple(e.row for e in list(history)[-OVERVIEW_EVENTS:][::-1])
    return Overview(
        tiles,
        cooling,
        lockouts,
        events,
        lockout_total=lockout_total,
        cooling_total=len(unwell),
        replicas=replicas_line(fleet, now) if fleet else "",
    )


def replicas_line(fleet: dict[str, object], now: float) -> str:
    """`Replicas 2 · replica-a (this) http://10.0.0.5:20128 up 5m 02s, 3 in flight, seen 1s ago · …`"""
    listed = fleet.get("replicas")
    replicas = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
    me = fleet.get("replica")
    parts = [f"Replicas {len(replicas)}"]
    for r in replicas:
        seen = epoch_ms(r.get("lastSeen"))
        uptime = r.get("uptimeMs")
        this = " (this)" if r.get("id") == me else ""
        parts.append(
            f"{visible(str(r.get('id', '?')))}{this} {visible(str(r.get('address', '')))}"
            f" up {fmt.duration(float(uptime)) if isinstance(uptime, int | float) else '?'},"
            f" {r.get('inFlight', 0)} in flight,"
            f" seen {fmt.duration(max(0.0, now - seen)) if seen is not None else '?'} ago"
        )
    return " · ".join(parts)


def header(
    read: Observed,
    now: float,
    *,
    url: str,
    live: bool,
    read_only: bool,
    lockouts: int,
    stale: bool = False,
) -> Header:
    rates = read.rates(now, 30)
    traffic = read.traffic()
    backend = read.state_backend()
    fleet = read.fleet_api()
    state = f"{backend.get('kind')} lost" if backend.get("connected") is False else ""
    # The current second is still filling up: the last complete one is the honest rate.
    return Header(
        url=visible(url),
        version=visible(read.version),
        uptime=fmt.duration(now - read.started_at),
        rates=tuple(rates[:-1]),
        rate_now=fmt.rate(rates[-2] if len(rates) > 1 else 0),
        requests=f"{fmt.count(traffic.total)} req · {fmt.count(traffic.failed)} failed",
        open_breakers=read.open_breakers(now),
        cooling=read.cooling(now),
        lockouts=lockouts,
        live=live,
        stale=stale,
        read_only=read_only,
        replica=visible(str(fleet.get("replica", ""))) if fleet else "",
        state=visible(state),
    )
