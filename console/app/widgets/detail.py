"""A read-only detail dialog: fields, pretty JSON payload and headers, the error history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.syntax import Syntax
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ...literal import clip, literal, printable
from ..formatting import pretty_json

# A stored megabyte would take seconds to lay out; the CLI's --json prints a value whole.
DETAIL_LIMIT = 100_000


def error_history_table(history: Sequence[dict[str, Any]]) -> Table:
    table = Table("#", "at", "outcome", "error", expand=True, box=None, header_style="bold")
    for attempt in history:
        table.add_row(*(literal(clip(str(text), DETAIL_LIMIT), lines=True) for text in (
            attempt.get("attempt", ""), str(attempt.get("at", ""))[:19], attempt.get("outcome", ""),
            attempt.get("error", ""))))
    if not history:
        table.add_row("", "", "", "no failed attempts")
    return table


def _shown_json(value: Any) -> str:
    text = pretty_json(value)
    if len(text) > DETAIL_LIMIT:
        text = text[:DETAIL_LIMIT] + f"\n… {len(text) - DETAIL_LIMIT:,} more characters not shown"
    return printable(text, lines=True)


class DetailModal(ModalScreen[None]):
    DEFAULT_CSS = """
    DetailModal { align: center middle; }
    DetailModal > VerticalScroll {
        width: 100; max-width: 100%; height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    DetailModal .section { margin-top: 1; text-style: bold; color: $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "close", "Close", id="detail.close"),
    ]

    def __init__(self, title: str, fields: Sequence[tuple[str, Any]], payload: Any, headers: Any,
                 history: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.title_text = title
        self.fields = fields
        self.payload = payload
        self.headers = headers
        self.history = history

    def compose(self) -> ComposeResult:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for key, value in self.fields:
            grid.add_row(key, literal("-" if value is None else clip(str(value), DETAIL_LIMIT), lines=True))
        with VerticalScroll():
            yield Label(self.title_text, classes="section")
            yield Static(grid, id="detail-fields")
            yield Label("payload", classes="section")
            yield Static(Syntax(_shown_json(self.payload), "json", theme="ansi_dark", background_color="default",
                                word_wrap=True), id="detail-payload")
            yield Label("headers (secrets redacted)", classes="section")
            yield Static(Syntax(_shown_json(self.headers), "json", theme="ansi_dark", background_color="default",
                                word_wrap=True), id="detail-headers")
            yield Label("error history", classes="section")
            yield Static(error_history_table(self.history), id="detail-history")

    def action_close(self) -> None:
        self.dismiss(None)
