"""The console's one screen: the top bar, the connection banner, every pane in a content
switcher, and the key bar. Switching panes only flips which pane is displayed, which
measured ~10x faster than switching Textual screens or modes."""

from __future__ import annotations

import gc

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import ContentSwitcher

from .live import LivePane
from .panes import PANES
from .widgets.banner import ConnectionBanner
from .widgets.keybar import KeyBar
from .widgets.live_table import LiveTable
from .widgets.topbar import TopBar


class MainScreen(Screen):
    DEFAULT_CSS = """
    MainScreen { overflow: hidden hidden; }
    MainScreen > ContentSwitcher { height: 1fr; }
    """

    def __init__(self, first_pane: str) -> None:
        super().__init__()
        self.first_pane = first_pane

    def compose(self) -> ComposeResult:
        yield TopBar(PANES[self.first_pane].title)
        yield ConnectionBanner()
        with ContentSwitcher(initial=self.first_pane):
            for name, spec in PANES.items():
                yield spec.pane(id=name)
        yield KeyBar()

    @property
    def pane(self) -> LivePane:
        return self.query_one(f"#{self.query_one(ContentSwitcher).current}", LivePane)

    def on_mount(self) -> None:
        self._entered(self.pane)
        # Every pane and widget now exists for the app's lifetime: keep them out of the
        # collector's full passes, which otherwise showed up as 100 ms keypress outliers.
        gc.freeze()

    def show_pane(self, name: str) -> None:
        switcher = self.query_one(ContentSwitcher)
        if switcher.current == name:
            return
        self.pane.suspend()
        switcher.current = name
        self._entered(self.pane)

    def _entered(self, pane: LivePane) -> None:
        self.query_one(TopBar).set_title(pane.TITLE_TEXT)
        self.query_one(KeyBar).show_for(pane)
        tables = pane.query(LiveTable)
        (tables.first() if tables else pane).focus()
        if self.app.screen is self:
            pane.resume()

    # A modal on top pauses the pane beneath it; closing it resumes the pane.
    def on_screen_suspend(self) -> None:
        self.pane.suspend()

    def on_screen_resume(self) -> None:
        if not self.pane.active:
            self.pane.resume()
