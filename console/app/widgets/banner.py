"""A red line under the top bar while the database is unreachable; gone when it is back."""

from __future__ import annotations

from textual.widgets import Static

from ...literal import literal


class ConnectionBanner(Static):
    DEFAULT_CSS = """
    ConnectionBanner {
        display: none;
        height: auto;
        background: $error;
        color: $text;
        padding: 0 1;
        text-style: bold;
    }
    ConnectionBanner.-lost { display: block; }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "connection_error", self._show_state, init=True)

    def _show_state(self, error: str) -> None:
        self.set_class(bool(error), "-lost")
        if error:
            self.update(literal(f"database unreachable: {error} — reconnecting…"))
