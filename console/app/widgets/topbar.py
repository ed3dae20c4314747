"""The one-line header of every pane: where you are, which database, the embedded pool."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widgets import Static


class TopBar(Static):
    DEFAULT_CSS = """
    TopBar {
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
    }
    """

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title
        self._updated_at: datetime | None = None

    def on_mount(self) -> None:
        self.watch(self.app, "pool_summary", lambda _: self._draw(), init=False)
        self._draw()

    def set_title(self, title: str) -> None:
        self.title_text = title
        self._draw()

    def touch(self, now: datetime) -> None:
        self._updated_at = now
        self._draw()

    def _draw(self) -> None:
        app = self.app
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("Courier", style="bold")
        line.append(f" · {self.title_text}", style="bold")
        line.append(f"  {app.database_label}", style="dim")  # type: ignore[attr-defined]
        pool = getattr(app, "pool_summary", "")
        if pool:
            line.append(f"  {pool}")
        if self._updated_at is not None:
            line.append(f"  {self._updated_at.astimezone(app.tz).strftime('%H:%M:%S')}",  # type: ignore[attr-defined]
                        style="dim")
        self.update(line)
