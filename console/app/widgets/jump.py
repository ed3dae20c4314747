"""k9s's `:` prompt: type a pane's name (or the start of it) and go there."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input


def resolve_pane(text: str) -> str | None:
    from ..panes import PANES

    word = text.strip().lstrip(":").lower()
    if not word:
        return None
    for name, spec in PANES.items():
        if word == name or word in spec.aliases:
            return name
    matches = [name for name in PANES if name.startswith(word)]
    return matches[0] if len(matches) == 1 else None


class JumpPrompt(ModalScreen[str | None]):
    DEFAULT_CSS = """
    JumpPrompt { align: center top; }
    JumpPrompt Input { width: 78; max-width: 100%; margin-top: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="jump.cancel")]

    def compose(self) -> ComposeResult:
        from ..panes import PANES

        names = [*PANES, *[a for spec in PANES.values() for a in spec.aliases]]
        field = Input(placeholder=":" + " ".join(PANES), suggester=SuggestFromList(names, case_sensitive=False),
                      id="jump-input")
        field.border_title = "go to pane"
        field.border_subtitle = "enter · esc"
        yield field

    def on_input_submitted(self, event: Input.Submitted) -> None:
        target = resolve_pane(event.value)
        if target is None:
            self.notify(f"no pane called {event.value!r}", severity="warning", timeout=3)
            return
        self.dismiss(target)

    def action_cancel(self) -> None:
        self.dismiss(None)
