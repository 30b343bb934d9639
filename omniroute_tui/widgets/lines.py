"""A box of pre-styled, unwrapped lines drawn with the Line API.

Why not `Static`: a `Static` turns its Rich text into Textual content and lays it out again on
every update, about a millisecond or two for a few lines, and the Overview's boxes change every
second (countdowns) in the event loop the proxy serves from (bench/tui.py). Here an update costs
a comparison per line and a segment per span for the lines drawn; a line longer than the box
ends in "…".
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

Line = tuple[tuple[str, str], ...]
"""A line: (text, Rich style) spans."""


def line(text: str, style: str = "") -> Line:
    return ((text, style),)


class LinesView(Widget):
    DEFAULT_CSS = """
    LinesView {
        height: auto;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.lines: tuple[Line, ...] = ()
        self._base: Style | None = None

    def show(self, lines: Sequence[Line]) -> None:
        new = tuple(lines)
        if new == self.lines:
            return
        relayout = len(new) != len(self.lines) or self.styles.width is None or self.styles.width.is_auto
        self.lines = new
        self.refresh(layout=relayout)

    @property
    def plain(self) -> str:
        return "\n".join("".join(text for text, _ in spans) for spans in self.lines)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._base = None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((sum(cell_len(text) for text, _ in spans) for spans in self.lines), default=0)

    def render_line(self, y: int) -> Strip:
        base = self._base
        if base is None:
            base = self._base = self.rich_style
        width = self.size.width
        if y >= len(self.lines):
            return Strip.blank(width, base)
        spans = self.lines[y]
        strip = Strip([Segment(text, base + Style.parse(style)) for text, style in spans])
        if strip.cell_length > width > 0:
            last = base + Style.parse(spans[-1][1]) if spans else base
            strip = Strip.join([strip.crop(0, width - 1), Strip([Segment("…", last)])])
        return strip.extend_cell_length(width, base)
