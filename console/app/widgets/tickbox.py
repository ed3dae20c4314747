"""A checkbox that shows its state in its glyph, not only in colour."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Checkbox


class Tickbox(Checkbox):
    """Textual's Checkbox draws an X whether ticked or not and tells the two apart by colour
    alone, so a terminal without colour (NO_COLOR, a plain capture) showed every box ticked.
    This one draws the X only when ticked."""

    @property
    def _button(self) -> Content:
        self.BUTTON_INNER = "X" if self.value else " "
        return super()._button
