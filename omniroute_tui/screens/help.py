"""`?` and ctrl+p: every key and every command, read from the BINDINGS themselves.

Nothing here is hand-written per key: add a binding to the app or a table and it shows up in the
help screen, the footer and the command palette at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Protocol, cast

from rich.table import Table
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Static

from omniroute_tui.screens.confirm import ConfirmScreen
from omniroute_tui.screens.filter import FilterScreen
from omniroute_tui.widgets.overview import PickList, TileBar
from omniroute_tui.widgets.tables import TABLE_CLASSES, ResourceTable


class ConsoleApp(Protocol):
    """What the catalogue needs from the app (kept as a protocol: this module must not import app.py)."""

    BINDINGS: ClassVar[list[BindingType]]
    COMMAND_PALETTE_BINDING: ClassVar[str]
    read_only: bool

    def run_action(self, action: str, default_namespace: Any = None) -> Awaitable[bool]: ...

    def table_action(self, table: str, action: str) -> None: ...

    def help_for(self, binding: Binding) -> str: ...

    def get_key_display(self, binding: Binding) -> str: ...


@dataclass(frozen=True, slots=True)
class KeyEntry:
    scope: str
    table: str | None
    """The table whose widget owns the binding (None: the app)."""
    binding: Binding


def _widget_scopes() -> Iterator[tuple[str, str | None, type[Widget] | type[App[Any]]]]:
    yield "Overview tiles", None, TileBar
    yield "Overview lists", None, PickList
    for cls in TABLE_CLASSES:
        if "BINDINGS" in vars(cls):
            yield f"{cls.TABLE.capitalize()} table", cls.TABLE, cls
    yield "Any table", None, ResourceTable
    try:
        import omniroute_tui.cards  # noqa: F401  (the Settings tab is optional until its cards exist)
    except ImportError:
        pass
    else:
        # Whatever keys the cards define, found by walking their widget classes.
        for card_widget in _subclasses(Widget):
            if card_widget.__module__.startswith("omniroute_tui.cards") and "BINDINGS" in vars(card_widget):
                yield "Settings tab", None, card_widget
    yield "Confirmation dialog", None, ConfirmScreen
    yield "Filter dialog", None, FilterScreen


def _subclasses(cls: type[Widget]) -> Iterator[type[Widget]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def key_catalogue(app: ConsoleApp) -> list[KeyEntry]:
    """Every key the console answers to, grouped by where it works."""
    entries = [
        KeyEntry("Everywhere", None, b)
        for b in Binding.make_bindings(type(app).BINDINGS)
        if b.action != "refuse"  # read-only's answer to the table keys, not a key of its own
    ]
    entries.append(
        KeyEntry(
            "Everywhere",
            None,
            Binding(
                app.COMMAND_PALETTE_BINDING,
                "command_palette",
                "Command palette",
                tooltip="Find any action or tab by name",
            ),
        )
    )
    seen: set[tuple[str, str, str]] = set()
    for scope, table, cls in _widget_scopes():
        for b in Binding.make_bindings(cls.BINDINGS):
            if (scope, b.key, b.action) not in seen:  # (the same key on several kinds of field: once)
                seen.add((scope, b.key, b.action))
                entries.append(KeyEntry(scope, table, b))
    return entries


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="help-close"),
    ]

    def compose(self) -> ComposeResult:
        app = cast(ConsoleApp, self.app)
        sections: dict[str, Table] = {}
        for entry in key_catalogue(app):
            table = sections.get(entry.scope)
            if table is None:
                table = Table(
                    title=entry.scope, title_justify="left", title_style="bold", box=None, show_header=False
                )
                table.add_column(style="bold", width=8, no_wrap=True)
                table.add_column(width=18, no_wrap=True)
                table.add_column(style="dim", ratio=1)
                sections[entry.scope] = table
            b = entry.binding
            table.add_row(app.get_key_display(b), b.description or b.action, app.help_for(b))
        with VerticalScroll(classes="dialog help"):
            yield Static("Keys  (escape closes)", classes="dialog-question")
            for table in sections.values():
                yield Static(table, classes="help-section")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


def commands(app: ConsoleApp) -> list[tuple[str, str, Callable[[], object]]]:
    """(title, help, callback) for every action and tab, derived from the key catalogue."""
    found: list[tuple[str, str, Callable[[], object]]] = []
    for entry in key_catalogue(app):
        b = entry.binding
        if b.action in ("command_palette", "dismiss") or entry.scope.endswith("dialog"):
            continue
        if entry.scope in ("Settings tab", "Any table") or entry.scope.startswith("Overview"):
            continue  # these keys need a focused card, table or list; the palette cannot give one
        if app.read_only and entry.table is not None and b.action in ResourceTable.CHANGES:
            continue  # refused in read-only mode: not offered
        title = b.description or b.action
        if entry.table is not None:
            title = f"{entry.table.capitalize()}: {title}"
            callback: Callable[[], object] = partial(app.table_action, entry.table, b.action)
        else:
            if b.action.startswith("show_tab"):
                title = f"Show the {title} tab"
            callback = partial(app.run_action, b.action)
        found.append((title, f"{app.help_for(b)} [{b.key}]".strip(), callback))
    return found


class ConsoleCommands(Provider):
    """The command palette's provider: every tab and every action of the console."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        seen: set[str] = set()  # q and ctrl+c both quit: one entry is enough
        unique = []
        for title, help_text, callback in commands(self.app):  # type: ignore[arg-type]
            if title not in seen:
                seen.add(title)
                unique.append((title, help_text, callback))
        return unique

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
