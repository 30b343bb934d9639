"""`omniroute tui`: the operator console, hosting its own proxy or attached to one (docs/console.md).

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
from textual.driver import Driver
from textual.widget import Widget
from textual.widgets import Footer, Static, TabbedContent, TabPane, Tabs
from textual.worker import Worker, WorkerState

from omniroute_tui import actions, untrusted
from omniroute_tui.cards.card import RuntimeSettings, SettingsSource
from omniroute_tui.cards.fields import SettingField
from omniroute_tui.feed import TICK_S, Feed, FeedLogHandler, captured_logging
from omniroute_tui.host import ProxyHost
from omniroute_tui.messages import SnapshotReady, TerminalGone
from omniroute_tui.remote import Remote, RemoteError
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
    RequestsTable,
    ResourceTable,
)
from proxy import serve
from proxy.readmodel import Observed
from proxy.runtime import Runtime, not_saved
from proxy.signals import StopSignals

log = logging.getLogger("omniroute.tui")

TABLE_TABS = ("breakers", "connections", "lockouts", "events", "requests")
ACTION_TABS = ("breakers", "connections", "lockouts")
"""The tabs whose rows `r`, `e` and `R` act on."""
SHORT_ROWS = 20
WIDE_COLUMNS = 90
QUIT_QUESTION = "quit-question"
"""The id of `q`'s dialog, which each snapshot asks again (the requests it counts go on finishing)."""
NOTHING_LOST_NOW = "Nothing in flight any more: quit and stop the proxy?"


class OmniRouteApp(App[int]):
    CSS_PATH = "omniroute.tcss"
    TITLE = "omniroute"
    # (Not annotated again: Textual declares it `ClassVar[...] | None`, which mypy reads as an
    # instance variable that a ClassVar may not override.)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_ROWS, "-tall")]  # noqa: RUF012
    """A terminal shorter than SHORT_ROWS hides the detail panes (omniroute.tcss), so that every
    table keeps its header and at least three rows down to 40x12."""
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]  # noqa: RUF012
    """A terminal narrower than WIDE_COLUMNS spaces the tabs by one cell instead of two, so that
    all seven fit in 80 columns (omniroute.tcss)."""
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_tab('overview')", "Overview", show=False, id="tab-overview"),
        Binding("2", "show_tab('breakers')", "Breakers", show=False, id="tab-breakers"),
        Binding("3", "show_tab('connections')", "Connections", show=False, id="tab-connections"),
        Binding("4", "show_tab('lockouts')", "Lockouts", show=False, id="tab-lockouts"),
        Binding("5", "show_tab('settings')", "Settings", show=False, id="tab-settings"),
        Binding("6", "show_tab('events')", "Events", show=False, id="tab-events"),
        Binding("7", "show_tab('requests')", "Requests", show=False, id="tab-requests"),
        Binding("slash", "filter", "Filter", tooltip="Show only rows containing a text", id="filter"),
        Binding("s", "sort", "Sort", tooltip="Sort by the next column", id="sort"),
        # Not on the key bar (80 columns must keep p, ? and q): in help and the palette.
        Binding("S", "reverse", "Reverse", tooltip="Reverse the sort order", show=False, id="reverse"),
        Binding(
            "escape",
            "clear_filter",
            "Clear filter",
            tooltip="Show every row again",
            show=False,
            id="clear-filter",
        ),
        # Read-only, the tables' action keys are not offered; pressed anyway, they are answered.
        Binding("r,e,R", "refuse", "Actions are off (read-only)", show=False, id="read-only-refusal"),
        Binding("p", "pause", "Pause", tooltip="Stop live updates", id="pause"),
        Binding("p", "resume", "Resume", tooltip="Live updates again (while paused)", id="resume"),
        Binding("question_mark", "help", "Help", tooltip="List every key", id="help"),
        Binding("q", "quit", "Quit", tooltip="Stop the proxy and leave", id="quit"),
        Binding(
            "ctrl+c",
            "stop",
            "Quit",
            tooltip="Stop the proxy and leave, without asking",
            show=False,
            priority=True,
            id="quit-ctrl-c",
        ),
    ]

    def __init__(
        self,
        runtime: Runtime | None = None,
        *,
        remote: Remote | None = None,
        read_only: bool = False,
        serve_sock: socket.socket | None = None,
        live: bool = True,
        ascii_only: bool = False,
    ) -> None:
        """Either `runtime` (the instance in this process; served on `serve_sock` if given) or
        `remote` (an instance elsewhere, attached over its API and live stream)."""
        self.ascii_only = ascii_only  # before App.__init__, which asks get_driver_class
        """Every character leaves through a driver that writes ASCII look-alikes."""
        super().__init__()
        untrusted.use_ascii(ascii_only)
        self.runtime = runtime
        self.remote = remote
        self.read_only = read_only
        self.read: Observed
        self.operator: actions.Operator
        self.settings_source: SettingsSource
        if runtime is not None:
            self.read, self.operator, self.settings_source = (
                runtime.read,
                runtime.engine,
                RuntimeSettings(runtime),
            )
            self.host = ProxyHost(runtime, serve_sock, demo=runtime.demo) if serve_sock is not None else None
            server = runtime.config.server
            base = self.host.base_url if self.host else f"http://{server.host}:{server.port}"
            url = f"{base}/v1"
        elif remote is not None:
            self.read, self.operator, self.settings_source = remote.mirror, remote.operator, remote.settings
            self.host = None
            url = remote.status
        else:
            raise ValueError("the console needs a runtime to host or a remote instance to attach to")
        self.feed = Feed(self, self.read, url=url, read_only=read_only, live=live)
        self._cleanup = ExitStack()
        self._quitting = False
        self._visited: set[str] = {"overview"}
        self._left_focus: dict[str, Widget] = {}
        """What had the focus on the Overview or Settings tab when another tab was shown: it gets
        it back (a table tab's table always does)."""
        self._palette_action: tuple[str, actions.Verb, bool] | None = None
        """A table action from the command palette, waiting for its tab's rows."""
        self._going_to: tuple[str, str] | None = None
        """(tab, row key) to put the cursor on once that tab's rows arrive (enter on an event)."""
        self.status = StatusHeader()
        self.tabs = TabbedContent(initial="overview", id="tabs")
        self.overview = OverviewPane(id="overview-pane")
        self.panes = {
            table.TABLE: TablePane(table(id=f"{table.TABLE}-table"), id=f"{table.TABLE}-pane")
            for table in (BreakersTable, ConnectionsTable, LockoutsTable, EventsTable, RequestsTable)
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
            with TabPane("7 Requests", id="requests"):
                yield self.panes["requests"]
        yield self.status  # below the tabs: see omniroute.tcss
        yield Footer(compact=True)

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
        for warning in self.runtime.warnings if self.runtime is not None else ():
            log.warning("%s", warning)
        if self.remote is not None:
            self.remote.on_change = self._remote_changed
            self.remote.on_status = self._remote_status
            self.remote.follow_requests(self.feed.tab == "requests")
            self.remote.start()
        if self.host is not None:
            self.run_worker(self.host.start(), name="proxy server", group="server", exit_on_error=False)
            self.call_after_refresh(self._settle_heap)

    def _settle_heap(self) -> None:
        """Exempt what exists from the cyclic GC: the widgets and the engine live as long as the
        process, and a full GC pass over them stalls every request in flight for tens of ms
        (bench/tui.py). Done at start and after each tab's first build: a bounded number of times."""
        if self.host is not None:
            serve.settle_heap()

    def help_for(self, binding: Binding) -> str:
        """A key's help text in this mode: attached, `q` leaves an instance that goes on serving."""
        if binding.id in ("quit", "quit-ctrl-c") and self.remote is not None:
            return "Leave; the instance goes on serving"
        return binding.tooltip or ""

    def _remote_changed(self, kind: str) -> None:
        feed = self.feed
        if kind == "snapshot":
            feed.reload()  # it may say what no event did (it came back after a gap)
        elif kind in ("state", "settings") and not feed.paused:  # (paused: drawn on resuming)
            feed.request()  # at once, not at the next tick: the rows are already 250 ms late

    def _remote_status(self, text: str) -> None:
        self.feed.url = text
        self.feed.stale = self.remote is not None and not self.remote.connected
        self.feed.request()

    async def on_unmount(self) -> None:
        if self.host is not None:
            gc.unfreeze()
        if self.remote is not None:
            await self.remote.stop()
        self.feed.stop()
        if self.host is not None:
            await self.host.stop()
        self._cleanup.close()

    async def action_quit(self) -> None:
        """`q`: hosting, ask first when quitting would cut requests in flight or drop a settings
        draft (ctrl+c and signals never ask)."""
        question = self.quit_question()
        if question is None:
            self.stop()
            return

        # The requests it counts go on finishing while the operator reads it, and the feed builds no
        # screen updates while a dialog is open: the question recounts on its own.
        recount = self.set_interval(TICK_S, self._ask_again)

        def answered(yes: bool | None) -> None:
            recount.stop()
            if yes:
                self.stop()

        self.push_screen(ConfirmScreen(question, id=QUIT_QUESTION), answered)

    def _ask_again(self) -> None:
        asking = self.screen
        if isinstance(asking, ConfirmScreen) and asking.id == QUIT_QUESTION:
            asking.ask(self.quit_question() or NOTHING_LOST_NOW)

    def action_stop(self) -> None:
        self.stop()

    def quit_question(self) -> str | None:
        """What quitting would lose, as a question; None when it loses nothing."""
        losses = []
        if self.runtime is not None:  # attached, requests in flight are the instance's, and go on
            in_flight = self.read.traffic().in_flight
            if in_flight:
                losses.append(f"{in_flight} request{'s' if in_flight != 1 else ''} in flight")
        if self.query("SettingsCard"):
            from omniroute_tui.cards.card import SettingsCard

            drafts = [card.spec.title for card in self.query(SettingsCard) if card.dirty]
            if drafts:
                losses.append(f"unsaved settings ({', '.join(drafts)})")
        if not losses:
            return None
        what = " and ".join(losses)
        return (
            f"{what[0].upper()}{what[1:]}: quit{' and stop the proxy' if self.runtime is not None else ''}?"
        )

    def stop(self) -> None:
        """Stop the proxy (in-flight requests get its grace period), then leave with 0; idempotent.
        Attached, just leave: the instance runs on.

        What `q` does, and a stop signal, and a terminal that went away."""
        if self.host is None:
            self.exit(0)
        elif not self._quitting:
            self._quitting = True
            self.notify("Stopping the proxy (in-flight requests get a short grace period)…")
            self.run_worker(self._stop_and_exit(), name="shutdown", group="server", exit_on_error=False)

    def stop_on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM, SIGINT, SIGHUP (proxy.signals): stop, as `q` does. The terminal is checked first:
        the signal may be the first news of a hang-up, and a dead terminal is let go of before the
        stop draws anything on it."""
        if sys.platform != "win32":
            from omniroute_tui.driver import ConsoleDriver

            if isinstance(self._driver, ConsoleDriver):
                self._driver.check_terminal()
        self.stop()

    def on_terminal_gone(self, message: TerminalGone) -> None:
        self.stop()

    def get_driver_class(self) -> type[Driver]:
        """Textual's Linux driver, made safe for a terminal that goes away, and writing ASCII for a
        locale that is not UTF-8 (omniroute_tui.driver)."""
        driver = super().get_driver_class()
        if sys.platform != "win32":
            from textual.drivers.linux_driver import LinuxDriver

            from omniroute_tui.driver import AsciiDriver, ConsoleDriver

            if driver is LinuxDriver:
                return AsciiDriver if self.ascii_only else ConsoleDriver
        return driver

    async def _stop_and_exit(self) -> None:
        assert self.host is not None
        await self.host.stop()
        self.exit(0)

    # -- snapshots down ----------------------------------------------------------------------------

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        snapshot = message.snapshot
        self.status.show(snapshot.header)
        self._ask_again()
        if snapshot.overview is not None:
            self.overview.apply(snapshot.overview)
        if snapshot.table is not None:
            self.panes[snapshot.table.name].apply(snapshot.table)
            going = self._going_to
            if going is not None and going[0] == snapshot.table.name:
                self._going_to = None
                if not self.table(going[0]).select_key(going[1]):
                    self.notify("It is gone: no such row any more", severity="warning")
            pending = self._palette_action
            if pending is not None and pending[0] == snapshot.table.name:
                self._palette_action = None
                tab, verb, every_row = pending
                self.table(tab).request(verb, every_row=every_row, ask=True)

    @on(TabbedContent.TabActivated)
    async def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or "overview"
        self.feed.tab = tab
        if self.remote is not None:
            self.remote.follow_requests(tab == "requests")
        if tab not in self._visited:
            self._visited.add(tab)
            self.set_timer(1.0, self._settle_heap)  # once its rows and caches exist
        if tab in TABLE_TABS:
            self.table(tab).focus()
        elif tab == "settings":
            pane = self.query_one("#settings", TabPane)
            if self.query("#settings-placeholder"):
                # Mounted on first visit: the cards are hundreds of widgets, and every millisecond
                # spent building them at startup is one the proxy cannot serve.
                self.query_one("#settings-placeholder").remove()
                await pane.mount(settings_pane(self.settings_source, self.read_only))
            # On a field, so that its keys (j/k, enter) work at once: the first one, or what had
            # the focus when the tab was left (`action_show_tab` let go of it).
            field = self._left_focus.get(tab)
            if field is None or not field.is_attached:
                field = next((f for f in pane.query(SettingField) if f.focusable), None)
            if field is not None and self.active_tab == "settings":
                field.focus()
        elif tab == "overview" and self.focused is None:
            # What had the focus when the tab was left (the tiles, say), else the tab bar, as on a
            # fresh console: one Tab from it reaches the tiles. With nothing focused the first Tab
            # went to the tab bar and `l`, `enter` did nothing.
            back = self._left_focus.get(tab)
            if back is not None and back.is_attached and back.focusable:
                back.focus()
            else:
                self.tabs.query_one(Tabs).focus()
        self.refresh_bindings()
        self.feed.request()

    @on(EventsTable.GoTo)
    def _go_to(self, message: EventsTable.GoTo) -> None:
        self._going_to = (message.tab, message.key)
        views = self.feed.views
        views[message.tab] = View("", views[message.tab].sort, views[message.tab].reverse)  # show it
        self.action_show_tab(message.tab)
        self.feed.request()

    @on(RequestsTable.FailuresToggled)
    def _failures_toggled(self, message: RequestsTable.FailuresToggled) -> None:
        self.feed.failures_only = not self.feed.failures_only
        self.feed.request()
        self.refresh_bindings()  # `f` says what it does now

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
            self.action_refuse()
        elif action.asks:

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
        if self.remote is not None:  # blocking HTTP: off the UI's loop
            return await asyncio.to_thread(actions.apply, self.read, self.operator, action)
        result = actions.apply(self.read, self.operator, action)
        if self.runtime is not None:  # said done once on disk, as the API answers it
            problem = await self.runtime.acknowledge()
            if problem is not None:
                raise actions.NotSaved(not_saved(problem))
        return result

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """The one funnel for every worker's outcome (harlequin)."""
        worker = event.worker
        if event.state is WorkerState.SUCCESS and isinstance(worker.result, actions.Result):
            result = worker.result
            self.notify(
                untrusted.visible(result.summary()), title=untrusted.visible(result.command()), markup=False
            )
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
                # A refusal or an unreachable instance is told in words; anything else by its kind.
                said = (
                    str(error)
                    if isinstance(error, RemoteError | actions.NotSaved)
                    else f"{type(error).__name__}: {error}"
                )
                unsaved = isinstance(error, actions.NotSaved)  # done all the same: shown as it is now
                self.notify(
                    untrusted.visible(said),
                    title="Not saved" if unsaved else "Action failed",
                    severity="error",
                    markup=False,
                )
                if unsaved:
                    self.feed.request()

    def table_action(self, tab: str, action: str) -> None:
        """Run a table's key from elsewhere (the command palette): show the tab, then act, asking
        first even for one row (which row is selected there is not what the operator was looking
        at): the question names the row and its state."""
        self.action_show_tab(tab)
        table = self.table(tab)
        verbs: dict[str, tuple[actions.Verb, bool]] = {
            "reset": ("reset", False),
            "reset_shown": ("reset", True),
            "toggle_enabled": ("toggle", False),
        }
        if action in verbs:
            # After the tab's next snapshot: a tab not shown before has no rows yet to act on.
            self._palette_action = (tab, *verbs[action])
            self.feed.request()
        else:
            self.call_after_refresh(table.run_action, action)

    # -- view keys ---------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("filter", "sort", "reverse"):  # hidden where there is no table to act on
            return self.active_tab in TABLE_TABS
        if action == "refuse":
            return self.read_only and self.active_tab in ACTION_TABS
        if action in ("pause", "resume"):  # one key: the key bar says what it does now
            return self.feed.paused == (action == "resume")
        if action == "clear_filter":  # else escape is left to whatever else wants it
            tab = self.active_tab
            return tab in TABLE_TABS and bool(self.feed.views[tab].filter.strip())
        return True

    def action_refuse(self) -> None:
        self.notify("read-only mode: actions are disabled", severity="warning")

    def action_show_tab(self, tab: str) -> None:
        # Let go of the focus first: a focused widget in the pane being hidden hands the focus to its
        # neighbour in the same pane, which would bring that pane back (a Settings field, say).
        focused, leaving = self.focused, self.active_tab
        if focused is not None and leaving in ("overview", "settings"):
            self._left_focus[leaving] = focused
        self.set_focus(None)
        self.tabs.active = tab

    def _set_view(self, tab: str, view: View) -> None:
        self.feed.views[tab] = view
        self.feed.request()
        self.refresh_bindings()  # escape clears a filter only while there is one

    def action_filter(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]

        def filtered(text: str | None) -> None:
            if text is not None:
                self._set_view(tab, View(text, view.sort, view.reverse))

        self.push_screen(FilterScreen(tab, view.filter), filtered)

    def action_clear_filter(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]
        self._set_view(tab, View("", view.sort, view.reverse))

    def action_sort(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]
        self._set_view(tab, View(view.filter, (view.sort + 1) % len(COLUMNS[tab]), False))

    def action_reverse(self) -> None:
        tab = self.active_tab
        view = self.feed.views[tab]
        self._set_view(tab, View(view.filter, view.sort, not view.reverse))

    def action_pause(self) -> None:
        self._set_paused(True)

    def action_resume(self) -> None:
        self._set_paused(False)

    def _set_paused(self, paused: bool) -> None:
        self.feed.paused = paused
        self.feed.request()
        self.refresh_bindings()

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
    """`omniroute tui`: returns the exit code; a startup problem is one line on stderr, never a traceback.

    SIGTERM, SIGINT and SIGHUP stop it like `q` (proxy.signals: a second one exits at once, and
    the stop has a deadline); so does its terminal going away (omniroute_tui.driver).
    """
    restore = None
    if sys.platform != "win32":  # the module is Textual's Linux driver, made safe for a hang-up
        from omniroute_tui.driver import SavedModes

        restore = SavedModes().restore
    with StopSignals(deadline_s=serve.SHUTDOWN_GRACE_S + 1, emergency=restore) as signals:
        try:
            serve.open_files_limit()
            return asyncio.run(_run(options, read_only, ascii_only, signals))
        except serve.StartupError as exc:
            print(
                f"omniroute: {untrusted.visible_lines(str(exc))}", file=sys.stderr
            )  # (it may quote a --host)
            return 2


async def _run(options: serve.Options, read_only: bool, ascii_only: bool, signals: StopSignals) -> int:
    async with serve.listening(options) as (runtime, sock):
        try:
            app = make_app(runtime, read_only=read_only, serve_sock=sock, ascii_only=ascii_only)
            # Through the app's message queue: the stop runs in the app's context, after it started.
            signals.attach(asyncio.get_running_loop(), lambda sig: app.call_later(app.stop_on_signal, sig))
            try:
                await app.run_async()
            finally:
                signals.detach()
                if app.host is not None:
                    await app.host.stop()  # idempotent: normally done when the app quit
        finally:
            runtime.store.close()  # idempotent: the lifespan closed it unless the server never started
        return app.return_code or 0


def run_attached(url: str, token: str | None, *, read_only: bool = False, ascii_only: bool = False) -> int:
    """`omniroute tui --url`: the console attached to a running instance; quitting leaves it running.

    The instance must answer first (exit 3 unreachable, 4 token refused, as the CLI); after that a
    dropped stream is only "reconnecting…" in the status line, until it comes back."""
    restore = None
    if sys.platform != "win32":
        from omniroute_tui.driver import SavedModes

        restore = SavedModes().restore

    async def main(signals: StopSignals) -> int:
        app = OmniRouteApp(remote=Remote(url, token), read_only=read_only, ascii_only=ascii_only)
        signals.attach(asyncio.get_running_loop(), lambda sig: app.call_later(app.stop_on_signal, sig))
        try:
            await app.run_async()
        finally:
            signals.detach()
        return app.return_code or 0

    with StopSignals(deadline_s=serve.SHUTDOWN_GRACE_S + 1, emergency=restore) as signals:
        return asyncio.run(main(signals))
