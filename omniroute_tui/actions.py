"""Operator actions: what `r`, `e` and `R` do to the engine, and the CLI command each one equals.

No Textual here: the app runs `apply` in a worker and reports the result. The engine itself emits
an `operator` event per action (its key is the command without `omniroute `), so every action
lands in the Events tab and in `GET /api/events` the same way, whichever surface triggered it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from omniroute_tui.format import counted
from proxy.readmodel import ConnectionView, Observed

Table = Literal["breakers", "connections", "lockouts"]
Verb = Literal["reset", "toggle"]
Scope = Literal["row", "shown", "all"]
"""`row`: the selected row (`r`, `e`); `shown`: every row the filter keeps (`R`); `all`: `R` with no filter."""

SOURCE = "tui"


class NotSaved(Exception):
    """An action that was done and is in effect, but that the state store refused to keep: its
    message says so, and why (a restart would undo it)."""


class Operator(Protocol):
    """The engine's operator commands, the only writes an action makes (the engine satisfies it)."""

    def reset_breakers(self, provider: str | None = None, *, source: str = ...) -> int: ...

    def reset_connection(self, connection_id: str | None = None, *, source: str = ...) -> int: ...

    def set_connection_enabled(self, connection_id: str, enabled: bool, *, source: str = ...) -> None: ...

    def reenable(
        self, provider: str, model: str, connection_id: str | None = None, *, source: str = ...
    ) -> int: ...

    def reenable_all(self, *, source: str = ...) -> int: ...


@dataclass(frozen=True, slots=True)
class Action:
    table: Table
    verb: Verb
    targets: tuple[tuple[str, ...], ...]
    """Row targets: (provider,), (connection id,) or (provider, connection id, model)."""
    scope: Scope = "row"
    ask: bool = False
    """Ask even for one row: the command palette acts on a row the operator may not be looking at."""
    label: str = ""
    """The one row in words ("flaky (now OPEN)"), for that question."""

    @property
    def bulk(self) -> bool:
        """Acts on every row shown: asks first (single-row actions from a key never do)."""
        return self.scope != "row"

    @property
    def asks(self) -> bool:
        return self.bulk or self.ask

    def describe(self) -> str:
        """The question the confirmation dialog asks."""
        n = len(self.targets)
        noun = {"breakers": "breaker", "connections": "connection", "lockouts": "lockout"}[self.table]
        verb = {"breakers": "Reset", "connections": "Clear", "lockouts": "Re-enable"}[self.table]
        if self.verb == "toggle":
            verb = "Enable/disable"
        if not self.bulk:
            return f"{verb} {noun} {self.label}?"
        plural = "" if n == 1 else "s"
        scope = " (every row)" if self.scope == "all" else " (every row the filter shows)"
        return f"{verb} {n:,} {noun}{plural}{scope}?"


@dataclass(frozen=True, slots=True)
class Result:
    commands: tuple[str, ...]
    """The equivalent CLI commands, `omniroute ...`."""
    changed: int
    """Targets that were not already in the state the action puts them in."""
    said: tuple[str, ...] = ()
    """What happened to each target, in words: "Reset breaker flaky (was OPEN)"."""

    def summary(self) -> str:
        """One line for the toast: what was done, and what was already so."""
        if len(self.said) == 1:
            return self.said[0]
        total = len(self.said)
        text = "; ".join(self.said[:2]) + (f" … and {total - 2} more" if total > 2 else "")
        unchanged = total - self.changed
        return f"{text} ({unchanged} already so)" if unchanged else text

    def command(self) -> str:
        """The CLI equivalent, for the toast's title."""
        if len(self.commands) <= 2:
            return "; ".join(self.commands)
        return f"{self.commands[0]} … and {len(self.commands) - 1} more"


def apply(read: Observed, engine: Operator, action: Action) -> Result:
    """Run the action through the engine's commands (the ones the management API runs), reading what
    each target was through the read model; KeyError when a target vanished (a row can outlive its
    entry by one tick)."""
    now = read.now()
    commands: list[str] = []
    said: list[str] = []
    changed = 0
    if action.verb == "toggle":
        for (cid,) in action.targets:
            enabled = not _connection(read, cid, now).enabled
            engine.set_connection_enabled(cid, enabled, source=SOURCE)
            commands.append(f"omniroute {'enable' if enabled else 'disable'} {cid}")
            said.append(f"{'Enabled' if enabled else 'Disabled'} connection {cid}")
            changed += 1
        return Result(tuple(commands), changed, tuple(said))
    if action.table == "breakers":
        for (pid,) in action.targets:
            breaker = read.breaker(pid, now)
            if breaker is None:
                raise KeyError(pid)
            state = breaker.state
            if state != "CLOSED" or breaker.failures:
                changed += 1
                said.append(f"Reset breaker {pid} (was {state}, {counted(breaker.failures, 'failure')})")
            else:
                said.append(f"Breaker {pid} was already CLOSED")
        if action.scope == "all":
            engine.reset_breakers(None, source=SOURCE)
            commands.append("omniroute reset breaker --all")
        else:
            for (pid,) in action.targets:
                engine.reset_breakers(pid, source=SOURCE)
                commands.append(f"omniroute reset breaker {pid}")
    elif action.table == "connections":
        for (cid,) in action.targets:
            conn = _connection(read, cid, now)
            status = conn.status
            if status not in ("active", "disabled") or conn.backoff_level:
                changed += 1
                said.append(f"Cleared connection {cid} (was {status})")
            else:
                said.append(f"Connection {cid} was already {status}")
        if action.scope == "all":
            engine.reset_connection(None, source=SOURCE)
            commands.append("omniroute reset connection --all")
        else:
            for (cid,) in action.targets:
                engine.reset_connection(cid, source=SOURCE)
                commands.append(f"omniroute reset connection {cid}")
    elif action.scope == "all":
        removed = engine.reenable_all(source=SOURCE)
        changed = removed
        said.append(f"Re-enabled every locked model ({counted(removed, 'lockout')} lifted)")
        commands.append("omniroute reenable --all")
    else:
        for provider, cid, model in action.targets:
            removed = engine.reenable(provider, model, cid, source=SOURCE)
            changed += removed
            said.append(
                f"Re-enabled {provider}/{model} on {cid}"
                if removed
                else f"{provider}/{model} on {cid} was not locked"
            )
            commands.append(f"omniroute reenable {provider}/{model} --connection {cid}")
    return Result(tuple(commands), changed, tuple(said))


def _connection(read: Observed, connection_id: str, now: float) -> ConnectionView:
    found = read.connection(connection_id, now)
    if found is None:
        raise KeyError(connection_id)
    return found
