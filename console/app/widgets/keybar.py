"""The key hints on the last line of every pane: drawn once, as one line of text.

Textual's Footer rebuilds a widget per key on every screen switch, which measured as a
third of the time a pane switch takes; a pane's keys never change, so one Static redrawn per pane switch will do.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.content import Content
from textual.widgets import Static

KEY_NAMES = {"question_mark": "?", "colon": ":", "slash": "/", "space": "space", "plus": "+", "minus": "-",
             "equals_sign": "=", "escape": "esc", "enter": "enter"}


def shown_bindings(screen_class: type, app_class: type) -> list[Binding]:
    seen: set[str] = set()
    chosen = []
    for owner in (*[c for c in screen_class.__mro__ if "BINDINGS" in vars(c)], app_class):
        for binding in vars(owner).get("BINDINGS", []):
            if isinstance(binding, Binding) and binding.show and binding.key not in seen:
                seen.add(binding.key)
                chosen.append(binding)
    return chosen


class KeyBar(Static):
    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: 1; background: $panel; color: $foreground; padding: 0 1; }
    """

    def show_for(self, pane: object) -> None:
        # Content with a theme variable, not a colour: it follows a theme change.
        parts = []
        for binding in shown_bindings(type(pane), type(self.app)):
            key = binding.key_display or KEY_NAMES.get(binding.key.split(",")[0], binding.key.split(",")[0])
            parts.append(Content.assemble((key, "bold $text-accent"), f" {binding.description}"))
        self.update(Content("  ").join(parts))
