"""The request trail: what each `/v1` request went through, kept beside the engine (which stays
pure) and fed by the pipeline.

Recording is on the request path, so it is cheap by construction: a record is one mutable
object per request, its state an attribute write; an attempt, a skip or a wait appends one frozen
view when it happens (skips are explained only when there was one); a stream costs a byte count
per chunk and a look at its last two chunks for the usage at the end. Nothing of the prompt or the
answer is kept, ever: the usage numbers are all that is read from an answer.

Frozen `RequestView`s (proxy/readmodel.py) are built only when someone reads. The alive records
are in a dict; the last `server.request_history` finished ones in a ring, packed (`finished`:
two objects a record, where a `RequestRecord` holds about fifteen).

Each finished request goes to the traffic statistics (`proxy/traffic.py`) and into the ring in
batches of FOLD_BATCH, and whatever is left of a batch before anyone reads either.

About 850 lines: a record, and the little it reads of an answer (the error's code and
message, the token usage of a body or a stream's ends), kept together because what a record may
read of an answer (never its content) is the record's rule.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import cast

from proxy.config import REQUEST_HISTORY
from proxy.engine import Attempt, Engine, NoTarget, Skip, Target
from proxy.readmodel import (
    AttemptOutcome,
    AttemptView,
    RequestView,
    SkipView,
    UsageView,
    WaitView,
)
from proxy.resilience.classify import Verdict
from proxy.resilience.clock import Clock
from proxy.resilience.cooldown import ConnectionHealth
from proxy.resilience.events import Event
from proxy.resilience.outcome import Outcome, OutcomeKind
from proxy.traffic import TrafficStats, Usage

MESSAGE_LIMIT = 200
"""The most of an error's code or message a record keeps (an upstream's may be any length)."""
REASON_LIMIT = 120
TOKENS_MAX = 10**12
"""The most tokens a usage count may say: more is no count any request has (`10**400` is legal
JSON, and the statistics' float sums cannot take it), so it reads as not said."""
FOLD_BATCH = 64
"""Finished records the statistics and the ring take at a time: a batch goes through a connection's bucket row,
the histogram bounds and the code while they are hot, where one request at a time met them cold
again between everything else a request touches (bench/proxy.py: recording on / off 0.924 median
over seven runs, 0.905 before; docs/performance.md), and the ring's packed records are made
together (`finished`). A read of either takes the rest first, so no reader sees them behind."""
_STATUS = OutcomeKind.STATUS
"""(Read once: an Enum member read through its class costs a metaclass lookup in Python 3.11.)"""
_SUCCESS = frozenset(range(200, 300))
"""2xx: one set lookup where `200 <= status < 300` is five steps and a check for None."""


def span(ms: float) -> str:
    """A duration in words for a reason: `850 ms`, `12 s`, `1m52s`, `2h05m`."""
    if ms < 1000:
        return f"{max(0, round(ms))} ms"
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


AttemptRow = tuple[str, str, str, float, float, int | None, AttemptOutcome, str]
"""An attempt as the record keeps it: `AttemptView`'s fields, in order."""


_PENDING_WORDS = {
    "queued": "in the request queue",
    "slot": "waiting for a concurrency slot",
    "upstream": "sent, no answer yet",
    "streaming": "streaming",
}
"""An attempt in flight in words, by its record's state."""


class RequestRecord:
    """One request as it runs; the pipeline writes it, readers get a `RequestView` of it."""

    # The fields every request starts with as class attributes: a record sets only those that
    # differ, its list of attempts, and the five that packing it reads (`finished`: a field read
    # through the class misses the instance and costs more than setting it once). (Slotted, it
    # stored all 21 on every request: callgrind counts 2.6 k instructions to make one now, 3.5 k then.)
    ended_at: float | None = None
    state = "queued"
    model_asked: str | None = None
    route = "bare"
    stream = False
    status: int | None = None
    code: str | None
    message: str | None
    ttft_ms: float | None
    usage: Usage | None = None
    bytes_in = 0
    bytes_out = 0
    skipped: list[SkipView] | None
    """Skips and waits are rare: no list until one."""
    waits: list[WaitView] | None
    current: Attempt | None = None
    """The attempt in flight (from its dispatch until the engine records it): an alive record's
    view shows it as `pending`, so that a long stream says where it goes."""

    def __init__(self, request_id: str, seq: int, started_at: float, client: str, endpoint: str) -> None:
        self.id = request_id
        self.seq = seq
        self.started_at = started_at
        self.client = client
        self.endpoint = endpoint
        self.code = self.message = self.ttft_ms = self.skipped = self.waits = None
        self.attempts: list[AttemptRow] = []
        """Plain tuples on the request path (a frozen view costs a setattr per field): the views
        are built when someone reads."""

    def view(self, now: float | None = None) -> RequestView:
        """The record as readers see it; `now` (an alive record's): the time its attempt in flight
        has taken so far."""
        ended = self.ended_at
        attempts = tuple(AttemptView(*a) for a in self.attempts)
        current = self.current
        if current is not None and ended is None:
            started = current.started_at
            attempts += (
                AttemptView(
                    current.target.name,
                    current.provider.spec.id,
                    current.connection.id,
                    started,
                    max(0.0, (now if now is not None else started) - started),
                    None,
                    "pending",
                    _PENDING_WORDS.get(self.state, "in flight"),
                ),
            )
        return RequestView(
            id=self.id,
            seq=self.seq,
            started_at=self.started_at,
            ended_at=ended,
            state=self.state,
            client=self.client,
            endpoint=self.endpoint,
            model_asked=self.model_asked,
            route=self.route,
            stream=self.stream,
            status=self.status,
            code=self.code,
            message=self.message,
            duration_ms=None if ended is None else ended - self.started_at,
            ttft_ms=self.ttft_ms,
            usage=None if self.usage is None else UsageView(*self.usage),
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            attempts=attempts,
            skipped=tuple(self.skipped or ()),
            waits=tuple(self.waits or ()),
        )


Finished = tuple[object, ...]
"""A finished record as the ring keeps it (`finished`): its numbers, id and model packed in one
bytes object, then client, endpoint, route, state, code, message, skipped, waits, and five strings
per attempt (target, provider, connection, outcome, reason)."""

_HEAD = struct.Struct("<qdddqqqqqqBH")
"""A finished record's numbers: seq, started_at, ended_at, ttft_ms (NaN for none), status, bytes_in,
bytes_out, the usage's three counts, flags (_STREAM, _USAGE, _MODEL) and the id's length in bytes;
then each attempt's _ATTEMPT; then the id and the model asked, in UTF-8. (_NONE: no count, no status.)"""
_ATTEMPT = "ddq"
"""An attempt's numbers: started_at, duration_ms, status."""
_NONE = -1
_STREAM, _USAGE, _MODEL = 1, 2, 4
_WORDS = 9
"""The items of a `Finished` before its attempts' strings."""
_LAYOUTS = [struct.Struct(_HEAD.format + _ATTEMPT * n) for n in range(4)]
"""The numbers' layout by attempt count (more attempts than these are rare: made when met)."""
_ONE_ATTEMPT = _LAYOUTS[1]
_SEQ = struct.Struct("<q")
_ID_LENGTH = struct.Struct("<H")
_ID_LENGTH_AT = _HEAD.size - _ID_LENGTH.size


def _layout(attempts: int) -> struct.Struct:
    return (
        _LAYOUTS[attempts] if attempts < len(_LAYOUTS) else struct.Struct(_HEAD.format + _ATTEMPT * attempts)
    )


def finished(record: RequestRecord) -> Finished:
    """`record`, ended, as the ring keeps it.

    A ring holds thousands of records, each for as long as the ring takes to turn, and what they
    keep costs every request beside them: a `RequestRecord` keeps about fifteen objects of its own
    (its floats, counts, attempt tuple and list, id and model), each one made among a request's
    short-lived objects, and freed cold when its record leaves, long after. For requests to a bare
    model that cost 3-8 % of the proxy's CPU per request, with the same work done (a ring of one
    against one of 2,000; docs/performance.md; `bench/proxy.py --recording-ring 1` measures it). A
    `Finished` is two objects, both made with the rest of a batch (`Trail._fold`); its other strings
    are shared ones for a success (a connection's client, the configured names, the words of an
    outcome)."""
    attempts = record.attempts
    usage = record.usage
    ttft = record.ttft_ms
    status = record.status
    model = record.model_asked
    ident = record.id.encode()
    flags = _STREAM if record.stream else 0
    prompt = completion = total = _NONE
    if usage is not None:
        flags |= _USAGE
        said_prompt, said_completion, said_total = usage
        if said_prompt is not None:
            prompt = said_prompt
        if said_completion is not None:
            completion = said_completion
        if said_total is not None:
            total = said_total
    text = ident
    if model is not None:
        flags |= _MODEL
        text += model.encode()
    skipped = None if record.skipped is None else tuple(record.skipped)
    waits = None if record.waits is None else tuple(record.waits)
    ttft_or_nan = math.nan if ttft is None else ttft
    status_or_none = _NONE if status is None else status
    if len(attempts) == 1:  # the common case, spelt out: no intermediate tuples, no loop
        target, provider, connection, started, took, answered, outcome, reason = attempts[0]
        data = _ONE_ATTEMPT.pack(
            record.seq,
            record.started_at,
            record.ended_at,
            ttft_or_nan,
            status_or_none,
            record.bytes_in,
            record.bytes_out,
            prompt,
            completion,
            total,
            flags,
            len(ident),
            started,
            took,
            _NONE if answered is None else answered,
        )
        return (
            data + text,
            record.client,
            record.endpoint,
            record.route,
            record.state,
            record.code,
            record.message,
            skipped,
            waits,
            target,
            provider,
            connection,
            outcome,
            reason,
        )
    numbers: list[object] = [
        record.seq,
        record.started_at,
        record.ended_at,
        ttft_or_nan,
        status_or_none,
        record.bytes_in,
        record.bytes_out,
        prompt,
        completion,
        total,
        flags,
        len(ident),
    ]
    kept: list[object] = [
        None,
        record.client,
        record.endpoint,
        record.route,
        record.state,
        record.code,
        record.message,
        skipped,
        waits,
    ]
    for target, provider, connection, started, took, answered, outcome, reason in attempts:
        numbers += (started, took, _NONE if answered is None else answered)
        kept += (target, provider, connection, outcome, reason)
    kept[0] = _layout(len(attempts)).pack(*numbers) + text
    return tuple(kept)


def finished_seq(kept: Finished) -> int:
    seq: int = _SEQ.unpack_from(cast(bytes, kept[0]))[0]
    return seq


def finished_id(kept: Finished) -> str:
    data = cast(bytes, kept[0])
    at = _layout((len(kept) - _WORDS) // 5).size
    return data[at : at + _ID_LENGTH.unpack_from(data, _ID_LENGTH_AT)[0]].decode()


_Words = tuple[
    str, str, str, str, str | None, str | None, tuple[SkipView, ...] | None, tuple[WaitView, ...] | None
]
"""A `Finished`'s items after its numbers: client, endpoint, route, state, code, message, skipped, waits."""


def finished_view(kept: Finished) -> RequestView:
    """A finished record's view, from what the ring keeps of it."""
    count = (len(kept) - _WORDS) // 5
    layout = _layout(count)
    data = cast(bytes, kept[0])
    strings = cast(tuple[str, ...], kept[_WORDS:])
    numbers = layout.unpack_from(data)
    seq, started, ended, ttft, status, bytes_in, bytes_out, prompt, completion, total, flags, id_length = (
        numbers[:12]
    )
    at = layout.size + id_length
    attempts = []
    for i in range(count):
        a_started, took, answered = numbers[12 + 3 * i : 15 + 3 * i]
        target, provider, connection, outcome, reason = strings[5 * i : 5 + 5 * i]
        attempts.append(
            AttemptView(
                target,
                provider,
                connection,
                a_started,
                took,
                None if answered == _NONE else answered,
                cast(AttemptOutcome, outcome),
                reason,
            )
        )
    client, endpoint, route, state, code, message, skipped, waits = cast(_Words, kept[1:_WORDS])
    return RequestView(
        id=data[layout.size : at].decode(),
        seq=seq,
        started_at=started,
        ended_at=ended,
        state=state,
        client=client,
        endpoint=endpoint,
        model_asked=data[at:].decode() if flags & _MODEL else None,
        route=route,
        stream=bool(flags & _STREAM),
        status=None if status == _NONE else status,
        code=code,
        message=message,
        duration_ms=ended - started,
        ttft_ms=None if math.isnan(ttft) else ttft,
        usage=(
            UsageView(*(None if n == _NONE else n for n in (prompt, completion, total)))
            if flags & _USAGE
            else None
        ),
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        attempts=tuple(attempts),
        skipped=skipped or (),
        waits=waits or (),
    )


class Trail:
    """The alive requests and a ring of the last `capacity` finished ones, with their statistics."""

    def __init__(self, engine: Engine, clock: Clock, capacity: int = REQUEST_HISTORY) -> None:
        self.engine = engine
        self.clock = clock
        self.capacity = capacity
        self.alive: dict[str, RequestRecord] = {}
        self.ring: deque[Finished] = deque(maxlen=max(capacity, 0))
        self._seq = 0
        self.version = 0
        """Bumped on every change a reader could see (a new record, a state, an end)."""
        self.finished = 0
        """Records ended so far: a reader's mark for `finished_since`."""
        self._stats = TrafficStats(
            {p: [c.spec.id for c in provider.connections] for p, provider in engine.providers.items()}
        )
        self._unfolded: list[RequestRecord] = []
        """Finished records not in the statistics and the ring yet (at most FOLD_BATCH - 1): every
        reader of either adds them first."""
        self.fallbacks: dict[str, int] = {}
        """Attempts that fell back, per provider (for /metrics)."""

    @property
    def stats(self) -> TrafficStats:
        """The traffic statistics, every finished request in them."""
        if self._unfolded:
            self._fold()
        return self._stats

    @property
    def finished_ring(self) -> deque[Finished]:
        """The ring of finished records, every finished request in it."""
        if self._unfolded:
            self._fold()
        return self.ring

    def stats_rows(self, now: float) -> dict[str, dict[str, list[float]]]:
        """`TrafficStats.rows` of `stats` (what a fleet's replica publishes)."""
        return self.stats.rows(now)

    # -- the pipeline's side ------------------------------------------------------------------------

    def begin(self, request_id: str, client: str, endpoint: str) -> RequestRecord:
        self._seq += 1
        record = RequestRecord(request_id, self._seq, self.clock.now(), client, endpoint)
        self.alive[request_id] = record
        self.version += 1
        return record

    def state(self, record: RequestRecord, state: str) -> None:
        record.state = state
        self.version += 1

    def attempt(
        self,
        record: RequestRecord,
        attempt: Attempt,
        outcome: Outcome,
        verdict: Verdict,
        status: int | None,
        committed: bool,
        now: float | None = None,
    ) -> None:
        """One attempt recorded by the engine; `committed`: its stream had reached the client
        (it can no longer fall back); `now`: when it ended (the clock's reading unless given)."""
        if now is None:
            now = self.clock.now()
        record.current = None
        started = attempt.started_at
        result: AttemptOutcome
        # `outcome.is_success` inline (a property is a call), and the client got a 2xx: the common case
        if status in _SUCCESS and outcome.kind is _STATUS and outcome.status in _SUCCESS:
            result = reason = "ok"
        else:
            result, reason = self._failed_attempt(attempt, outcome, verdict, status, committed)
        record.attempts.append(
            (
                attempt.target.name,
                attempt.provider.spec.id,
                attempt.connection.id,
                started,
                now - started,
                status,
                result,
                reason,
            )
        )

    def _failed_attempt(
        self, attempt: Attempt, outcome: Outcome, verdict: Verdict, status: int | None, committed: bool
    ) -> tuple[AttemptOutcome, str]:
        """An attempt that did not end in a 2xx the client got: its outcome and reason in words."""
        kind = outcome.kind
        if kind is OutcomeKind.CLIENT_DISCONNECT:
            return "disconnect", "the client went away"
        if kind is OutcomeKind.LOCAL_REJECTION:
            return "local", _short(outcome.error, REASON_LIMIT)
        if outcome.is_success:
            return "ok", "ok"
        result: AttemptOutcome = "fallback" if verdict.fallback and not committed else "returned"
        if result == "fallback":
            pid = attempt.provider.spec.id
            self.fallbacks[pid] = self.fallbacks.get(pid, 0) + 1
        # An error's words may quote the key the attempt was sent with: scrubbed like the engine's.
        reason = _short(
            f"{status} {verdict.reason}"
            if status is not None
            else self.engine.scrubber(outcome.error) or verdict.reason,
            REASON_LIMIT,
        )
        return result, reason

    def passed_over(
        self, record: RequestRecord, chosen: Attempt, targets: Sequence[Target], tried: Iterable[str]
    ) -> None:
        """Note what selection passed over before it chose `chosen` (a cooling key, an open breaker)
        that this request had not tried itself. (The pipeline does not ask when `chosen` is the
        first target's only connection: nothing was passed over.)"""
        upto = []
        for t in targets:
            upto.append(t)
            if t == chosen.target:
                break
        # What this request already tried is in its attempts: only the others were passed over.
        tried_ids = set(tried)
        tried_ids.add(chosen.connection.spec.id)
        tried_targets = {a[0] for a in record.attempts}
        skips = [
            s
            for s in self.engine.explain(upto, tried_ids)
            if s.connection_id not in tried_ids
            and (s.connection_id is not None or s.target not in tried_targets)
        ]
        if skips:
            self._skipped(record, skips)

    def nothing_eligible(self, record: RequestRecord, decision: NoTarget) -> None:
        self._skipped(record, decision.skips)

    def _skipped(self, record: RequestRecord, skips: Iterable[Skip]) -> None:
        now = self.clock.now()
        skipped = record.skipped
        if skipped is None:
            skipped = record.skipped = []
        after = len(record.attempts)
        for skip in skips:
            if skip.reason == "already_tried":
                continue
            retry = None if skip.retry_at is None else max(0, int(skip.retry_at - now))
            view = SkipView(skip.target, skip.connection_id, self._words(skip, now), retry, after)
            # One entry per target and connection: a request that meets the same cooling key
            # again (after a wait, say) keeps the latest words about it.
            at = next(
                (
                    i
                    for i, s in enumerate(skipped)
                    if s.target == view.target and s.connection_id == view.connection_id
                ),
                None,
            )
            if at is None:
                skipped.append(view)
            else:
                skipped[at] = view

    def _words(self, skip: Skip, now: float) -> str:
        """A skip in words: "cooling 12 s (429 rate_limited)", "breaker OPEN, probe in 8 s"."""
        remaining = None if skip.retry_at is None else span(max(0.0, skip.retry_at - now))
        reason = skip.reason
        if reason == "circuit_open":
            return f"breaker OPEN, probe in {remaining}"
        if reason == "probe_in_flight":
            return "breaker HALF_OPEN, its probe is in flight"
        conn = self.engine.connections.get(skip.connection_id) if skip.connection_id else None
        if reason == "cooling":
            why = cooled_by(conn.health) if conn is not None else None
            return f"cooling {remaining}" if why is None else f"cooling {remaining} ({why})"
        if reason == "locked":
            status = ""
            if conn is not None:
                target = skip.target.split("/", 1)
                entry = self.engine.lockouts.get(target[0], conn.spec.id, target[-1])
                if entry is not None and entry.status is not None:
                    status = f" ({entry.status})"
            return f"locked: {skip.lock_reason}{status} {remaining}"
        if reason == "disabled":
            return "disabled by the operator"
        if reason == "no_connection":
            return "no connection can serve it"
        if reason == "unknown_provider":
            return "unknown provider"
        return f"connection {reason}"  # banned, expired, credits_exhausted

    def waited(self, record: RequestRecord, ms: float, decision: NoTarget) -> None:
        ready = min(
            (s for s in decision.skips if s.waitable and s.retry_at is not None),
            key=lambda s: s.retry_at or 0.0,
            default=None,
        )
        reason = "nothing eligible"
        if ready is not None:
            reason += f"; waited for {ready.connection_id or ready.target} ({ready.reason})"
        if record.waits is None:
            record.waits = []
        record.waits.append(WaitView(ms, reason, len(record.attempts)))

    def first_byte(self, record: RequestRecord) -> None:
        record.ttft_ms = self.clock.now() - record.started_at
        record.state = "streaming"
        self.version += 1

    def end(
        self, record: RequestRecord, status: int | None, state: str | None = None, now: float | None = None
    ) -> None:
        """The request is over: `status` is what the client got; its record joins the ring. `now`:
        when (the clock's reading unless given)."""
        if record.ended_at is not None:
            return
        if now is None:
            now = self.clock.now()
        record.ended_at = now
        record.status = status
        if state is None:
            if status == 499 and record.code == "client_disconnected":
                state = "client_gone"
            else:
                state = "failed" if status is None or status >= 400 else "done"
        record.state = state
        self.version += 1
        self.finished += 1
        self.alive.pop(record.id, None)
        if self.capacity <= 0:
            return
        unfolded = self._unfolded
        unfolded.append(record)
        if len(unfolded) >= FOLD_BATCH:
            self._fold()

    def _fold(self) -> None:
        """Add the finished records not yet counted to the statistics, each in the bucket of its
        own end (its record holds everything the statistics take: nothing changes a record after
        its end), and to the ring, packed: a batch's packed records are made together, apart from
        the short-lived objects of the requests around them."""
        unfolded, self._unfolded = self._unfolded, []
        stats = self._stats
        add = stats.add
        keep = self.ring.append  # a full ring lets its oldest record go
        kept = finished
        for record in unfolded:
            keep(kept(record))
            attempts = record.attempts
            if not attempts:
                stats.add_unrouted(record.status)
                continue
            last = attempts[-1]
            ended = record.ended_at
            assert ended is not None
            took = ended - record.started_at
            ttft = record.ttft_ms
            add(
                last[1],
                last[2],
                ended,
                took,
                record.state != "done",
                record.status,
                ttft,
                record.usage,
                # tokens per second: from the first byte to the end, for streams with usage
                took - ttft if ttft is not None else None,
            )

    # -- the readers' side --------------------------------------------------------------------------

    def view(self, request_id: str) -> RequestView | None:
        # The ring is searched, newest first, rather than indexed: a lookup by id is a rare read,
        # and an index would cost every request an insert and a delete, and memory.
        record = self.alive.get(request_id)
        if record is not None:
            return record.view(self.clock.now())
        kept = next((r for r in reversed(self.finished_ring) if finished_id(r) == request_id), None)
        return finished_view(kept) if kept is not None else None

    def finished_since(self, mark: int, limit: int | None = None) -> tuple[list[RequestView], int]:
        """The records that ended after a reader's `mark` (still in the ring; at most the newest
        `limit`), in end order, and the new mark: a reader that keeps what it read builds each
        finished record's view once."""
        ring = self.finished_ring
        count = min(self.finished - mark, len(ring))
        if limit is not None:
            count = min(count, limit)
        if count <= 0:
            return [], self.finished
        return [finished_view(r) for r in islice(ring, len(ring) - count, None)], self.finished

    def alive_views(self) -> list[RequestView]:
        now = self.clock.now()
        return [r.view(now) for r in self.alive.values()]

    def alive_changed(self, known: dict[str, str]) -> tuple[list[RequestView], dict[str, str]]:
        """Views of the alive records whose state is not the one a reader `known` for them, and
        every alive record's state now (the reader's next `known`): views only for what moved."""
        states = {}
        changed = []
        now = self.clock.now()
        for request_id, record in self.alive.items():
            state = states[request_id] = record.state
            if known.get(request_id) != state:
                changed.append(record.view(now))
        return changed, states

    def views(
        self,
        *,
        after: int = 0,
        limit: int | None = None,
        state: str | None = None,
        newest: int | None = None,
    ) -> list[RequestView]:
        """Oldest first by `seq`: the finished ones (ring order is end order) and the alive ones;
        `limit`: only the oldest that many, `newest`: only the newest that many. Views are built
        only for the records returned (a view of every record in the ring is milliseconds)."""
        chosen: list[tuple[int, RequestRecord | None, Finished | None]] = []
        if state != "alive":
            for kept in self.finished_ring:
                seq = finished_seq(kept)
                if seq > after:
                    chosen.append((seq, None, kept))
        if state != "done":
            chosen.extend((r.seq, r, None) for r in self.alive.values() if r.seq > after)
        chosen.sort(key=_first)
        if limit is not None:
            chosen = chosen[:limit]
        if newest is not None:
            chosen = chosen[len(chosen) - newest :] if newest > 0 else []
        now = self.clock.now()
        return [
            record.view(now) if record is not None else finished_view(cast(Finished, kept))
            for _, record, kept in chosen
        ]


def _first(chosen: tuple[int, object, object]) -> int:
    return chosen[0]


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cooled_by(health: ConnectionHealth) -> str | None:
    """What cooled a connection, in a few words: an upstream's status and its kind (`429
    rate_limited`), or a failure that had no status as it was told (`connection refused`). The one
    wording of the trail's skips and of the answer when nothing
    is left to serve, so that a server that is down never reads as a rate limit in either."""
    if health.error_code is not None:
        kind = health.last_error_type
        return f"{health.error_code} {kind}" if kind else str(health.error_code)
    error = health.last_error  # (scrubbed when the engine recorded it)
    return _short(error, REASON_LIMIT - 20) if error else None


def kept_message(text: str | None) -> str | None:
    """An error's words as a record keeps them: at most MESSAGE_LIMIT characters, None for none."""
    return _short(text, MESSAGE_LIMIT) or None if text else None


class EventCounts:
    """Resilience events per layer since the start (for /metrics): a bus subscriber, O(1) per event."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, event: Event) -> None:
        counts = self.counts
        counts[event.layer] = counts.get(event.layer, 0) + 1


# -- reading an answer's error and usage (never its content) --------------------------------------------


def error_of(body: bytes) -> tuple[str | None, str | None]:
    """(code, message) of a JSON error answer (ours or an upstream's), or (None, None)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    error = doc.get("error", doc)
    if not isinstance(error, dict):
        return None, _short(error, MESSAGE_LIMIT) if isinstance(error, str) else None
    code = error.get("code")
    if not isinstance(code, str):
        code = error.get("type") if isinstance(error.get("type"), str) else None
    message = error.get("message")
    return (
        _short(code, MESSAGE_LIMIT) if code is not None else None,
        _short(message, MESSAGE_LIMIT) if isinstance(message, str) else None,
    )


def usage_of(answer: object) -> Usage | None:
    """(prompt, completion, total) tokens from the `usage` object of a parsed answer (or stream
    chunk), if it has one with numbers."""
    if type(answer) is not dict:
        return None
    try:  # a chat completion's three counts: the common case, checked inline (subscripts: no calls)
        usage = answer["usage"]
        prompt, completion, total = usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
    except (KeyError, TypeError):  # (TypeError: a `usage` that is a list or a string)
        usage = answer.get("usage")
    else:
        if (
            type(prompt) is int
            and type(completion) is int
            and type(total) is int
            and 0 <= prompt <= TOKENS_MAX
            and 0 <= completion <= TOKENS_MAX
            and 0 <= total <= TOKENS_MAX
        ):
            return (prompt, completion, total)
    if type(usage) is not dict:
        inner = answer.get("response")  # the Responses API's `response.completed` event
        usage = inner.get("usage") if type(inner) is dict else None
        if type(usage) is not dict:
            return None
    prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    if prompt is not None and "prompt_tokens" not in usage:
        # Anthropic's `input_tokens` is the prompt past its cache: what the cache wrote and read
        # (most of a coding agent's prompt) it counts apart. (OpenAI's counts, the Responses API's
        # too, hold their cached part, and have no such keys.)
        prompt += _count(usage.get("cache_creation_input_tokens")) or 0
        prompt += _count(usage.get("cache_read_input_tokens")) or 0
    completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    total = _count(usage.get("total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    if prompt is None and completion is None and total is None:
        return None
    return (prompt, completion, total)


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value <= TOKENS_MAX else None


def stream_usage(tail: bytes) -> Usage | None:
    """The usage of a stream from its last bytes: the last `data:` event that mentions `usage`,
    or, when that event began before these bytes (a Responses stream's `response.completed`
    repeats the whole answer: hundreds of KB for a large tool call), its `usage` object alone."""
    at = tail.rfind(b'"usage"')
    while at >= 0:
        start = tail.rfind(b"data:", 0, at)
        if start < 0:  # the event began before these bytes: the last `usage` key is its own
            return _usage_object_at(tail, at + len(b'"usage"'))
        end = tail.find(b"\n", at)
        try:
            found = usage_of(json.loads(tail[start + 5 : end if end >= 0 else len(tail)]))
        except (ValueError, RecursionError):
            found = None
        if found is not None:
            return found
        at = tail.rfind(b'"usage"', 0, start)
    return None


_KEY_END = re.compile(rb"\s*:\s*")
USAGE_OBJECT_BYTES = 4096
_DECODER = json.JSONDecoder()


def _usage_object_at(tail: bytes, after_key: int) -> Usage | None:
    """The usage of the JSON object that follows a `"usage"` key ending at `after_key`, if it is one."""
    colon = _KEY_END.match(tail, after_key)
    if colon is None:
        return None
    try:  # (a usage object is far under USAGE_OBJECT_BYTES; what follows it is left unread)
        value, _ = _DECODER.raw_decode(
            tail[colon.end() : colon.end() + USAGE_OBJECT_BYTES].decode("utf-8", "replace")
        )
    except (ValueError, RecursionError):
        return None
    return usage_of({"usage": value}) if type(value) is dict else None


def messages_stream_usage(head: bytes, tail: bytes) -> Usage | None:
    """A Messages stream's usage: its prompt's tokens are said once, in `message_start` (the
    first event), its output's at the end (`message_delta`, a running total)."""
    end = stream_usage(tail)
    if end is not None and end[0] is not None:
        return end
    start: Usage | None = None
    at = head.find(b'"message_start"')
    begin = head.rfind(b"data:", 0, at) if at >= 0 else -1
    if begin >= 0:
        stop = head.find(b"\n", at)
        try:
            event = json.loads(head[begin + 5 : stop if stop >= 0 else len(head)])
        except (ValueError, RecursionError):
            event = None
        start = usage_of(event.get("message")) if type(event) is dict else None
    if start is None or end is None:
        return end or start
    prompt, completion = start[0], end[1] if end[1] is not None else start[1]
    total = prompt + completion if prompt is not None and completion is not None else None
    return (prompt, completion, total)


__all__ = [
    "EventCounts",
    "RequestRecord",
    "Trail",
    "error_of",
    "messages_stream_usage",
    "span",
    "stream_usage",
    "usage_of",
]
