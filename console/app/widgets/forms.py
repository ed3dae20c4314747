"""The base of every dialog that changes the database: its submit runs one change in a thread,
and PostgreSQL's own validation speaks through an error line inside the dialog, which stays
open with nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from sqlkit.errors import CourierError

from ...literal import literal


class DatabaseForm(ModalScreen[Any]):
    """Subclasses compose their fields, error_line() and buttons(), and implement action_submit."""

    DEFAULT_CSS = """
    DatabaseForm { align: center middle; }
    DatabaseForm > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    DatabaseForm Label.field { margin-top: 1; color: $text-muted; }
    DatabaseForm TextArea { height: 5; }
    DatabaseForm .form-error { color: $error; text-style: bold; height: auto; margin-top: 1; }
    DatabaseForm Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    DatabaseForm Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+s", "submit", "Save", id="form.save"),
    ]

    def error_line(self) -> Static:
        return Static("", classes="form-error", id="form-error")

    def buttons(self, submit_label: str, *, compact: bool = False) -> ComposeResult:
        with Horizontal(classes="buttons"):
            yield Button("Cancel (esc)", id="cancel", compact=compact)
            yield Button(f"{submit_label} (ctrl+s)", id="submit", variant="primary", compact=compact)

    def show_error(self, text: str) -> None:
        self.query_one("#form-error", Static).update(literal(text, lines=True))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "submit":
            self.action_submit()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_submit(self) -> None:
        raise NotImplementedError

    @work(thread=True, exclusive=True, group="form", exit_on_error=False)
    def save(self, change: Callable[[psycopg.Connection], Any], result: Any = None) -> None:
        """Run change; close the dialog with result (by default, what change returned)."""
        try:
            returned = self.app.database.run(change)  # type: ignore[attr-defined]
        except CourierError as error:
            self.app.call_from_thread(self.show_error, error.one_line())
            return
        self.app.call_from_thread(self.dismiss, returned if result is None else result)
