"""The Textual console: one pane per file in panes/, shown in one screen (main_screen.py); widgets in widgets/."""

from .app import CourierApp, make_app

__all__ = ["CourierApp", "make_app"]
