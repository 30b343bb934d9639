"""Cost of one routing decision plus recording its outcome (docs/performance.md: median <= 20 µs).

    python bench/engine.py                 # 100 providers, 1,000 connections; 1k / 10k / 100k lockouts
    python bench/engine.py --iterations 50000

Each iteration picks a target on a random provider (`Engine.select`) and records an outcome for
it (`Engine.record`): mostly successes, some 503s, 429s and 404s, so every layer's write path runs.
Lockouts are spread over every connection and many models, and some requests hit a locked model,
so a full scan anywhere would show as growth between the columns. The clock is the real one.
`held` is the table's size after the build: the seeded locks are `not_found` ones, so a connection
keeps at most NOT_FOUND_BUDGET of them and the 100k table holds a little less.

The last row is a client flooding made-up names: every iteration is a 404 for a new name on a
connection already at its `not_found` budget, so every lock evicts one (the path issue #20 added).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.engine import Attempt, ConnectionSpec, Engine, ProviderSpec, Target
from proxy.resilience.lockout import NOT_FOUND_BUDGET
from proxy.resilience.outcome import Outcome, ProviderClass
from proxy.settings import Settings

CLASSES: tuple[ProviderClass, ...] = ("local", "apikey", "oauth")
OUTCOMES = (
    [Outcome.ok()] * 90
    + [
        Outcome.http(503),
        Outcome.http(503),
        Outcome.http(429, '{"error": "rate limited"}', {"retry-after": "1"}),
        Outcome.http(404, "model not found"),
        Outcome.network(),
    ]
    + [Outcome.ok()] * 5
)


def build(providers: int, connections_per_provider: int, lockouts: int, seed: int) -> Engine:
    rng = random.Random(seed)
    settings = Settings()
    settings.patch({"modelLockout": {"enabled": True}}, "settings")
    engine = Engine(
        [ProviderSpec(f"p{i}", CLASSES[i % 3], per_model_quota=i % 3 == 0) for i in range(providers)],
        [
            ConnectionSpec(f"p{i}-c{j}", f"p{i}", priority=j % 3)
            for i in range(providers)
            for j in range(connections_per_provider)
        ],
        settings=settings,
        max_lockouts=max(lockouts, 10_000),
    )
    lock_settings = settings.lockout()
    now = engine.clock.now()
    for n in range(lockouts):
        p = rng.randrange(providers)
        c = rng.randrange(connections_per_provider)
        # Most lockouts are on models the benchmark never asks for; a few are on the hot ones.
        model = f"m{rng.randrange(20)}" if n % 100 == 0 else f"cold-{n}"
        engine.lockouts.record_failure(
            f"p{p}", f"p{p}-c{c}", model, now, lock_settings, status=404, reason="not_found"
        )
    return engine


def run(engine: Engine, iterations: int, providers: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    targets = [[Target(f"p{rng.randrange(providers)}", f"m{rng.randrange(20)}")] for _ in range(4096)]
    outcomes = [OUTCOMES[rng.randrange(len(OUTCOMES))] for _ in range(4096)]
    samples: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(iterations):
            target = targets[i & 4095]
            start = clock()
            decision = engine.select(target)
            if isinstance(decision, Attempt):
                engine.record(decision, outcomes[i & 4095])
            samples.append(clock() - start)
            if i % 2048 == 0:
                engine.persist()  # what the server's 250 ms task does; not part of a request
    finally:
        gc.enable()
    return samples


def flood(engine: Engine, iterations: int, prefix: str) -> list[int]:
    """Select + record a 404 for a new made-up name on one connection at its not_found budget."""
    targets = [[Target("p0", f"{prefix}-{i}", "p0-c0")] for i in range(iterations)]
    outcome = Outcome.http(404, "model not found")
    samples: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(iterations):
            start = clock()
            decision = engine.select(targets[i])
            if isinstance(decision, Attempt):
                engine.record(decision, outcome)
            samples.append(clock() - start)
            if i % 2048 == 0:
                engine.persist()
    finally:
        gc.enable()
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--providers", type=int, default=100)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--lockouts", default="1000,10000,100000")
    ap.add_argument("--iterations", type=int, default=30_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    per_provider = max(1, args.connections // args.providers)
    print(
        f"engine decision + record: {args.providers} providers, {args.providers * per_provider} connections, "
        f"{args.iterations} iterations each"
    )
    print(f"{'lockouts':>9} {'held':>7} {'median µs':>10} {'p90 µs':>8} {'p99 µs':>8}")
    medians: list[float] = []

    def report(label: object, held: int, samples: list[int], note: str = "") -> None:
        samples.sort()
        median = statistics.median(samples) / 1000
        medians.append(median)
        p90 = samples[int(len(samples) * 0.9)] / 1000
        p99 = samples[int(len(samples) * 0.99)] / 1000
        print(f"{label:>9} {held:>7} {median:>10.2f} {p90:>8.2f} {p99:>8.2f}{note}")

    for count in (int(x) for x in args.lockouts.split(",")):
        engine = build(args.providers, per_provider, count, args.seed)
        held = len(engine.lockouts)
        run(engine, 2000, args.providers, args.seed + 1)  # warm-up
        report(count, held, run(engine, args.iterations, args.providers, args.seed))
    growth = max(medians) / min(medians)

    engine = build(args.providers, per_provider, 10_000, args.seed)
    flood(engine, 2 * NOT_FOUND_BUDGET, "warm-up")  # fills p0-c0's budget
    held = len(engine.lockouts)
    samples = flood(engine, args.iterations, "made-up")
    report("flood", held, samples, f"  ({engine.lockout_table_status().evicted} evicted)")
    verdict = "meets" if max(medians) <= 20 else "MISSES"
    print(f"bar: median <= 20 µs -> {verdict}; largest/smallest median across lockout counts: {growth:.2f}x")
    return 0 if max(medians) <= 20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
