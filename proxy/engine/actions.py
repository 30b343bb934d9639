"""Operator actions: what an operator may do to the layers (the API, the console and the CLI).

Each action changes the layers at once, marks what it changed dirty, and announces itself on the
bus as an `operator` event naming where it came from (`source`), so every observer sees who did it.
"""

from __future__ import annotations

from proxy.engine.layers import EnginePart
from proxy.resilience.events import Event
from proxy.shared import reenable_op


class OperatorActions(EnginePart):
    def _operator(self, action: str, reason: str) -> None:
        self._layers.emit(Event(self.clock.now(), "operator", action, "", "", reason))

    def announce(self, action: str, *, source: str = "api") -> None:
        """An operator action made beside the engine (a settings change), told like the engine's
        own: its CLI command without `omniroute`, and where it was done."""
        self._operator(action, source)

    def reset_breakers(self, provider: str | None = None, *, source: str = "api") -> int:
        """Reset one provider's breaker, or all; returns how many. KeyError for an unknown provider."""
        now = self.clock.now()
        if provider is not None and provider not in self.providers:
            raise KeyError(provider)
        ids = [provider] if provider is not None else list(self.providers)
        shared = self._layers.shared
        for pid in ids:
            if shared is not None:
                shared.reset_breaker(pid, now)
            self.providers[pid].breaker.reset(now, "operator")
            self.dirty.breakers.add(pid)
        self._operator(f"reset breaker {provider or '--all'}", source)
        return len(ids)

    def reset_connection(self, connection_id: str | None = None, *, source: str = "api") -> int:
        now = self.clock.now()
        if connection_id is not None and connection_id not in self.connections:
            raise KeyError(connection_id)
        ids = [connection_id] if connection_id is not None else list(self.connections)
        for cid in ids:
            self._layers.connection_op(cid, lambda h: h.reset(now, "operator"), by_operator=True)
        self._operator(f"reset connection {connection_id or '--all'}", source)
        return len(ids)

    def set_connection_enabled(self, connection_id: str, enabled: bool, *, source: str = "api") -> None:
        if connection_id not in self.connections:
            raise KeyError(connection_id)
        conn = self.connections[connection_id]
        now = self.clock.now()
        self._layers.connection_op(connection_id, lambda h: h.set_enabled(enabled, now))
        if not enabled:
            conn.recheck()  # what waits for it is not sent to a disabled connection
        self._operator(f"{'enable' if enabled else 'disable'} {connection_id}", source)

    def reenable(
        self, provider: str, model: str, connection_id: str | None = None, *, source: str = "api"
    ) -> int:
        """Lift the lockouts of one model: on one connection, or across the provider's connections."""
        runtime = self.providers.get(provider)
        now = self.clock.now()
        if runtime is not None:
            keys = [
                (provider, c.spec.id, model)
                for c in runtime.connections
                if connection_id is None or c.spec.id == connection_id
            ]
            self.dirty.lockouts.update(keys)
            if self._layers.shared is not None:
                for key in keys:
                    self._layers.shared.lockout(key, reenable_op(key, now), by_operator=True)
        removed = self.lockouts.reenable(provider, model, now, connection_id)
        suffix = f" --connection {connection_id}" if connection_id else ""
        self._operator(f"reenable {provider}/{model}{suffix}", source)
        return removed

    def reenable_all(self, *, source: str = "api") -> int:
        keys = self.lockouts.keys()
        self.dirty.lockouts.update(keys)
        now = self.clock.now()
        if self._layers.shared is not None:
            for key in keys:
                self._layers.shared.lockout(key, reenable_op(key, now), by_operator=True)
        removed = self.lockouts.reenable_all(now)
        self._operator("reenable --all", source)
        return removed
