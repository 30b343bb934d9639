"""The console's only collector: reads the instance's read model in-process and posts immutable snapshots.

Why one collector: the proxy serves from the same event loop, so every millisecond spent reading
the engine is a millisecond a request waits. So there is one re-armed one-shot timer (never
`set_interval`, so ticks cannot pile up), at most two ticks a second, and a tick builds nothing
unless something changed: bus events, finished requests, the view, or a countdown on screen.
Only the active tab's rows are built; the other tables catch up when they are shown.

The bus subscriber and the log handler only append to a deque: they run on the request path
(and, for logging, on any thread), so they must be O(1) and must not touch Textual. The deque is
bounded: it is drained only by a tick, and no tick runs while the console is paused or a dialog is
open, which may last hours under traffic. When it overflows, the oldest items are dropped and the
next drain reloads what they could have changed (see `_push`).
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Final

from textual.message_pump import MessagePump
from textual.timer import Timer

from omniroute_tui import format as fmt
from omniroute_tui import snapshot as snap
from omniroute_tui.messages import SnapshotReady
from omniroute_tui.snapshot import Detail, Entry, Overview, Row, Snapshot, SortKey, TableSnapshot, View
from proxy.readmodel import (
    DEFAULT_WINDOW,
    Event,
    LockoutView,
    Observed,
    RequestView,
    StatsReport,
    triple_of,
)

TICK_S: Final = 0.5
WINDOW_MARGIN: Final = 10
"""Rows above and below a table's screen that get fresh countdowns too (a short scroll)."""
HISTORY: Final = 1000
"""Events and log lines kept for the Events tab and the detail panes (the bus ring's size)."""
PENDING_LIMIT: Final = HISTORY
"""Events and log lines queued between two drains. No more than HISTORY can ever be shown, so an
overflow only drops items the history would have pushed out anyway; what else they carried (lockout
changes) is reloaded whole."""

_LogLine = tuple[float, str, str, str]
_REMAINING = snap.LOCKOUT_REMAINING  # the Remaining column: its sort key is the deadline


class LockoutIndex:
    """Every running lockout as a row, kept current from lockout events instead of rescanned.

    There can be 10,000 lockouts, and between two ticks usually only their countdowns move. The
    rows are kept in ascending (deadline, key) order: the locks that expired (silently, as a
    deadline passing) are a prefix cut by bisection, the default view (longest remaining first)
    is the list reversed, and a lockout event re-reads just its own triple. Other views are sorted
    once per change. The one change that has no event, success decay halving the count of a lock
    whose request was already in flight, shows at that triple's next event.
    """

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.entries: dict[str, tuple[LockoutView, Row]] = {}
        """By row key: the lockout as read and the row it was rendered into."""
        self.matching: tuple[Row, ...] = ()
        self._view: View | None = None
        self._arranged: list[Row] | None = None

    def load(self, active: list[LockoutView]) -> None:
        pairs = [(e, snap.lockout_template(e)) for e in active]
        self.entries = {row.key: (e, row) for e, row in pairs}
        self.rows = sorted((row for _, row in pairs), key=_order)
        self._arranged = None

    def update(self, read: Observed, keys: Iterable[tuple[str, ...]], now: float) -> None:
        for provider, connection, model in keys:
            old = self.entries.pop(snap.lockout_key(provider, connection, model), None)
            if old is not None:
                i = bisect.bisect_left(self.rows, _order(old[1]), key=_order)
                del self.rows[i]
            entry = read.lockout(provider, connection, model)
            if entry is not None and entry.expires_at > now:
                row = snap.lockout_template(entry)
                bisect.insort(self.rows, row, key=_order)
                self.entries[row.key] = (entry, row)
        self._arranged = None

    def expire(self, now: float) -> None:
        cut = bisect.bisect_right(self.rows, now, key=_deadline)
        if cut:
            for row in self.rows[:cut]:
                del self.entries[row.key]
            del self.rows[:cut]
            self._arranged = None

    def arranged(self, view: View) -> list[Row]:
        if self._arranged is None or view != self._view:
            if not view.filter.strip() and view.sort in _DEADLINE_COLUMNS:
                arranged = self.rows[::-1] if view.reverse else list(self.rows)
            else:
                arranged = snap.arrange(self.rows, view)
            self._arranged, self._view, self.matching = arranged, view, tuple(arranged)
        return self._arranged

    def longest(self, n: int) -> list[LockoutView]:
        return [self.entries[row.key][0] for row in self.rows[: -n - 1 : -1]]


_DEADLINE_COLUMNS = (5, 6)  # Remaining and Expires at: both sort by the deadline


def _order(row: Row) -> tuple[SortKey, str]:
    return (row.sort_keys[_REMAINING], row.key)


def _deadline(row: Row) -> float:
    return float(row.sort_keys[_REMAINING])


class RequestIndex:
    """The finished requests as rows, kept from tick to tick: a finished record never changes, so
    its view and row are built once, when it ends (`ReadModel.finished_requests` hands out only the
    new ones); only the alive requests (a few dozen) are read and rebuilt each tick."""

    def __init__(self) -> None:
        self.finished: deque[tuple[RequestView, Row]] = deque()
        self.by_id: dict[str, RequestView] = {}
        self._mark = 0
        self._epoch = 0

    def refresh(self, read: Observed, now: float) -> None:
        if read.requests_epoch != self._epoch:  # an attached console's instance restarted
            self._epoch = read.requests_epoch
            self.finished.clear()
            self.by_id.clear()
            self._mark = 0
        new, self._mark = read.finished_requests(self._mark)
        finished, by_id = self.finished, self.by_id
        capacity = read.request_history
        for view in new:
            if len(finished) >= capacity:
                old, _ = finished.popleft()
                if by_id.get(old.id) is old:
                    del by_id[old.id]
            finished.append((view, snap.request_row(view, now)))
            by_id[view.id] = view


class Feed:
    """Collects snapshots for `owner` (the app), which receives them as `SnapshotReady` messages.

    The owner sets the attributes that say what to collect (`tab`, `views`, `selected`, `paused`,
    `held`) and calls `request()` when the operator changed something that must show at once.
    """

    def __init__(
        self,
        owner: MessagePump,
        read: Observed,
        *,
        url: str,
        read_only: bool = False,
        live: bool = True,
        interval: float = TICK_S,
        limit: int = snap.ROW_LIMIT,
    ) -> None:
        self.owner = owner
        self.read = read
        self.url = url
        self.stale = False
        """An attached console's stream is down (the owner says so): the header says STALE."""
        self.read_only = read_only
        self.live = live
        """False (frozen clock): no periodic tick; snapshots are built only on request."""
        self.interval = interval
        self.limit = limit
        self.tab = "overview"
        self.views: dict[str, View] = dict(snap.DEFAULT_VIEWS)
        self.selected: dict[str, str | None] = {}
        self.windows: dict[str, tuple[int, int]] = {}
        """The rows (start, stop) each table has on screen: only they get fresh countdowns."""
        self.paused = False
        self.held: Callable[[], bool] = lambda: False
        """True while a modal screen is open: nobody sees the tables, so ticks are skipped."""
        self.history: deque[Entry] = deque(maxlen=HISTORY)
        self.last: Snapshot | None = None
        self._pending: deque[Event | _LogLine] = deque(maxlen=PENDING_LIMIT)
        self._overflowed = False
        """Items were dropped from `_pending` since the last drain: reload what they may have changed."""
        self._log_count = 0
        self._timer: Timer | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._scheduled = False
        self._body_key: object = None
        self._counters: tuple[int, int] = (-1, -1)
        self._body_second = -1
        self._second = -1
        self._moving = False
        self.lockouts = LockoutIndex()
        self._lockout_changes: set[tuple[str, ...]] | None = None
        """Triples touched by lockout events since the last tick; None: reload the whole table."""
        self._finished: dict[str, tuple[Row, Row]] = {}
        self.requests = RequestIndex()
        self.failures_only = False
        """The Requests tab shows failed requests only (`f`)."""

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        for event in self.read.events_after(0):  # what happened before the console opened
            self._push(event)
        self._unsubscribe = self.read.subscribe(self._push)
        self.request()
        if self.live:
            self._arm()

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.live = False

    def log(self, logger: str, level: str, message: str) -> None:
        """Thread-safe: a log record for the Events tab."""
        self._push((self.read.now(), logger, level, message))

    def _push(self, item: Event | _LogLine) -> None:
        # O(1) and thread-safe enough: deque.append is atomic, and the flag only ever goes to True
        # here (a race can at worst set it for an append that did not overflow: one extra reload).
        pending = self._pending
        if len(pending) >= PENDING_LIMIT:
            self._overflowed = True  # the append drops the oldest item
        pending.append(item)

    def reload(self) -> None:
        """What is read may have changed without an event saying so (an attached console's stream
        started over): rebuild the lockout index whole, then redraw (when paused: on resuming)."""
        self._overflowed = True
        if not self.paused:
            self.request()

    def request(self) -> None:
        """Build a snapshot as soon as the owner is idle, even when paused (the operator asked)."""
        if not self._scheduled:
            self._scheduled = True
            self.owner.call_later(self._requested)

    def _requested(self) -> None:
        self._scheduled = False
        self.collect(force=True)

    def _arm(self) -> None:
        self._timer = self.owner.set_timer(self.interval, self._tick, name="feed")

    def _tick(self) -> None:
        self._timer = None
        try:
            if not self.paused and not self.held():
                self.collect()
        finally:
            if self.live:
                self._arm()

    # -- collecting --------------------------------------------------------------------------------

    def collect(self, *, force: bool = False) -> Snapshot | None:
        """Build and post a snapshot if anything visible can have changed; returns it."""
        read = self.read
        now = read.now()
        self._drain()
        tab = self.tab
        # State changes (events, the operator's view) show within a tick. What merely counts (the
        # requests, a countdown, the uptime) moves once a second, header and body in the same tick:
        # Textual's compositor re-renders every widget under a frame's dirty region, so one frame
        # with both costs the proxy about half of two frames with one each (bench/tui.py).
        body_key = (
            read.last_seq,
            self._log_count,
            tab,
            self.views.get(tab),
            self.selected.get(tab),
            self.windows.get(tab),
            read.requests_version if tab == "requests" else 0,
            self.failures_only,
        )
        traffic = read.traffic()
        counters = (traffic.total, traffic.in_flight)
        second = int((now - read.started_at) // 1000)  # the uptime's seconds: one step per header
        changed = force or body_key != self._body_key
        header_due = changed or second != self._second
        body_due = changed or (second != self._body_second and (self._moving or counters != self._counters))
        if not (header_due or body_due):
            return None
        self._second = second
        lockouts = self._lockouts(now)
        head = snap.header(
            read,
            now,
            url=self.url,
            live=not self.paused,
            stale=self.stale,
            read_only=self.read_only,
            lockouts=len(lockouts.rows),
        )
        result = Snapshot(header=head, tab=tab)
        if body_due:
            self._body_key, self._counters, self._body_second = body_key, counters, second
            self._moving = (
                bool(head.open_breakers or head.cooling or head.lockouts) and tab != "events"
            ) or (
                tab == "requests" and read.alive_count() > 0  # their age ticks
            )
            body = self._body(tab, lockouts, now)
            result = replace(
                result,
                moving=self._moving,
                table=body if isinstance(body, TableSnapshot) else None,
                overview=body if isinstance(body, Overview) else None,
            )
        self.last = result
        self.owner.post_message(SnapshotReady(result))
        return result

    def _drain(self) -> None:
        pending = self._pending
        history = self.history
        if self._overflowed:
            # Lockout events were possibly dropped: the index cannot be patched, reload it whole.
            # (The history needs nothing: the newest PENDING_LIMIT items are all it can hold.)
            self._overflowed = False
            self._lockout_changes = None
        while pending:
            item = pending.popleft()
            if isinstance(item, Event):
                history.append(snap.event_entry(item))
                changes = self._lockout_changes
                if item.layer == "lockout" and changes is not None:
                    changes.add(triple_of(item.key))
            else:
                self._log_count += 1
                history.append(snap.log_entry(self._log_count, *item))

    def _lockouts(self, now: float) -> LockoutIndex:
        index, changes = self.lockouts, self._lockout_changes
        if changes is None or len(changes) > max(100, len(index.rows) // 4):
            index.load(self.read.lockouts(now))
        elif changes:
            index.update(self.read, changes, now)
        self._lockout_changes = set()
        index.expire(now)
        return index

    def _body(self, tab: str, lockouts: LockoutIndex, now: float) -> TableSnapshot | Overview | None:
        read = self.read
        if tab == "overview":
            longest = lockouts.longest(snap.OVERVIEW_ROWS)
            breakers = read.breakers(now)
            minute = read.provider_stats("1m", now) if read.recording else {}
            latencies = {
                b.provider: (
                    read.latency_series(b.provider, now, snap.TILE_SPARK),
                    minute[b.provider].p50_ms if b.provider in minute else None,
                )
                for b in breakers
            }
            return snap.overview(
                breakers,
                read.unwell(now),
                self.history,
                longest,
                len(lockouts.rows),
                now,
                latencies,
                fleet=read.fleet_api(),
            )
        if tab == "settings":
            return None
        view = self.views[tab]
        selected = self.selected.get(tab)
        table: TableSnapshot
        if tab == "requests":
            return self._requests_table(view, selected, now)
        # (The statistics only for the tabs that show them: a report reads every busy connection.)
        stats: StatsReport | None = (
            read.stats(DEFAULT_WINDOW, now) if read.recording and tab in ("breakers", "connections") else None
        )
        if tab == "breakers":
            breakers = read.breakers(now)
            picked = next((b for b in breakers if b.provider == selected), None)
            detail = (
                snap.breaker_detail(picked, read.breaker_history(picked.provider), now) if picked else None
            )
            per_provider = stats.providers if stats is not None else {}
            rows = [snap.breaker_row(b, per_provider.get(b.provider)) for b in breakers]
            table = snap.select(tab, rows, view, limit=self.limit, detail=detail)
        elif tab == "connections":
            connections = read.connections(now)
            conn = next((c for c in connections if c.id == selected), None)
            detail = (
                snap.connection_detail(conn, read.lockouts_of(conn.provider, conn.id, now), self.history)
                if conn
                else None
            )
            per_connection = stats.connections if stats is not None else {}
            rows = [snap.connection_row(c, per_connection.get(c.id)) for c in connections]
            table = snap.select(tab, rows, view, limit=self.limit, detail=detail)
        elif tab == "lockouts":
            table = self._lockout_table(lockouts, view, selected, now)
        else:
            table = snap.select(
                tab,
                [e.row for e in self.history],
                view,
                limit=self.limit,
                detail=self._event_detail(selected),
            )
        return table

    def _lockout_table(
        self, lockouts: LockoutIndex, view: View, selected: str | None, now: float
    ) -> TableSnapshot:
        arranged = lockouts.arranged(view)
        finished: dict[str, tuple[Row, Row]] = {}
        previous = self._finished
        start, stop = self.windows.get("lockouts", (0, self.limit))
        start, stop = start - WINDOW_MARGIN, stop + WINDOW_MARGIN

        def finish(template: Row, shown: bool) -> Row:
            # Only the rows on screen get a fresh countdown: with 10,000 lockouts every one of
            # them moves each second, and the table repaints only what is on screen anyway (a
            # scroll asks for a new snapshot at once). An unchanged row is handed over as the
            # same object, so the table skips it without comparing cells.
            expires_at = float(template.sort_keys[_REMAINING])
            last = previous.get(template.key)
            if (
                last is not None
                and last[0] is template
                and (not shown or last[1].cells[_REMAINING] == fmt.countdown(expires_at - now))
            ):
                row = last[1]
            else:
                row = snap.with_remaining(template, expires_at, now)
            finished[template.key] = (template, row)
            return row

        pair = lockouts.entries.get(selected) if selected is not None else None
        detail = snap.lockout_detail(pair[0], self.history) if pair is not None else None
        rows = tuple(finish(r, start <= i < stop) for i, r in enumerate(arranged[: self.limit]))
        self._finished = finished
        notice = snap.lockout_notice(self.read.lockout_table())
        return TableSnapshot("lockouts", rows, view, len(lockouts.rows), lockouts.matching, detail, notice)

    def _requests_table(self, view: View, selected: str | None, now: float) -> TableSnapshot:
        index = self.requests
        index.refresh(self.read, now)
        alive = self.read.alive_requests()
        failures = self.failures_only
        rows = [snap.request_row(r, now) for r in alive if not failures]
        rows += [row for r, row in index.finished if not failures or r.failed]
        picked = None
        if selected is not None:
            picked = next((r for r in alive if r.id == selected), None) or index.by_id.get(selected)
        detail = snap.request_detail(picked) if picked is not None else None
        table = snap.select("requests", rows, view, limit=self.limit, detail=detail)
        if failures:
            return replace(table, notice=("failures only (f shows every request)", fmt.WARN))
        return table

    def _event_detail(self, selected: str | None) -> Detail | None:
        if selected is None:
            return None
        for entry in reversed(self.history):
            if entry.row.key == selected:
                time, layer, key, change, reason = entry.row.cells
                return Detail(f"{time} · {layer} · {key}", ((change, entry.row.style), (reason, "info")))
        return None


# -- logging --------------------------------------------------------------------------------------


class FeedLogHandler(logging.Handler):
    """Sends log records to the Events tab instead of the terminal the console draws on."""

    def __init__(self, feed: Feed) -> None:
        super().__init__(logging.INFO)
        self.feed = feed

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                message = f"{message}: {type(error).__name__}: {error}"
            self.feed.log(record.name, record.levelname, message)
        except Exception:  # logging must never raise into the code that logged
            self.handleError(record)


_CAPTURED_LOGGERS: Final = ("uvicorn", "uvicorn.error", "uvicorn.access", "omniroute", "py.warnings")


@contextmanager
def captured_logging(handler: logging.Handler) -> Iterator[None]:
    """While the console runs, every log record goes to `handler` and nothing to the terminal.

    Handlers installed earlier (a StreamHandler holding the real stderr, uvicorn's own config)
    would write straight over the screen, so they are detached and put back afterwards.
    """
    root = logging.getLogger()
    saved = [(root, root.handlers[:], root.propagate)]
    for name in _CAPTURED_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers = []
        logger.propagate = True
    root.handlers = [handler]
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate
