"""The base of every dialog that changes the database: its submit runs one change in a thread,
and PostgreSQL's own validation speaks through an error line inside the dialog, which stays
open with nothing stored.

The fields scroll; the error line and the buttons are docked below them, so at 80x24 (the
smallest terminal the console supports) the database's answer and Save are always in sight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from sqlkit.errors import CourierError

from ...literal import literal


class DatabaseForm(ModalScreen[Any]):
    """Subclasses yield their fields from fields(), set SUBMIT_LABEL, and implement action_submit."""

    SUBMIT_LABEL: ClassVar[str] = "Save"
    DEFAULT_CSS = """
    DatabaseForm { align: center middle; }
    DatabaseForm > #dialog {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    DatabaseForm #form-body { height: auto; max-height: 100%; }
    DatabaseForm #form-footer { dock: bottom; height: auto; }
    DatabaseForm Label.field { margin-top: 1; color: $text-muted; }
    DatabaseForm .hint { color: $text-muted; }
    DatabaseForm TextArea { height: 5; }
    DatabaseForm #form-error { color: $text-error; text-style: bold; height: auto; margin-top: 1; display: none; }
    DatabaseForm #form-error.shown { display: block; }
    DatabaseForm Horizontal.buttons { height: auto; align-horizontal: right; margin-top: 1; }
    DatabaseForm Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+s", "submit", "Save", id="form.save"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            with Vertical(id="form-footer"):
                yield Static("", id="form-error")
                with Horizontal(classes="buttons"):
                    yield Button("Cancel (esc)", id="cancel", compact=True)
                    yield Button(f"{self.SUBMIT_LABEL} (ctrl+s)", id="submit", variant="primary", compact=True)
            with VerticalScroll(id="form-body"):
                yield from self.fields()

    def fields(self) -> ComposeResult:
        raise NotImplementedError

    def show_error(self, text: str) -> None:
        error = self.query_one("#form-error", Static)
        error.update(literal(text, lines=True))
        error.set_class(bool(text), "shown")

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
