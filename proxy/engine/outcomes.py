"""Outcomes: what one attempt's result does to the layers.

`record` restates the status (the provider's rules), classifies the outcome (`classify.py`: one
verdict, a column per layer) and applies the verdict to the breaker, the connection's health and
the lockout table, marking each changed object dirty; a success refreshes the session's pin. The
probe's lease is kept alive here too, since only the attempt's owner knows it is making progress.
"""

from __future__ import annotations

from proxy.engine.decisions import Attempt, Recorded
from proxy.engine.layers import EnginePart, Layers
from proxy.resilience.classify import (
    SUCCESS,
    BreakerEffect,
    ConnectionEffect,
    LockoutEffect,
    Verdict,
    classify,
)
from proxy.resilience.hints import parse_retry_hint
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.outcome import Outcome, OutcomeKind
from proxy.resilience.restate import restate
from proxy.scrub import Scrubber

# The members `record` compares with, read once here: an Enum member read through its class costs
# a metaclass lookup (Python 3.11), a dozen times per request.
_STATUS = OutcomeKind.STATUS
_B_NONE, _B_SUCCESS, _B_FAILURE = BreakerEffect.NONE, BreakerEffect.SUCCESS, BreakerEffect.FAILURE
_C_NONE, _C_CLEAR = ConnectionEffect.NONE, ConnectionEffect.CLEAR
_L_DECAY, _L_LOCK = LockoutEffect.DECAY, LockoutEffect.LOCK


class Outcomes(EnginePart):
    def __init__(self, layers: Layers, scrubber: Scrubber) -> None:
        super().__init__(layers)
        self.scrubber = scrubber

    def record(
        self, attempt: Attempt, outcome: Outcome, *, session: str | None = None, now: float | None = None
    ) -> Recorded:
        """Classify one attempt's outcome and apply it to the three layers (at `now`, the clock's
        reading unless the caller took it)."""
        if now is None:
            now = self.clock.now()
        provider = attempt.provider
        conn = attempt.connection
        conn.in_flight -= 1
        pid = provider.spec.id
        cid = conn.spec.id
        model = attempt.target.model

        if outcome.body or outcome.error:
            # Only failures carry text; it may quote the key the attempt was sent with.
            scrub = self.scrubber
            outcome = Outcome(
                outcome.kind, outcome.status, outcome.headers, scrub(outcome.body), scrub(outcome.error)
            )

        client_retry: int | None = None
        if outcome.kind is _STATUS and outcome.status is not None and outcome.status >= 400:
            restated = restate(outcome.status, outcome.body, provider.rules) if provider.rules else None
            if restated is not None:
                client_retry = restated.retry_after_ms
                outcome = Outcome(outcome.kind, restated.status, outcome.headers, outcome.body, outcome.error)

        status = outcome.status
        if outcome.kind is _STATUS and status is not None and 200 <= status < 300:
            # What classify says of every 2xx, whatever the settings: not worth reading them.
            lockout_settings = None
            verdict = SUCCESS
        else:
            lockout_settings = self.settings.lockout()
            verdict = classify(
                outcome, per_model_quota=provider.spec.per_model_quota, lockout=lockout_settings
            )

        breaker = provider.breaker
        shared = self._layers.shared
        if shared is not None and (verdict.breaker is not _B_NONE or attempt.probe):
            shared.breaker(pid, verdict.breaker, now, probe=attempt.probe)
        changed = True
        if verdict.breaker is _B_SUCCESS:
            # Nothing to store when nothing changed (a closed breaker without failures): the state
            # file would be written four times a second for every provider that has traffic.
            changed = breaker.record_success(now, probe=attempt.probe_ticket)
        elif verdict.breaker is _B_FAILURE:
            breaker.record_failure(now, probe=attempt.probe_ticket)
        elif attempt.probe:
            breaker.release_probe(now, attempt.probe_ticket)
        if (verdict.breaker is not _B_NONE and changed) or attempt.probe:
            self.dirty.breakers.add(pid)

        # The layers' changes go through helpers: a lambda here would make every variable it
        # reads a cell, allocated on every call, the successes' too.
        health = conn.health
        effect = verdict.connection
        if effect is _C_CLEAR:
            if health.terminal is None and (
                health.last_error is not None or health.backoff_level or health.rate_limited_until is not None
            ):
                self._connection_recovered(cid, now)
        elif effect is not _C_NONE:
            self._connection_failed(attempt, outcome, verdict, now)

        if verdict.lockout is _L_DECAY:
            locked = self.lockouts.keys_for_model(pid, model)  # (None for the usual model: no lookup)
            if locked and (pid, cid, model) in locked:
                self._lockout_decayed(pid, cid, model, now)
        elif verdict.lockout is _L_LOCK:
            self._lock(attempt, outcome, verdict, lockout_settings or self.settings.lockout(), now)

        if verdict.breaker is _B_FAILURE or effect not in (_C_NONE, _C_CLEAR) or verdict.lockout is _L_LOCK:
            self._layers.recheck_queues(provider)

        if session is not None and outcome.is_success:
            ttl = self.settings.session_ttl_ms()
            if ttl > 0:
                self.pins.pin(session, cid, now, ttl)
                if self._layers.shared is not None:
                    self._layers.shared.pinned(session, cid, now + ttl)

        if verdict is SUCCESS and client_retry is None:
            # One per status: a Recorded is immutable, and a frozen dataclass is slow to make.
            found = _SUCCESSES.get(outcome.status)
            if found is None:
                found = _SUCCESSES[outcome.status] = Recorded(verdict, outcome.status, None)
            return found
        return Recorded(verdict, outcome.status, client_retry)

    def _connection_recovered(self, cid: str, now: float) -> None:
        self._layers.connection_op(cid, lambda h: h.record_success(now))

    def _connection_failed(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, now: float) -> None:
        """A cooldown or a terminal state for the attempt's connection, as the verdict says."""
        conn = attempt.connection
        cid = conn.spec.id
        effect = verdict.connection
        error = _describe(outcome, verdict)
        if effect is ConnectionEffect.COOLDOWN:
            policy = self.settings.cooldown_policy(attempt.provider.spec.provider_class)
            hint = (
                parse_retry_hint(outcome.headers, outcome.body, now)
                if policy.use_upstream_retry_hints
                else None
            )
            reason, code, no_cooling = verdict.reason, outcome.status, conn.spec.disable_cooling
            self._layers.connection_op(
                cid,
                lambda h: h.record_failure(
                    now,
                    policy,
                    error=error,
                    error_type=reason,
                    code=code,
                    hint_ms=hint,
                    disable_cooling=no_cooling,
                ),
            )
        else:
            status, code = effect.value, outcome.status
            self._layers.connection_op(cid, lambda h: h.mark_terminal(now, status, error=error, code=code))

    def _lockout_decayed(self, pid: str, cid: str, model: str, now: float) -> None:
        self._layers.lockout_op((pid, cid, model), lambda t: t.record_success(pid, cid, model, now))

    def _lock(
        self, attempt: Attempt, outcome: Outcome, verdict: Verdict, lock_settings: LockoutSettings, now: float
    ) -> None:
        """Lock the attempt's model on its connection, as the verdict says."""
        pid, cid, model = attempt.provider.spec.id, attempt.connection.spec.id, attempt.target.model
        hint = (
            parse_retry_hint(outcome.headers, outcome.body, now) if outcome.headers or outcome.body else None
        )
        lock_status, lock_reason, started = outcome.status, verdict.reason, attempt.started_at
        self._layers.lockout_op(
            (pid, cid, model),
            lambda t: t.record_failure(
                pid,
                cid,
                model,
                now,
                lock_settings,
                status=lock_status,
                reason=lock_reason,
                hint_ms=hint,
                started_at=started,
            ),
        )

    def probe_waiting(self, attempt: Attempt) -> None:
        """The attempt is about to wait in our own queues. A probe's lease stops running meanwhile:
        its owner is alive and settles it on every path, and time it spends queued behind other
        requests must not let a second probe in."""
        if attempt.probe:
            attempt.provider.breaker.hold_probe(attempt.probe_ticket)

    def probe_alive(self, attempt: Attempt) -> None:
        """A sign of progress (dispatched, response headers, a chunk relayed): a probe's lease
        starts over, so a probe that streams for longer than the lease keeps its slot."""
        if attempt.probe:
            attempt.provider.breaker.renew_probe(self.clock.now(), attempt.probe_ticket)
            if self._layers.shared is not None:
                self._layers.shared.probe_alive(attempt.provider.spec.id)


_SUCCESSES: dict[int | None, Recorded] = {}
"""Status -> what `record` concludes of a success with it (2xx only: a handful)."""


def _describe(outcome: Outcome, verdict: Verdict) -> str:
    """A short description of an error for `lastError` (its text was scrubbed in `record`)."""
    if outcome.kind is OutcomeKind.STATUS:
        body = " ".join(outcome.body.split())[:160]
        return f"{outcome.status}: {body}" if body else f"{outcome.status} {verdict.reason}"
    return outcome.error or verdict.reason
