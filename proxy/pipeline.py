"""One client request, end to end: parse → select → admit → upstream → record → respond.

The attempt loop (docs/resilience.md#routing-and-fallback): try targets and connections in order,
fall back on a fallback outcome, wait out short transient blocks (cooldown-aware retry) and answer
with the statuses of docs/resilience.md#answers-when-nothing-can-serve when nothing is left.
Streams are relayed chunk by chunk; before the first byte a failed attempt may still fall back,
after it the stream ends with an error event.

Long on purpose (about 1,200 lines): the attempt loop, the waits, the two ways a stream starts and
the error answers all act on one request's state (its record, its progress, the `_AttemptScope`
that must give back its queue place, slot and response on every path, however the request ends).
Spread over modules, that "on every path" would be checked in files that each see only part of the
paths. What is not about one request's path is already elsewhere: the wire APIs (`apis.py`), the
body (`body.py`), the upstream client (`upstream.py`), the trail, the single-attempt routes
(`passthrough.py`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from proxy import untrusted
from proxy.apis import (
    CLIENT_HEADERS,
    ENDPOINT_API,
    ErrorSpotter,
    EventKind,
    StreamError,
    anthropic_error_body,
    anthropic_sse_error,
    auth_headers,
    event_kind,
    response_id,
    responses_sse_error,
    stream_error,
)
from proxy.body import RequestBody
from proxy.body import parse as parse_body
from proxy.config import Config, ProviderConfig, shown_url
from proxy.engine import PROBE_RECOVERY_ESTIMATE_MS, Attempt, Engine, NoTarget, Recorded, Skip, Target
from proxy.guard import HEADERS_KEY
from proxy.owners import RESPONSE_ID
from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import Clock, sleep_until
from proxy.resilience.errors import ExecutionTimeout, QueueFull, Withdrawn
from proxy.resilience.events import Event
from proxy.resilience.limiter import RequestLimiter, Ticket
from proxy.resilience.outcome import Outcome, OutcomeKind
from proxy.resilience.semaphore import ConnectionSemaphore
from proxy.resilience.watchdog import ThroughputWatchdog
from proxy.responses import ErrorResponse, error_response, sse_error
from proxy.router import Router
from proxy.scrub import Scrubber, StreamScrubber
from proxy.sse import SSEParser
from proxy.trail import (
    RequestRecord,
    Trail,
    cooled_by,
    error_of,
    kept_message,
    messages_stream_usage,
    stream_usage,
    usage_of,
)
from proxy.upstream import (
    MAX_ERROR_BODY,
    DeadlinePassed,
    Deadlines,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
)

if TYPE_CHECKING:
    from proxy.owners import ResponseOwners

MAX_BODY_BYTES = 32 * 1024 * 1024
CLASSIFIED_ERROR_BYTES = 64 * 1024
"""What the engine reads of an error body (its markers, retry hints and lastError are near the
start); the client gets the whole body, up to MAX_ERROR_BODY."""
SESSION_HEADERS = ("x-session-id", "x-codex-session-id", "x-omniroute-session")
_SESSION_KEYS = tuple(h.encode() for h in SESSION_HEADERS)
_CLIENT_KEYS = tuple((h, h.encode()) for h in CLIENT_HEADERS)
WAIT_SLACK_MS = 50.0
_NUDGING_LAYERS = frozenset(("operator", "settings"))
"""The events after which a request waiting out a cooldown looks again at once (`Pipeline.nudge`),
besides a probe that settled (a breaker leaving `HALF_OPEN`)."""
_HALF_OPEN = BreakerState.HALF_OPEN.value
_RETRY_HINT = re.compile(
    r"[0-9]{1,12}(?:\.[0-9]{1,6})?|[A-Za-z]{3}, [0-9]{2} [A-Za-z]{3} [0-9]{4} [0-9:]{8} GMT"
)
"""What a relayed Retry-After (-Ms) may hold: seconds (or ms), or an HTTP date; anything else an
upstream puts there (its echo of our key, say) stays with us."""


def retry_hints(upstream_headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's `Retry-After` and `Retry-After-Ms` that a relayed error answer carries on to
    its client (those that read as a number or a date)."""
    hints = {}
    for name in ("retry-after", "retry-after-ms"):
        value = upstream_headers.get(name)
        if value is not None and _RETRY_HINT.fullmatch(value):
            hints[name] = value
    return hints


_MEDIA_CACHED = 64
ADDRESS_LIMIT = 64
"""The most of a client's address a record keeps (an IPv6 address with its zone is under 64)."""
GATE_LIMIT_BYTES = 256 * 1024
"""How much of a Messages or Responses stream's preamble is held back while waiting for its first
content (an error event before content still falls back); past it the stream is committed."""


class BodyTooLarge(Exception):
    pass


BODY_IDLE_TIMEOUT_S = 60.0
"""How long a request's body may stop arriving before the request is answered 408: a silence
between two parts, not a limit on the whole body (nginx's `client_body_timeout`). A client that
sends its headers and then nothing would otherwise hold its request, alive and `queued` in the
trail, for as long as it keeps the socket open."""


class BodyStalled(Exception):
    """Nothing of the body arrived for BODY_IDLE_TIMEOUT_S."""


def body_stalled() -> ErrorResponse:
    """The answer to a body that stopped arriving; the connection closes after it (what is left of
    the body, should it come, is no request to read)."""
    return error_response(
        408,
        f"the request body stopped arriving (nothing for {BODY_IDLE_TIMEOUT_S:g} s)",
        "request_timeout",
        headers={"Connection": "close"},
    )


_Send = tuple[str, str | None, Mapping[str, str], Mapping[str, str] | None]
"""(url, bearer key, extra headers, credential headers) of an attempt (`Pipeline._send_of`)."""
_NO_SENDS: dict[str, _Send] = {}


@dataclass(frozen=True, slots=True)
class _UpstreamError:
    """One failed attempt as the client reads it: `ollama-1: connection refused at http://...`,
    `key-b: 429 Rate limit reached`."""

    connection_id: str
    status: int | None
    """The upstream's status; None when it never answered (refused, reset, timed out)."""
    message: str
    """What went wrong, in the upstream's words when it said any (scrubbed, at most a line)."""

    def __str__(self) -> str:
        status = f"{self.status} " if self.status is not None else ""
        return f"{self.connection_id}: {status}{self.message}"

    def to_api(self) -> dict[str, object]:
        return {"connectionId": self.connection_id, "status": self.status, "message": self.message}


class _Progress:
    """What one request has been through so far (for headers and the final error).

    A plain class: a dataclass's generated __init__, with its defaults and default factories, cost
    several times as much, and one is made for every request."""

    __slots__ = (
        "api_skips",
        "attempted_targets",
        "client_retry_ms",
        "failed_attempts",
        "last_error",
        "last_failure",
        "record",
        "tried",
        "waited_ms",
        "waits",
    )

    def __init__(self, api_skips: tuple[Skip, ...] = (), record: RequestRecord | None = None) -> None:
        self.tried: list[str] = []
        self.failed_attempts = 0
        self.attempted_targets: set[str] = set()
        self.last_error: Response | None = None
        self.last_failure: _UpstreamError | None = None
        """What the upstream of this request's last failed attempt did, in words (for the final answer)."""
        self.client_retry_ms: int | None = None
        self.waits = 0
        self.waited_ms = 0.0
        self.api_skips = api_skips
        """Targets left out before the first attempt because their provider does not speak the API."""
        self.record = record
        """The request's record in the trail (None when recording is off)."""


STOPPING = (503, "the server is stopping; retry in a moment", "server_stopping")
"""(status, message, code) of a request cut by the server's stop (`Pipeline.stop`)."""
STOPPING_HEADERS = {"Retry-After": "1"}


@dataclass(frozen=True, slots=True)
class Wire:
    """One request of a passed-through wire API (Messages, Responses): what differs from chat."""

    api: str
    client_headers: Mapping[str, str]
    """The client's own `anthropic-version` / `anthropic-beta`, passed upstream."""
    owners: ResponseOwners | None
    """Where a Responses API answer's id is remembered (None: not the Responses API)."""
    follows: str | None = None
    """The connection that created the response this request continues (`previous_response_id`):
    selection prefers it over every other, a session's pin included."""
    ids: list[str] = field(default_factory=list)
    """The response ids this request's answer named (a fleet waits for their owners' writes)."""

    def sse_error(self, message: str, code: str) -> bytes:
        return (anthropic_sse_error if self.api == "messages" else responses_sse_error)(message, code)

    def seen(self, connection_id: str, data: Mapping[str, Any] | None) -> None:
        """An answer (or a stream's preamble event) went by: remember the response id it names."""
        if self.owners is not None:
            ident = response_id(data)
            if ident is not None:
                self.owners.remember(ident, connection_id)
                self.ids.append(ident)


async def _shared_settled(engine: Engine, session: str | None, wire: Wire | None) -> None:
    """A fleet: wait (briefly) until the pin and response owners this answer made have reached the
    fleet, so the client's next request finds them on any replica (docs/fleet.md). Costs nothing
    for a request with neither, or without a fleet."""
    shared = engine.shared
    if shared is None:
        return
    ids = wire.ids if wire is not None else ()
    if session is not None or ids:
        await shared.settled(session, ids)


def upstream_headers(
    provider: ProviderConfig, api_key: str | None, wire: Wire | None
) -> tuple[Mapping[str, str], Mapping[str, str] | None, str | None]:
    """(extra headers, credential headers, bearer key) for a provider with another auth style or a
    passed-through API: the client's Anthropic headers travel, its credentials never do."""
    client = wire.client_headers if wire is not None else {}
    extra = {**provider.headers, **client} if client else provider.headers
    if provider.auth == "bearer":
        return extra, None, api_key
    return extra, auth_headers(provider.auth, api_key, client.get("anthropic-version")), None


class Pipeline:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        router: Router,
        upstream: UpstreamClient,
        trail: Trail | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.router = router
        self.upstream = upstream
        self.trail = trail
        """Where each request leaves its record (None: recording is off)."""
        self.waiting = 0
        """Requests waiting out a cooldown right now (cooldown-aware retry)."""
        self.stopping = False
        """The server has begun to stop (`stop`): what is cut from now on is answered STOPPING."""
        self._waiters: set[asyncio.Task[Any]] = set()
        """The tasks of the requests waiting right now (a cooldown, the request queue, a
        concurrency slot): `stop` answers them at once rather than hold the stop."""
        self._sleepers: set[asyncio.Future[None]] = set()
        """The wake-ups of the requests waiting out a cooldown: `nudge` brings them forward."""
        self.owners: ResponseOwners | None = None
        """Which connection created each Responses API response (set by the runtime)."""
        self._mute: dict[str, frozenset[str]] = {
            api: frozenset(p.id for p in config.providers.values() if api not in p.apis)
            for api in set(ENDPOINT_API.values())
        }
        """API -> the providers that do not speak it (mostly empty: checked only when not)."""
        self._usual_headers: dict[str, tuple[dict[str, str], list[tuple[bytes, bytes]] | None]] = {}
        """Connection id -> its routing headers without fallbacks (`_route_headers`)."""
        self._media: dict[str, tuple[bool, str]] = {}
        """An upstream's Content-Type -> (whether it claims JSON, as relayed, scrubbed): at most
        _MEDIA_CACHED types, so that an upstream cannot grow it."""
        self._sends: dict[str, dict[str, _Send]] = {}
        """Endpoint -> connection id -> where and how a chat-like attempt is sent (`_send_of`)."""

    def stop(self) -> None:
        """The server has begun to stop. A request that waits (a cooldown, the request queue, a
        concurrency slot) is answered now with a 503 `server_stopping` and `Retry-After: 1`,
        rather than hold the stop for the grace period; one that is upstream gets the grace
        period, and is answered the same way (a stream: with its API's error event) if it is cut."""
        self.stopping = True
        for task in list(self._waiters):
            task.cancel()

    async def while_connected(self, receive: Receive, work: Coroutine[Any, Any, Response]) -> Response:
        """Run `work` (a request's one upstream call, read after its body) for as long as its client
        is there to read the answer: the single-attempt routes (proxy/passthrough.py), which
        `handle` does not run. A client that goes away ends it at once (its upstream connection
        is closed, so the upstream stops working on it too); one cut by the server's stop is
        answered STOPPING, as `handle` answers its own, never with a bare 500."""
        return await _while_connected(receive, work, lambda: self.stopping)

    def nudge(self, event: Event) -> None:
        """An event bus subscriber: an operator's action, a settings change or a breaker's change
        (its probe settled) may have freed what a waiting request waits for (a breaker reset or
        closed, a connection re-enabled) or turned waiting off, so every request waiting out a
        cooldown looks again now rather than at the recovery it planned for (up to a minute and a
        half away). One that still finds nothing waits again for what is left."""
        if self._sleepers and (
            event.layer in _NUDGING_LAYERS or (event.layer == "breaker" and event.from_ == _HALF_OPEN)
        ):
            for wake in self._sleepers:
                if not wake.done():
                    wake.set_result(None)

    # ------------------------------------------------------------------ entry point

    async def handle_messages(self, scope: Scope, receive: Receive) -> Response:
        """`/v1/messages`: `handle`, with the proxy's own errors in Anthropic's shape (an upstream's
        error is relayed as it came, already in that shape)."""
        response = await self.handle(scope, receive, "messages")
        if isinstance(response, ErrorResponse):
            return response.reshaped(anthropic_error_body(response.status_code, response.message))
        return response

    async def handle(self, scope: Scope, receive: Receive, endpoint: str) -> Response:
        """One request to an API route, as its ASGI scope and `receive` (no request object: the
        pipeline reads nothing else of it, and an object per request costs more than it saves)."""
        # One coroutine from the request to its attempts (no wrapper for the trail's record, nor for
        # the client watch): every coroutine in the chain is resumed again at every await below it.
        trail = self.trail
        record = None
        if trail is not None:
            record = trail.begin(_request_id(scope), _client(scope), endpoint)
        response: Response | None = None
        ended_at: float | None = None  # when the statistics counted its end: the trail's end too
        try:
            headers = _header_map(scope)
            try:
                # `_read_body`, with the common case (the whole body in one message) inline.
                length = headers.get(b"content-length")
                if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                    raise BodyTooLarge
                if _arrived(receive):
                    message = await receive()
                else:
                    message = await _receive_in_time(receive, self.upstream.deadlines())
                raw = message.get("body", b"")
                if (
                    message["type"] != "http.request"
                    or message.get("more_body", False)
                    or len(raw) > MAX_BODY_BYTES
                ):
                    raw = await _read_body(scope, receive, self.upstream.deadlines(), headers, message)
            except BodyTooLarge:
                response = error_response(413, "request body exceeds 32 MiB", "request_too_large")
                return response
            except BodyStalled:
                response = body_stalled()
                return response
            except ClientDisconnect:  # gone before its body arrived: nobody reads this
                response = error_response(
                    499, "the client went away before its body arrived", "client_disconnected"
                )
                return response
            try:
                body, exact = parse_body(raw)
            except untrusted.Unsendable as exc:
                response = error_response(400, f"request body: {exc}", "invalid_request")
                return response
            except untrusted.TooDeep:
                response = error_response(400, f"request body is {untrusted.TOO_DEEP}", "invalid_json")
                return response
            except (ValueError, RecursionError):
                response = error_response(
                    400,
                    "request body is not valid JSON (NaN and Infinity are not JSON either)",
                    "invalid_json",
                )
                return response
            if not isinstance(body, dict):
                response = error_response(400, "request body must be a JSON object", "invalid_request")
                return response
            model = body.get("model")
            if not isinstance(model, str) or not model:
                response = error_response(400, "`model` is required and must be a string", "missing_model")
                return response
            if len(model) > untrusted.MODEL_LIMIT:
                response = error_response(400, untrusted.MODEL_TOO_LONG, "invalid_model")
                return response
            if not model.isascii() and not untrusted.is_text(model):
                # A name is looked up, locked, logged and stored: it must be text UTF-8 can hold. (The
                # messages may hold any JSON string: they are only passed on.)
                response = error_response(
                    400, "`model` holds a lone surrogate escape; it is not a name", "invalid_model"
                )
                return response
            try:
                # Parsed once; each attempt puts its own model in (RequestBody.for_model), which
                # cannot fail, so nothing an attempt does can fail to encode.
                payload = RequestBody(raw, body, exact)  # (by position: see RequestBody.__init__)
            except (ValueError, RecursionError):  # nested deeper than the encoder goes from here
                response = error_response(400, f"request body is {untrusted.TOO_DEEP}", "invalid_json")
                return response
            asked = body.get("stream")
            if asked is not None and type(asked) is not bool:
                # "yes", 1, "false": which one the client meant is a guess, and a wrong one is a
                # stream its parser cannot read, or a wait for an answer it will not get.
                response = error_response(400, "`stream` must be true or false", "invalid_stream")
                return response
            stream = asked is True and endpoint != "embeddings"
            if record is not None:
                record.model_asked, record.stream, record.bytes_in = model, stream, len(raw)
            previous = body.get("previous_response_id") if endpoint == "responses" else None
            # The parsed document is done with: let its objects (a coding agent's: thousands) go now,
            # while they are young, rather than keep them through the attempts and into the cyclic
            # collector's older generations.
            del body

            pinned = None
            if b"x-omniroute-connection" in headers:  # (the guard's dict: the common case looks no further)
                try:
                    pinned = pinned_connection(scope["headers"])
                except ValueError as exc:
                    response = error_response(400, str(exc), "invalid_request")
                    return response
            router = self.router
            route = router.known(model, pinned)
            if route is None:
                route = await router.resolve(model, pinned)
            if route is None:
                response = error_response(
                    404,
                    f"model {untrusted.echo(model)!r} is not a configured provider/model, combo, or model any upstream lists",
                    "model_not_found",
                )
                return response
            if not route.targets:
                response = pin_not_found(pinned, model)
                return response
            session = None
            for key in _SESSION_KEYS:
                session_raw = headers.get(key)
                if session_raw is not None:
                    session = (
                        session_raw.decode("latin-1")
                        if len(session_raw) <= untrusted.SESSION_LIMIT
                        else _session_digest(session_raw)
                    )
                    break
            targets = route.targets
            api = ENDPOINT_API[endpoint]
            mute = self._mute[api]
            skips: tuple[Skip, ...] = ()
            # (The rare cases in helpers: a comprehension here would make the variables it reads
            # cells, allocated on every request.)
            if mute and _any_muted(targets, mute):
                skips, targets = _without_muted(targets, mute, api)
                if not targets:
                    response = _none_speaks(model, api, skips)
                    return response
            wire = None
            if api in ("messages", "responses"):
                owners = self.owners if api == "responses" else None
                # A conversation continued by `previous_response_id` lives only at the connection
                # that created that response: another key, or another provider of a combo, answers
                # 400 `previous_response_not_found`. It is tried first, before the combo's order
                # and before a session pin.
                follows = (
                    await owners.lookup(previous)
                    if owners is not None and type(previous) is str and RESPONSE_ID.fullmatch(previous)
                    else None
                )
                if follows is not None:
                    targets = _creator_first(targets, follows, self.engine)
                wire = Wire(api, _client_headers(headers), owners, follows)
            if record is not None:
                record.route = "combo" if route.combo is not None else "target" if "/" in model else "bare"

            stats = self.engine.stats
            stats.started()
            # As `while_connected`, without a coroutine of its own: the attempts run in this task
            # for as long as the client is there to read the answer.
            watch: _ClientWatch | None = None
            try:
                watch = _ClientWatch(receive)
                response = await self._route(endpoint, payload, targets, stream, session, skips, wire, record)
                return response
            except asyncio.CancelledError:
                if watch is not None and watch.left():
                    response = error_response(
                        499, "the client went away before the answer", "client_disconnected"
                    )
                    return response
                if self.stopping:  # cut by the stop (`stop`, or the grace period's end)
                    _uncancel()
                    response = error_response(*STOPPING, headers=STOPPING_HEADERS)
                    return response
                raise
            finally:
                if watch is not None:
                    watch.stop()
                # A stream counts itself when it ends; everything else ends here.
                if not isinstance(response, StreamingResponse):
                    ok = response is not None and response.status_code < 400
                    ended_at = self.engine.clock.now()
                    stats.finished(ok, ended_at)
        except Exception:
            # A bug: the app answers 500 internal_error (the traceback in the log); the record says
            # so, not that the client left. (No cost on the way through: 3.11's handlers are free.)
            if record is not None:
                record.code, record.message = "internal_error", "the proxy failed on this request (a bug)"
            raise
        finally:
            # A relayed stream ends its record itself, when the stream ends.
            if record is not None and trail is not None and not isinstance(response, _RelayResponse):
                _ended(trail, record, response, ended_at)

    # ------------------------------------------------------------------ the attempt loop

    async def _route(
        self,
        endpoint: str,
        payload: RequestBody,
        targets: list[Target],
        stream: bool,
        session: str | None,
        skips: tuple[Skip, ...] = (),
        wire: Wire | None = None,
        record: RequestRecord | None = None,
    ) -> Response:
        engine = self.engine
        trail = self.trail
        progress = _Progress(skips, record)  # (by position: keywords to a class cost a dict)
        if session is not None and engine.shared is not None and engine.settings.session_ttl_ms() > 0:
            # A fleet: the session may have moved to another replica since this one pinned it.
            await engine.shared.refresh_pin(session)
        prefer = wire.follows if wire is not None else None
        while True:
            decision = engine.select(targets, tried=progress.tried, session=session, prefer=prefer)
            if isinstance(decision, NoTarget):
                if record is not None and trail is not None:
                    trail.nothing_eligible(record, decision)
                if not await self._maybe_wait(decision, progress):
                    return self._unavailable(decision, progress, targets)
                progress.tried.clear()
                continue
            fleet = engine.shared if decision.probe else None  # (a property: read for a probe only)
            if fleet is not None and not await fleet.take_probe(decision):
                continue  # another replica holds the fleet's one probe: decide again without it
            if (
                record is not None
                and trail is not None
                # The common case passed nothing over: the first target's only connection.
                and (decision.target is not targets[0] or len(decision.provider.connections) > 1)
            ):
                trail.passed_over(record, decision, targets, progress.tried)
            response = await self._attempt(
                decision, endpoint, payload, stream, progress, targets, session, wire
            )
            if response is not None:
                return response
            progress.tried.append(decision.connection.spec.id)
            progress.failed_attempts += 1

    async def _maybe_wait(self, decision: NoTarget, progress: _Progress) -> bool:
        """Cooldown-aware retry: wait for the earliest recovery if the rules allow (True), or not.

        The engine's clock decides when the wait ends, like every other engine duration, so the
        wait is as long in engine time as the cooldown it waits out (and a FakeClock test ends it by
        advancing). A client that leaves cancels it (the watch in `handle`); an operator's action or
        a settings change ends it early (`nudge`), and the request looks again.
        """
        wait = self.engine.settings.combo_wait()
        if (
            self.stopping
            or not wait.active
            or not decision.all_waitable
            or progress.waits >= wait.max_attempts
        ):
            return False
        now = self.engine.clock.now()
        wake, on_probe = _wake_at(
            decision, now + min(wait.max_wait_ms, wait.budget_ms - progress.waited_ms) - WAIT_SLACK_MS
        )
        if wake is None:
            return False
        delay_ms = max(0.0, wake - now) + WAIT_SLACK_MS
        if delay_ms > wait.max_wait_ms or progress.waited_ms + delay_ms > wait.budget_ms:
            return False
        self.waiting += 1
        record, trail = progress.record, self.trail
        if record is not None and trail is not None:
            trail.state(record, "waiting")
        task = asyncio.current_task()
        assert task is not None
        self._waiters.add(task)
        clock = self.engine.clock
        until = now + delay_ms
        # A probe let go without a verdict (its client left) frees its slot with no event to say
        # so: a request waiting on a probe looks again every PROBE_RECOVERY_ESTIMATE_MS, and such
        # a look is no wait of its own (it counts against the budget, not `maxAttempts`).
        look = min(until, now + PROBE_RECOVERY_ESTIMATE_MS) if on_probe else until
        try:
            await sleep_until(clock, look, self._sleepers)  # the recovery, or a `nudge`
        finally:
            self._waiters.discard(task)
            self.waiting -= 1
            ended = clock.now()
            waited = ended - now
            progress.waited_ms += waited  # (what it took: a nudged wait ends early)
            if ended >= until:
                # Only a wait that ran its course counts: a nudged one goes on waiting for the same
                # recovery if nothing was freed, and five saves of a setting must not use up its waits.
                progress.waits += 1
            if record is not None and trail is not None:
                trail.waited(record, waited, decision)
        return True

    async def _attempt(
        self,
        attempt: Attempt,
        endpoint: str,
        payload: RequestBody,
        stream: bool,
        progress: _Progress,
        targets: list[Target],
        session: str | None,
        wire: Wire | None = None,
    ) -> Response | None:
        """Run one attempt. A Response ends the request; None means: fall back to the next candidate.

        The attempt's `_AttemptScope` owns everything it takes (queue place, concurrency slot,
        upstream response) and records its one outcome; whatever path leaves here without a
        relay taking the scope over closes it, which records a disconnect if nothing else was.
        """
        engine = self.engine
        scrub = engine.scrubber
        conn = attempt.connection
        provider = attempt.provider
        progress.attempted_targets.add(attempt.target.name)
        headers, raw_headers = self._route_headers(attempt, progress, targets)
        data = payload.for_model(attempt.target.model)
        if wire is None:
            send = self._sends.get(endpoint, _NO_SENDS).get(conn.spec.id)
            if send is None:
                send = self._send_of(endpoint, conn.spec.id, provider.spec.id, None)
                self._sends.setdefault(endpoint, {})[conn.spec.id] = send  # one per configured connection
        else:  # (the client's Anthropic headers travel: nothing to keep)
            send = self._send_of(endpoint, conn.spec.id, provider.spec.id, wire)
        url, api_key, extra, credentials = send

        scope = _AttemptScope(engine, attempt, session, self.trail, progress.record)
        try:
            try:
                upstream = await self._dispatch(scope, url, data, api_key, extra, credentials)
                scope.upstream = upstream
                if attempt.probe:  # a sign of progress: only a probe's lease needs it
                    engine.probe_alive(attempt)
            except QueueFull:
                scope.finish(Outcome.local("request queue full"))
                return _answer(
                    progress,
                    429,
                    f"the request queue of connection {conn.spec.id!r} is full (requestQueue.maxQueueDepth)",
                    "RATE_LIMIT_QUEUE_FULL",
                    headers=headers,
                )
            except Withdrawn:
                # The connection stopped being usable while the request waited in its queue: this
                # attempt never happened, and the request moves on like any other that finds it so.
                scope.finish(Outcome.local("withdrawn from the request queue"))
                return None
            except ExecutionTimeout:
                scope.finish(Outcome.local("execution deadline passed"))
                return _answer(
                    progress,
                    504,
                    f"connection {conn.spec.id!r} did not answer within requestQueue.maxWaitMs",
                    "RATE_LIMIT_EXECUTION_TIMEOUT",
                    headers=headers,
                )
            except UpstreamFailure as failure:
                if failure.outcome.kind is OutcomeKind.LOCAL_REJECTION:  # this process is out of something
                    scope.finish(failure.outcome)
                    return _answer(
                        progress,
                        503,
                        failure.outcome.error or "the proxy is out of resources",
                        "proxy_out_of_resources",
                        headers={**headers, "retry-after": "1"},
                    )
                self._failed(scope, failure.outcome, progress, headers)
                return None

            if upstream.status >= 400:
                raw, whole = await upstream.read_error_body()
                return self._upstream_error(
                    scope,
                    upstream.status,
                    upstream.headers,
                    upstream.content_type,
                    raw,
                    whole,
                    progress,
                    headers,
                )

            content_type = upstream.content_type
            if stream and content_type.startswith("text/event-stream"):
                if wire is not None:
                    return await self._start_gated(scope, upstream, headers, progress, wire)
                return await self._start_stream(scope, upstream, headers, progress)

            try:
                content = upstream.read_arrived()  # (no coroutine when it is all there: the usual case)
                if content is None:
                    content = await upstream.read()
            except UpstreamFailure as failure:
                self._failed(scope, failure.outcome, progress, headers)
                return None
            # Read whole, the response has gone back to the pool: nothing is left for the scope to
            # close (closing it would be two calls that do nothing).
            scope.upstream = None
            media = self._media.get(content_type)
            if media is None:
                # (whether it claims JSON, the type as relayed): the same few types every time
                media = (_claims_json(content_type), scrub(content_type))
                if len(self._media) < _MEDIA_CACHED:
                    self._media[content_type] = media
            claims_json, media_type = media
            parsed = untrusted.read_answer(content) if claims_json else untrusted.NOT_JSON
            garbled = claims_json and parsed is untrusted.NOT_JSON
            if garbled:
                # A cut-off or garbled answer (a proxy's HTML page labelled JSON, a body that broke
                # off) is no success: the client could not use it, so the next candidate is tried.
                broken = Outcome.network(
                    f"answered {upstream.status} with a body that is not the JSON it claims"
                )
                self._failed(scope, broken, progress, headers)
                return None
            scope.finish(Outcome.ok(upstream.status))
            if wire is not None and wire.owners is not None:
                wire.seen(conn.spec.id, _json_object(content))
            if engine.shared is not None:  # (asked here: a coroutine made and run costs more)
                await _shared_settled(engine, session, wire)
            if progress.record is not None:
                progress.record.usage = usage_of(parsed)  # the numbers only: never the answer's text
            return _relayed(scrub.secrets(content), upstream.status, media_type, headers, raw_headers)
        finally:
            # Every path above either recorded an outcome or handed the scope to a relay; anything
            # else (a cancellation, a bug) ends here as a disconnect, which counts against nothing.
            if not scope.handed_off:
                scope.close()

    def _send_of(self, endpoint: str, connection_id: str, provider_id: str, wire: Wire | None) -> _Send:
        """Where an attempt on a connection goes and with what headers: the same every time for a
        request without a wire API's client headers (the config does not change)."""
        provider_config = self.config.providers[provider_id]
        url = f"{provider_config.base_url}/{endpoint}"
        conn_config = self.config.connection(connection_id)
        api_key = conn_config.api_key if conn_config else None
        if wire is None and provider_config.auth == "bearer":
            return url, api_key, provider_config.headers, None
        extra, credentials, api_key = upstream_headers(provider_config, api_key, wire)
        return url, api_key, extra, credentials

    def _upstream_error(
        self,
        scope: _AttemptScope,
        status_in: int,
        upstream_headers: Mapping[str, str],
        content_type: str,
        raw: bytes,
        whole: bool,
        progress: _Progress,
        headers: dict[str, str],
    ) -> Response | None:
        """An upstream's error answer (or a stream's error event before any content, as the status it
        stands for): recorded, then relayed to the client, or None to fall back."""
        scrub = self.engine.scrubber
        conn = scope.attempt.connection
        text = scrub(raw[:CLASSIFIED_ERROR_BYTES].decode("utf-8", "replace"))
        recorded = scope.finish(Outcome(OutcomeKind.STATUS, status_in, upstream_headers, text))
        status = recorded.status or status_in
        if recorded.client_retry_after_ms is not None:
            progress.client_retry_ms = recorded.client_retry_after_ms
        passthrough_headers = dict(headers)
        passthrough_headers.update(retry_hints(upstream_headers))
        if recorded.client_retry_after_ms is not None:
            passthrough_headers["retry-after"] = str(math.ceil(recorded.client_retry_after_ms / 1000))
        if whole:
            reply = Response(
                scrub.error_bytes(raw),
                status_code=status,
                media_type=scrub(content_type),
                headers=passthrough_headers,
            )
        elif len(raw) < MAX_ERROR_BODY:  # not all of it, and not for its size: it broke off
            reply = error_response(
                status,
                f"{conn.spec.id}: {status_in} with an error body that broke off after {len(raw)} bytes, not relayed",
                "upstream_error_incomplete",
                headers=passthrough_headers,
            )
        else:
            reply = error_response(
                status,
                f"{conn.spec.id}: {status_in} with an error body larger than"
                f" {MAX_ERROR_BODY // (1024 * 1024)} MiB, not relayed",
                "upstream_error_too_large",
                headers=passthrough_headers,
            )
        if recorded.verdict.fallback:
            progress.last_error = reply
            progress.last_failure = _UpstreamError(conn.spec.id, status_in, _error_words(text))
            return None
        return reply

    def _dispatch(
        self,
        scope: _AttemptScope,
        url: str,
        data: bytes,
        api_key: str | None,
        extra: Mapping[str, str],
        credentials: Mapping[str, str] | None = None,
    ) -> Awaitable[UpstreamResponse]:
        """Take the attempt's local places in order, then send it: the awaitable returned ends when
        the response headers are in (the caller hands the response to the scope).

        The queue place comes first (QueueFull is answered at once, before any waiting), then the
        connection's concurrency slot (fail-open), then the dispatch: the execution deadline
        (requestQueue.maxWaitMs) runs from there to the response headers, so no local wait eats
        into the time the upstream is given. A connection with neither a request queue nor a
        concurrency limit has nothing to wait for: its request is sent without a coroutine between.
        """
        engine = self.engine
        attempt = scope.attempt
        limiter = engine.limiter_for(attempt.connection, attempt.provider)
        if limiter is not None or attempt.connection.semaphore is not None:
            return self._dispatch_queued(scope, limiter, url, data, api_key, extra, credentials)
        if attempt.probe:  # (both are about a probe's lease only)
            engine.probe_waiting(attempt)
        record, trail = scope.record, scope.trail
        if record is not None and trail is not None:
            trail.state(record, "upstream")
        if attempt.probe:
            engine.probe_alive(attempt)
        return self.upstream.send(
            "POST", url, body=data, api_key=api_key, extra_headers=extra, credentials=credentials
        )

    async def _dispatch_queued(
        self,
        scope: _AttemptScope,
        limiter: RequestLimiter | None,
        url: str,
        data: bytes,
        api_key: str | None,
        extra: Mapping[str, str],
        credentials: Mapping[str, str] | None,
    ) -> UpstreamResponse:
        """`_dispatch` through the connection's request queue and/or concurrency slots."""
        engine = self.engine
        attempt = scope.attempt
        record, trail = scope.record, scope.trail
        ticket = limiter.admit() if limiter is not None else None
        scope.ticket = ticket
        engine.probe_waiting(attempt)
        sem = attempt.connection.semaphore
        task = asyncio.current_task()
        assert task is not None
        self._waiters.add(task)  # (until it is sent: `stop` answers it rather than wait for it)

        def still_wanted() -> bool:  # asked while waiting: a key that started cooling is not sent to
            return engine.still_eligible(attempt)

        try:
            if sem is not None:
                quota = engine.settings.quota_share()
                if record is not None and trail is not None and quota.enabled:
                    trail.state(record, "slot")
                if quota.enabled and await sem.acquire(
                    queue_depth=quota.queue_depth,
                    timeout_ms=quota.queue_timeout_ms,
                    still_wanted=still_wanted,
                ):
                    scope.semaphore = sem  # no await since the slot was granted: the scope owns it

            if ticket is not None and record is not None and trail is not None:
                trail.state(record, "queued")
            dispatch = await ticket.dispatch(still_wanted) if ticket is not None else None
        finally:
            self._waiters.discard(task)
        if record is not None and trail is not None:
            trail.state(record, "upstream")
        engine.probe_alive(attempt)
        send = self.upstream.send(
            "POST", url, body=data, api_key=api_key, extra_headers=extra, credentials=credentials
        )
        if limiter is not None and dispatch is not None:
            return await limiter.within_deadline(dispatch, send)
        return await send

    # ------------------------------------------------------------------ streams

    async def _start_stream(
        self,
        scope: _AttemptScope,
        upstream: UpstreamResponse,
        headers: dict[str, str],
        progress: _Progress,
    ) -> Response | None:
        """Wait for the first chunk (fallback still possible), then commit to relaying."""
        engine = self.engine
        chunks = upstream.chunks()
        try:
            first = await anext(chunks, b"")
        except UpstreamFailure as failure:
            self._failed(scope, failure.outcome, progress, headers)
            return None
        if not first:
            outcome = Outcome.network("upstream ended the stream before any data")
            self._failed(scope, outcome, progress, headers)
            return None

        watch = engine.settings.watchdog()
        watchdog = ThroughputWatchdog(watch, engine.clock.now()) if watch.enabled else None

        attempt = scope.attempt
        probe = attempt.probe
        record, trail = scope.record, scope.trail

        async def relay() -> AsyncGenerator[bytes, None]:
            outcome: Outcome | None = None
            parser = SSEParser() if watchdog is not None else None
            # The trail's share of a stream: a byte count, and the last two chunks (the usage
            # chunk comes last) to read the usage from when it ends. No parsing per chunk.
            sent = len(first)
            previous, last = b"", first
            try:
                if record is not None and trail is not None:
                    trail.first_byte(record)
                yield first
                if parser is not None and watchdog is not None:
                    _observe(parser, watchdog, first, engine.clock.now())
                async for chunk in chunks if watchdog is None else _judged(chunks, watchdog, engine.clock):
                    if probe:
                        engine.probe_alive(attempt)
                    if parser is not None and watchdog is not None:
                        now = engine.clock.now()
                        _observe(parser, watchdog, chunk, now)
                        if watchdog.should_abort(now):
                            outcome = Outcome.stall("stream throughput below the watchdog minimum")
                            if record is not None:
                                record.code = "stream_stalled"  # (what the client is told)
                            yield _Ending(
                                sse_error(
                                    "the upstream stream stalled (throughput watchdog)", "stream_stalled"
                                )
                            )
                            return
                    sent += len(chunk)
                    previous, last = last, chunk
                    yield chunk
                if _ends_inside_an_event(previous + last):
                    raise UpstreamFailure(_CUT_INSIDE_AN_EVENT)
                ended = _chat_stream_error(previous + last)
                if ended is not None:  # relayed as it came; it counts as the failure it reports
                    outcome = _stream_failure(ended, engine.scrubber, record)
                else:
                    outcome = Outcome.ok(upstream.status)
            except _Silent:
                outcome = Outcome.stall("stream throughput below the watchdog minimum")
                if record is not None:
                    record.code = "stream_stalled"
                yield _Ending(
                    sse_error("the upstream stream stalled (throughput watchdog)", "stream_stalled")
                )
            except UpstreamFailure as failure:
                outcome = failure.outcome
                yield _Ending(
                    sse_error(f"the upstream stream broke off: {failure.outcome.error}", "stream_interrupted")
                )
            finally:
                # Synchronous on purpose: this also runs on GeneratorExit from aclose().
                scope.finish(outcome or Outcome.disconnect())
                if record is not None:
                    record.bytes_out = sent
                    record.usage = stream_usage(previous + last)
            # Ended well (the pin was made): the stream ends once the fleet has the pin.
            await _shared_settled(engine, scope.session, None)

        return _RelayResponse(
            _scrubbed(relay(), engine.scrubber),
            scope,
            status_code=upstream.status,
            media_type="text/event-stream",
            headers=headers,
            pipeline=self,
            ending=sse_error,
        )

    async def _start_gated(
        self,
        scope: _AttemptScope,
        upstream: UpstreamResponse,
        headers: dict[str, str],
        progress: _Progress,
        wire: Wire,
    ) -> Response | None:
        """A Messages or Responses stream: its preamble (`message_start`, `response.created`) is held
        back until the first content, so that an `error` event before any content still falls back
        like a failed attempt; after content an `error` event is relayed and ends the stream, and
        is recorded as the status it stands for (`overloaded_error` as 529...)."""
        engine = self.engine
        api = wire.api
        chunks = upstream.chunks()
        parser = SSEParser()
        head: list[bytes] = []
        held = 0
        failed: StreamError | None = None
        ended: StreamError | None = None  # an error event after content, in the same chunk
        content = False
        connection_id = scope.attempt.connection.spec.id
        # Judged from the first byte on, as a chat stream is, the held-back preamble too: pings
        # and nothing else would otherwise hold the request for as long as they come.
        watch = engine.settings.watchdog()
        watchdog = ThroughputWatchdog(watch, engine.clock.now()) if watch.enabled else None
        if watchdog is not None:
            chunks = _judged(chunks, watchdog, engine.clock)
        stalled = False
        attempt = scope.attempt
        probe = attempt.probe
        try:
            while not content and failed is None and held <= GATE_LIMIT_BYTES:
                chunk = await anext(chunks, b"")
                if not chunk:
                    break
                if probe:  # the probe is making progress, held back or not: its slot stays its own
                    engine.probe_alive(attempt)
                head.append(chunk)
                held += len(chunk)
                now = engine.clock.now() if watchdog is not None else 0.0
                for event in parser.feed(chunk):
                    data = event.json_object()
                    if watchdog is not None:
                        watchdog.observe(data, now)
                    kind = event_kind(api, event.event, data)
                    if kind == EventKind.ERROR:
                        if content:
                            ended = stream_error(api, data)
                        else:
                            failed = stream_error(api, data)
                        break
                    if kind == EventKind.CONTENT:
                        content = True
                    else:
                        wire.seen(connection_id, data)
                if watchdog is not None and not content and failed is None and watchdog.should_abort(now):
                    stalled = True
                    break
        except _Silent:
            stalled = True
        except UpstreamFailure as failure:
            self._failed(scope, failure.outcome, progress, headers)
            return None
        if stalled:  # nothing went to the client yet: a failed attempt, which may fall back
            outcome = Outcome.stall("stream throughput below the watchdog minimum before any content")
            self._failed(scope, outcome, progress, headers)
            return None
        if failed is not None:
            return self._upstream_error(
                scope,
                failed.status,
                upstream.headers,
                "application/json",
                failed.body,
                True,
                progress,
                headers,
            )
        if not content and held <= GATE_LIMIT_BYTES:
            outcome = Outcome.network("upstream ended the stream before any content")
            self._failed(scope, outcome, progress, headers)
            return None

        if wire.ids:
            # The preamble naming the response id goes out next: the fleet knows its owner first.
            await _shared_settled(engine, None, wire)
        first = b"".join(head)
        record, trail = scope.record, scope.trail

        async def relay() -> AsyncGenerator[bytes, None]:
            outcome: Outcome | None = None
            sent = len(first)  # the trail's share, as in _start_stream: a count and the last chunks
            previous, last = b"", first
            try:
                if record is not None and trail is not None:
                    trail.first_byte(record)
                yield first
                if ended is not None:
                    outcome = _stream_failure(ended, engine.scrubber, record)
                    return
                # (The watchdog saw the held-back events as they came.)
                # Without the watchdog nothing needs every event: the spotter finds an error
                # event by its bytes and parses only from there (the relay keeps chat's pace).
                spotter = ErrorSpotter(api, first) if watchdog is None else None
                async for chunk in chunks:
                    if probe:
                        engine.probe_alive(attempt)
                    error: StreamError | None = None
                    if spotter is not None:
                        error = spotter.feed(chunk)
                    elif watchdog is not None:
                        now = engine.clock.now()
                        for event in parser.feed(chunk):
                            data = event.json_object()
                            watchdog.observe(data, now)
                            if error is None and event_kind(api, event.event, data) == EventKind.ERROR:
                                error = stream_error(api, data)
                        if error is None and watchdog.should_abort(now):
                            outcome = Outcome.stall("stream throughput below the watchdog minimum")
                            if record is not None:
                                record.code = "stream_stalled"  # (what the client is told)
                            yield _Ending(
                                wire.sse_error(
                                    "the upstream stream stalled (throughput watchdog)", "stream_stalled"
                                )
                            )
                            return
                    sent += len(chunk)
                    previous, last = last, chunk
                    yield chunk
                    if error is not None:
                        outcome = _stream_failure(error, engine.scrubber, record)
                        return
                tail = previous + last
                if _ends_inside_an_event(tail):
                    raise UpstreamFailure(_CUT_INSIDE_AN_EVENT)
                if wire.api == "messages" and b"message_stop" not in tail:
                    # Whole events, but not the whole answer: Anthropic's SDK hands such a message
                    # back with `stop_reason: null` as if it were complete.
                    raise UpstreamFailure(_ENDED_BEFORE_MESSAGE_STOP)
                outcome = Outcome.ok(upstream.status)
            except _Silent:
                outcome = Outcome.stall("stream throughput below the watchdog minimum")
                if record is not None:
                    record.code = "stream_stalled"
                yield _Ending(
                    wire.sse_error("the upstream stream stalled (throughput watchdog)", "stream_stalled")
                )
            except UpstreamFailure as failure:
                outcome = failure.outcome
                yield _Ending(
                    wire.sse_error(
                        f"the upstream stream broke off: {failure.outcome.error}", "stream_interrupted"
                    )
                )
            finally:
                # Synchronous on purpose: this also runs on GeneratorExit from aclose().
                scope.finish(outcome or Outcome.disconnect())
                if record is not None:
                    record.bytes_out = sent
                    record.usage = (
                        messages_stream_usage(first, previous + last)
                        if wire.api == "messages"
                        else stream_usage(previous + last)
                    )
            # Reached only when the stream ended here normally (a `return` above skips it).
            await _shared_settled(engine, scope.session, None)

        return _RelayResponse(
            _scrubbed(relay(), engine.scrubber),
            scope,
            status_code=upstream.status,
            media_type="text/event-stream",
            headers=headers,
            pipeline=self,
            ending=wire.sse_error,
        )

    # ------------------------------------------------------------------ answers

    def _failed(
        self,
        scope: _AttemptScope,
        outcome: Outcome,
        progress: _Progress,
        headers: dict[str, str],
    ) -> None:
        """Record an attempt that broke before any byte reached the client; its 502 is the answer
        if nothing else is left to try."""
        scope.finish(outcome)
        attempt = scope.attempt
        base_url = shown_url(self.config.providers[attempt.provider.spec.id].base_url)
        failure = _UpstreamError(attempt.connection.spec.id, None, f"{outcome.error} at {base_url}")
        progress.last_failure = failure
        progress.last_error = error_response(
            502,
            f"{failure} (trying {attempt.target})",
            "upstream_unreachable",
            headers=headers,
            upstreamError=failure.to_api(),
        )

    def _route_headers(
        self, attempt: Attempt, progress: _Progress, targets: list[Target]
    ) -> tuple[dict[str, str], list[tuple[bytes, bytes]] | None]:
        """The attempt's routing headers, and (when they are the connection's usual ones, without
        fallbacks) the same encoded for an answer's header list. The usual ones are built once per
        connection: nothing changes a route headers dict (answers copy it, or read it)."""
        target = attempt.target
        skipped_before = 0
        for t in targets:
            if t is target or t == target:
                break
            if t.name not in progress.attempted_targets:
                skipped_before += 1
        conn_id, provider_id = attempt.connection.spec.id, attempt.provider.spec.id
        fallbacks = progress.failed_attempts + skipped_before
        if not fallbacks:
            usual = self._usual_headers.get(conn_id)
            if usual is not None and usual[0]["x-omniroute-provider"] == provider_id:
                return usual
        headers = {"x-omniroute-selected-connection-id": conn_id, "x-omniroute-provider": provider_id}
        if fallbacks:
            headers["x-omniroute-fallback-attempts"] = str(fallbacks)
            return headers, None
        usual = headers, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._usual_headers[conn_id] = usual  # one per configured connection
        return usual

    def nothing_eligible(self, targets: list[Target]) -> Response:
        """The answer to a single-attempt request (`count_tokens`) that none of `targets` can take
        now: what a chat request that may not wait is answered (its status, words, `skipped` and
        Retry-After)."""
        decision = NoTarget(tuple(self.engine.explain(targets, set())))
        return self._unavailable(decision, _Progress(), targets)

    def _unavailable(self, decision: NoTarget, progress: _Progress, targets: list[Target]) -> Response:
        now = self.engine.clock.now()
        relevant = [s for s in decision.skips if s.reason != "already_tried"]
        if not relevant and progress.last_error is not None:
            return progress.last_error
        last = progress.last_error
        if decision.not_found_only and last is not None and last.status_code == 404:
            return last  # this request's own 404 locked the model: the client gets the upstream's answer
        every = (*decision.skips, *progress.api_skips) if progress.api_skips else decision.skips
        skipped = [s.to_dict(now) for s in every]
        why = "; ".join(
            f"{s.target}{'@' + s.connection_id if s.connection_id else ''}: {self._skip_reason(s)}"
            + (f" (retry in {max(0, int(s.retry_at - now))} ms)" if s.retry_at is not None else "")
            for s in every
        )
        if decision.not_found_only:
            # A model that every candidate answered 404 for is not found, and no
            # Retry-After would make it appear; a 429 would only invite the client to retry.
            return _answer(
                progress, 404, f"no target serves this model: {why}", "model_not_found", skipped=skipped
            )
        recovery = decision.earliest_recovery
        if decision.breaker_only and recovery is not None:
            retry = max(1, math.ceil((recovery - now) / 1000))
            return _answer(
                progress,
                503,
                f"every target's provider circuit is open: {why}",
                "provider_circuit_open",
                headers={"retry-after": str(retry)},
                skipped=skipped,
            )
        if recovery is not None:
            retry_ms = recovery - now
            if progress.client_retry_ms is not None:
                retry_ms = max(retry_ms, progress.client_retry_ms)
            retry = max(1, math.ceil(retry_ms / 1000))
            return _answer(
                progress,
                429,
                f"no target is available right now: {why}",
                "all_targets_cooling",
                headers={"retry-after": str(retry)},
                skipped=skipped,
            )
        return _answer(
            progress,
            503,
            f"no target can serve this request: {why}",
            "all_targets_unavailable",
            skipped=skipped,
        )

    def _skip_reason(self, skip: Skip) -> str:
        """Why a target was passed over, in the answer's words: a cooling connection with what cooled
        it, as the trail says it (`cooled_by`: a local server that is down reads "cooling after
        connection refused", not as a rate limit)."""
        if skip.reason == "cooling" and skip.connection_id is not None:
            conn = self.engine.connections.get(skip.connection_id)
            why = cooled_by(conn.health) if conn is not None else None
            if why:
                return f"cooling after {why}"
        return skip.reason


class _Relayed(Response):
    """An upstream's answer relayed whole: what `Response(body, status_code=..., media_type=...,
    headers=...)` builds, with its header list written out directly instead of by
    `Response.init_headers` (which lower-cases, encodes and scans them all again for every answer)."""

    def __init__(
        self, body: bytes, status: int, media_type: str, raw_headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.status_code = status
        self.media_type = media_type
        self.background = None
        self.body = body
        self.raw_headers = raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


WHOLE_ANSWERS: tuple[type[Response], ...] = (Response, ErrorResponse, _Relayed)
"""The answers whose `__call__` is Starlette's Response's: the start, then the whole body."""


def _relayed(
    body: bytes,
    status: int,
    media_type: str,
    headers: dict[str, str],
    encoded: list[tuple[bytes, bytes]] | None = None,
) -> Response:
    """The answer of a successful non-streaming attempt, with the route's `headers` (`encoded`: the
    same as a header list, when the caller has it)."""
    if media_type.startswith("text/") or status < 200 or status in (204, 304):
        # Starlette's own rules (a charset for text, no length without a body): its Response.
        return Response(body, status_code=status, media_type=media_type, headers=headers)
    if encoded is None:
        encoded = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw = [
        *encoded,
        (b"content-length", str(len(body)).encode()),
        (b"content-type", media_type.encode("latin-1")),
    ]
    return _Relayed(body, status, media_type, raw)


def _any_muted(targets: list[Target], mute: frozenset[str]) -> bool:
    return any(t.provider in mute for t in targets)


def _without_muted(
    targets: list[Target], mute: frozenset[str], api: str
) -> tuple[tuple[Skip, ...], list[Target]]:
    """The targets whose provider speaks `api`, and a skip for each of the others."""
    skips = tuple(
        Skip(str(t), None, f"does not speak {api}", None, False) for t in targets if t.provider in mute
    )
    return skips, [t for t in targets if t.provider not in mute]


def _none_speaks(model: str, api: str, skips: tuple[Skip, ...]) -> ErrorResponse:
    why = "; ".join(f"{s.target}: {s.reason}" for s in skips)
    return error_response(
        404,
        f"model {untrusted.echo(model)!r}: no target speaks the {api} API ({why})",
        "model_not_found",
        skipped=[s.to_dict(0) for s in skips],
    )


def _session_digest(raw: bytes) -> str:
    """A long session id's stand-in: the same id always maps to it (the pin holds), in 65
    characters however long the id (a pin is kept in memory and the state file)."""
    return "#" + hashlib.sha256(raw).hexdigest()


def _client_headers(headers: Mapping[bytes, bytes]) -> dict[str, str]:
    """The client's own headers of a passed-through API (`anthropic-version`...)."""
    return {h: headers[k].decode("latin-1") for h, k in _CLIENT_KEYS if k in headers}


def _answer(
    progress: _Progress,
    status: int,
    message: str,
    code: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    """Our own error answer. When this request's own attempts failed, it starts with what the last
    upstream did, in words, and `upstreamError` says it as data: a dead upstream is then not
    hidden behind the cooldown it caused."""
    failure = progress.last_failure
    if failure is None:
        return error_response(status, message, code, headers=headers, **extra)
    return error_response(
        status, f"{failure}; {message}", code, headers=headers, upstreamError=failure.to_api(), **extra
    )


_WORDS_LIMIT = 200
"""The most of an upstream's error message an answer repeats."""


def _error_words(text: str) -> str:
    """What an upstream's error body says, in one line: the `message` of an OpenAI-style (or similar)
    JSON error, else the text itself."""
    words = text
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        found = error.get("message") if isinstance(error, dict) else error
        if not isinstance(found, str):
            found = body.get("message") or body.get("detail")
        if isinstance(found, str) and found.strip():
            words = found
    words = " ".join(words.split())
    if len(words) > _WORDS_LIMIT:
        words = words[: _WORDS_LIMIT - 1] + "…"
    return words or "(no error text)"


def _claims_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _stream_failure(error: StreamError, scrub: Scrubber, record: RequestRecord | None) -> Outcome:
    """An error event after content: relayed as it came and the stream ends there; the attempt
    counts as the status the event stands for (an `overloaded_error` is a 529 to every layer), and
    the record says the error its client got."""
    said = scrub(error.body.decode("utf-8", "replace"))
    if record is not None:
        code, message = error_of(error.body)
        record.code = scrub(code) if code else None
        record.message = scrub(message) if message else kept_message(said)  # its words, or itself
    return Outcome(OutcomeKind.STATUS, error.status, {}, said)


def _json_object(content: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# -- routing's helpers -----------------------------------------------------------------------------


def pinned_connection(raw_headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The connection `X-OmniRoute-Connection` names, or None. ValueError when it is given more than
    once: two would pin to whichever one the proxy happened to read (asked, not guessed)."""
    found = [value for name, value in raw_headers if name.lower() == b"x-omniroute-connection"]
    if len(found) > 1:
        raise ValueError("X-OmniRoute-Connection is given more than once; give one")
    return found[0].decode("latin-1") if found else None


def pin_not_found(pinned: str | None, model: str) -> ErrorResponse:
    """The answer to a pin that names no connection of the model's targets."""
    return error_response(
        404,
        f"connection {untrusted.echo(pinned or '')!r} is unknown or cannot serve {untrusted.echo(model)!r}",
        "connection_not_found",
    )


def _wake_at(decision: NoTarget, probe_settled_by: float) -> tuple[float | None, bool]:
    """When a request that found nothing eligible is done waiting: the earliest recovery it may
    wait for, and whether that is a probe in flight. A probe settles when its upstream answers,
    which no estimate knows: its wait lasts until the breaker's event says it settled
    (`Pipeline.nudge`), or `probe_settled_by`."""
    wake: float | None = None
    on_probe = False
    for skip in decision.skips:
        if skip.waitable and skip.retry_at is not None:
            probe = skip.reason == "probe_in_flight"
            at = probe_settled_by if probe else skip.retry_at
            if wake is None or at < wake:
                wake, on_probe = at, probe
    return wake, on_probe


def _creator_first(targets: list[Target], connection_id: str, engine: Engine) -> list[Target]:
    """`targets` with those that reach `connection_id` (where a continued conversation lives) first,
    the rest in their order."""
    connection = engine.connections.get(connection_id)
    if connection is None:
        return targets
    provider = connection.spec.provider
    first = [t for t in targets if t.provider == provider and t.connection_id in (None, connection_id)]
    if not first or first[0] is targets[0]:
        return targets
    return first + [t for t in targets if t not in first]


# -- the request trail's ends ------------------------------------------------------------------------


def _request_id(scope: Scope) -> str:
    try:
        found = scope["state"]["request_id"]  # the guard's (proxy.guard), on every request it passes
    except (KeyError, TypeError):
        found = None
    return found if type(found) is str else f"local-{id(scope):x}"


def _client(scope: Scope) -> str:
    client = scope.get("client")  # (host, port); `request.client` builds a named tuple
    if not client:
        return "unknown"
    host: str = client[0]  # (a str: ASGI's, and uvicorn's from X-Forwarded-For alike)
    # A loopback client's `X-Forwarded-For` is taken for its address (uvicorn's proxy headers), so
    # any local process makes it as long as its headers: the record keeps at most an address's worth.
    return host if len(host) <= ADDRESS_LIMIT else host[: ADDRESS_LIMIT - 1] + "…"


def _ended(trail: Trail, record: RequestRecord, response: Response | None, now: float | None) -> None:
    """A request answered without a relayed stream: its status, and for an error what it said.
    `now`: when it ended, if the caller has read the clock."""
    if response is None:
        if record.code == "internal_error":  # (set as the bug went by: `Pipeline.handle`)
            trail.end(record, 500, state="failed", now=now)
            return
        # The handler was cancelled (shutdown): nobody got an answer.
        record.code, record.message = "cancelled", "the server stopped before it answered"
        trail.end(record, None, state="client_gone", now=now)
        return
    status = response.status_code
    body = response.body if not isinstance(response, StreamingResponse) else b""
    record.bytes_out = len(body)
    if status >= 400:
        # The body was scrubbed as it was relayed; what decoding it reveals is scrubbed again (a
        # secret an upstream escaped twice reads, once decoded, as one escaped once).
        scrub = trail.engine.scrubber
        if type(response) is ErrorResponse:  # our own: its words are at hand, as its body says them
            code, message = kept_message(response.code), kept_message(response.message)
        else:
            code, message = error_of(bytes(body))
        record.code = scrub(code) if code else code
        record.message = scrub(message) if message else message
    trail.end(record, status, None, now)  # (by position: keywords to a method cost a dict)


def _stream_ended(
    trail: Trail, record: RequestRecord, status: int, outcome: Outcome | None, now: float
) -> None:
    if outcome is None or outcome.kind is OutcomeKind.CLIENT_DISCONNECT:
        record.code, record.message = "client_disconnected", "the client went away during the stream"
        trail.end(record, status, state="client_gone", now=now)
    elif not outcome.is_success:
        # The code the client's error event carried: the relay sets the upstream's own for its
        # error event, and `stream_stalled` when the watchdog cut the stream; anything else that
        # broke it off (an idle upstream too, which counts as a stall) the client was told was
        # `stream_interrupted`.
        if record.code is None:
            record.code, record.message = "stream_interrupted", None
        if record.message is None:
            record.message = kept_message(trail.engine.scrubber(outcome.error))
        trail.end(record, status, state="failed", now=now)
    else:
        trail.end(record, status, None, now)


class _AttemptScope:
    """The one owner of an attempt: it records exactly one outcome and gives back every place the
    attempt took (queue place or limiter slot, concurrency slot, upstream response), on every path.

    `finish(outcome)` records the first outcome it is given and releases everything; later calls
    change nothing. `close()` is `finish(disconnect)` for a path that ended without an outcome of
    its own (a cancellation, a relay that never ran): a disconnect counts against no layer. Both
    are synchronous, so they can run in a `finally` that must not await (a generator being closed,
    a cancelled task).
    """

    __slots__ = (
        "_finished",
        "attempt",
        "engine",
        "handed_off",
        "outcome",
        "record",
        "semaphore",
        "session",
        "ticket",
        "trail",
        "upstream",
    )

    def __init__(
        self,
        engine: Engine,
        attempt: Attempt,
        session: str | None,
        trail: Trail | None = None,
        record: RequestRecord | None = None,
    ) -> None:
        self.engine = engine
        self.attempt = attempt
        self.session = session
        self.trail = trail
        self.record = record if trail is not None else None
        if self.record is not None:
            self.record.current = attempt  # (shown as pending until `finish` records it)
        self.ticket: Ticket | None = None
        self.semaphore: ConnectionSemaphore | None = None
        self.upstream: UpstreamResponse | None = None
        self.outcome: Outcome | None = None
        self.handed_off = False
        """A relay response owns the scope now: it closes it when the response ends."""
        self._finished: Recorded | None = None

    def finish(self, outcome: Outcome) -> Recorded:
        if self._finished is not None:
            return self._finished
        self.outcome = outcome
        engine = self.engine
        # One clock reading for the engine's record and the trail's: the same moment, read once.
        now = engine.clock.now()
        try:
            self._finished = recorded = engine.record(self.attempt, outcome, session=self.session, now=now)
        finally:
            self._release()
        if self.record is not None and self.trail is not None:
            # (By position: keywords to a method cost a dict.)
            self.trail.attempt(
                self.record, self.attempt, outcome, recorded.verdict, recorded.status, self.handed_off, now
            )
        return recorded

    def close(self) -> None:
        if self.outcome is None:
            self.finish(Outcome.disconnect())

    def _release(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.close()  # a no-op for a response already read and released
        semaphore, self.semaphore = self.semaphore, None
        if semaphore is not None:
            semaphore.release()
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            ticket.release()


class _Ending(bytes):
    """The proxy's own event that ends a relayed stream (the upstream broke off, the watchdog cut
    it): what is left of an event the upstream never finished is dropped before it, so that the
    client's SSE parser reads it whole."""


_CUT_INSIDE_AN_EVENT = Outcome.network("the stream ended inside an event")
_ENDED_BEFORE_MESSAGE_STOP = Outcome.network("the stream ended before message_stop")
"""A Messages stream's last event is `message_stop` (its last two reads are looked at: that event is
a few dozen bytes, written last)."""


class _Silent(Exception):
    """The watchdog's moment came with no chunk since (`_judged`): the stream is cut as stalled."""


async def _judged(
    chunks: AsyncIterator[bytes], watchdog: ThroughputWatchdog, clock: Clock
) -> AsyncIterator[bytes]:
    """`chunks`, each waited for no longer than the watchdog's `due()`: a stream gone silent is
    cut when the watchdog would judge it, not when (if ever) its upstream speaks again. (Only with
    the watchdog on: a timer per read. The read a deadline cuts ends the upstream's body, which
    the stall ends anyway.)"""
    while True:
        due = watchdog.due()
        if due is None:  # suspended (a tool call in flight): the idle timeout, not the watchdog
            chunk = await anext(chunks, b"")
        else:
            try:
                # (+1 ms: the clock read after the wait is past `due`, where `should_abort` holds.)
                async with asyncio.timeout(max(0.0, (due - clock.now() + 1) / 1000)):
                    chunk = await anext(chunks, b"")
            except TimeoutError:
                raise _Silent from None
        if not chunk:
            return
        yield chunk


def _chat_stream_error(tail: bytes) -> StreamError | None:
    """The error a chat stream's upstream ended it with, if it did: some servers (vLLM, OpenAI)
    report a failure after the content as a last `data: {"error": {...}}` event, before `[DONE]`
    or without it. Read from the stream's last bytes, once it ended: no parsing per chunk."""
    at = tail.rfind(b'"error"')
    if at < 0:
        return None
    end = tail.rstrip()
    if end.endswith(b"data: [DONE]"):
        end = end[: -len(b"data: [DONE]")].rstrip()
    start = end.rfind(b"data:")
    if start < 0 or start > at:
        return None  # the word is not in the last event
    try:
        data = json.loads(end[start + 5 :])
    except (ValueError, RecursionError):
        return None
    error = data.get("error") if type(data) is dict else None
    if type(error) is not dict:
        return None
    code = error.get("code")
    status = code if type(code) is int and 400 <= code <= 599 else 502
    try:
        return StreamError(status, json.dumps(data).encode())
    except (ValueError, RecursionError):
        return StreamError(status, b'{"error": {"message": "the upstream stream failed"}}')


def _ends_inside_an_event(tail: bytes) -> bool:
    """Whether a stream whose last bytes are `tail` ended before its last event's blank line: an
    upstream whose body ends where its connection does (no length, no chunks) and closed it
    mid-event, which reads as a clean end. SSE clients drop such an event, and so does the relay
    (it sends the API's error event instead); a bare `data: [DONE]` line, which some servers end
    on without the blank line, is a finished stream."""
    end = tail.rstrip(b" \t")
    if end.endswith((b"\n\n", b"\n\r\n")) or not end.strip():
        return False
    return not end.rstrip().endswith(b"data: [DONE]")


async def _scrubbed(relay: AsyncGenerator[bytes, None], scrubber: Scrubber) -> AsyncGenerator[bytes, None]:
    """The relay's bytes without the configured secrets, and its error events without anything
    shaped like a key (`StreamScrubber`). Closing this closes the relay (its `finally` records)."""
    lines = StreamScrubber(scrubber)
    try:
        async for chunk in relay:
            if type(chunk) is _Ending:
                lines.drop_partial()
            out = lines.feed(chunk)
            if out:
                yield out
        tail = lines.flush()
        if tail:
            yield tail
    finally:
        await relay.aclose()  # never suspends: the relay's own finally is synchronous


class _RelayResponse(StreamingResponse):
    """A relayed stream whose attempt ends when the response does, whether its body ran or not.

    The relay generator records the stream's outcome in its `finally`, but a generator's `finally`
    runs only if it started and is then run to its end or closed: a response whose start fails
    (the client has gone) is never iterated, and one stopped at a `yield` would be closed only by
    the garbage collector. So the response closes the relay itself, and then the scope, whatever
    happened. Starlette calls the response right after the endpoint returns it, with no await in
    between, and `__call__` enters its `try` before its first await: no path skips the `finally`.
    """

    def __init__(
        self,
        relay: AsyncGenerator[bytes, None],
        scope: _AttemptScope,
        *,
        status_code: int,
        media_type: str,
        headers: dict[str, str],
        pipeline: Pipeline,
        ending: Callable[[str, str], bytes],
    ) -> None:
        """`ending`: the API's last event of a stream that cannot continue (message, code)."""
        super().__init__(relay, status_code=status_code, media_type=media_type, headers=headers)
        self._relay = relay
        self._scope = scope
        self._pipeline = pipeline
        self._ending = ending
        scope.handed_off = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True  # (the start comes first: any message means it went)
            await send(message)

        try:
            await super().__call__(scope, receive, sending)
        except asyncio.CancelledError:
            if not (started and self._pipeline.stopping):
                raise
            # Cut by the server's stop (the grace period ran out): the stream ends as one that
            # cannot continue does, with its API's error event, not mid-event. (The blank line
            # first ends whatever event the last chunk left open.)
            _uncancel()
            _, message, code = STOPPING
            await send({"type": "http.response.body", "body": b"\n" + self._ending(message, code)})
        finally:
            try:
                await self._relay.aclose()  # no await inside the relay's finally: this never suspends
            finally:
                attempt = self._scope
                attempt.close()
                engine = attempt.engine
                outcome = attempt.outcome
                now = engine.clock.now()  # one reading for the statistics and the trail
                engine.stats.finished(outcome is not None and outcome.is_success, now)
                if attempt.record is not None and attempt.trail is not None:
                    _stream_ended(attempt.trail, attempt.record, self.status_code, outcome, now)


async def _while_connected(
    receive: Receive, work: Coroutine[Any, Any, Response], stopping: Callable[[], bool] = lambda: False
) -> Response:
    """`Pipeline.while_connected`; `stopping`: whether the server has begun to stop. (`handle` does
    the same inline: a coroutine of its own on every request costs the hot path.)"""
    watch = _ClientWatch(receive)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.left():
            return error_response(499, "the client went away before the answer", "client_disconnected")
        if stopping():
            _uncancel()
            return error_response(*STOPPING, headers=STOPPING_HEADERS)
        raise
    finally:
        watch.stop()


def _uncancel() -> None:
    """A cancellation answered, not passed on: the task is no longer being cancelled."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()


class _ClientWatch:
    """The watch on one request's client, started in the task that runs its attempts once its body
    has been read: the task is cancelled when the client leaves, unless `stop` came first (the
    answer is on its way: the watch may end in the same turn of the loop as the attempts).

    The client has left when the next message the server has for us is `http.disconnect` (at the
    latest when the response is complete). Any other message (nothing should come after the body)
    ends the watch: the request then runs as if the client stayed.

    Under uvicorn the watch waits on the server's own signal (`_cycle_of`): a future among the
    cycle's `message_event` waiters (what `Event.wait` puts there) with this watch's callback,
    which is what `receive()` waits for, without a task per request running the coroutine (its
    creation, two steps and a cancellation thrown through two frames: about 4 % of a small
    request's instructions). Under any other server it is `receive()` itself, run as a task
    (`_watch_task`).
    """

    __slots__ = ("_answered", "_cycle", "_gone", "_handler", "_stop", "_waiter")

    def __init__(self, receive: Receive) -> None:
        handler = asyncio.current_task()
        assert handler is not None  # an ASGI app runs in a task
        self._handler = handler
        self._gone = False
        self._answered = False
        self._stop: Callable[[], None] | None = None
        self._waiter: asyncio.Future[bool] | None = None
        cycle = self._cycle = _cycle_of(receive)
        if cycle is None:
            self._stop = _watch_task(receive, handler.get_loop(), self._leave)
            return
        # As receive() does before it waits: a transport whose reading was paused (a body past
        # uvicorn's high-water mark) would not see the client go.
        flow = cycle.flow
        if flow.read_paused:
            flow.resume_reading()
        waiter: asyncio.Future[bool] = handler.get_loop().create_future()
        cycle.message_event._waiters.append(waiter)
        waiter.add_done_callback(self._woken)
        self._waiter = waiter

    def _woken(self, waiter: asyncio.Future[bool]) -> None:
        """The cycle's event was set: what receive() does when it wakes."""
        cycle = self._cycle
        if self._waiter is None or cycle is None:  # stopped while this callback was on its way
            return
        self._waiter = None
        event = cycle.message_event
        event._waiters.remove(waiter)  # what Event.wait does when woken
        event.clear()
        if cycle.disconnected or cycle.response_complete:
            self._leave()

    def _leave(self) -> None:
        if not self._answered:
            self._gone = True
            self._handler.cancel()

    def left(self) -> bool:
        """Asked of a CancelledError: is it ours (the client left) and not also a shutdown's?"""
        return self._gone and self._handler.uncancel() == 0

    def stop(self) -> None:
        self._answered = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self._cycle is not None:
            self._cycle.message_event._waiters.remove(waiter)
            # The waiter never completes: its callback (which refers to this watch) must go, or
            # the two would hold each other, the cycle and the request's task until the cyclic
            # collector runs.
            waiter.remove_done_callback(self._woken)
        self._cycle = None
        stop, self._stop = self._stop, None  # it refers back to this watch: no cycle is left behind
        if stop is not None:
            stop()


_CYCLES: dict[type, bool] = {}
"""Type of a `receive` method's owner -> whether it is uvicorn's request cycle (`_cycle_of`)."""


def _watch_task(
    receive: Receive, loop: asyncio.AbstractEventLoop, leave: Callable[[], None]
) -> Callable[[], None]:
    """Under a server other than uvicorn: call `leave` when `receive()` answers `http.disconnect`;
    the function returned stops the watch."""
    received = receive()
    # Straight to the loop: `ensure_future` checks its argument's kind in Python first.
    watch: asyncio.Future[Message] = (
        loop.create_task(received) if asyncio.iscoroutine(received) else asyncio.ensure_future(received)
    )

    def ended(watched: asyncio.Future[Message]) -> None:
        if (
            not watched.cancelled()
            and watched.exception() is None
            and watched.result()["type"] == "http.disconnect"
        ):
            leave()

    watch.add_done_callback(ended)

    def stop() -> None:
        watch.cancel()

    return stop


def _cycle_of(receive: Receive) -> Any | None:
    """uvicorn's request cycle behind `receive`, when it can be watched as `_ClientWatch` does:
    nothing has arrived since the body (its event is clear) and the client is still there.

    uvicorn's `receive()` (httptools and h11 alike) resumes reading, waits for the cycle's
    `message_event`, clears it, and answers `http.disconnect` when the cycle is `disconnected`
    or its response complete: `_ClientWatch` does the same with a future on that event. Should
    a uvicorn release change those names, this finds no cycle and the task watches instead.
    """
    cycle = getattr(receive, "__self__", None)
    if cycle is None:
        return None
    kind = type(cycle)
    known = _CYCLES.get(kind)
    if known is None:
        known = _CYCLES[kind] = _watchable(cycle)
    if not known or cycle.message_event.is_set() or cycle.disconnected or cycle.response_complete:
        return None
    return cycle


def _watchable(cycle: Any) -> bool:
    """Is `cycle` a uvicorn request cycle with everything `_ClientWatch` reads? (Asked once per type.)"""
    kind = type(cycle)
    return (
        kind.__name__ == "RequestResponseCycle"
        and kind.__module__.startswith("uvicorn.protocols.http.")
        and all(
            hasattr(cycle, name) for name in ("message_event", "disconnected", "response_complete", "flow")
        )
        and isinstance(cycle.message_event, asyncio.Event)
        and isinstance(getattr(cycle.message_event, "_waiters", None), collections.deque)
        and callable(getattr(cycle.flow, "resume_reading", None))
        and isinstance(getattr(cycle.flow, "read_paused", None), bool)
    )


def _header_map(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of repeated ones, as Starlette's
    `request.headers.get` reads them: one dict built in C, where each `request.headers` lookup
    scans the list in Python (and a miss raises and catches a KeyError). The Guard in front has
    built it already (HEADERS_KEY); nothing changes it."""
    found = scope.get(HEADERS_KEY)
    if found is not None:
        return cast(dict[bytes, bytes], found)
    raw = scope["headers"]
    return dict(reversed(raw if isinstance(raw, list) else list(raw)))


async def _read_body(
    scope: Scope,
    receive: Receive,
    deadlines: Deadlines,
    headers: Mapping[bytes, bytes] | None = None,
    first: Message | None = None,
) -> bytes:
    """The whole body, at most MAX_BODY_BYTES (BodyTooLarge past that); ClientDisconnect when the
    client leaves before it is in, BodyStalled when it stops sending it (`deadlines` time each
    wait). Read from the ASGI messages themselves, as Request.stream() does, without an async
    generator per request. `headers`: the request's `_header_map`, when the caller has it;
    `first`: the first message, when the caller has received it."""
    length = (headers if headers is not None else _header_map(scope)).get(b"content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        if first is not None:
            message, first = first, None
        elif _arrived(receive):
            message = await receive()
        else:
            message = await _receive_in_time(receive, deadlines)
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _arrived(receive: Receive) -> bool:
    """Has the server something for `receive()` already, so that it will not wait? Under uvicorn,
    when its request cycle's event is set (the body, or its next part, is in): the common case,
    which then needs no timer. False when it would wait, and under any other server."""
    event = getattr(getattr(receive, "__self__", None), "message_event", None)
    return event is not None and event.is_set()


async def _receive_in_time(receive: Receive, deadlines: Deadlines) -> Message:
    """`receive()`, or BodyStalled when nothing comes for BODY_IDLE_TIMEOUT_S. Behind the loop's
    one deadline timer rather than `asyncio.timeout`, whose timer of its own cost 2.9 µs a wait
    against 0.4 µs (a wait per request for the clients, SDKs among them, that send a request's
    headers and its body in two writes)."""
    loop = deadlines.loop
    task = asyncio.current_task(loop)
    assert task is not None  # an ASGI app runs in a task
    try:
        return await deadlines.within(receive(), task, loop.time() + BODY_IDLE_TIMEOUT_S)
    except DeadlinePassed:
        raise BodyStalled from None


def _observe(parser: SSEParser, watchdog: ThroughputWatchdog, chunk: bytes, now: float) -> None:
    for event in parser.feed(chunk):
        # Not JSON, [DONE] and oversize events say nothing about progress: None, as for a ping.
        watchdog.observe(event.json_object(), now)
