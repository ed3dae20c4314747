"""k9s's `/`: a line that filters the pane's table as you type; enter keeps the filter and
returns to the table, escape clears it."""

from __future__ import annotations

from textual import events
from textual.widgets import Input

from .live_table import LiveTable


class FilterBox(Input):
    DEFAULT_CSS = """
    FilterBox { display: none; height: 3; }
    FilterBox.-shown { display: block; }
    """

    def open(self) -> None:
        self.add_class("-shown")
        self.focus()

    def _table(self) -> LiveTable:
        return self.parent.query_one(LiveTable)  # type: ignore[union-attr]

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._table().set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._table().focus()

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape":
            event.stop()
            self.value = ""
            self.remove_class("-shown")
            self._table().focus()
