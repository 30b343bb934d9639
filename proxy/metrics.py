"""`GET /metrics`: the instance in Prometheus text exposition (docs/api.md#prometheus-metrics).

Nothing is counted for Prometheus on the request path: at scrape time a collector reads the read
model's frozen views and the trail's running totals (which the console and `/api/stats` read
too) and hands them to `prometheus_client`, which writes the format. Every label value is a
configured provider or connection, a state name, a layer or an HTTP status (100-599): never a
model name a client sent, so the number of series stays bounded by the configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from proxy.resilience.breaker import BreakerState
from proxy.resilience.cooldown import TERMINAL_STATUSES
from proxy.traffic import COMPLETION, LAT, PROMPT, TTFT, histogram

if TYPE_CHECKING:
    from proxy.runtime import Runtime

__all__ = ["CONTENT_TYPE_LATEST", "exposition"]

NO_UPSTREAM = "none"
"""The provider and connection label of a request that reached no upstream (a 404, all cooling)."""
CONNECTION_STATUSES = ("active", "cooling", "disabled", *sorted(TERMINAL_STATUSES))


class _Collector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        read = runtime.read
        now = read.now()
        trail = runtime.trail

        requests = CounterMetricFamily(
            "omniroute_requests", "Finished /v1 requests", labels=("provider", "connection", "status")
        )
        duration = HistogramMetricFamily(
            "omniroute_request_duration_seconds", "Request duration, arrival to end", labels=("provider",)
        )
        ttft = HistogramMetricFamily(
            "omniroute_ttft_seconds", "Time to the first streamed byte", labels=("provider",)
        )
        tokens = CounterMetricFamily(
            "omniroute_tokens", "Tokens the upstreams reported", labels=("provider", "kind")
        )
        fallbacks = CounterMetricFamily(
            "omniroute_fallbacks", "Attempts that fell back to the next candidate", labels=("provider",)
        )
        if trail is not None:
            stats = trail.stats
            for (provider, connection, code), n in sorted(stats.by_status().items()):
                requests.add_metric([provider, connection, str(code)], n)
            for code, n in sorted(stats.unrouted.items()):
                requests.add_metric([NO_UPSTREAM, NO_UPSTREAM, str(code)], n)
            for provider in stats.members:
                all_time = stats.all_time(provider)
                buckets, total = histogram(all_time, LAT)
                duration.add_metric([provider], buckets, total)
                buckets, total = histogram(all_time, TTFT)
                ttft.add_metric([provider], buckets, total)
                tokens.add_metric([provider, "prompt"], all_time[PROMPT])
                tokens.add_metric([provider, "completion"], all_time[COMPLETION])
                fallbacks.add_metric([provider], trail.fallbacks.get(provider, 0))
        yield from (requests, duration, ttft, tokens, fallbacks)

        breaker_state = GaugeMetricFamily(
            "omniroute_breaker_state", "1 for the breaker's current state", labels=("provider", "state")
        )
        in_flight = GaugeMetricFamily("omniroute_in_flight", "Attempts in flight", labels=("provider",))
        lockouts = GaugeMetricFamily("omniroute_lockouts", "Running model lockouts", labels=("provider",))
        connections = read.connections(now)
        flying: dict[str, int] = {}
        for c in connections:
            flying[c.provider] = flying.get(c.provider, 0) + c.in_flight
        locked: dict[str, int] = {}
        for entry in read.lockouts(now):
            locked[entry.provider] = locked.get(entry.provider, 0) + 1
        for b in read.breakers(now):
            for state in BreakerState:
                breaker_state.add_metric([b.provider, state.value], 1.0 if b.state == state.value else 0.0)
            in_flight.add_metric([b.provider], flying.get(b.provider, 0))
            lockouts.add_metric([b.provider], locked.get(b.provider, 0))
        yield from (breaker_state, in_flight, lockouts)

        status = GaugeMetricFamily(
            "omniroute_connection_status",
            "1 for the connection's current status",
            labels=("connection", "status"),
        )
        cooldown = GaugeMetricFamily(
            "omniroute_connection_cooldown_seconds", "Cooldown remaining", labels=("connection",)
        )
        queue = GaugeMetricFamily(
            "omniroute_queue_depth", "Requests waiting in the connection's queue", labels=("connection",)
        )
        for c in connections:
            for name in CONNECTION_STATUSES:
                status.add_metric([c.id, name], 1.0 if c.status == name else 0.0)
            cooldown.add_metric([c.id], c.remaining_ms / 1000)
            queue.add_metric([c.id], c.queued)
        yield from (status, cooldown, queue)

        events = CounterMetricFamily("omniroute_events", "Resilience events published", labels=("layer",))
        for layer, n in sorted(runtime.event_counts.counts.items()):
            events.add_metric([layer], n)
        yield events


def exposition(runtime: Runtime) -> bytes:
    """The text a scrape gets. A registry per call: nothing global, two instances never mix."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(runtime))
    return generate_latest(registry)
