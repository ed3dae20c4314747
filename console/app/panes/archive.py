"""Archive: the monthly partitions with their sizes, and the replay wizard."""

from __future__ import annotations

from typing import ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from sqlkit import archive, endpoints
from sqlkit.archive import ArchivePartition
from sqlkit.errors import CourierError

from ..formatting import count, size
from ..live import LivePane
from ..widgets.live_table import LiveTable
from ..widgets.replay_wizard import ReplayWizard


class ArchivePane(LivePane):
    TITLE_TEXT = "Archive"
    REFRESH_SECONDS = 10.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "replay", "Replay…", id="archive.replay"),
    ]

    def compose(self) -> ComposeResult:
        yield LiveTable([("partition", "partition"), ("from", "from"), ("to", "to"), ("rows", "rows (est.)"),
                         ("size", "size")], id="archive-table")

    def fetch(self, conn: psycopg.Connection) -> list[ArchivePartition]:
        return archive.partitions(conn)

    def show(self, partitions: list[ArchivePartition]) -> None:
        tz = self.courier.tz

        def day(moment) -> str:
            return "…" if moment is None else moment.astimezone(tz).strftime("%Y-%m-%d")
        self.query_one(LiveTable).sync(
            (p.partition_name, [p.partition_name, day(p.range_from), day(p.range_to),
                                count(max(p.estimated_rows, 0)), size(p.total_bytes)])
            for p in partitions)

    def action_replay(self) -> None:
        self._open_wizard()

    @work(thread=True, exit_on_error=False, group="wizard")
    def _open_wizard(self) -> None:
        try:
            names = self.courier.database.run(lambda conn: [e.name for e in endpoints.list_all(conn)])
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return

        def done(replayed: int | None) -> None:
            if replayed:
                self.notify(f"replayed {replayed:,} archived message(s)", timeout=5)
        self.app.call_from_thread(self.app.push_screen, ReplayWizard(names, self.courier.clock(), self.courier.tz),
                                  done)
