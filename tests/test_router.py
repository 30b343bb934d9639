"""A bare model name is answered from the model lists at hand without a coroutine, and that answer
is always the one the full lookup (a task per provider, gathered) gives.

A bare model (`m1`: no provider, no combo) goes to the first provider, in the config's order, whose
`/v1/models` lists it. The lists last a minute, so nearly every such request finds them cached;
`Router.known` then answers at once. A stateful property test (hypothesis) drives lists changing
upstream, time passing and breakers opening, and after every step compares the two answers.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from proxy.config import Config, load_config
from proxy.engine import Target
from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.router import MODEL_LIST_TTL_S, Route, Router
from proxy.runtime import Runtime
from proxy.store import MemoryStore

PROVIDERS = ("p1", "p2", "p3")
MODELS = ("m1", "m2", "m3", "p1/m1")
TTL_MS = MODEL_LIST_TTL_S * 1000


def three_providers(default_combo: bool) -> Config:
    text = "".join(
        f'[providers.{p}]\nclass = "local"\nbase_url = "http://127.0.0.1:9/{p}"\n'
        f'[[providers.{p}.connections]]\nid = "{p}-1"\n'
        for p in PROVIDERS
    )
    if default_combo:
        text = '[server]\ndefault_combo = "fallback"\n' + text + '[combos.fallback]\ntargets = ["p3/big"]\n'
    path = Path(tempfile.mkdtemp(prefix="omr-router-")) / "config.toml"
    path.write_text(text)
    return load_config(path, {})


class BareModels(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.config = three_providers(default_combo=True)
        self.runtime = Runtime(self.config, MemoryStore(), clock=self.clock, env={})
        self.upstream: dict[str, list[str]] = {p: [] for p in PROVIDERS}
        """What each upstream lists right now (a list call returns it)."""
        self.calls: list[str] = []
        self.router = Router(self.config, self.runtime.engine, self.list_models)

    async def list_models(self, provider: str) -> list[str] | None:
        self.calls.append(provider)
        return list(self.upstream[provider])

    @rule(provider=st.sampled_from(PROVIDERS), models=st.lists(st.sampled_from(MODELS[:3]), max_size=3))
    def upstream_lists(self, provider: str, models: list[str]) -> None:
        self.upstream[provider] = models

    @rule(ms=st.sampled_from([1.0, TTL_MS / 2, TTL_MS, TTL_MS + 1]))
    def time_passes(self, ms: float) -> None:
        self.clock.advance(ms)

    @rule(provider=st.sampled_from(PROVIDERS))
    def breaker_opens(self, provider: str) -> None:
        """Failures open a closed breaker; a half-open one reopens when its probe fails."""
        breaker = self.runtime.engine.providers[provider].breaker
        now = self.clock.now()
        while breaker.state(now) in (BreakerState.CLOSED, BreakerState.DEGRADED):
            breaker.record_failure(now)
        if breaker.state(now) is BreakerState.HALF_OPEN and breaker.can_execute(now):
            breaker.admit(now)
            breaker.record_failure(now, probe=breaker.probe_ticket)

    @rule(provider=st.sampled_from(PROVIDERS))
    def probe_goes_out(self, provider: str) -> None:
        """A half-open breaker's probe in flight: the provider takes no other traffic meanwhile."""
        breaker = self.runtime.engine.providers[provider].breaker
        if breaker.state(self.clock.now()) is BreakerState.HALF_OPEN:
            breaker.admit(self.clock.now())

    @rule(provider=st.sampled_from(PROVIDERS))
    def breaker_resets(self, provider: str) -> None:
        self.runtime.engine.providers[provider].breaker.reset(self.clock.now())

    @rule(model=st.sampled_from(MODELS))
    def a_request(self, model: str) -> None:
        """What `known` says at once is what `resolve` decides; when `known` cannot say, `resolve`
        still answers (fetching what it must), and once it has, `known` can."""
        at_once = self.router.known(model)
        calls = len(self.calls)
        decided = asyncio.run(self.router.resolve(model))
        event("known at once" if at_once is not None else "left to resolve")
        if at_once is not None:
            assert at_once == decided
            assert len(self.calls) == calls  # answered from the lists at hand: no list was fetched
        elif decided is not None:
            assert self.router.known(model) == decided

    @invariant()
    def at_hand_means_the_full_lookups_answer(self) -> None:
        at_hand, provider = self.router._listed("m1")
        if not at_hand:
            return
        calls = len(self.calls)
        listing = asyncio.run(_gathered(self.router, "m1"))
        assert provider == listing
        # Only lists after the answer can have been fetched, never one that decided it.
        if provider is not None:
            assert PROVIDERS.index(provider) < min(
                (PROVIDERS.index(p) for p in self.calls[calls:]), default=len(PROVIDERS)
            )


async def _gathered(router: Router, model: str) -> str | None:
    """The full lookup: every provider's list (`models_of`, fetching a stale one), first match."""
    lists = await asyncio.gather(*(router.models_of(p) for p in router.config.providers))
    return next(
        (p for p, models in zip(router.config.providers, lists, strict=True) if model in models), None
    )


BareModels.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestBareModels = BareModels.TestCase


def test_a_bare_model_is_known_at_once_while_its_lists_are_fresh() -> None:
    clock = FakeClock()
    config = three_providers(default_combo=False)
    runtime = Runtime(config, MemoryStore(), clock=clock, env={})
    listed = {"p1": ["a"], "p2": ["m1"], "p3": ["m1"]}
    calls: list[str] = []

    async def list_models(provider: str) -> list[str]:
        calls.append(provider)
        return listed[provider]

    router = Router(config, runtime.engine, list_models)
    assert router.known("m1") is None  # nothing fetched yet: resolve must ask
    assert asyncio.run(router.resolve("m1")) == Route([Target("p2", "m1")])
    assert sorted(calls) == ["p1", "p2", "p3"]
    assert router.known("m1") == Route([Target("p2", "m1")])  # the first in the config's order
    assert router.known("m1", "p2-1") == Route([Target("p2", "m1", "p2-1")])
    assert router.known("nobody-lists-it") is None  # resolve answers the 404
    clock.advance(TTL_MS)
    assert router.known("m1") is None  # the lists went stale: resolve fetches them again


def test_an_open_provider_never_listed_is_passed_over_not_the_end_of_the_search() -> None:
    clock = FakeClock()
    config = three_providers(default_combo=True)
    runtime = Runtime(config, MemoryStore(), clock=clock, env={})

    async def list_models(provider: str) -> list[str]:
        return {"p1": ["m1"], "p2": ["m1"], "p3": []}[provider]

    router = Router(config, runtime.engine, list_models)
    breaker = runtime.engine.providers["p1"].breaker
    while breaker.state(clock.now()) is not BreakerState.OPEN:
        breaker.record_failure(clock.now())
    assert asyncio.run(router.resolve("m1")) == Route([Target("p2", "m1")])  # p1 is not asked
    assert router.known("m1") == Route([Target("p2", "m1")])


def test_a_bare_models_route_is_made_once_and_follows_the_lists() -> None:
    """Every request for a local server's model (`llama3.1:8b`) gets the same route, not a new one;
    when another provider comes to list it first, the route goes there."""
    clock = FakeClock()
    config = three_providers(default_combo=False)
    runtime = Runtime(config, MemoryStore(), clock=clock, env={})
    listed = {"p1": [], "p2": ["m1"], "p3": ["m1"]}

    async def list_models(provider: str) -> list[str]:
        return listed[provider]

    router = Router(config, runtime.engine, list_models)
    first = asyncio.run(router.resolve("m1"))
    assert first == Route([Target("p2", "m1")])
    assert router.known("m1") is first and asyncio.run(router.resolve("m1")) is first
    listed["p1"] = ["m1"]
    clock.advance(TTL_MS)
    assert asyncio.run(router.resolve("m1")) == Route([Target("p1", "m1")])
    assert router.known("m1") == Route([Target("p1", "m1")])
