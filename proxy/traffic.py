"""The traffic statistics, fed by the trail with the requests that ended (in batches: see
`proxy.trail.FOLD_BATCH`).

The statistics (`TrafficStats`) keep per provider and per connection a ring of 5-second buckets
(15 minutes) and running totals per window (1, 5 and 15 minutes): a request adds to its bucket
and to each window's totals, and a bucket leaving a window is subtracted from it, so a read
never scans records or buckets. Latencies are counted in fixed histogram bins (the same ones
`/metrics` exposes); percentiles are interpolated within a bin, and each bucket also keeps its
fastest and slowest latency, so that an estimate never lies outside what the window's requests
took (one request of 320 ms reads as 320 ms, not as the middle of its 300-400 ms bin).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from operator import add, sub

from proxy.readmodel import WINDOWS, StatsReport, StatsView

Usage = tuple[int | None, int | None, int | None]
"""(prompt, completion, total) tokens, as `UsageView` holds them."""

BUCKET_MS = 5000
"""The statistics' resolution: a window is its current bucket plus whole ones before it."""
SLOTS = max(WINDOWS.values()) // BUCKET_MS
LATENCY_EDGES_MS: tuple[float, ...] = (
    5, 10, 25, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 4000, 5000,
    7500, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000, 90_000, 120_000, 180_000, 300_000,
)  # fmt: skip
"""Upper bounds of the latency (and TTFT) histogram bins; one more bin holds everything above."""
_EDGES = tuple(float(edge) for edge in LATENCY_EDGES_MS)
"""The same bounds as floats, for `bisect`: a latency is a float, and a float compared with an int
takes CPython's slow mixed-type path (half the cost of a request's statistics, on 3.11). Every
bound is an integer, so the bins found are the same."""
_BUCKET = float(BUCKET_MS)
"""The bucket width as a float: `now` is one, and a float divided by an int converts it first."""
_BINS = len(LATENCY_EDGES_MS) + 1

# The layout of one bucket, one window's totals and the all-time totals: a flat list of numbers.
# No request counts: a request adds one to a latency bin (and, when it streamed, to a TTFT bin),
# so the counts are the bins added up, when read.
ERRORS, STREAM_TOKENS, STREAM_MS, PROMPT, COMPLETION, LAT_SUM, TTFT_SUM = range(7)
LAT = 7
TTFT = LAT + _BINS
_WIDTH = TTFT + _BINS
"""The part of a row that adds up: a window's totals are its buckets' rows added (and taken away)."""
LAT_MIN, LAT_MAX, TTFT_MIN, TTFT_MAX = range(_WIDTH, _WIDTH + 4)
"""The extremes, after the part that adds up: they do not subtract, so a window's are found from
its buckets when read (`_Series.window`), and the all-time row keeps none."""
_FULL = _WIDTH + 4
_NONE = 1e300
"""The fastest latency of a row that holds none (finite: a row goes to other replicas as JSON)."""
_BLANK = (0.0,) * _WIDTH + (_NONE, 0.0, _NONE, 0.0)


def _blank() -> list[float]:
    return list(_BLANK)


def _served_any(row: list[float]) -> bool:
    """Whether a request went into a bucket's row (each one narrows its fastest latency)."""
    return row[LAT_MIN] != _NONE


def count(row: list[float], start: int) -> float:
    """How many the histogram at row[start:start+_BINS] holds (LAT: requests; TTFT: streams)."""
    return sum(row[start : start + _BINS])


class _Series:
    """One connection's buckets and window totals.

    A request adds to one row only: its bucket's. Each window's totals, and the all-time totals,
    hold *closed* buckets: a bucket is added to them when it closes (the first request or read of
    a later bucket), and subtracted from a window's when it leaves it; a read adds the current
    bucket. A provider's figures are its connections' added up when read (a connection belongs to
    one provider), so a request costs the same whatever a provider holds.
    """

    __slots__ = (
        "bucket_of",
        "buckets",
        "current",
        "extremes",
        "last",
        "latest",
        "statuses",
        "total",
        "windows",
    )

    def __init__(self) -> None:
        self.buckets = [_blank() for _ in range(SLOTS)]
        self.bucket_of = [-1] * SLOTS
        """The bucket number each slot holds (-1: none)."""
        self.windows = [_blank() for _ in _SPANS]
        self.total = _blank()
        """Closed buckets since the start (for /metrics' counters and histograms)."""
        self.last = -1
        self.current = self.buckets[0]
        """The row of bucket `last`."""
        self.statuses: dict[int, int] = {}
        """Finished requests per status since the start (0: none, the client went first)."""
        self.extremes: list[tuple[int, list[float]]] = [(-1, list(_BLANK[LAT_MIN:])) for _ in _SPANS]
        """Per window, the extremes of its closed buckets as of bucket `last` (`_closed_extremes`)."""
        self.latest = -1 - SLOTS
        """The bucket of the latest request: a window that ends past it by its span is empty,
        which a read then knows without summing (most connections of a large config are idle)."""

    def advance(self, bucket: int) -> None:
        last = self.last
        if bucket <= last:
            return
        buckets, bucket_of, windows = self.buckets, self.bucket_of, self.windows
        # (A row no request went into adds nothing, and is passed over: a read opens the current
        # bucket of every connection it looks at, and most connections of a large config are idle.)
        if last >= 0 and _served_any(self.current):
            _add(self.total, self.current)  # bucket `last` closes
        if last < 0 or bucket - last > SLOTS:
            for row in windows:
                row[:] = _BLANK
            bucket_of[:] = [-1] * SLOTS
        else:
            for b in range(last + 1, bucket + 1):
                closed = b - 1
                slot = closed % SLOTS
                if bucket_of[slot] == closed and _served_any(new := buckets[slot]):
                    for totals in windows:
                        _add(totals, new)
                for spans, totals in zip(_SPANS, windows, strict=True):
                    gone = b - spans
                    slot = gone % SLOTS
                    if bucket_of[slot] == gone and _served_any(old := buckets[slot]):
                        totals[:_WIDTH] = map(sub, islice(totals, _WIDTH), old)
        # Slots skipped over hold stale buckets: their numbers tell, and they are reset when their
        # number comes round.
        slot = bucket % SLOTS
        if bucket_of[slot] != bucket:
            buckets[slot] = _blank()
            bucket_of[slot] = bucket
        self.current = buckets[slot]
        self.last = bucket

    def window(self, w: int, bucket: int) -> list[float]:
        """Window `w`'s totals as of `bucket` (the current bucket included), with the extremes of
        the buckets it holds (a fresh list)."""
        self.advance(bucket)
        closed, current = self.windows[w], self.current
        now_too = self.last == bucket  # (else a bucket before the last one: nothing of now to add)
        row = list(map(add, closed, current)) if now_too else closed[:]
        row[LAT_MIN:] = self._closed_extremes(w)
        if now_too:
            _extend(row, current)
        return row

    def _closed_extremes(self, w: int) -> list[float]:
        """The extremes of window `w`'s closed buckets, (last - span, last - 1]: found from them
        once per bucket (a closed bucket never changes), so that a read stays O(1)."""
        last = self.last
        cached = self.extremes[w]
        if cached[0] == last:
            return cached[1]
        found = _blank()
        buckets, bucket_of = self.buckets, self.bucket_of
        for b in range(last - _SPANS[w] + 1, last):
            slot = b % SLOTS
            if bucket_of[slot] == b:
                _extend(found, buckets[slot])
        extremes = found[LAT_MIN:]
        self.extremes[w] = (last, extremes)
        return extremes

    def all_time(self) -> list[float]:
        """Everything since the start, the open bucket included (no extremes: see LAT_MIN)."""
        if self.last < 0:
            return list(self.total)
        return [a + b for a, b in zip(self.total, self.current, strict=True)]

    def bucket(self, b: int) -> list[float] | None:
        """Bucket `b`'s row, if this series still holds it."""
        slot = b % SLOTS
        return self.buckets[slot] if self.bucket_of[slot] == b else None


def _add(into: list[float], row: list[float]) -> None:
    # (map: the loop in C. A provider's figures add up its connections' rows at every read, and a
    # row is 67 numbers: the console's Overview read 200 connections' in 4 ms, a Python loop each.)
    into[:_WIDTH] = map(add, islice(into, _WIDTH), row)


def _extend(into: list[float], row: Sequence[float]) -> None:
    """Widen `into`'s extremes to take in `row`'s."""
    into[LAT_MIN] = min(into[LAT_MIN], row[LAT_MIN])
    into[LAT_MAX] = max(into[LAT_MAX], row[LAT_MAX])
    into[TTFT_MIN] = min(into[TTFT_MIN], row[TTFT_MIN])
    into[TTFT_MAX] = max(into[TTFT_MAX], row[TTFT_MAX])


def _summed(rows: Iterable[list[float]]) -> list[float]:
    total = _blank()
    for row in rows:
        _add(total, row)
        _extend(total, row)
    return total


_SPANS = tuple(ms // BUCKET_MS for ms in WINDOWS.values())
_WINDOW_INDEX = {name: i for i, name in enumerate(WINDOWS)}


class TrafficStats:
    """Per provider and per connection, over the windows of WINDOWS, kept as requests end.

    `members`: each provider's connection ids (a connection id belongs to one provider)."""

    def __init__(self, members: Mapping[str, Sequence[str]]) -> None:
        self.ids = {p: list(ids) for p, ids in members.items()}
        self.connections = {c: _Series() for ids in members.values() for c in ids}
        self.members = {p: [self.connections[c] for c in ids] for p, ids in members.items()}
        self.unrouted: dict[int, int] = {}
        """Finished requests that reached no upstream, per status."""
        self._p50s: dict[str, dict[int, float | None]] = {}
        """Per provider, the p50 of each closed bucket a sparkline has shown: the console reads
        every provider's sparkline every second, and only the open bucket's can have moved."""

    def add(
        self,
        provider: str,
        connection: str,
        now: float,
        duration_ms: float,
        error: bool,
        status: int | None,
        ttft_ms: float | None,
        usage: Usage | None,
        generation_ms: float | None,
    ) -> None:
        # (Subscripts, not `.get`: a method call costs more than the rare KeyError's handler.)
        try:
            series = self.connections[connection]
        except KeyError:
            return
        code = status or 0
        try:
            series.statuses[code] += 1
        except KeyError:
            series.statuses[code] = 1
        bucket = int(now // _BUCKET)
        if bucket != series.last:
            series.advance(bucket)
        series.latest = bucket  # (not only on a new bucket: a read may have opened this one)
        row = series.current
        # Floats added to floats (1.0, not 1): an int added to a float is converted first.
        row[LAT_SUM] += duration_ms
        row[LAT + bisect_left(_EDGES, duration_ms)] += 1.0
        if duration_ms > row[LAT_MAX]:
            row[LAT_MAX] = duration_ms
        if duration_ms < row[LAT_MIN]:
            row[LAT_MIN] = duration_ms
        if error:
            row[ERRORS] += 1.0
        if ttft_ms is not None:
            row[TTFT_SUM] += ttft_ms
            row[TTFT + bisect_left(_EDGES, ttft_ms)] += 1.0
            if ttft_ms > row[TTFT_MAX]:
                row[TTFT_MAX] = ttft_ms
            if ttft_ms < row[TTFT_MIN]:
                row[TTFT_MIN] = ttft_ms
        if usage is not None:
            completion = usage[1]
            row[PROMPT] += usage[0] or 0
            if completion:
                row[COMPLETION] += completion
                if generation_ms is not None and generation_ms > 0:
                    row[STREAM_TOKENS] += completion
                    row[STREAM_MS] += generation_ms

    def add_unrouted(self, status: int | None) -> None:
        key = status or 0
        self.unrouted[key] = self.unrouted.get(key, 0) + 1

    def report(self, window: str, now: float) -> StatsReport:
        rows = self._served(_WINDOW_INDEX[window], int(now // BUCKET_MS))
        return StatsReport(
            window,
            self._providers(rows),
            {c: _stats(rows[c]) if c in rows else _IDLE for c in self.connections},
        )

    def providers(self, window: str, now: float) -> dict[str, StatsView]:
        """`report(window, now).providers`, without a view of every connection."""
        return self._providers(self._served(_WINDOW_INDEX[window], int(now // BUCKET_MS)))

    def _providers(self, rows: dict[str, list[float]]) -> dict[str, StatsView]:
        return {
            p: _stats(_summed(row for c in ids if (row := rows.get(c)) is not None))
            for p, ids in self.ids.items()
        }

    def rows(self, now: float) -> dict[str, dict[str, list[float]]]:
        """Every window's raw totals per connection as of `now` (window name -> connection -> row),
        idle connections left out: what a fleet's replica publishes, for `merged_report` to add up
        on another replica. Fresh lists (never a series' own)."""
        bucket = int(now // BUCKET_MS)
        out: dict[str, dict[str, list[float]]] = {}
        for name, w in _WINDOW_INDEX.items():
            rows = self._served(w, bucket)
            out[name] = {c: list(row) for c, row in rows.items() if any(row)}
        return out

    def _served(self, w: int, bucket: int) -> dict[str, list[float]]:
        """Window `w`'s totals as of `bucket` of the connections that served a request in it (a
        series' own list may be among them: not to be changed). The others are idle, which their
        latest request's bucket says without summing: most connections of a large config are."""
        since = bucket - _SPANS[w]  # the window holds buckets (since, bucket]
        return {c: s.window(w, bucket) for c, s in self.connections.items() if s.latest > since}

    def by_status(self) -> dict[tuple[str, str, int], int]:
        """Finished requests per (provider, connection, status) since the start (for /metrics)."""
        return {
            (provider, connection, code): n
            for provider, ids in self.ids.items()
            for connection in ids
            for code, n in self.connections[connection].statuses.items()
        }

    def all_time(self, provider: str) -> list[float]:
        """A provider's totals since the start (its connections' added up)."""
        return _summed(s.all_time() for s in self.members.get(provider, ()))

    def p50_series(self, provider: str, now: float, buckets: int) -> list[float | None]:
        series = self.members.get(provider)
        if series is None:
            return []
        current = int(now // BUCKET_MS)
        for s in series:
            s.advance(current)  # every bucket before `current` is closed now: it cannot change
        known = self._p50s.setdefault(provider, {})
        out: list[float | None] = []
        for b in range(current - min(buckets, SLOTS) + 1, current + 1):
            if b in known:
                out.append(known[b])
                continue
            rows = [row for s in series if (row := s.bucket(b)) is not None and _served_any(row)]
            p50 = None
            if rows:
                row = _summed(rows)
                p50 = _quantile(row, LAT, count(row, LAT), 0.5)
            if b < current:
                known[b] = p50
            out.append(p50)
        if len(known) > SLOTS:
            for b in [b for b in known if b <= current - SLOTS]:
                del known[b]
        return out


_IDLE = StatsView(0, 0, None, None, None, None, None)
"""A connection's figures over a window it served no request in."""

ROW_WIDTH = _FULL
"""The length of one raw row (`TrafficStats.rows`): a row of another length (another layout of
the bins) cannot be added and is left out by `merged_report`."""


def merged_report(
    window: str, members: Mapping[str, Sequence[str]], parts: Iterable[Mapping[str, Sequence[float]]]
) -> StatsReport:
    """One window's report over several replicas' raw rows (`TrafficStats.rows()[window]` each).

    The rows are added up bin by bin, then read like one replica's: counts, errors and token sums
    add, the extremes widen, and the percentiles come from the merged histograms (never an
    average of percentiles).
    `members`: each provider's connection ids, as `TrafficStats` takes them."""
    totals = {c: _blank() for ids in members.values() for c in ids}
    for part in parts:
        for connection, row in part.items():
            into = totals.get(connection)
            if into is None or len(row) != _FULL:
                continue
            row = [float(x) for x in row]
            _add(into, row)
            _extend(into, row)
    return StatsReport(
        window,
        {p: _stats(_summed(totals[c] for c in ids)) for p, ids in members.items()},
        {c: _stats(row) for c, row in totals.items()},
    )


def _stats(row: list[float]) -> StatsView:
    n = count(row, LAT)
    requests = round(n)
    if requests <= 0:
        return _IDLE
    errors = round(row[ERRORS])
    tokens, ms = row[STREAM_TOKENS], row[STREAM_MS]
    return StatsView(
        requests,
        errors,
        round(errors / requests, 4),
        _quantile(row, LAT, n, 0.5),
        _quantile(row, LAT, n, 0.95),
        _quantile(row, TTFT, count(row, TTFT), 0.5),
        round(tokens * 1000 / ms, 1) if ms > 0 else None,
    )


def _quantile(row: list[float], start: int, count: float, q: float) -> float | None:
    """The q-quantile of the histogram at row[start:start+_BINS], interpolated within its bin, the
    bin narrowed to the row's fastest and slowest (which lie in its first and last bins): so the
    estimate never leaves what was measured, and the open bin past the last bound has a top."""
    if count < 0.5:
        return None
    extremes = LAT_MIN if start == LAT else TTFT_MIN
    fastest, slowest = row[extremes], row[extremes + 1]
    known = fastest <= slowest
    rank = q * count
    seen = 0.0
    for i in range(_BINS):
        n = row[start + i]
        if n <= 0:
            continue
        if seen + n >= rank:
            low = float(LATENCY_EDGES_MS[i - 1]) if i > 0 else 0.0
            high = float(LATENCY_EDGES_MS[i]) if i < len(LATENCY_EDGES_MS) else low
            if known:
                low = max(low, fastest)
                high = max(low, slowest if i == len(LATENCY_EDGES_MS) else min(high, slowest))
            return round(low + (high - low) * (rank - seen) / n, 1)
        seen += n
    return None


def histogram(total: list[float], start: int) -> tuple[list[tuple[str, float]], float]:
    """(cumulative `le` buckets in seconds, sum in seconds) of an all-time row's histogram, for /metrics."""
    buckets: list[tuple[str, float]] = []
    seen = 0.0
    for i, edge in enumerate(LATENCY_EDGES_MS):
        seen += total[start + i]
        buckets.append((repr(edge / 1000), seen))
    seen += total[start + len(LATENCY_EDGES_MS)]
    buckets.append(("+Inf", seen))
    return buckets, total[LAT_SUM if start == LAT else TTFT_SUM] / 1000
