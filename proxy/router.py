"""Model addressing: turn the `model` a client sent into an ordered list of targets.

`provider/model` names one target; a combo name expands to its targets; a bare model name goes
to the first provider whose `/v1/models` lists it, else to the default combo
(docs/resilience.md#routing-and-fallback).

Model lists are cached for a minute per provider, and fetched single-flight: while one fetch of a
provider's list is in flight every other request that needs it awaits that fetch, so a burst of
bare-model requests costs the upstream one `/models` call, not one per request. A provider whose
breaker rejects traffic (OPEN, or HALF_OPEN with its probe out) is not asked at all: it keeps its
last known list (so its model still routes to it and the client learns the circuit is open), or
none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy import untrusted
from proxy.config import Config
from proxy.engine import Engine, Target

MODEL_LIST_TTL_S = 60.0
MODEL_LIST_TIMEOUT_MS = 2000.0
_TARGETS_CACHED = 1024

ListModels = Callable[[str], Awaitable[list[str] | None]]
"""Fetch one provider's model ids (None when it does not answer)."""


@dataclass(frozen=True, slots=True)
class Route:
    targets: list[Target]
    combo: str | None = None


class Router:
    def __init__(self, config: Config, engine: Engine, list_models: ListModels) -> None:
        self.config = config
        self.engine = engine
        self._list_models = list_models
        self._model_cache: dict[str, tuple[float, list[str]]] = {}
        """provider -> (engine-clock ms of the fetch, model ids)"""
        self._fetching: dict[str, asyncio.Task[list[str]]] = {}
        """provider -> the one fetch of its list in flight"""
        self._targets: dict[str, Route] = {}
        """`provider/model` -> its route (the config does not change while it runs; nobody changes a
        route's targets). At most _TARGETS_CACHED names: a client cannot grow it."""
        self._bare_routes: dict[str, Route] = {}
        """A bare model -> its route to the provider that listed it when last asked (replaced when
        another lists it first). Only models some provider lists, and at most _TARGETS_CACHED."""
        self._combo_targets = {
            name: [_parse_target(t) for t in combo.targets] for name, combo in config.combos.items()
        }

    async def resolve(self, model: str, pinned_connection: str | None = None) -> Route | None:
        route = self._resolve_static(model)
        if route is None:
            route = self._bare(model, await self._provider_listing(model))
        if route is None:
            return None
        return self._pinned(route, pinned_connection) if pinned_connection is not None else route

    def known(self, model: str, pinned_connection: str | None = None) -> Route | None:
        """`resolve`'s answer when it needs no coroutine: a combo, `provider/model`, or a bare model
        while the lists it is looked up in are at hand (cached and fresh). None when `resolve` must
        decide (a list to fetch, or no route at all)."""
        route = self._resolve_static(model)
        if route is None:
            at_hand, provider = self._listed(model)
            if not at_hand:
                return None
            route = self._bare(model, provider)
        if route is None or pinned_connection is None:
            return route
        return self._pinned(route, pinned_connection)

    def _bare(self, model: str, provider: str | None) -> Route | None:
        """A bare model's route: the provider that lists it, else the default combo (or none)."""
        if provider is not None:
            # A route and its target made once per model, not per request: the common case of a
            # local server's models (`llama3.1:8b`).
            route = self._bare_routes.get(model)
            if route is None or route.targets[0].provider != provider:
                route = Route([Target(provider, model)])
                if model in self._bare_routes or len(self._bare_routes) < _TARGETS_CACHED:
                    self._bare_routes[model] = route
            return route
        if self.config.server.default_combo:
            return self._resolve_static(self.config.server.default_combo)
        return None

    def _pinned(self, route: Route, pinned_connection: str) -> Route:
        conn = self.config.connection(pinned_connection)
        if conn is None:
            return Route([], route.combo)
        return Route(
            [
                Target(t.provider, t.model, pinned_connection)
                for t in route.targets
                if t.provider == conn.provider
            ],
            route.combo,
        )

    def _resolve_static(self, model: str) -> Route | None:
        combo = self.config.combos.get(model)
        if combo is not None:
            targets = self.engine.order_targets(combo.name, combo.strategy, self._combo_targets[combo.name])
            return Route(targets, combo.name)
        route = self._targets.get(model)
        if route is not None:
            return route
        provider, sep, bare = model.partition("/")
        if sep and bare and provider in self.config.providers:
            route = Route([Target(provider, bare)])
            if len(self._targets) < _TARGETS_CACHED:
                self._targets[model] = route
            return route
        return None

    async def _provider_listing(self, model: str) -> str | None:
        at_hand, provider = self._listed(model)
        if at_hand:
            return provider
        lists = await asyncio.gather(*(self.models_of(p) for p in self.config.providers))
        for provider, models in zip(self.config.providers, lists, strict=True):
            if model in models:
                return provider
        return None

    def _listed(self, model: str) -> tuple[bool, str | None]:
        """(True, the first provider, in the config's order, whose list holds `model`, or None) when
        the lists that decide it are at hand: the same answer the gathered `models_of` would give,
        without a task per provider on every bare-model request (lists last a minute). (False, None)
        when a provider before the answer has a list to fetch first."""
        now = self.engine.clock.now()
        for provider in self.config.providers:
            models = self._at_hand(provider, now)
            if models is None:
                return False, None
            if model in models:
                return True, provider
        return True, None

    def _at_hand(self, provider: str, now: float) -> list[str] | None:
        """The provider's list when no fetch is due: fresh in the cache, or its last known one (else
        none) while its breaker rejects traffic. None when it must be fetched."""
        cached = self._model_cache.get(provider)
        if cached is not None and now - cached[0] < MODEL_LIST_TTL_S * 1000:
            return cached[1]
        runtime = self.engine.providers.get(provider)
        if runtime is not None and not runtime.breaker.can_execute(now):
            # We stopped sending this provider traffic; a model-list call would be traffic too.
            return cached[1] if cached is not None else []
        return None

    async def models_of(self, provider: str) -> list[str]:
        """The model ids an upstream lists, cached for a minute (an empty list when it is down)."""
        models = self._at_hand(provider, self.engine.clock.now())
        if models is not None:
            return models
        task = self._fetching.get(provider)
        if task is None:
            task = asyncio.ensure_future(self._fetch(provider))
            self._fetching[provider] = task
            task.add_done_callback(lambda done: self._fetched(provider, done))
        # Shielded: a client that hangs up cancels its own wait, not the fetch the others await.
        return await asyncio.shield(task)

    async def _fetch(self, provider: str) -> list[str]:
        models = await self._list_models(provider)
        result = models or []
        self._model_cache[provider] = (self.engine.clock.now(), result)
        return result

    def _fetched(self, provider: str, task: asyncio.Task[list[str]]) -> None:
        if self._fetching.get(provider) is task:
            del self._fetching[provider]
        if not task.cancelled():
            task.exception()  # read here: when every waiter left, nobody else would

    def configured_models(self) -> list[str]:
        names: list[str] = []
        for combo in self.config.combos.values():
            names.append(combo.name)
            names.extend(combo.targets)
        return list(dict.fromkeys(names))


def _parse_target(text: str) -> Target:
    provider, _, model = text.partition("/")
    return Target(provider, model)


def parse_model_list(raw: bytes) -> list[str] | None:
    """Model ids out of an OpenAI `/v1/models` body (None when it is not one). An upstream's answer:
    read as untrusted (nesting no parser recurses through is no list), and an id that is not a
    string names no model (`str()` of `null` or `["x"]` would make `None` a routable name)."""
    document = untrusted.read_answer(raw)
    listed = document.get("data") if isinstance(document, dict) else None
    if not isinstance(listed, list):
        return None
    return [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
