"""Events: a live tail of the event log (circuit transitions, endpoint and config changes,
redrives, replays, partition upkeep, leader elections)."""

from __future__ import annotations

import json
from typing import ClassVar

import psycopg
from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from sqlkit import observability
from sqlkit.observability import Event

from ..formatting import one_line, when
from ..live import LivePane
from ..widgets.filter_box import FilterBox
from ..widgets.live_table import LiveTable

KEEP = 500


class EventsPane(LivePane):
    TITLE_TEXT = "Events"
    REFRESH_SECONDS = 1.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", id="events.filter"),
        Binding("f", "follow", "Follow", id="events.follow"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.events: list[Event] = []
        self.follow = True

    def compose(self) -> ComposeResult:
        yield FilterBox(placeholder="filter (type, endpoint, details…); escape clears", id="events-filter")
        yield LiveTable([("at", "at"), ("type", "event"), ("endpoint", "endpoint"), ("actor", "actor"),
                         ("details", "details")], id="events-table")

    def fetch(self, conn: psycopg.Connection) -> list[Event]:
        if not self.events:
            return observability.latest_events(conn, KEEP)
        return observability.events_after(conn, self.events[-1].id, limit=KEEP)

    def show(self, new: list[Event]) -> None:
        if not new and self.loaded:
            return
        self.events = (self.events + new)[-KEEP:]
        tz = self.courier.tz
        table = self.query_one(LiveTable)
        table.sync((str(e.id), [when(e.created_at, tz)[5:], e.event_type, e.endpoint or "", e.actor,
                                one_line(json.dumps(e.details, default=str), 80)]) for e in self.events)
        if self.follow:
            table.move_cursor(row=table.row_count - 1)

    def action_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following new events" if self.follow else "paused following", timeout=2)

    def action_filter(self) -> None:
        self.query_one("#events-filter", FilterBox).open()
