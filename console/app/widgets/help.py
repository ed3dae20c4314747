"""The help screen: every key, global and per pane, read from the bindings themselves; esc (or
q, or ?) closes it, as its frame and its first lines say."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .keybar import KEY_NAMES

GLOBAL_KEYS = [
    ("1 … 9, 0", "go to Overview, Endpoints, Messages, DLQ, Archive, Events, Workers, Analytics, Tokens, "
                 "Schedules"),
    (":", "jump to a pane by name (k9s style): :dlq, :endpoints, :workers …"),
    ("/", "filter or search the current table"),
    ("ctrl+p", "command palette: every pane and action by name"),
    ("r", "refresh now"),
    ("?", "this help"),
    ("q, ctrl+c", "quit (the embedded pool drains first)"),
    ("esc", "close this help, a dialog or a detail; clear a filter"),
]


def _keys_of(screen_class) -> list[tuple[str, str]]:
    rows = []
    for binding in vars(screen_class).get("BINDINGS", []):
        if isinstance(binding, Binding) and binding.description:
            keys = ", ".join(KEY_NAMES.get(k, k) for k in binding.key.split(","))
            rows.append((keys, binding.tooltip or binding.description))
    return rows


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: 90%; border: thick $accent; background: $surface; padding: 0 1;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def compose(self) -> ComposeResult:
        from ..panes import PANES

        table = Table(box=None, show_header=False, padding=(0, 2), expand=True)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        table.add_row("[reverse] Everywhere [/]", "")
        for key, text in GLOBAL_KEYS:
            table.add_row(key, text)
        for spec in PANES.values():
            keys = _keys_of(spec.pane)
            if keys:
                table.add_row("", "")
                table.add_row(f"[reverse] {spec.title} [/]", spec.summary)
                for key, text in keys:
                    table.add_row(key, text)
        with VerticalScroll() as scroll:
            scroll.border_title = "Keys"
            scroll.border_subtitle = "esc closes"
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)
