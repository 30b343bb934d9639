"""The trail's pure parts: sliding-window statistics on explicit instants, reading usage and errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import Attempt, ConnectionSpec, Engine, ProviderSpec, Target
from proxy.readmodel import WINDOWS, SkipView, WaitView
from proxy.resilience.clock import FakeClock
from proxy.resilience.cooldown import DEFAULT_COOLDOWN_POLICIES, ConnectionHealth
from proxy.resilience.outcome import Outcome
from proxy.settings import Settings
from proxy.traffic import (
    BUCKET_MS,
    LAT,
    LAT_SUM,
    LATENCY_EDGES_MS,
    TTFT,
    TTFT_SUM,
    TrafficStats,
    Usage,
    count,
    merged_report,
)
from proxy.trail import (
    FOLD_BATCH,
    TOKENS_MAX,
    RequestRecord,
    Trail,
    cooled_by,
    error_of,
    finished,
    finished_id,
    finished_seq,
    finished_view,
    messages_stream_usage,
    span,
    stream_usage,
    usage_of,
)

T0 = 1_767_225_600_000.0  # a bucket boundary


def stats() -> TrafficStats:
    return TrafficStats({"p": ["c"]})


def add(s: TrafficStats, at: float, ms: float, *, error: bool = False, ttft: float | None = None) -> None:
    s.add("p", "c", at, ms, error, 500 if error else 200, ttft, None, None)


def test_a_window_counts_what_ended_within_it_and_forgets_it_after() -> None:
    s = stats()
    add(s, T0, 100)
    add(s, T0 + 30_000, 300, error=True)
    one = s.report("1m", T0 + 30_000).providers["p"]
    assert (one.requests, one.errors, one.error_rate) == (2, 1, 0.5)
    # 1m later the first request has left the 1-minute window, not the 5-minute one
    later = T0 + 60_000 + BUCKET_MS
    assert s.report("1m", later).providers["p"].requests == 1
    assert s.report("5m", later).providers["p"].requests == 2
    assert s.report("5m", T0 + 10 * 60_000).providers["p"].requests == 0
    assert s.report("15m", T0 + 10 * 60_000).connections["c"].requests == 2
    empty = s.report("15m", T0 + 16 * 60_000).providers["p"]
    assert (empty.requests, empty.p50_ms, empty.error_rate) == (0, None, None)


def test_a_jump_past_every_window_starts_over_but_keeps_the_totals() -> None:
    s = stats()
    add(s, T0, 100)
    add(s, T0 + 3 * 3600_000, 100)
    assert s.report("15m", T0 + 3 * 3600_000).providers["p"].requests == 1
    assert count(s.all_time("p"), LAT) == 2


def test_a_providers_figures_are_its_connections_added_up() -> None:
    s = TrafficStats({"p": ["a", "b"], "q": ["c"]})
    s.add("p", "a", T0, 100, False, 200, None, (3, 4, 7), None)
    s.add("p", "b", T0 + BUCKET_MS, 300, True, 500, None, None, None)
    s.add("q", "c", T0, 50, False, 200, None, None, None)
    now = T0 + BUCKET_MS
    report = s.report("1m", now)
    p = report.providers["p"]
    assert (p.requests, p.errors) == (2, 1)
    assert (report.connections["a"].requests, report.connections["b"].requests) == (1, 1)
    assert report.providers["q"].requests == 1
    # all time: a closed bucket (a's) and an open one (b's) both count, once
    assert count(s.all_time("p"), LAT) == 2 and count(s.all_time("q"), LAT) == 1
    series = s.p50_series("p", now, 2)
    assert series[0] is not None and series[1] is not None and series[0] < series[1]


def test_percentiles_are_interpolated_within_their_bins() -> None:
    s = stats()
    for ms in range(1, 101):  # 1..100 ms, evenly
        add(s, T0, float(ms), ttft=float(ms) * 10)
    view = s.report("1m", T0).providers["p"]
    assert view.p50_ms is not None and 40 <= view.p50_ms <= 60
    assert view.p95_ms is not None and 90 <= view.p95_ms <= 100
    assert view.ttft_p50_ms is not None and 400 <= view.ttft_p50_ms <= 600


def test_one_request_reads_as_its_own_latency_not_its_bins_middle() -> None:
    s = stats()
    add(s, T0, 320.0, ttft=120.0)  # bins (300, 400] and (100, 150]
    view = s.report("1m", T0).providers["p"]
    assert (view.p50_ms, view.p95_ms, view.ttft_p50_ms) == (320.0, 320.0, 120.0)


def test_the_slowest_bin_is_read_up_to_the_slowest_request_even_past_the_last_bound() -> None:
    s = stats()
    for _ in range(10):
        add(s, T0, 400_000.0)  # past the last bound (300 s): the open bin
    view = s.report("1m", T0).providers["p"]
    assert view.p50_ms == 400_000.0 and view.p95_ms == 400_000.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 400_000, allow_nan=False), min_size=1, max_size=40),
    st.lists(st.floats(0, 400_000, allow_nan=False), min_size=1, max_size=40),
    st.sampled_from(("1m", "5m", "15m")),
)
def test_percentiles_lie_between_the_fastest_and_the_slowest_request(
    here: list[float], there: list[float], window: str
) -> None:
    """Whatever the bins, an estimate never says a request took less than the fastest one or more
    than the slowest: on one connection, a provider of two, and two replicas' rows merged."""
    one, other = TrafficStats({"p": ["a", "b"]}), TrafficStats({"p": ["a", "b"]})
    for i, ms in enumerate(here):
        one.add("p", "ab"[i % 2], T0 + i, ms, False, 200, ms / 2, None, None)
    for ms in there:
        other.add("p", "a", T0, ms, False, 200, None, None, None)
    merged = merged_report(window, one.ids, [one.rows(T0 + 40)[window], other.rows(T0 + 40)[window]])
    for view, latencies in (
        (one.report(window, T0 + 40).providers["p"], here),
        (one.report(window, T0 + 40).connections["a"], here[::2]),
        (merged.providers["p"], here + there),
    ):
        low, high = min(latencies), max(latencies)
        assert view.p50_ms is not None and view.p95_ms is not None
        assert low - 0.05 <= view.p50_ms <= view.p95_ms <= high + 0.05, (view, low, high)
    ttft = one.report(window, T0 + 40).providers["p"].ttft_p50_ms
    assert ttft is not None and min(here) / 2 - 0.05 <= ttft <= max(here) / 2 + 0.05
    series = one.p50_series("p", T0 + 40, 1)
    assert series[0] is not None and min(here) - 0.05 <= series[0] <= max(here) + 0.05


def test_tokens_per_second_counts_streams_with_usage_only() -> None:
    s = stats()
    s.add("p", "c", T0, 2000, False, 200, 500, (10, 300, 310), 1500)
    s.add("p", "c", T0, 2000, False, 200, None, (10, 999, 1009), None)  # not a stream
    assert s.report("5m", T0).providers["p"].tokens_per_second == 200.0


def test_merged_rows_of_one_replica_read_as_its_own_report() -> None:
    s = TrafficStats({"p": ["a", "b"], "q": ["c"]})
    s.add("p", "a", T0, 100, False, 200, 40, (3, 4, 7), 80)
    s.add("p", "b", T0 + BUCKET_MS, 300, True, 500, None, None, None)
    now = T0 + 2 * BUCKET_MS
    rows = s.rows(now)
    assert set(rows) == {"1m", "5m", "15m"} and set(rows["1m"]) == {"a", "b"}  # idle c left out
    for window in rows:
        assert merged_report(window, s.ids, [json.loads(json.dumps(rows[window]))]) == s.report(window, now)


def test_a_fleets_statistics_add_counts_and_merge_histograms_never_average_percentiles() -> None:
    fast, slow = stats(), stats()
    for _ in range(9):
        add(fast, T0, 10)  # nine fast requests on one replica
    add(slow, T0, 1000, error=True)  # one slow failure on another
    merged = merged_report("1m", {"p": ["c"]}, [fast.rows(T0)["1m"], slow.rows(T0)["1m"]]).providers["p"]
    assert (merged.requests, merged.errors, merged.error_rate) == (10, 1, 0.1)
    one, other = fast.report("1m", T0).providers["p"], slow.report("1m", T0).providers["p"]
    assert one.p50_ms is not None and other.p50_ms is not None
    # The fleet's median is in the fast requests' bin (5-10 ms), not the average of two medians.
    assert merged.p50_ms is not None and 5 <= merged.p50_ms <= 10
    assert (one.p50_ms + other.p50_ms) / 2 > 400
    assert merged.p95_ms is not None and merged.p95_ms > 750
    # A row of another layout (another version's bins), or of an unknown connection, adds nothing.
    odd = merged_report("1m", {"p": ["c"]}, [fast.rows(T0)["1m"], {"c": [1.0] * 3, "zz": [1.0] * 99}])
    assert odd.providers["p"].requests == 9


def test_the_sparkline_series_is_one_p50_per_bucket() -> None:
    s = stats()
    add(s, T0, 100)
    add(s, T0 + 2 * BUCKET_MS, 1000)
    series = s.p50_series("p", T0 + 2 * BUCKET_MS, 4)
    assert series[0] is None and series[2] is None
    assert series[1] is not None and series[3] is not None and series[1] < series[3]


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(
                (0.0, 300.0, BUCKET_MS / 2, BUCKET_MS, 3 * BUCKET_MS, 40 * BUCKET_MS)
            ),  # the pause
            st.sampled_from(("a", "b", "read")),
            st.floats(0.5, 5_000),
        ),
        max_size=40,
    )
)
def test_a_sparkline_read_again_and_again_is_what_one_read_of_the_same_requests_gives(
    steps: list[tuple[float, str, float]],
) -> None:
    """The console reads each provider's sparkline every second: the p50 of a closed bucket is
    kept from one read to the next, and must be what a first read of the same requests says."""
    members = {"p": ["a", "b"]}
    read_often = TrafficStats(members)
    added: list[tuple[str, float, float]] = []
    now = T0
    for pause, what, ms in steps:
        now += pause
        if what != "read":
            read_often.add("p", what, now, ms, False, 200, None, None, None)
            added.append((what, now, ms))
            continue
        read_once = TrafficStats(members)
        for connection, at, took in added:
            read_once.add("p", connection, at, took, False, 200, None, None, None)
        assert read_often.p50_series("p", now, 12) == read_once.p50_series("p", now, 12)
        for window in WINDOWS:  # the Overview's provider figures are the report's
            assert read_often.providers(window, now) == read_once.report(window, now).providers


@pytest.mark.parametrize(
    ("ms", "words"),
    [(0, "0 ms"), (850, "850 ms"), (12_000, "12 s"), (112_000, "1m52s"), (7_500_000, "2h05m")],
)
def test_span(ms: float, words: str) -> None:
    assert span(ms) == words


def test_usage_of_an_answer_and_of_a_streams_tail() -> None:
    assert usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == (3, 4, 7)
    assert usage_of({"usage": None}) is None
    assert usage_of({"usage": {"prompt_tokens": "3"}}) is None
    assert usage_of({"usage": {"prompt_tokens": 0, "completion_tokens": 0}}) == (0, 0, 0)
    assert usage_of({"usage": {"input_tokens": 2, "output_tokens": 3}}) == (2, 3, 5)
    assert usage_of({"usage": {"prompt_tokens": True}}) is None
    completed = {"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 6}}}
    assert usage_of(completed) == (4, 6, 10)
    final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
    tail = (
        b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
        + b"data: "
        + json.dumps(final).encode()
        + b"\n\ndata: [DONE]\n\n"
    )
    assert stream_usage(tail) == (5, 4, 9)
    assert stream_usage(b'data: {"choices":[],"usage":null}\n\ndata: [DONE]\n\n') is None
    # An event that began before the tail (a large `response.completed`): its usage object, whole,
    # still reads; one cut short does not.
    assert stream_usage(b'cut-off "usage": {"prompt_tokens": 1}') == (1, None, None)
    assert stream_usage(b'ff"}],"usage":{"input_tokens":2,"output_tokens":3},"user":null}}\n\n') == (2, 3, 5)
    assert stream_usage(b'cut-off "usage": {"prompt_tokens": 1') is None
    assert stream_usage(b'a tool\'s "usage" text, "usage": 5') is None


def _usage_by_the_rules(answer: object) -> Usage | None:
    """What `usage_of` reads, spelt out with no fast path: its fast path must agree."""
    if not isinstance(answer, dict):
        return None
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        inner = answer.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            return None

    def said(key: str) -> int | None:
        value = usage.get(key)
        return value if type(value) is int and 0 <= value <= TOKENS_MAX else None

    if "prompt_tokens" in usage:
        prompt = said("prompt_tokens")
    else:
        prompt = said("input_tokens")
        if prompt is not None:
            prompt += (said("cache_creation_input_tokens") or 0) + (said("cache_read_input_tokens") or 0)
    completion = said("completion_tokens") if "completion_tokens" in usage else said("output_tokens")
    total = said("total_tokens")
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    return None if prompt is None and completion is None and total is None else (prompt, completion, total)


_COUNT = st.one_of(
    st.integers(-3, 10**6),
    st.just(TOKENS_MAX + 1),
    st.booleans(),
    st.floats(0, 10, allow_nan=False),
    st.text(max_size=2),
    st.none(),
)
_USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
_USAGE = st.one_of(
    st.dictionaries(st.sampled_from(_USAGE_KEYS), _COUNT),
    st.fixed_dictionaries({k: _COUNT for k in _USAGE_KEYS[:3]}),  # the chat completion's three
    st.lists(st.integers(), max_size=2),
    st.text(max_size=3),
    st.integers(),
    st.none(),
)


@settings(max_examples=400, deadline=None)
@given(
    answer=st.one_of(
        st.fixed_dictionaries({"usage": _USAGE}),
        st.fixed_dictionaries({"response": st.fixed_dictionaries({"usage": _USAGE})}),
        st.fixed_dictionaries({"usage": st.none(), "response": st.fixed_dictionaries({"usage": _USAGE})}),
        st.lists(st.integers(), max_size=2),
        st.text(max_size=3),
        st.none(),
    )
)
def test_usage_of_reads_any_answer_as_the_rules_say(answer: object) -> None:
    assert usage_of(answer) == _usage_by_the_rules(answer)


def test_a_messages_prompt_counts_what_its_cache_wrote_and_read() -> None:
    """Anthropic's `input_tokens` leaves out the prompt's cached part, which for a coding agent is
    nearly all of it: the prompt is the three counts (OpenAI's `prompt_tokens` already holds its
    cached tokens, and so does the Responses API's `input_tokens`)."""
    cached = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 1_000,
        "cache_read_input_tokens": 48_000,
        "output_tokens": 300,
    }
    assert usage_of({"type": "message", "usage": cached}) == (49_012, 300, 49_312)
    assert usage_of({"usage": {**cached, "cache_read_input_tokens": None}}) == (1_012, 300, 1_312)
    openai = {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
    assert usage_of({"usage": {**openai, "prompt_tokens_details": {"cached_tokens": 40}}}) == (50, 5, 55)
    head = _sse("message_start", {"type": "message_start", "message": {"usage": cached}})
    tail = _sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 301}})
    assert messages_stream_usage(head, tail) == (49_012, 301, 49_313)
    assert messages_stream_usage(b"", _sse("message_delta", {"type": "message_delta", "usage": cached})) == (
        49_012,
        300,
        49_312,
    )


def test_a_token_count_no_request_could_have_is_no_count() -> None:
    """`"prompt_tokens": 10**400` (legal JSON) made every read of the statistics a 500 (`int too
    large to convert to float`) and lost the requests folded with it; a count over a trillion
    tokens is not one any request has, so it reads as not said."""
    huge = 10**400
    assert usage_of({"usage": {"prompt_tokens": huge, "completion_tokens": 4, "total_tokens": huge}}) == (
        None,
        4,
        None,
    )
    assert usage_of({"usage": {"input_tokens": 10**12 + 1, "output_tokens": 2}}) == (None, 2, None)
    assert usage_of({"usage": {"prompt_tokens": 10**12, "completion_tokens": 0}}) == (10**12, 0, 10**12)
    assert stream_usage(b'data: {"usage": {"prompt_tokens": 1' + b"0" * 500 + b"}}\n\n") is None
    clock = FakeClock()
    trail, engine = _trail(clock)
    for n in range(FOLD_BATCH + 3):
        usage = usage_of({"usage": {"prompt_tokens": huge if n == 1 else 5, "completion_tokens": 1}})
        _served(trail, engine, clock, n, 10.0, 200, usage)
    report = trail.stats.report("5m", clock.now())
    assert report.providers["p"].requests == FOLD_BATCH + 3


def test_what_cooled_a_connection_is_its_status_and_kind_or_the_failure_that_had_none() -> None:
    # One wording for the trail's skips and the 429 answer (proxy.pipeline): a status reads as its
    # status and kind, never as the upstream's body; a network failure as it was told.
    health = ConnectionHealth("c", "p")
    assert cooled_by(health) is None
    policy = DEFAULT_COOLDOWN_POLICIES["local"]
    health.record_failure(T0, policy, error='503: {"error": "busy"}', error_type="server_error", code=503)
    assert cooled_by(health) == "503 server_error"
    health.record_failure(T0 + 10**6, policy, error="connection refused", error_type="network", code=None)
    assert cooled_by(health) == "connection refused"
    health.record_failure(T0 + 2 * 10**6, policy, error="x " * 500, error_type="network", code=None)
    said = cooled_by(health)
    assert said is not None and len(said) <= 100 and said.endswith("…")


def test_error_of_reads_code_and_message_only() -> None:
    assert error_of(b'{"error": {"message": "no", "code": "x", "type": "y"}}') == ("x", "no")
    assert error_of(b'{"error": {"message": "no", "code": null, "type": "y"}}') == ("y", "no")
    assert error_of(b"<html>") == (None, None)
    code, message = error_of(json.dumps({"error": {"message": "m" * 1000}}).encode())
    assert code is None and message is not None and len(message) == 200


def test_the_running_windows_match_a_recount_of_every_request() -> None:
    """Adds and reads interleaved at random instants (some in the same bucket, some far apart):
    each window always counts exactly the requests whose bucket is within its last N buckets."""
    import random

    from proxy.readmodel import WINDOWS

    rng = random.Random(11)
    s = stats()
    ended: list[tuple[int, bool]] = []  # (bucket, error)
    now = T0
    for _ in range(3000):
        now += rng.choice((0, 0, 300, 2_000, 5_000, 40_000, 400_000))
        if rng.random() < 0.7:
            error = rng.random() < 0.3
            add(s, now, rng.uniform(1, 5000), error=error)
            ended.append((int(now // BUCKET_MS), error))
        else:
            bucket = int(now // BUCKET_MS)
            for name, ms in WINDOWS.items():
                span = ms // BUCKET_MS
                inside = [e for b, e in ended if bucket - span < b <= bucket]
                view = s.report(name, now).providers["p"]
                assert (view.requests, view.errors) == (len(inside), sum(inside)), (name, now)


def _sse(event: str, data: dict[str, object]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@pytest.mark.parametrize(
    ("head_usage", "tail_usage", "expected"),
    [
        ({"input_tokens": 12, "output_tokens": 1}, {"output_tokens": 40}, (12, 40, 52)),
        ({"input_tokens": 12, "output_tokens": 1}, {"input_tokens": 12, "output_tokens": 40}, (12, 40, 52)),
        ({"input_tokens": 12, "output_tokens": 1}, None, (12, 1, 13)),
        (None, {"output_tokens": 40}, (None, 40, None)),
        (None, None, None),
    ],
)
def test_a_messages_stream_takes_the_prompt_from_its_start_and_the_output_from_its_end(
    head_usage: dict[str, int] | None, tail_usage: dict[str, int] | None, expected: object
) -> None:
    message: dict[str, object] = {"id": "msg_1", "type": "message"}
    if head_usage is not None:
        message["usage"] = head_usage
    head = _sse("message_start", {"type": "message_start", "message": message})
    delta: dict[str, object] = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    if tail_usage is not None:
        delta["usage"] = tail_usage
    tail = _sse("message_delta", delta) + _sse("message_stop", {"type": "message_stop"})
    assert messages_stream_usage(head, tail) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 400), st.floats(1, 5000)),
        max_size=30,
    ),
    st.lists(st.integers(0, 500), min_size=1, max_size=6),
)
def test_a_report_holds_exactly_the_requests_its_window_holds(
    requests: list[tuple[str, int, float]], reads: list[int]
) -> None:
    """Against a naive count: requests added (in time order) and reports read at any times in
    between, in any window; idle connections and reads that opened a bucket included. The
    percentiles lie between the fastest and the slowest request the window holds."""
    s = TrafficStats({"p": ["a", "b"], "q": ["c"]})
    events = sorted([(at, 0, r) for r in requests for at in [r[1]]] + [(at, 1, None) for at in reads],
                    key=lambda e: (e[0], e[1]))  # fmt: skip
    added: list[tuple[str, int, float]] = []
    for second, kind, request in events:
        now = T0 + second * 1000
        if kind == 0:
            assert request is not None
            connection, _, ms = request
            s.add("q" if connection == "c" else "p", connection, now, ms, False, 200, None, None, None)
            added.append((connection, int(now // BUCKET_MS), ms))
            continue
        bucket = int(now // BUCKET_MS)
        for window, span_ms in WINDOWS.items():
            report = s.report(window, now)
            inside = [(c, ms) for c, b, ms in added if bucket - span_ms // BUCKET_MS < b <= bucket]
            held = [c for c, _ in inside]
            for connection in "abc":
                assert report.connections[connection].requests == held.count(connection)
                took = [ms for c, ms in inside if c == connection]
                view = report.connections[connection]
                if took:  # the estimates lie within what the window's requests took
                    assert view.p50_ms is not None and view.p95_ms is not None
                    assert min(took) - 0.05 <= view.p50_ms <= view.p95_ms <= max(took) + 0.05
            assert report.providers["p"].requests == held.count("a") + held.count("b")
            assert report.providers["q"].requests == held.count("c")


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.floats(0, 400_000, allow_nan=False),
        st.sampled_from(LATENCY_EDGES_MS).map(float),  # exactly on a bound: the bin below it
        st.sampled_from(LATENCY_EDGES_MS).map(lambda edge: edge + 1e-9),
    ),
    st.one_of(st.none(), st.floats(0, 400_000, allow_nan=False)),
)
def test_a_request_lands_in_the_bins_the_bounds_say(ms: float, ttft: float | None) -> None:
    """The bins `add` finds (bisected on float copies of the bounds) are the ones a plain reading
    of LATENCY_EDGES_MS gives: the first bound at or above the value, or the last bin."""
    s = stats()
    add(s, T0, ms, ttft=ttft)
    row = s.all_time("p")

    def plain_bin(value: float) -> int:
        return next((i for i, edge in enumerate(LATENCY_EDGES_MS) if value <= edge), len(LATENCY_EDGES_MS))

    bins = len(LATENCY_EDGES_MS) + 1
    assert row[LAT : LAT + bins] == [1.0 if i == plain_bin(ms) else 0.0 for i in range(bins)]
    assert row[TTFT : TTFT + bins] == [
        1.0 if ttft is not None and i == plain_bin(ttft) else 0.0 for i in range(bins)
    ]
    assert row[LAT_SUM] == ms and row[TTFT_SUM] == (ttft or 0.0)


# -- the trail's statistics: taken in batches, read as if each request were added at its end ------------


def _trail(clock: FakeClock) -> tuple[Trail, Engine]:
    engine = Engine(
        [ProviderSpec("p", "local", per_model_quota=False)],
        [ConnectionSpec("c1", "p", priority=1), ConnectionSpec("c2", "p", priority=2)],
        clock=clock,
        settings=Settings(clock=clock),
    )
    return Trail(engine, clock, capacity=50), engine


def _served(
    trail: Trail, engine: Engine, clock: FakeClock, n: int, ms: float, status: int, usage: Usage | None = None
) -> None:
    """Request `n`: one attempt of `ms` from the clock's reading; the client got `status`, with
    `usage` read from the answer."""
    record = trail.begin(f"r{n}", "127.0.0.1", "chat")
    record.usage = usage
    decision = engine.select([Target("p", "m")])
    assert isinstance(decision, Attempt)
    clock.advance(ms)
    outcome = Outcome.ok()  # (the upstream's answer is the layers' business, not the statistics')
    recorded = engine.record(decision, outcome)
    trail.attempt(record, decision, outcome, recorded.verdict, recorded.status, committed=False)
    trail.end(record, status)  # what the client got: an error counts as one


_USAGES = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 10_000)),
    st.tuples(st.none(), st.integers(0, 5000), st.none()),  # an answer that said its output only
)


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("request"),
                st.sampled_from((0.0, 40.0, 900.0, 4_990.0, 61_000.0, 400_000.0)),  # the pause before it
                # many to a bucket (tenths of a millisecond: sums that round), or few
                st.one_of(st.integers(10, 400).map(lambda k: k / 10), st.floats(1, 20_000)),
                st.sampled_from((200, 200, 200, 500, 499)),
                st.sampled_from(("c1", "c1", "c2", None)),  # None: it reached no upstream
                st.one_of(st.none(), st.floats(0, 1)),  # a stream's first byte, as a share of its time
                _USAGES,
            ),
            st.tuples(st.just("read"), st.sampled_from(("1m", "5m", "15m"))),
        ),
        max_size=3 * FOLD_BATCH,
    )
)
def test_statistics_taken_in_batches_read_as_if_each_request_were_added_at_its_end(
    steps: list[tuple[object, ...]],
) -> None:
    """The trail adds finished requests to its statistics FOLD_BATCH at a time; whenever they are
    read, they must hold every request that ended, each in the bucket of its own end, exactly as
    statistics that took each one when it ended (`reference`) hold them: across bucket boundaries,
    windows passing by and reads between batches, on either connection or none, for streams,
    usage, failures and clients gone, to the last bit of every sum."""
    clock = FakeClock(T0)
    trail, _ = _trail(clock)
    reference = TrafficStats({"p": ["c1", "c2"]})
    for n, step in enumerate(steps):
        if step[0] == "read":
            window = step[1]
            assert isinstance(window, str)
            assert trail.stats.report(window, clock.now()) == reference.report(window, clock.now())
            continue
        _, pause, ms, status, connection, first, usage = step
        assert isinstance(pause, float) and isinstance(ms, float) and isinstance(status, int)
        clock.advance(pause)
        started = clock.now()
        record = trail.begin(f"r{n}", "127.0.0.1", "chat")
        clock.advance(ms)
        ttft = None if first is None else ms * first  # type: ignore[operator]
        if connection is not None:
            record.attempts.append(("p/m", "p", connection, started, ms, status, "ok", "ok"))  # type: ignore[arg-type]
            record.ttft_ms, record.usage = ttft, usage  # type: ignore[assignment]
        if status == 499:
            record.code = "client_disconnected"
        trail.end(record, status)
        took = clock.now() - started
        if connection is None:
            reference.add_unrouted(status)
        else:
            assert isinstance(connection, str)
            generation = took - ttft if ttft is not None else None
            reference.add("p", connection, clock.now(), took, status >= 400, status, ttft, usage, generation)  # type: ignore[arg-type]
    for window in WINDOWS:
        assert trail.stats.report(window, clock.now()) == reference.report(window, clock.now())
    assert trail.stats.by_status() == reference.by_status()
    assert trail.stats.unrouted == reference.unrouted
    assert trail.stats_rows(clock.now()) == reference.rows(clock.now())
    assert [trail.stats.all_time(p) for p in "p"] == [reference.all_time("p")]


def test_the_request_path_leaves_the_statistics_alone_until_a_batch_is_full() -> None:
    """What the batches are for: a request's end costs the statistics nothing until FOLD_BATCH
    requests have ended (then all of them go in at once); a read takes the rest at any time."""
    clock = FakeClock(T0)
    trail, engine = _trail(clock)
    untouched = trail._stats.rows(clock.now())
    for n in range(FOLD_BATCH - 1):
        _served(trail, engine, clock, n, 10.0, 200)
    assert trail._stats.rows(clock.now()) == untouched
    _served(trail, engine, clock, FOLD_BATCH, 10.0, 200)
    assert trail._stats.report("1m", clock.now()).providers["p"].requests == FOLD_BATCH
    _served(trail, engine, clock, FOLD_BATCH + 1, 10.0, 200)
    assert trail.stats.report("1m", clock.now()).providers["p"].requests == FOLD_BATCH + 1


def test_an_alive_records_attempt_in_flight_is_shown_pending_until_it_is_recorded() -> None:
    """A long stream says where it goes while it goes (found by an operator's trial: a streaming
    request read `Went to —`, no attempt): the attempt in flight is in the view as `pending`, with
    its time so far, and gives way to the recorded one."""
    clock = FakeClock(T0)
    trail, engine = _trail(clock)
    record = trail.begin("r1", "127.0.0.1", "chat")
    decision = engine.select([Target("p", "m")])
    assert isinstance(decision, Attempt)
    record.current = decision  # what the pipeline's attempt scope does at dispatch
    trail.state(record, "upstream")
    clock.advance(250)
    (pending,) = trail.alive_views()[0].attempts
    assert (pending.connection_id, pending.outcome, pending.status) == ("c1", "pending", None)
    assert (pending.reason, pending.duration_ms) == ("sent, no answer yet", 250)
    trail.first_byte(record)
    assert trail.view("r1").attempts[0].reason == "streaming"  # type: ignore[union-attr]
    outcome = Outcome.ok()
    recorded = engine.record(decision, outcome)
    trail.attempt(record, decision, outcome, recorded.verdict, recorded.status, committed=True)
    assert [a.outcome for a in trail.alive_views()[0].attempts] == ["ok"]
    trail.end(record, 200)
    assert [a.outcome for a in trail.view("r1").attempts] == ["ok"]  # type: ignore[union-attr]


_WORDS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_TIMES = st.floats(0, 2e12, allow_nan=False, allow_infinity=False)
_COUNTS = st.one_of(st.none(), st.integers(0, TOKENS_MAX))


@settings(max_examples=300, deadline=None)
@given(
    request_id=st.one_of(st.text("0123456789abcdef", min_size=16, max_size=16), _WORDS),
    seq=st.integers(1, 2**62),
    started=_TIMES,
    took=st.floats(0, 1e9, allow_nan=False),
    ttft=st.one_of(st.none(), st.floats(0, 1e9, allow_nan=False)),
    client=_WORDS,
    model=st.one_of(st.none(), _WORDS),
    stream=st.booleans(),
    status=st.one_of(st.none(), st.integers(100, 599)),
    state=st.sampled_from(("done", "failed", "client_gone")),
    code=st.one_of(st.none(), _WORDS),
    message=st.one_of(st.none(), _WORDS),
    usage=st.one_of(st.none(), st.tuples(_COUNTS, _COUNTS, _COUNTS)),
    sizes=st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)),
    attempts=st.lists(
        st.tuples(
            _WORDS,
            _WORDS,
            _WORDS,
            _TIMES,
            st.floats(0, 1e9, allow_nan=False),
            st.one_of(st.none(), st.integers(100, 599)),
            st.sampled_from(("ok", "fallback", "returned", "local", "disconnect")),
            _WORDS,
        ),
        max_size=5,
    ),
    skipped=st.one_of(
        st.none(), st.lists(st.builds(SkipView, _WORDS, st.none(), _WORDS, st.none()), max_size=2)
    ),
    waits=st.one_of(st.none(), st.lists(st.builds(WaitView, st.floats(0, 1e6), _WORDS), max_size=2)),
)
def test_the_ring_keeps_every_field_of_a_finished_record(
    request_id: str,
    seq: int,
    started: float,
    took: float,
    ttft: float | None,
    client: str,
    model: str | None,
    stream: bool,
    status: int | None,
    state: str,
    code: str | None,
    message: str | None,
    usage: Usage | None,
    sizes: tuple[int, int],
    attempts: list[tuple[str, str, str, float, float, int | None, str, str]],
    skipped: list[SkipView] | None,
    waits: list[WaitView] | None,
) -> None:
    """What the ring keeps of a record (packed: proxy.trail.finished) reads back as the record did."""
    record = RequestRecord(request_id, seq, started, client, "chat/completions")
    record.model_asked, record.stream, record.route = model, stream, "bare"
    record.status, record.state, record.code, record.message = status, state, code, message
    record.ttft_ms, record.usage = ttft, usage
    record.bytes_in, record.bytes_out = sizes
    record.attempts.extend(attempts)  # type: ignore[arg-type]
    record.skipped, record.waits = skipped, waits
    record.ended_at = started + took
    kept = finished(record)
    assert finished_view(kept) == record.view()
    assert (finished_id(kept), finished_seq(kept)) == (request_id, seq)


def test_a_record_is_read_as_soon_as_it_ends_before_its_batch_is_kept() -> None:
    clock = FakeClock()
    trail, engine = _trail(clock)
    for n in range(60):  # more than the ring's 50, and not a whole batch
        _served(trail, engine, clock, n, 10.0, 200)
    assert [v.id for v in trail.views()] == [f"r{n}" for n in range(10, 60)]
    assert trail.view("r59") is not None and trail.view("r9") is None
    views, mark = trail.finished_since(57)
    assert [v.id for v in views] == ["r57", "r58", "r59"] and mark == 60
    assert [v.id for v in trail.views(after=59)] == ["r59"]  # `after` is a seq: r59's is 60
