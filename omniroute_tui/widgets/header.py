"""The two header lines: where the proxy listens, how long it has run, how busy it is, what is wrong."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from omniroute_tui.snapshot import Header


class StatusHeader(Vertical):
    def __init__(self) -> None:
        super().__init__(id="header")
        self._shown: Header | None = None
        self.title_line = Static("", id="header-title")
        self.mode = Static("", id="header-mode")
        self.rates = Sparkline([0], summary_function=max, id="header-rates")
        self.counts = Static("", id="header-counts")

    def compose(self) -> ComposeResult:
        with Horizontal(classes="header-line"):
            yield self.title_line
            yield self.mode
        with Horizontal(classes="header-line"):
            yield Static("req/s ", id="header-rates-label")
            yield self.rates
            yield self.counts

    def show(self, header: Header) -> None:
        old, self._shown = self._shown, header
        if old is not None and old == header:
            return
        if old is None or (old.url, old.version, old.uptime) != (header.url, header.version, header.uptime):
            title = Text()
            title.append(" omniroute ", style="bold reverse")
            title.append(f" {header.version}  ", style="dim")
            title.append(header.url, style="bold")
            title.append(f"  up {header.uptime}", style="dim")
            self.title_line.update(title, layout=False)  # its width is fixed by CSS (1fr)
        if old is None or (old.live, old.read_only) != (header.live, header.read_only):
            mode = Text()
            if header.read_only:
                mode.append(" READ-ONLY ", style="bold black on yellow")
                mode.append(" ")
            mode.append(
                " LIVE " if header.live else " PAUSED ",
                style="bold black on green" if header.live else "bold black on yellow",
            )
            self.mode.update(mode)
        if old is None or old.rates != header.rates:
            self.rates.data = list(header.rates) or [0]
        self.counts.update(counts(header), layout=False)


def counts(header: Header) -> Text:
    text = Text()
    text.append(f" {header.rate_now}  ", style="bold")
    for n, label, style in (
        (header.open_breakers, "OPEN", "bold red"),
        (header.cooling, "cooling", "yellow"),
        (header.lockouts, "lockouts", "yellow"),
    ):
        text.append(f"{label} {n:,}", style=style if n else "dim")
        text.append("  ")
    text.append(header.requests, style="dim")
    return text
