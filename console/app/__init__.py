"""The Textual console: one screen per pane in screens/, widgets in widgets/."""

from .app import CourierApp, make_app

__all__ = ["CourierApp", "make_app"]
