from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.resilience.watchdog import Activity, ThroughputWatchdog, WatchdogSettings, useful_bytes

START = 1_767_225_600_000.0
CASE_31 = WatchdogSettings(
    enabled=True, warmup_ms=1_000, window_ms=2_000, min_useful_bytes_per_second=10, min_useful_bytes=1
)


def _chat(content: str) -> dict[str, object]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}


TOOL_CALL = {
    "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}}]
}


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (_chat("Hello"), (5, Activity.TEXT)),
        (_chat("héllo"), (6, Activity.TEXT)),  # é is 2 bytes
        (_chat("日本"), (6, Activity.TEXT)),  # 3 bytes each
        (_chat("🙂"), (4, Activity.TEXT)),
        (_chat(""), (0, Activity.NONE)),
        ({"choices": [{"delta": {"role": "assistant"}}]}, (0, Activity.NONE)),
        ({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12}}, (0, Activity.NONE)),
        ({}, (0, Activity.NONE)),
        ({"choices": [{"delta": {"content": "ab"}}, {"delta": {"content": "cd€"}}]}, (7, Activity.TEXT)),
        ({"choices": [{"delta": {"content": "Hi", "reasoning_content": None}}]}, (2, Activity.TEXT)),
        (TOOL_CALL, (0, Activity.SUSPEND)),
        ({"choices": [{"delta": {"function_call": {"arguments": "{"}}}]}, (0, Activity.SUSPEND)),
        ({"choices": [{"delta": {"reasoning_content": "Let me think"}}]}, (0, Activity.SUSPEND)),
        ({"choices": [{"delta": {"reasoning": "Hmm"}}]}, (0, Activity.SUSPEND)),
        ({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}, (2, Activity.FINISH)),
        ({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}, (0, Activity.FINISH)),
        ({"type": "response.output_text.delta", "delta": "Grüße"}, (7, Activity.TEXT)),
        ({"type": "response.output_text.delta", "delta": ""}, (0, Activity.NONE)),
        ({"type": "response.function_call_arguments.delta", "delta": '{"a"'}, (0, Activity.SUSPEND)),
        ({"type": "response.reasoning_summary_text.delta", "delta": "x"}, (0, Activity.SUSPEND)),
        ({"type": "response.reasoning_text.delta", "delta": "x"}, (0, Activity.SUSPEND)),
        # every kind of tool call's input, and a tool the upstream runs itself, is a tool call in flight
        (
            {"type": "response.custom_tool_call_input.delta", "delta": "*** Begin Patch"},
            (0, Activity.SUSPEND),
        ),
        ({"type": "response.mcp_call_arguments.delta", "delta": '{"q"'}, (0, Activity.SUSPEND)),
        ({"type": "response.code_interpreter_call_code.delta", "delta": "import"}, (0, Activity.SUSPEND)),
        ({"type": "response.web_search_call.searching", "item_id": "ws_1"}, (0, Activity.SUSPEND)),
        ({"type": "response.file_search_call.in_progress", "item_id": "fs_1"}, (0, Activity.SUSPEND)),
        ({"type": "response.image_generation_call.generating", "item_id": "ig_1"}, (0, Activity.SUSPEND)),
        (
            {"type": "response.output_item.added", "item": {"type": "custom_tool_call", "input": ""}},
            (0, Activity.SUSPEND),
        ),
        ({"type": "response.output_item.added", "item": {"type": "message"}}, (0, Activity.NONE)),
        ({"type": "response.completed", "response": {}}, (0, Activity.FINISH)),
        ({"type": "response.created", "response": {}}, (0, Activity.NONE)),
        ({"type": "response.output_text.done", "text": "all of it"}, (0, Activity.NONE)),
        # Anthropic Messages
        (
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Grüße"}},
            (7, Activity.TEXT),
        ),
        ({"type": "content_block_delta", "delta": {"type": "text_delta", "text": ""}}, (0, Activity.NONE)),
        (
            {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}},
            (0, Activity.SUSPEND),
        ),
        (
            {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "x"}},
            (0, Activity.SUSPEND),
        ),
        (
            {"type": "content_block_start", "content_block": {"type": "tool_use", "id": "t"}},
            (0, Activity.SUSPEND),
        ),
        ({"type": "content_block_start", "content_block": {"type": "text", "text": ""}}, (0, Activity.NONE)),
        ({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}, (0, Activity.FINISH)),
        ({"type": "message_stop"}, (0, Activity.FINISH)),
        ({"type": "message_start", "message": {}}, (0, Activity.NONE)),
        ({"type": "ping"}, (0, Activity.NONE)),
    ],
)
def test_case_31_useful_bytes_per_event_form(
    event: dict[str, object], expected: tuple[int, Activity]
) -> None:
    assert useful_bytes(event) == expected


def test_case_31_steady_stream_never_aborts_over_60_s() -> None:
    dog = ThroughputWatchdog(CASE_31, START)
    aborted_at = []
    for step in range(0, 60_000, 100):
        now = START + step
        if step % 200 == 0:
            dog.observe(_chat("x" * 40), now)  # 40 B every 200 ms = 200 B/s
        else:
            dog.observe(None, now)  # a keep-alive comment in between
        if dog.should_abort(now):
            aborted_at.append(step)
    assert aborted_at == []


def test_case_31_pings_only_abort_at_warmup_plus_window() -> None:
    dog = ThroughputWatchdog(CASE_31, START)
    for step in range(0, 3_000, 500):
        dog.observe(None, START + step)
        dog.observe({"choices": [], "usage": {"completion_tokens": 0}}, START + step)
    assert dog.should_abort(START + 2_999) is False
    assert dog.should_abort(START + 3_000) is True


def test_case_31_a_tool_call_delta_suspends_judgement() -> None:
    dog = ThroughputWatchdog(CASE_31, START)
    for step in range(0, 4_000, 200):
        dog.observe(_chat("x" * 40), START + step)
    dog.observe(TOOL_CALL, START + 4_000)
    assert dog.suspended is True
    # Two minutes of pings while the tool call streams: never an abort.
    assert [s for s in range(4_000, 124_000, 250) if dog.should_abort(START + s)] == []

    # Text resumes at 124 s with a trickle (5 B/s if judged now): no judgement for one full window...
    dog.observe(_chat("x" * 10), START + 124_000)
    assert dog.suspended is False
    assert dog.should_abort(START + 124_500) is False
    assert dog.should_abort(START + 125_999) is False
    # ...and at 126 s that lone chunk is exactly one window old: nothing in the window.
    assert dog.should_abort(START + 126_000) is True


def test_resumed_text_at_a_healthy_rate_keeps_the_stream_alive() -> None:
    dog = ThroughputWatchdog(CASE_31, START)
    dog.observe({"choices": [{"delta": {"reasoning_content": "thinking"}}]}, START + 500)
    assert dog.should_abort(START + 30_000) is False
    for step in range(30_000, 40_000, 200):
        dog.observe(_chat("x" * 40), START + step)
        assert dog.should_abort(START + step) is False


def test_rate_is_judged_against_the_window_exactly() -> None:
    dog = ThroughputWatchdog(CASE_31, START)  # 10 B/s over 2 s: 20 B needed
    dog.observe(_chat("x" * 19), START + 2_500)
    assert dog.should_abort(START + 3_000) is True
    dog.observe(_chat("x"), START + 3_000)
    assert dog.should_abort(START + 3_000) is False
    assert dog.should_abort(START + 4_499) is False
    assert dog.should_abort(START + 4_500) is True  # the 19 B chunk left the window


def test_min_useful_bytes_applies_even_when_the_rate_is_met() -> None:
    settings = WatchdogSettings(
        enabled=True, warmup_ms=0, window_ms=2_000, min_useful_bytes_per_second=1, min_useful_bytes=100
    )
    dog = ThroughputWatchdog(settings, START)
    dog.observe(_chat("x" * 50), START + 1_000)  # 25 B/s, but under 100 B
    assert dog.should_abort(START + 2_000) is True
    dog.observe(_chat("x" * 50), START + 1_500)
    assert dog.should_abort(START + 2_000) is False


def test_disabled_watchdog_never_aborts() -> None:
    dog = ThroughputWatchdog(WatchdogSettings(enabled=False, warmup_ms=0, window_ms=1_000), START)
    dog.observe(None, START)
    assert [s for s in range(0, 600_000, 1_000) if dog.should_abort(START + s)] == []


def test_memory_stays_bounded_for_a_chatty_stream() -> None:
    dog = ThroughputWatchdog(CASE_31, START)
    for step in range(0, 60_000):  # one 1-byte chunk every millisecond for a minute
        dog.observe(_chat("x"), START + step)
    assert dog.should_abort(START + 59_999) is False
    assert len(dog._samples) <= 101  # one entry per 20 ms bucket within the 2 s window
    # Bucketing never undercounts: at least the exact 2,000 bytes of the window are seen.
    assert dog._bytes >= 2_000


@settings(max_examples=300, deadline=None)
@given(
    warmup=st.integers(0, 5_000),
    window=st.integers(1_000, 10_000),
    rate=st.integers(1, 50),
    least=st.integers(1, 200),
    events=st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 120), st.booleans()), max_size=30),
)
def test_due_is_the_moment_silence_would_be_cut(
    warmup: int, window: int, rate: int, least: int, events: list[tuple[int, int, bool]]
) -> None:
    """`due()` is when `should_abort` turns True if nothing more arrives (None while suspended):
    the relay waits that long for the next chunk, so a stream gone silent is cut on time (found
    by a trial: a silent stream was judged only when its upstream spoke again)."""
    dog = ThroughputWatchdog(
        WatchdogSettings(
            enabled=True,
            warmup_ms=warmup,
            window_ms=window,
            min_useful_bytes_per_second=rate,
            min_useful_bytes=least,
        ),
        0.0,
    )
    now = 0.0
    for gap, size, tool in events:
        now += gap
        dog.observe({"choices": [{"delta": {"tool_calls": [{}]}}]} if tool else _chat("x" * size), now)
    due = dog.due()
    if dog.suspended:
        assert due is None
        return
    assert due is not None
    # Judged on copies: `should_abort` trims what it holds. A moment already past is judged at once.
    assert _copy(dog).should_abort(max(due, now)) is True
    if due - 0.5 >= now:
        assert _copy(dog).should_abort(due - 0.5) is False, due


def _copy(dog: ThroughputWatchdog) -> ThroughputWatchdog:
    copy = ThroughputWatchdog.__new__(ThroughputWatchdog)
    for name in ThroughputWatchdog.__slots__:
        value = getattr(dog, name)
        setattr(copy, name, value.copy() if hasattr(value, "copy") else value)
    return copy
