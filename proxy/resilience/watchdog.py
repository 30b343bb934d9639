"""Stream throughput watchdog: abort a stream that trickles without saying much.

For operators: docs/resilience.md#streams-and-the-throughput-watchdog.

A pure function of the events observed and the time; the relay feeds it and asks it. Exact rules:

- Useful bytes are the UTF-8 length of assistant text in an event (see `useful_bytes`). Pings,
  comments, unparsable lines, usage-only and empty events count 0 and reset nothing.
- The window at time `now` is the half-open interval `(now - window_ms, now]`: an event exactly
  `window_ms` old no longer counts.
- Judgement starts at `start + warmup_ms + window_ms`. From then on `should_abort(now)` is True
  when `bytes_in_window * 1000 / window_ms < min_useful_bytes_per_second` or
  `bytes_in_window < min_useful_bytes`.
- A tool-call or reasoning delta SUSPENDS judgement until the next text or finish event; while
  suspended `should_abort` is False however long the silence (the idle timeout, not this
  watchdog, catches a dead upstream). When text (or a finish) resumes at `t`, judgement restarts
  no earlier than `t + window_ms`, so the window is full of post-tool output before it is judged.
- `enabled=False`: never aborts, and `observe` does nothing.
- Silence is judged too: `due()` is when `should_abort` turns True if nothing more arrives, and
  the relay waits for the next chunk no longer than that.

Memory is bounded: bytes are kept per bucket of `window_ms / 100` (one (ts, bytes) entry per
bucket, stamped with its latest event) and trimmed to the window. A bucket counts until its
latest event leaves the window, so the count is never below the exact one: bucketing can only
delay an abort (by at most 1 % of the window), never cause one. Times must not go backwards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from proxy.resilience.tunable import tunable


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    enabled: bool = field(
        default=False,
        metadata=tunable(help="Abort streams whose useful output is slower than the minimum rate"),
    )
    warmup_ms: int = field(
        default=30_000,
        metadata=tunable(
            min=0, max=600_000, help="Grace period after the stream starts before the watchdog judges"
        ),
    )
    window_ms: int = field(
        default=30_000,
        metadata=tunable(
            min=1000, max=600_000, help="Rolling window over which the useful-byte rate is measured"
        ),
    )
    min_useful_bytes_per_second: int = field(
        default=4,
        metadata=tunable(min=1, max=1_000_000, help="Lowest acceptable assistant-text rate over the window"),
    )
    min_useful_bytes: int = field(
        default=1,
        metadata=tunable(min=1, max=1_000_000, help="Smallest amount of assistant text the window must hold"),
    )


class Activity(Enum):
    TEXT = "text"
    """Non-empty assistant text: ends a suspension."""
    SUSPEND = "suspend"
    """A tool-call or reasoning delta is in flight: judgement pauses."""
    FINISH = "finish"
    """A choice finished (or a Responses stream completed): ends a suspension."""
    NONE = "none"
    """Says nothing about progress: pings, usage-only, empty events."""


_RESPONSES_TEXT = "response.output_text.delta"
# Prefixes of the Responses events that suspend: a tool call's input (every kind of tool: a
# freeform tool's is how Codex's `apply_patch` writes a patch), a tool the upstream runs itself
# (searching, interpreting, generating: no text meanwhile), reasoning.
_RESPONSES_SUSPEND = (
    "response.function_call_arguments",
    "response.custom_tool_call_input",
    "response.mcp_call",
    "response.code_interpreter_call",
    "response.web_search_call",
    "response.file_search_call",
    "response.image_generation_call",
    "response.reasoning",
)
_RESPONSES_ITEM_ADDED = "response.output_item.added"
_RESPONSES_FINISH = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Anthropic Messages: text arrives as `content_block_delta` with a `text_delta`; tool input
# (`input_json_delta`) and thinking (`thinking_delta`, `signature_delta`) suspend, as does the start
# of a block that is not text; `message_delta` (the stop reason) and `message_stop` finish.
_MESSAGES_DELTA = "content_block_delta"
_MESSAGES_FINISH = frozenset({"message_delta", "message_stop"})
_MESSAGES_SUSPEND_DELTAS = frozenset({"input_json_delta", "thinking_delta", "signature_delta"})


def useful_bytes(event: Mapping[str, object]) -> tuple[int, Activity]:
    """UTF-8 length of the assistant text in one parsed SSE JSON event, and what the event means.

    Chat: the `choices[].delta.content` strings. Responses API: `response.output_text.delta`.
    Messages API: `content_block_delta` text deltas; its tool-input and thinking deltas and the
    start of a non-text block suspend, `message_delta` / `message_stop` finish.
    Tool-call deltas (`delta.tool_calls`, legacy `delta.function_call`, the Responses API's
    `response.function_call_arguments.delta`, `custom_tool_call_input`, `mcp_call*` and the
    upstream's own tools, `web_search_call*` and the like, and an output item that is not a
    message) and reasoning deltas (`delta.reasoning_content`, `delta.reasoning`,
    `response.reasoning*`) → SUSPEND. A choice with a `finish_reason` (or
    `response.completed`/`incomplete`/`failed`) → FINISH. When one event carries several of
    these, FINISH beats SUSPEND beats TEXT; the byte count always covers all the text in it.
    """
    kind = event.get("type")
    if isinstance(kind, str):
        if kind == _RESPONSES_TEXT:
            delta = event.get("delta")
            return (
                (_utf8_len(delta), Activity.TEXT) if isinstance(delta, str) and delta else (0, Activity.NONE)
            )
        if kind.startswith(_RESPONSES_SUSPEND):
            return 0, Activity.SUSPEND
        if kind == _RESPONSES_ITEM_ADDED:  # as a Messages block: an item that is not a message suspends
            item = event.get("item")
            is_message = isinstance(item, Mapping) and item.get("type") == "message"
            return (0, Activity.NONE) if is_message else (0, Activity.SUSPEND)
        if kind in _RESPONSES_FINISH:
            return 0, Activity.FINISH
        if kind == _MESSAGES_DELTA:
            return _messages_delta(event.get("delta"))
        if kind == "content_block_start":
            block = event.get("content_block")
            is_text = isinstance(block, Mapping) and block.get("type") == "text"
            return (0, Activity.NONE) if is_text else (0, Activity.SUSPEND)
        if kind in _MESSAGES_FINISH:
            return 0, Activity.FINISH
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices:
        return 0, Activity.NONE
    size = 0
    suspend = finish = False
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        if choice.get("finish_reason") is not None:
            finish = True
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            continue
        content = delta.get("content")
        if isinstance(content, str):
            size += _utf8_len(content)
        if _suspends(delta):
            suspend = True
    if finish:
        return size, Activity.FINISH
    if suspend:
        return size, Activity.SUSPEND
    return (size, Activity.TEXT) if size else (0, Activity.NONE)


def _messages_delta(delta: object) -> tuple[int, Activity]:
    if not isinstance(delta, Mapping):
        return 0, Activity.NONE
    kind = delta.get("type")
    if kind == "text_delta":
        text = delta.get("text")
        return (_utf8_len(text), Activity.TEXT) if isinstance(text, str) and text else (0, Activity.NONE)
    if kind in _MESSAGES_SUSPEND_DELTAS:
        return 0, Activity.SUSPEND
    return 0, Activity.NONE


def _suspends(delta: Mapping[str, object]) -> bool:
    # Truthiness, not presence: providers send `"reasoning_content": null` next to text.
    return bool(
        delta.get("tool_calls")
        or delta.get("function_call")
        or delta.get("reasoning_content")
        or delta.get("reasoning")
    )


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


class ThroughputWatchdog:
    """One per streamed upstream attempt."""

    __slots__ = ("_bucket", "_bucket_ms", "_bytes", "_judge_from", "_samples", "_settings", "_suspended")

    def __init__(self, settings: WatchdogSettings, start: float) -> None:
        """`start` is the epoch ms at which the attempt's stream began."""
        self._settings = settings
        self._judge_from = start + settings.warmup_ms + settings.window_ms
        self._suspended = False
        self._samples: deque[tuple[float, int]] = deque()
        self._bytes = 0  # sum of the bytes in `_samples`
        self._bucket_ms = max(settings.window_ms / 100.0, 1.0)
        self._bucket = -1.0  # bucket index of `_samples[-1]`

    @property
    def suspended(self) -> bool:
        return self._suspended

    def observe(self, event: Mapping[str, object] | None, now: float) -> None:
        """Feed one SSE event; None stands for a ping, a comment or an unparsable line."""
        if event is None or not self._settings.enabled:
            return
        size, activity = useful_bytes(event)
        if activity is Activity.SUSPEND:
            self._suspended = True
        elif activity is not Activity.NONE and self._suspended:
            self._suspended = False
            self._judge_from = max(self._judge_from, now + self._settings.window_ms)
        if size:
            self._add(size, now)

    def should_abort(self, now: float) -> bool:
        settings = self._settings
        if not settings.enabled or self._suspended or now < self._judge_from:
            return False
        self._trim(now)
        # bytes / (window / 1000) < min, without float division.
        return not self._enough(self._bytes)

    def due(self) -> float | None:
        """When `should_abort` turns True if nothing more arrives (epoch ms): the relay waits for
        the next chunk no longer than that, so that a stream gone silent is judged on time, not
        when (if ever) its upstream speaks again. None while judgement is suspended, or disabled."""
        settings = self._settings
        if not settings.enabled or self._suspended:
            return None
        window = settings.window_ms
        remaining = self._bytes
        if not self._enough(remaining):
            return self._judge_from
        for at, size in self._samples:  # oldest first: each leaves the window at `at + window`
            remaining -= size
            if not self._enough(remaining):
                return max(self._judge_from, at + window)
        return self._judge_from  # (not reached: the window holds at least one byte of each sample)

    def _enough(self, in_window: int) -> bool:
        settings = self._settings
        return (
            in_window * 1000 >= settings.min_useful_bytes_per_second * settings.window_ms
            and in_window >= settings.min_useful_bytes
        )

    def _add(self, size: int, now: float) -> None:
        self._bytes += size
        bucket = now // self._bucket_ms
        if bucket == self._bucket and self._samples:
            self._samples[-1] = (now, self._samples[-1][1] + size)
            return
        self._bucket = bucket
        self._samples.append((now, size))
        self._trim(now)

    def _trim(self, now: float) -> None:
        cutoff = now - self._settings.window_ms
        samples = self._samples
        while samples and samples[0][0] <= cutoff:
            self._bytes -= samples.popleft()[1]
