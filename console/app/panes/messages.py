"""Messages: search the queue by endpoint, status, ordering key or correlation id, and open
one to see its payload, headers and error history."""

from __future__ import annotations

import uuid
from typing import ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Select

from sqlkit import messages, verbs
from sqlkit.errors import CourierError
from sqlkit.messages import Message, MessageSummary

from ..formatting import count, one_line, since, state_text, when
from ..live import LivePane
from ..widgets.confirm import ConfirmModal
from ..widgets.detail import DetailModal
from ..widgets.live_table import CELL_LIMIT, LiveTable

STATUSES = ("pending", "processing", "expired")
LIMIT = 200


def message_detail(message: Message, tz) -> DetailModal:
    fields = [("id", message.id), ("endpoint", message.endpoint_name), ("status", message.status),
              ("priority", message.priority), ("attempts", message.attempts),
              ("ordering key", message.ordering_key), ("correlation id", message.correlation_id),
              ("idempotency key", message.idempotency_key), ("created", when(message.created_at, tz)),
              ("scheduled", when(message.scheduled_at, tz)), ("next retry", when(message.next_retry_at, tz)),
              ("expires", when(message.expires_at, tz)), ("completed", when(message.completed_at, tz)),
              ("last error", message.last_error)]
    if message.visible_at is not None:  # a pull topic's message
        deadline = "visible until" if message.status == "processing" else "due"
        fields += [("key", message.key), ("lease", message.lease), (deadline, when(message.visible_at, tz))]
    return DetailModal(f"Message {message.id}", fields, message.payload, message.headers, message.history)


class MessagesPane(LivePane):
    TITLE_TEXT = "Messages"
    DEFAULT_CSS = """
    MessagesPane #search { height: 3; }
    MessagesPane #search Input { width: 1fr; }
    MessagesPane #search Select { width: 18; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_search", "Search", id="messages.search"),
        Binding("escape", "focus_table", "Results", show=False, id="messages.results"),
        Binding("o", "open", "Open", tooltip="Open the message (enter)", id="messages.open"),
        Binding("x", "cancel_message", "Cancel", tooltip="Cancel the message: it leaves the queue for the archive "
                "as cancelled (in processing: its outcome is discarded)", show=False, id="messages.cancel"),
    ]

    def compose(self) -> ComposeResult:
        with Horizontal(id="search"):
            yield Input(placeholder="endpoint", id="search-endpoint")
            yield Select([(s, s) for s in STATUSES], prompt="any status", id="search-status")
            yield Input(placeholder="ordering key", id="search-ordering-key")
            yield Input(placeholder="correlation id", id="search-correlation-id")
        yield LiveTable([("id", "id"), ("endpoint", "endpoint"), ("status", "status"), ("priority", "prio"),
                         ("attempts", "tries"), ("ordering_key", "ordering key"), ("age", "age"),
                         ("last_error", "last error")], flex="last_error", id="messages-table")


    def criteria(self) -> dict[str, object]:
        status_select = self.query_one("#search-status", Select)
        correlation = self.query_one("#search-correlation-id", Input).value.strip()
        criteria: dict[str, object] = {
            "endpoint": self.query_one("#search-endpoint", Input).value.strip() or None,
            "status": None if status_select.is_blank() else str(status_select.value),
            "ordering_key": self.query_one("#search-ordering-key", Input).value.strip() or None,
            "correlation_id": None,
        }
        if correlation:
            criteria["correlation_id"] = uuid.UUID(correlation)
        return criteria

    def fetch(self, conn: psycopg.Connection) -> list[MessageSummary]:
        try:
            criteria = self._criteria
        except AttributeError:
            criteria = {}
        return messages.search(conn, limit=LIMIT, **criteria)

    def poll_now(self) -> None:
        try:
            self._criteria = self.criteria()
        except ValueError:
            self.notify("correlation id: not a UUID", severity="error", timeout=4)
            self._criteria = {}
        except Exception:  # not composed yet
            self._criteria = {}
        super().poll_now()

    def show(self, rows: list[MessageSummary]) -> None:
        now = self.courier.clock()
        colors = self.app.get_css_variables()
        self.query_one(LiveTable).sync(
            (str(m.id), [str(m.id), m.endpoint_name, state_text(m.status, colors), str(m.priority),
                         count(m.retry_count), m.ordering_key or "", since(m.created_at, now),
                         one_line(m.last_error, CELL_LIMIT)])
            for m in rows)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.poll_now()
        self.query_one(LiveTable).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        self.poll_now()

    def action_focus_search(self) -> None:
        self.query_one("#search-endpoint", Input).focus()

    def action_focus_table(self) -> None:
        self.query_one(LiveTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        key = self.query_one(LiveTable).current_key
        if key is not None:
            self.open_message(int(key))

    @work(thread=True, exit_on_error=False, group="detail")
    def open_message(self, message_id: int) -> None:
        try:
            message = self.courier.database.run(lambda conn: messages.get(conn, message_id))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        self.app.call_from_thread(self.app.push_screen, message_detail(message, self.courier.tz))

    def action_cancel_message(self) -> None:
        key = self.query_one(LiveTable).current_key
        if key is None:
            return
        message_id = int(key)

        def answered(yes: bool | None) -> None:
            if yes:
                self.write(lambda conn: verbs.cancel(conn, message_id, "console").was,
                           f"cancelled message {message_id} ({{result}})")
        self.app.push_screen(ConfirmModal(f"Cancel message {message_id}? Pending, it leaves the queue at once; in "
                                          "processing, its delivery's outcome is discarded and it is never retried. "
                                          "It ends in the archive as cancelled.", "Cancel message"), answered)
