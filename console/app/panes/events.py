"""Events: a live tail of the event log (circuit transitions, endpoint and config changes,
redrives, replays, partition upkeep, leader elections). The details take the width the other
columns leave; enter opens an event whole."""

from __future__ import annotations

import json
from typing import ClassVar

import psycopg
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from sqlkit import observability
from sqlkit.observability import Event

from ..formatting import one_line, when
from ..live import LivePane
from ..widgets.detail import DetailModal
from ..widgets.filter_box import FilterBox
from ..widgets.live_table import CELL_LIMIT, LiveTable

KEEP = 500


def event_detail(event: Event, tz) -> DetailModal:
    fields = [("event id", event.id), ("at", when(event.created_at, tz)), ("event", event.event_type),
              ("endpoint", event.endpoint), ("actor", event.actor)]
    return DetailModal(f"Event {event.id}", fields, documents=[("details", event.details)])


class EventsPane(LivePane):
    TITLE_TEXT = "Events"
    REFRESH_SECONDS = 1.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", id="events.filter"),
        Binding("f", "follow", "Follow", id="events.follow"),
        Binding("o", "open", "Open", tooltip="Open the event: its details whole (enter)", show=False,
                id="events.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.events: list[Event] = []
        self.follow = True

    def compose(self) -> ComposeResult:
        yield FilterBox(placeholder="filter (type, endpoint, details…); escape clears", id="events-filter")
        yield LiveTable([("at", "at"), ("type", "event"), ("endpoint", "endpoint"), ("actor", "actor"),
                         ("details", "details")], flex="details", flex_min=8, id="events-table")

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
                                one_line(json.dumps(e.details, default=str), CELL_LIMIT)]) for e in self.events)
        if self.follow:
            table.move_cursor(row=table.row_count - 1)

    def action_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following new events" if self.follow else "paused following", timeout=2)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        key = self.query_one(LiveTable).current_key
        found = next((e for e in self.events if str(e.id) == key), None) if key else None
        if found is None:
            self.notify("no event selected", severity="warning", timeout=3)
            return
        self.app.push_screen(event_detail(found, self.courier.tz))

    def action_filter(self) -> None:
        self.query_one("#events-filter", FilterBox).open()
