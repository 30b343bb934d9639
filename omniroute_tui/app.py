"""`omniroute tui`: the proxy and its operator console in one process (surface.md §5).

The app wires the parts and routes messages; it holds no business logic. `Feed` reads the engine
and posts `SnapshotReady`; the app hands each part down to its widget. Widgets post
`ActionRequested` up; the app confirms bulk actions and runs them in one worker group, whose
results and errors all arrive through one `Worker.StateChanged` funnel.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
from contextlib import ExitStack
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from omniroute_tui import actions, terminal, untrusted
from omniroute_tui.feed import Feed, FeedLogHandler, captured_logging
from omniroute_tui.host import ProxyHost
from omniroute_tui.messages import SnapshotReady
from omniroute_tui.screens.confirm import ConfirmScreen
from omniroute_tui.screens.filter import FilterScreen
from omniroute_tui.screens.help import ConsoleCommands, HelpScreen
from omniroute_tui.snapshot import COLUMNS, View
from omniroute_tui.widgets.header import StatusHeader
from omniroute_tui.widgets.overview import OverviewPane
from omniroute_tui.widgets.panes import TablePane, settings_pane
from omniroute_tui.widgets.tables import (
    BreakersTable,
    ConnectionsTable,
    EventsTable,
    LockoutsTable,
    ResourceTable,
)
from proxy import serve
from proxy.runtime import Runtime

log = logging.getLogger("omniroute.tui")

TABLE_TABS = ("breakers", "connections", "lockouts", "events")
SHORT_ROWS = 20


class OmniRouteApp(App[int]):
    CSS_PATH = "omniroute.tcss"
    TITLE = "omniroute"
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-short"), (SHORT_ROWS, "-tall")]
    """A terminal shorter than SHORT_ROWS hides the detail panes (omniroute.tcss), so that every
    table keeps its header and at least three rows down to 40x12."""
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_tab('overview')", "Overview", show=False, id="tab-overview"),
        Binding("2", "show_tab('breakers')", "Breakers", show=False, id="tab-breakers"),
        Binding("3", "show_tab('connections')", "Connections", show=False, id="tab-connections"),
        Binding("4", "show_tab('lockouts')", "Lockouts", show=False, id="tab-lockouts"),
        Binding("5", "show_tab('settings')", "Settings", show=False, id="tab-settings"),
        Binding("6", "show_tab('events')", "Events", show=False, id="tab-events"),
        Binding("slash", "filter", "Filter", tooltip="Show only rows containing a text", id="filter"),
        Binding("s", "sort", "Sort", tooltip="Sort by the next column", id="sort"),
        Binding("S", "reverse", "Reverse", tooltip="Reverse the sort order", id="reverse"),
        Binding("p", "pause", "Pause", tooltip="Pause or resume live updates", id="pause"),
        Binding("question_mark", "help", "Help", tooltip="List every key", id="help"),
        Binding("q", "quit", "Quit", tooltip="Stop the proxy and leave", id="quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="quit-ctrl-c"),
    ]

    def __init__(
        self,
        runtime: Runtime,
        *,
        read_only: bool = False,
        serve_sock: socket.socket | None = None,
        live: bool = True,
        ascii_only: bool = False,
    ) -> None:
        # ASCII: every character leaves through a driver that writes ASCII look-alikes (terminal.py).
        super().__init__(driver_class=terminal.ascii_driver() if ascii_only else None)
        untrusted.use_ascii(ascii_only)
        self.runtime = runtime
        self.read_only = read_only
        self.host = ProxyHost(runtime, serve_sock, demo=runtime.demo) if serve_sock is not None else None
        server = runtime.config.server
        base = self.host.base_url if self.host else f"http://{server.host}:{server.port}"
        self.feed = Feed(self, runtime, url=f"{base}/v1", read_only=read_only, live=live)
        self._cleanup = ExitStack()
        self._quitting = False
        self._visited: set[str] = {"overview"}
        self.status = StatusHeader()
        self.tabs = TabbedContent(initial="overview", id="tabs")
        self.overview = OverviewPane(id="overview-pane")
        self.panes = {
            table.TABLE: TablePane(table(id=f"{table.TABLE}-table"), id=f"{table.TABLE}-pane")
            for table in (BreakersTable, ConnectionsTable, LockoutsTable, EventsTable)
        }

    def compose(self) -> ComposeResult:
        with self.tabs:
            with TabPane("1 Overview", id="overview"):
                yield self.overview
            for n, tab in enumerate(("breakers", "connections", "lockouts"), start=2):
                with TabPane(f"{n} {tab.capitalize()}", id=tab):
                    yield self.panes[tab]
            with TabPane("5 Settings", id="settings"):
                yield Static("Loading the settings cards…", id="settings-placeholder")
            with TabPane("6 Events", id="events"):
                yield self.panes["events"]
        yield self.status  # below the tabs: see omniroute.tcss
        yield Footer()

    # -- typed DOM accessors (held, not queried: a query only searches the active screen) ---------

    @property
    def active_tab(self) -> str:
        return self.tabs.active

    def table(self, tab: str) -> ResourceTable:
        return self.panes[tab].table

    # -- lifecycle ---------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self._cleanup.enter_context(captured_logging(FeedLogHandler(self.feed)))
        self.feed.held = lambda: len(self.screen_stack) > 1
        self.feed.start()
        for warning in self.runtime.warnings:
            log.warning("%s", warning)
        if self.host is not None:
            self.run_worker(self.host.start(), name="proxy server", group="server", exit_on_error=False)
            self.call_after_refresh(self._settle_heap)

    def _settle_heap(self) -> None:
        """Exempt what exists from the cyclic GC: the widgets and the engine live as long as the
        process, and a full GC pass over them stalls every request in flight for tens of ms
        (bench/tui.py). Done at start and after each tab's first build: a bounded number of times."""
        if self.host is not None:
            gc.collect()
            gc.freeze()

    async def on_unmount(self) -> None:
        if self.host is not None:
            gc.unfreeze()
        self.feed.stop()
        if self.host is not None:
            await self.host.stop()
        self._cleanup.close()

    async def action_quit(self) -> None:
        if self.host is None:
            self.exit(0)
        elif not self._quitting:
            self._quitting = True
            self.notify("Stopping the proxy (in-flight requests get a short grace period)…")
            self.run_worker(self._stop_and_exit(), name="shutdown", group="server", exit_on_error=False)

    async def _stop_and_exit(self) -> None:
        assert self.host is not None
        await self.host.stop()
        self.exit(0)

    # -- snapshots down ----------------------------------------------------------------------------

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        snapshot = message.snapshot
        self.status.show(snapshot.header)
        if snapshot.overview is not None:
            self.overview.apply(snapshot.overview)
        if snapshot.table is not None:
            self.panes[snapshot.table.name].apply(snapshot.table)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or "overview"
        self.feed.tab = tab
        if tab not in self._visited:
            self._visited.add(tab)
            self.set_timer(1.0, self._settle_heap)  # once its rows and caches exist
        if tab in TABLE_TABS:
            self.table(tab).focus()
        elif tab == "settings" and self.query("#settings-placeholder"):
            # Mounted on first visit: the cards are hundreds of widgets, and every millisecond
            # spent building them at startup is one the proxy cannot serve.
            self.query_one("#settings-placeholder").remove()
            self.query_one("#settings", TabPane).mount(settings_pane(self.runtime, self.read_only))
        self.refresh_bindings()
        self.feed.request()

    @on(ResourceTable.Scrolled)
    def _scrolled(self, message: ResourceTable.Scrolled) -> None:
        self.feed.windows[message.table.TABLE] = message.window
        self.feed.request()

    @on(ResourceTable.Selected)
    def _selected(self, message: ResourceTable.Selected) -> None:
        if self.feed.selected.get(message.table.TABLE) != message.key:
            self.feed.selected[message.table.TABLE] = message.key
            self.feed.request()

    # -- actions up --------------------------------------------------------------------------------

    @on(ResourceTable.ActionRequested)
    def _action_requested(self, message: ResourceTable.ActionRequested) -> None:
        action = message.action
        if self.read_only:
            self.notify("read-only mode: actions are disabled", severity="warning")
        elif action.bulk:

            def answered(yes: bool | None) -> None:
                if yes:
                    self.perform(action)
                else:
                    self.notify("Cancelled: nothing changed")

            self.push_screen(ConfirmScreen(action.describe()), answered)
        else:
            self.perform(action)

    @work(exclusive=True, group="actions", exit_on_error=False)
    async def perform(self, action: actions.Action) -> actions.Result:
        return actions.apply(self.runtime.engine, action)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """The one funnel for every worker's outcome (harlequin)."""
        worker = event.worker
        if event.state is WorkerState.SUCCESS and isinstance(worker.result, actions.Result):
            self.notify(untrusted.visible(worker.result.summary()), title="Done", markup=False)
            self.feed.request()
        elif event.state is WorkerState.ERROR:
            error = worker.error
            if worker.group == "server":
                self.exit(return_code=2, message=f"omniroute: {error}")
            elif isinstance(error, KeyError):
                self.notify(
                    untrusted.visible(f"{error.args[0]} no longer exists"), severity="warning", markup=False
                )
                self.feed.request()
            else:
                self.notify(
                    untrusted.visible(f"{type(error).__name__}: {error}"),
                    title="Action failed",
                    severity="error",
                    markup=False,
                )

    def table_action(self, tab: str, action: str) -> None:
        """Run a table's key from elsewhere (the command palette): show the tab, then act."""
        self.action_show_tab(tab)
        self.call_after_refresh(self.table(tab).run_action, action)

    # -- view keys ---------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("filter", "sort", "reverse"):
            return True if self.active_tab in TABLE_TABS else None
        return True

    def action_show_tab(self, tab: str) -> None:
        self.tabs.active = tab

    def _set_view(self, tab: str, view: View) -> None:
        self.feed.views[tab] = view
        self.feed.request()

    def action_filter(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]

        def filtered(text: str | None) -> None:
            if text is not None:
                self._set_view(tab, View(text, view.sort, view.reverse))

        self.push_screen(FilterScreen(tab, view.filter), filtered)

    def action_sort(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]
        self._set_view(tab, View(view.filter, (view.sort + 1) % len(COLUMNS[tab]), False))

    def action_reverse(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]
        self._set_view(tab, View(view.filter, view.sort, not view.reverse))

    def action_pause(self) -> None:
        self.feed.paused = not self.feed.paused
        self.feed.request()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def make_app(
    runtime: Runtime,
    *,
    read_only: bool = False,
    serve_sock: socket.socket | None = None,
    clock_frozen: bool = False,
    ascii_only: bool = False,
) -> OmniRouteApp:
    """The one factory: `run_tui`, the tests, the snapshots and the screenshots all build the app here.

    `serve_sock`: serve the proxy on it while the app runs. `clock_frozen`: no periodic tick, so
    nothing moves by itself (snapshots and tests drive every redraw). `ascii_only`: draw in ASCII
    (a terminal whose locale is not UTF-8).
    """
    return OmniRouteApp(
        runtime, read_only=read_only, serve_sock=serve_sock, live=not clock_frozen, ascii_only=ascii_only
    )


def run_tui(options: serve.Options, *, read_only: bool = False, ascii_only: bool = False) -> int:
    """`omniroute tui`: returns the exit code; a startup problem is one line on stderr, never a traceback."""
    try:
        return asyncio.run(_run(options, read_only, ascii_only))
    except serve.StartupError as exc:
        print(f"omniroute: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _run(options: serve.Options, read_only: bool, ascii_only: bool) -> int:
    async with serve.listening(options) as (runtime, sock):
        try:
            app = make_app(runtime, read_only=read_only, serve_sock=sock, ascii_only=ascii_only)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, app.call_later, app.action_quit)
            try:
                await app.run_async()
            finally:
                for sig in (signal.SIGTERM, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
                if app.host is not None:
                    await app.host.stop()  # idempotent: normally done when the app quit
        finally:
            runtime.store.close()  # idempotent: the lifespan closed it unless the server never started
        return app.return_code or 0
