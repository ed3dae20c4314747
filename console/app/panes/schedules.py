"""Schedules: each periodic schedule with its state, next run and last tick (on the schedule's own
clock), why it fails (beside its state, in the width the other columns leave, as on the
Endpoints pane), cron and time zone, target, and ticks sent and skipped; pause or resume one,
drop one after a confirmation; enter opens one whole, with its next five runs."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

import psycopg
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from sqlkit import schedules
from sqlkit.errors import CourierError
from sqlkit.schedules import Schedule, on_its_clock

from ..formatting import age, count, one_line, state_text, when
from ..live import LivePane
from ..widgets.confirm import ConfirmModal
from ..widgets.detail import DetailModal
from ..widgets.live_table import CELL_LIMIT, LiveTable


def schedule_detail(s: Schedule, runs: list[datetime], now: datetime, tz) -> DetailModal:
    state = s.shown_state(now)
    due = on_its_clock(s.next_run_at, s.time_zone)
    if state in ("late", "failing"):
        due += f" ({age((now - s.next_run_at).total_seconds())} late)"
    fields = [("schedule", s.name), ("state", state), ("cron", f"{s.cron} ({s.time_zone})"),
              ("target", f"{s.endpoint_name} ({s.protocol})"),
              ("catch up", f"all missed ticks, at most {s.catch_up_limit}" if s.catch_up == "all"
               else f"skip: the latest missed tick if no older than {s.grace_seconds} s"),
              ("next run", "- (paused)" if s.paused else due),
              ("next runs", "\n".join(on_its_clock(at, s.time_zone) for at in runs) if runs else "-"),
              ("last tick", on_its_clock(s.last_tick_at, s.time_zone)), ("last sent", when(s.last_sent_at, tz)),
              ("last message", s.last_message_id), ("ticks", f"{s.sent_ticks:,} sent, {s.skipped_ticks:,} skipped"),
              ("last error", s.last_error), ("failed at", when(s.last_error_at, tz)),
              ("paused at", when(s.paused_at, tz)), ("description", s.description),
              ("created", when(s.created_at, tz))]
    return DetailModal(f"Schedule {s.name}", fields)


class SchedulesPane(LivePane):
    TITLE_TEXT = "Schedules"
    REFRESH_SECONDS = 5.0
    # z pauses and resumes, as on the Endpoints pane.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("z", "toggle_pause", "Pause/resume",
                tooltip="Pause or resume the schedule: no tick is sent while paused, and none is made up",
                id="schedules.pause"),
        Binding("x", "drop", "Drop", tooltip="Drop the schedule (the messages it sent stay)", id="schedules.drop"),
        Binding("o", "open", "Open", tooltip="Open the schedule: its next five runs and its last error whole (enter)",
                show=False, id="schedules.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.by_name: dict[str, Schedule] = {}

    def compose(self) -> ComposeResult:
        yield LiveTable([("name", "schedule"), ("state", "state"), ("next_run", "next run"),
                         ("last_error", "last error"), ("cron", "cron"), ("target", "target"),
                         ("last_tick", "last tick"), ("ticks", "sent/skipped")],
                        flex="last_error", flex_min=32, id="schedules-table")

    def fetch(self, conn: psycopg.Connection) -> list[Schedule]:
        return schedules.list_all(conn)

    def show(self, found: list[Schedule]) -> None:
        now = self.courier.clock()
        colors = self.app.get_css_variables()
        self.by_name = {s.name: s for s in found}
        rows = []
        for s in found:
            state = s.shown_state(now)
            shown = state_text(state, colors)
            next_run = Text("-" if s.paused else on_its_clock(s.next_run_at, s.time_zone, "%m-%d %H:%M %Z"),
                            style=colors.get("text-error", "") if state in ("late", "failing") else "")
            rows.append((s.name, [s.name, shown, next_run, one_line(s.last_error, CELL_LIMIT),
                                  f"{s.cron} {s.time_zone}", s.endpoint_name,
                                  on_its_clock(s.last_tick_at, s.time_zone, "%m-%d %H:%M"),
                                  f"{count(s.sent_ticks)}/{count(s.skipped_ticks)}"]))
        self.query_one(LiveTable).sync(rows)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def _selected(self) -> Schedule | None:
        key = self.query_one(LiveTable).current_key
        schedule = self.by_name.get(key) if key else None
        if schedule is None:
            self.notify("no schedule selected", severity="warning", timeout=3)
        return schedule

    def action_open(self) -> None:
        if s := self._selected():
            self._open(s)

    @work(thread=True, exit_on_error=False, group="schedule-detail")
    def _open(self, s: Schedule) -> None:
        try:
            runs = [] if s.paused else self.courier.database.run(
                lambda conn: schedules.next_runs(conn, s.cron, s.time_zone, 5, after=self.courier.clock()))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        self.app.call_from_thread(self.app.push_screen,
                                  schedule_detail(s, runs, self.courier.clock(), self.courier.tz))

    def action_toggle_pause(self) -> None:
        if s := self._selected():
            name = s.name
            if s.paused:
                self.write(lambda conn: schedules.resume(conn, name), f"resumed schedule {name} from its next tick")
            else:
                self.write(lambda conn: schedules.pause(conn, name),
                           f"paused schedule {name}: no tick is sent until z resumes it")

    def action_drop(self) -> None:
        s = self._selected()
        if s is None:
            return
        name = s.name

        def answered(yes: bool | None) -> None:
            if yes:
                self.write(lambda conn: schedules.drop(conn, name), f"dropped schedule {name}")
        self.app.push_screen(ConfirmModal(f"Drop schedule {name} ({s.cron}, {s.time_zone}, to {s.endpoint_name})? "
                                          "No tick is sent from now on; the messages it sent stay. "
                                          "This cannot be undone.", "Drop"), answered)
