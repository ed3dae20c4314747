"""A plotext chart that draws its figure only when its data, size or theme changed, and
says "collecting…" (no axes at all) until there is something to draw.

PlotextPlot builds the whole figure in pure Python on every render, which made a pane
switch back to the Overview cost ~16 ms of the UI thread for two unchanged charts.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.align import Align
from rich.console import RenderableType
from rich.text import Text
from textual_plotext import Plot, PlotextPlot


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
