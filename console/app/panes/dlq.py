"""DLQ: browse and filter dead letters, open one, and redrive one, a selection, an endpoint
or everything, each behind a confirmation that says how many rows it touches."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import psycopg
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from sqlkit import dlq, verbs
from sqlkit.dlq import DlqDetail, DlqEntry
from sqlkit.errors import CourierError

from ..formatting import clock_time, count, one_line, state_text, when
from ..live import LivePane
from ..widgets.confirm import ConfirmModal
from ..widgets.detail import DetailModal
from ..widgets.filter_box import FilterBox
from ..widgets.live_table import CELL_LIMIT, LiveTable

LIMIT = 500
REDRIVE_BATCH = 1000


def dlq_detail(entry: DlqDetail, tz) -> DetailModal:
    fields = [("DLQ id", entry.id), ("message id", entry.original_message_id), ("endpoint", entry.endpoint_name),
              ("status", entry.status), ("attempts", entry.retry_count), ("ordering key", entry.ordering_key),
              ("correlation id", entry.correlation_id), ("created", when(entry.original_created_at, tz)),
              ("failed", when(entry.failed_at, tz)), ("redriven", when(entry.redriven_at, tz)),
              ("redriven as", entry.redriven_message_id), ("last error", entry.last_error)]
    return DetailModal(f"Dead letter {entry.id}", fields, entry.payload, entry.headers, entry.error_history)


class DlqPane(LivePane):
    TITLE_TEXT = "DLQ"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "toggle_select", "Mark", id="dlq.select"),
        Binding("o", "open", "Open", tooltip="Open the entry (enter)", show=False, id="dlq.open"),
        Binding("R", "redrive_one", "Redrive", tooltip="Redrive this entry", id="dlq.redrive_one"),
        Binding("S", "redrive_selection", "Marked", tooltip="Redrive the marked entries",
                id="dlq.redrive_selection"),
        Binding("E", "redrive_endpoint", "Endpoint", tooltip="Redrive every failed entry of this endpoint",
                id="dlq.redrive_endpoint"),
        Binding("A", "redrive_all", "All", tooltip="Redrive every failed entry", id="dlq.redrive_all"),
        Binding("P", "purge_endpoint", "Purge", tooltip="Delete every failed entry of this endpoint for good",
                show=False, id="dlq.purge"),
        Binding("t", "toggle_redriven", "Redriven", tooltip="Show or hide redriven entries", show=False,
                id="dlq.toggle_redriven"),
        Binding("slash", "filter", "Filter", id="dlq.filter"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.selected: set[int] = set()
        self.entries: dict[int, DlqEntry] = {}
        self.include_redriven = False

    def compose(self) -> ComposeResult:
        yield FilterBox(placeholder="filter rows (endpoint, error, id…); escape clears", id="dlq-filter")
        yield LiveTable([("mark", " "), ("id", "id"), ("endpoint", "endpoint"), ("status", "status"),
                         ("attempts", "tries"), ("failed_at", "failed"), ("last_error", "last error")],
                        flex="last_error", id="dlq-table")


    def fetch(self, conn: psycopg.Connection) -> list[DlqEntry]:
        return dlq.list_entries(conn, status=None if self.include_redriven else "failed", limit=LIMIT)

    def show(self, rows: list[DlqEntry]) -> None:
        self.entries = {e.id: e for e in rows}
        self.selected &= {e.id for e in rows if e.status == "failed"}
        colors = self.app.get_css_variables()
        self.query_one(LiveTable).sync(
            (str(e.id), [Text("●", style=colors["text-accent"]) if e.id in self.selected else "", str(e.id),
                         e.endpoint_name, state_text(e.status, colors), count(e.retry_count),
                         clock_time(e.failed_at, self.courier.tz), one_line(e.last_error, CELL_LIMIT)])
            for e in rows)

    # Browsing --------------------------------------------------------------------------

    def _current(self) -> DlqEntry | None:
        key = self.query_one(LiveTable).current_key
        entry = self.entries.get(int(key)) if key else None
        if entry is None:
            self.notify("no DLQ entry selected", severity="warning", timeout=3)
        return entry

    def action_toggle_select(self) -> None:
        if (entry := self._current()) is None:
            return
        if entry.status != "failed":
            self.notify(f"entry {entry.id} was already redriven", severity="warning", timeout=3)
            return
        self.selected ^= {entry.id}
        table = self.query_one(LiveTable)
        mark = Text("●", style=self.app.get_css_variables()["text-accent"]) if entry.id in self.selected else ""
        table.update_cell(str(entry.id), "mark", mark)
        table.action_cursor_down()

    def action_toggle_redriven(self) -> None:
        self.include_redriven = not self.include_redriven
        self.notify("showing redriven entries too" if self.include_redriven else "showing failed entries only",
                    timeout=3)
        self.poll_now()

    def action_filter(self) -> None:
        self.query_one("#dlq-filter", FilterBox).open()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        if entry := self._current():
            self.open_entry(entry.id)

    @work(thread=True, exit_on_error=False, group="detail")
    def open_entry(self, dlq_id: int) -> None:
        try:
            entry = self.courier.database.run(lambda conn: dlq.get(conn, dlq_id))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        self.app.call_from_thread(self.app.push_screen, dlq_detail(entry, self.courier.tz))

    # Redrive ---------------------------------------------------------------------------

    def _confirm_then(self, question: str, action: Callable[[psycopg.Connection], int], done: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.write(action, done)
        self.app.push_screen(ConfirmModal(question, "Redrive"), answered)

    def action_redrive_one(self) -> None:
        entry = self._current()
        if entry is None:
            return
        if entry.status != "failed":
            self.notify(f"entry {entry.id} was already redriven", severity="warning", timeout=3)
            return
        self._confirm_then(f"Redrive DLQ entry {entry.id} ({entry.endpoint_name})? 1 message will be re-queued.",
                           lambda conn: dlq.redrive_message(conn, entry.id), "redrove entry as message {result}")

    def action_redrive_selection(self) -> None:
        ids = sorted(self.selected)
        if not ids:
            self.notify("nothing selected: space marks entries", severity="warning", timeout=3)
            return

        def redrive(conn: psycopg.Connection) -> int:
            for dlq_id in ids:
                dlq.redrive_message(conn, dlq_id)
            self.app.call_from_thread(self.selected.clear)
            return len(ids)
        self._confirm_then(f"Redrive the {len(ids)} selected DLQ entr{'y' if len(ids) == 1 else 'ies'}? "
                           f"{len(ids)} message(s) will be re-queued.", redrive, "redrove {result} selected entries")

    def action_redrive_endpoint(self) -> None:
        if entry := self._current():
            self._count_then_confirm(entry.endpoint_name)

    def action_redrive_all(self) -> None:
        self._count_then_confirm(None)

    @work(thread=True, exit_on_error=False, group="count")
    def _count_then_confirm(self, endpoint: str | None) -> None:
        try:
            total = self.courier.database.run(lambda conn: dlq.failed_count(conn, endpoint))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        scope = f"endpoint {endpoint}" if endpoint else "every endpoint"
        if not total:
            self.app.call_from_thread(self.notify, f"no failed DLQ entries for {scope}", timeout=3)
            return
        self.app.call_from_thread(
            self._confirm_then,
            f"Redrive all {total:,} failed DLQ entries of {scope}? {total:,} message(s) will be re-queued, "
            f"in batches of {REDRIVE_BATCH:,}.",
            lambda conn: dlq.redrive_everything(conn, endpoint, REDRIVE_BATCH),
            f"redrove {{result}} message(s) of {scope}")

    def action_purge_endpoint(self) -> None:
        if entry := self._current():
            self._count_then_purge(entry.endpoint_name)

    @work(thread=True, exit_on_error=False, group="count")
    def _count_then_purge(self, name: str) -> None:
        try:
            total = self.courier.database.run(lambda conn: verbs.purge_count(conn, name, dlq=True))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.write(lambda conn: verbs.purge(conn, name, dlq=True, actor="console"),
                           f"purged {{result}} DLQ entries of {name}")
        self.app.call_from_thread(
            self.app.push_screen,
            ConfirmModal(f"Purge the {total:,} failed DLQ entries of endpoint {name}? They are deleted for good "
                         "(their messages stay in the archive as failed).", "Purge"), answered)
