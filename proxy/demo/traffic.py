"""The demo's client: a trickle of requests, weighted so every layer gets some traffic."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx

MAX_IN_FLIGHT = 8
REQUEST_TIMEOUT_S = 30.0

# (weight, endpoint, model, stream): every layer gets some traffic, the combo the most.
_MIX: tuple[tuple[int, str, str, bool], ...] = (
    (3, "chat/completions", "demo", False),
    (1, "chat/completions", "demo", True),
    (2, "chat/completions", "flaky/llama3", False),
    (2, "chat/completions", "ratelimited/gpt-4o-mini", False),
    (1, "chat/completions", "ratelimited/gpt-4o-mini", True),
    (1, "chat/completions", "models/missing-model", False),
    (2, "chat/completions", "models/llama3", False),
    (2, "chat/completions", "twokeys/gpt-4o-mini", False),
    (1, "chat/completions", "healthy/llama3", True),
    (1, "embeddings", "healthy/nomic-embed-text", False),
    (2, "messages", "claude/claude-sonnet", False),
    (1, "messages", "claude/claude-sonnet", True),
)
_MIX_WEIGHTS = [w for w, *_ in _MIX]


class DemoTraffic:
    """A trickle of client requests against the proxy at `base_url` (no `/v1` suffix).

    Runs as one task in the current loop; errors are expected and only counted, never raised.
    Never more than `MAX_IN_FLIGHT` requests are outstanding: a tick with no room is skipped.
    """

    def __init__(self, base_url: str, *, rate_per_s: float = 4.0, seed: int | None = None) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.base_url = base_url.rstrip("/")
        self.rate_per_s = rate_per_s
        self.sent = 0
        self.answered: dict[int, int] = {}
        """Responses by status."""
        self.served_by: dict[str, int] = {}
        """Successful responses by the provider that served them (`X-OmniRoute-Provider`)."""
        self.errors = 0
        """Requests that got no HTTP answer (proxy not up yet, timeouts)."""
        self._rng = random.Random(seed)
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="omniroute-demo-traffic")

    async def stop(self) -> None:
        """Stop sending, cancel what is in flight and close the client session."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        session = httpx.AsyncClient(
            timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_connections=MAX_IN_FLIGHT), trust_env=False
        )
        interval = 1.0 / self.rate_per_s
        try:
            while True:
                await asyncio.sleep(interval * self._rng.uniform(0.5, 1.5))
                if len(self._in_flight) >= MAX_IN_FLIGHT:
                    continue
                _, endpoint, model, stream = self._rng.choices(_MIX, _MIX_WEIGHTS)[0]
                task = asyncio.create_task(self._send(session, endpoint, model, stream))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
        finally:
            pending = tuple(self._in_flight)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await session.aclose()

    async def _send(self, session: httpx.AsyncClient, endpoint: str, model: str, stream: bool) -> None:
        if endpoint == "embeddings":
            payload: dict[str, Any] = {"model": model, "input": "the quick brown fox"}
        elif endpoint == "messages":
            payload = {
                "model": model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Say hello."}],
                "stream": stream,
            }
        else:
            payload = {
                "model": model,
                "messages": [{"role": "user", "content": "Say hello."}],
                "stream": stream,
            }
            if stream and model == "demo":  # the Requests tab shows streams with and without usage
                payload["stream_options"] = {"include_usage": True}
        self.sent += 1
        try:
            response = await session.post(f"{self.base_url}/v1/{endpoint}", json=payload)
            status = response.status_code
            provider = response.headers.get("x-omniroute-provider")
        except Exception:  # the demo's client must never disturb the instance: count and move on
            self.errors += 1
            return
        self.answered[status] = self.answered.get(status, 0) + 1
        if status < 400 and provider:
            self.served_by[provider] = self.served_by.get(provider, 0) + 1
