"""A read-only detail dialog: fields, then pretty JSON documents (a message's payload and
headers, an endpoint's config, an event's details) and an error history, each when given.
Every table whose cells are cut opens its row here with enter, every value shown whole."""

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


NOT_SHOWN: Any = object()
"""A section the dialog leaves out (None is a JSON document of its own: null)."""


class DetailModal(ModalScreen[None]):
    DEFAULT_CSS = """
    DetailModal { align: center middle; }
    DetailModal > VerticalScroll {
        width: 100; max-width: 100%; height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    DetailModal .section { width: 100%; margin-top: 1; text-style: bold; color: $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "close", "Close", id="detail.close"),
    ]

    def __init__(self, title: str, fields: Sequence[tuple[str, Any]], payload: Any = NOT_SHOWN,
                 headers: Any = NOT_SHOWN, history: Sequence[dict[str, Any]] | None = None, *,
                 documents: Sequence[tuple[str, Any]] = ()) -> None:
        """fields: (name, value) rows, shown as literal text; payload, headers and documents
        ((heading, value) pairs): JSON sections; history: the error history, when given."""
        super().__init__()
        self.title_text = title
        self.fields = fields
        self.payload = payload
        self.headers = headers
        self.documents = [(heading, value) for heading, value in
                          [("payload", payload), ("headers (secrets redacted)", headers), *documents]
                          if value is not NOT_SHOWN]
        self.history = history

    def compose(self) -> ComposeResult:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")  # a value without spaces (an id, a URL) is folded, not cut
        for key, value in self.fields:
            grid.add_row(key, literal("-" if value is None else clip(str(value), DETAIL_LIMIT), lines=True))
        with VerticalScroll():
            yield Label(literal(self.title_text), classes="section")
            yield Static(grid, id="detail-fields")
            for heading, value in self.documents:
                yield Label(literal(heading), classes="section")
                yield Static(Syntax(_shown_json(value), "json", theme="ansi_dark", background_color="default",
                                    word_wrap=True), id=f"detail-{heading.split()[0]}")
            if self.history is not None:
                yield Label("error history", classes="section")
                yield Static(error_history_table(self.history), id="detail-history")

    def action_close(self) -> None:
        self.dismiss(None)
