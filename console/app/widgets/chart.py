"""A plotext chart that draws its figure only when its data, size or theme changed, and
says "collecting…" (no axes at all) until there is something to draw.

PlotextPlot builds the whole figure in pure Python on every render, which made a pane
switch back to the Overview cost ~16 ms of the UI thread for two unchanged charts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rich.align import Align
from rich.console import RenderableType
from rich.text import Text
from textual_plotext import Plot, PlotextPlot

from ..formatting import count

NICE_STEPS = (1, 1.5, 2, 3, 4, 5, 6, 8, 10)
LOOKS = (("braille", "blue+"), ("hd", "green+"), ("x", "red+"))
"""Each series' marker and colour, in order: a second line differs from the first by its
marker too (a legend of colours alone tells nothing to whoever cannot tell them apart)."""

Run = Sequence[tuple[float, float]]
"""(x, y) points joined by a line."""
Series = tuple[str, Sequence[Run]]
"""A labelled line in runs: nothing is drawn between one run and the next (a gap)."""


class Chart(PlotextPlot):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._version = 0
        self._drawn: tuple[object, RenderableType] | None = None
        self._waiting: Text | None = None

    def replot(self, draw: Callable[[Plot], None]) -> None:
        """Replace the figure: draw(plt) gets a cleared plot."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        draw(plt)
        self._waiting = None
        self._version += 1
        self.refresh()

    def wait(self, title: str, note: str = "collecting…") -> None:
        """No figure yet: the title and a note in its place, rather than axes around nothing."""
        waiting = Text.assemble((title, "bold"), "\n\n", (note, "dim"), justify="center")
        if waiting != self._waiting:
            self._waiting = waiting
            self._version += 1
            self.refresh()

    def render(self) -> RenderableType:
        if self._waiting is not None:
            return Align.center(self._waiting, vertical="middle")
        key = (self.size, self.app.theme, self._version)
        if self._drawn is None or self._drawn[0] != key:
            self._drawn = (key, super().render())
        return self._drawn[1]


def nice_top(value: float) -> float:
    """The smallest round number (NICE_STEPS times a power of ten) at or above value; 1 for 0."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(step * scale for step in NICE_STEPS if step * scale >= value)


def _tick(value: float) -> str:
    return count(value) if value == int(value) else f"{value:g}"


def _seconds_ago(seconds: float) -> str:
    seconds = round(-seconds)
    if seconds == 0:
        return "now"
    if seconds < 60:
        return f"-{seconds}s"
    return f"-{seconds // 60}m" + (f"{seconds % 60:02d}s" if seconds % 60 else "")


def _hours_before(hours: float) -> str:
    return "end" if round(hours) == 0 else f"{round(hours)}h"  # hours < 0: "-12h"


def line_chart(plt: Plot, title: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]] | Series], *,
               span: float, hours: bool = False, whole: bool = True) -> None:
    """Lines over the span before 0, xs in seconds before now (or in hours before the end,
    hours=True): y from 0 to a round number above the highest value, ticked at 0, half and top;
    x ticked at round times. whole: the values are counts, so no tick at half of one. A series
    is (label, xs, ys), one line, or (label, runs), a line broken where one run ends and the
    next begins; each series has its own marker and colour (LOOKS)."""
    plt.title(title)
    highest = 0.0
    for n, line in enumerate(series):
        if len(line) == 3:  # one unbroken line in plotext's own colours, as before runs
            label, xs, ys = line
            plt.plot(list(xs), list(ys), label=label if len(series) > 1 else None, marker="braille")
            highest = max(highest, *ys, 0)
            continue
        label, runs = line
        marker, color = LOOKS[n % len(LOOKS)]
        labelled = len(series) == 1
        for run in runs:
            if not run:
                continue
            xs, ys = zip(*run, strict=True)
            highest = max(highest, *ys)
            plt.plot(list(xs), list(ys), marker=marker, color=color, label=None if labelled else label)
            labelled = True
    top = nice_top(highest)
    if whole:
        top = max(top, 2)
    plt.ylim(0, top)
    plt.yticks([0, top / 2, top], [_tick(v) for v in (0, top / 2, top)])
    span = max(span, 1.0)
    steps = (1, 2, 3, 6, 12, 24, 48) if hours else (10, 30, 60, 120, 300, 600)
    step = next((s for s in steps if span / s <= 5), steps[-1])
    ticks = [-step * n for n in range(int(span // step), -1, -1)]
    if len(ticks) < 2:  # a span shorter than the smallest step: its two ends
        ticks = [-span, 0]
    plt.xlim(-span, 0)
    plt.xticks(ticks, [_hours_before(t) if hours else _seconds_ago(t) for t in ticks])
