"""The two header lines: where the proxy listens, how long it has run, how busy it is, what is wrong.

Drawn with the Line API, two styled strips, instead of a row of `Static`s and a `Sparkline`: the
header changes every second, and a `Static` lays its Rich text out again on every change (about
a millisecond each, in the event loop the proxy serves from; bench/tui.py). Here a change costs
the segments of one line, and only the line that changed is marked dirty.
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from omniroute_tui.snapshot import Header

Spans = list[tuple[str, Style]]

BARS = "▁▂▃▄▅▆▇█"
SPARKLINE_WIDTH = 20
MIN_SPARKLINE = 6
"""The fewest bars the rate line keeps when the terminal is too narrow for the counts beside it."""
RATE_LABEL = " req/s "

BRAND = Style(bold=True, reverse=True)
DIM = Style(dim=True)
LOST = Style.parse("bold black on yellow")
BOLD = Style(bold=True)
LIVE = Style.parse("bold black on green")
PAUSED = Style.parse("bold black on yellow")
READ_ONLY = Style.parse("bold black on yellow")
COUNT_STYLES = {
    "OPEN": Style.parse("bold red"),
    "cooling": Style.parse("yellow"),
    "lockouts": Style.parse("yellow"),
}


class StatusHeader(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "status-header--muted",
        "status-header--rate-low",
        "status-header--rate-high",
    }
    DEFAULT_CSS = """
    StatusHeader {
        height: 2;
    }
    StatusHeader > .status-header--muted {
        color: $text-muted;
    }
    StatusHeader > .status-header--rate-high {
        color: $primary;
    }
    StatusHeader > .status-header--rate-low {
        color: $primary 30%;
    }
    """

    def __init__(self) -> None:
        super().__init__(id="header")
        self.shown: Header | None = None
        self._styles: dict[str, Style] | None = None

    def show(self, header: Header) -> None:
        old, self.shown = self.shown, header
        if old is not None and old == header:
            return
        width = self.size.width
        if old is None or title_key(old) != title_key(header):
            self.refresh(Region(0, 0, width, 1))
        if old is None or (old.rates, counts(old)) != (header.rates, counts(header)):
            self.refresh(Region(0, 1, width, 1))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None

    def _style(self, name: str) -> Style:
        styles = self._styles
        if styles is None:
            base = self.rich_style
            low, high = (
                self.background_colors[1] + self.get_component_styles(f"status-header--rate-{end}").color
                for end in ("low", "high")
            )
            styles = {
                "base": base,
                "muted": base + self.get_component_rich_style("status-header--muted"),
                **{f"bar{i}": base + Style(color=low.blend(high, i / 7).rich_color) for i in range(8)},
            }
            self._styles = styles
        return styles[name]

    def line_text(self, y: int) -> str:
        """What line `y` says, without its styles."""
        return "".join(segment.text for segment in self.render_line(y)).rstrip()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._style("base")
        header = self.shown
        if header is None or y > 1:
            return Strip.blank(width, base)
        if y == 0:
            left = Strip(segments(title(header), base))
            right = Strip(segments(mode(header), base))
        else:
            told = segments(counts(header), base)
            # The sparkline gives way to the counts on a narrow terminal (down to MIN_SPARKLINE).
            spare = width - len(RATE_LABEL) - sum(segment.cell_length for segment in told)
            bars = sparkline(header.rates, max(MIN_SPARKLINE, min(SPARKLINE_WIDTH, spare)))
            left = Strip(
                [
                    Segment(RATE_LABEL, self._style("muted")),
                    *(Segment(bar, self._style(f"bar{level}")) for bar, level in bars),
                    *told,
                ]
            )
            right = Strip([])
        room = max(width - right.cell_length, 0)
        if left.cell_length > room:
            cut = left.crop(0, max(room - 1, 0)).extend_cell_length(room - 1, base)
            left = Strip.join([cut, Strip([Segment("…", base)])])
        return Strip.join([left.extend_cell_length(room, base), right]).crop(0, width)


def segments(spans: Spans, base: Style) -> list[Segment]:
    return [Segment(text, base + style) for text, style in spans]


def title_key(header: Header) -> tuple[object, ...]:
    return (
        header.url,
        header.version,
        header.uptime,
        header.live,
        header.read_only,
        header.replica,
        header.state,
    )


def title(header: Header) -> Spans:
    return [
        (" omniroute ", BRAND),
        (f" {header.version}  ", DIM),
        (header.url, BOLD),
        *([(f"  replica {header.replica}", DIM)] if header.replica else []),
        (f"  up {header.uptime}", DIM),
        # The fleet's shared state is out of reach: this replica serves on what it knows.
        *([(f"  state: {header.state}", LOST)] if header.state else []),
    ]


def mode(header: Header) -> Spans:
    spans: Spans = []
    if header.read_only:
        spans += [(" READ-ONLY ", READ_ONLY), (" ", Style())]
    if header.stale:  # (an attached console's stream is down: nothing shown is current)
        spans.append((" STALE ", PAUSED))
    else:
        spans.append((" LIVE ", LIVE) if header.live else (" PAUSED ", PAUSED))
    return spans


def counts(header: Header) -> Spans:
    spans: Spans = [(f" {header.rate_now}  ", BOLD)]
    for n, label in (
        (header.open_breakers, "OPEN"),
        (header.cooling, "cooling"),
        (header.lockouts, "lockouts"),
    ):
        spans.append((f"{label} {n:,}", COUNT_STYLES[label] if n else DIM))
        spans.append(("  ", Style()))
    spans.append((header.requests, DIM))
    return spans


def sparkline(rates: tuple[int, ...], width: int = SPARKLINE_WIDTH) -> list[tuple[str, int]]:
    """`width` bars, each the busiest second of its share of `rates`, as (bar, level 0-7)."""
    if not rates:
        return [(BARS[0], 0)] * width
    low, high = min(rates), max(rates)
    extent = high - low or 1
    n = len(rates)
    bars = []
    for i in range(width):
        start = i * n // width
        level = round((max(rates[start : max((i + 1) * n // width, start + 1)]) - low) / extent * 7)
        bars.append((BARS[level], level))
    return bars
