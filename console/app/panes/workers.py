"""Workers: the console's embedded pool (start, stop, scale) and every worker seen through
its heartbeat, wherever it runs; enter opens a worker whole."""

from __future__ import annotations

from typing import ClassVar

import psycopg
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from sqlkit import observability
from sqlkit.observability import WorkerStatus

from ...literal import literal
from ..formatting import count, since, state_text, when
from ..live import LivePane
from ..widgets.detail import DetailModal
from ..widgets.live_table import LiveTable

MAX_CONCURRENCY = 10_000


class ConcurrencyPrompt(ModalScreen[int | None]):
    DEFAULT_CSS = """
    ConcurrencyPrompt { align: center middle; }
    ConcurrencyPrompt Input { width: 60; max-width: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="scale.cancel")]

    def __init__(self, current: int) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        field = Input(str(self.current), placeholder=f"messages in flight, 1-{MAX_CONCURRENCY}", type="integer",
                      id="concurrency-input")
        field.border_title = "embedded pool size"
        field.border_subtitle = f"messages in flight, 1-{MAX_CONCURRENCY:,} · enter · esc"
        yield field

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = int(event.value)
        except ValueError:
            value = 0
        if not 1 <= value <= MAX_CONCURRENCY:
            self.notify(f"concurrency: must be 1 to {MAX_CONCURRENCY:,}", severity="error", timeout=3)
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


def worker_detail(w: WorkerStatus, now, tz, embedded: bool) -> DetailModal:
    shown = w.shown_state(now)
    fields = [("worker", w.worker_id + (" (this console)" if embedded else "")), ("host", w.hostname),
              ("pid", w.pid), ("state", shown if shown == w.state else f"{shown} (reported {w.state})"),
              ("leader", "yes (maintenance leader)" if w.maintenance_leader else "no"),
              ("slots", w.concurrency), ("in flight", w.in_flight), ("delivered", w.delivered), ("failed", w.failed),
              ("started", when(w.started_at, tz)),
              ("seen", f"{when(w.last_heartbeat, tz)} ({since(w.last_heartbeat, now)} ago)"),
              ("sessions", "-" if w.connected is None else "connected" if w.connected else "gone")]
    return DetailModal(f"Worker {w.worker_id}", fields)


class WorkersPane(LivePane):
    TITLE_TEXT = "Workers"
    DEFAULT_CSS = """
    WorkersPane #pool-state { height: auto; padding: 0 1; border: round $primary-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "start_pool", "Start pool", id="workers.start"),
        Binding("x", "stop_pool", "Stop pool", id="workers.stop"),
        Binding("plus", "scale(1)", "+1", id="workers.scale_up"),
        Binding("minus", "scale(-1)", "-1", id="workers.scale_down"),
        Binding("equals_sign", "set_scale", "Set size", id="workers.set_scale"),
        Binding("o", "open", "Open", tooltip="Open the worker: host, pid, counts and heartbeat whole (enter)",
                show=False, id="workers.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.by_id: dict[str, WorkerStatus] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="pool-state")
        yield LiveTable([("worker", "worker"), ("state", "state"), ("leader", "lead"), ("concurrency", "slots"),
                         ("in_flight", "in flight"), ("delivered", "delivered"), ("failed", "failed"),
                         ("seen", "seen")], id="workers-table")

    def on_mount(self) -> None:
        self._draw_pool()
        self.set_interval(1.0, self._draw_pool)

    def fetch(self, conn: psycopg.Connection) -> list[WorkerStatus]:
        return observability.worker_status(conn)

    def show(self, workers: list[WorkerStatus]) -> None:
        now = self.courier.clock()
        colors = self.app.get_css_variables()
        embedded = self.courier.pool.state.worker_id if self.courier.pool is not None else None
        self.by_id = {w.worker_id: w for w in workers}
        rows = []
        for w in sorted(workers, key=lambda w: w.last_heartbeat, reverse=True):
            shown = w.shown_state(now)
            name = literal(w.worker_id)
            if w.worker_id == embedded:
                name.append(" (this console)", style="dim")
            late = shown in ("stale", "lost")
            seen = Text(since(w.last_heartbeat, now) + " ago", style=colors["text-error"] if late else "")
            rows.append((w.worker_id, [name, state_text(shown, colors),
                                       "★" if w.maintenance_leader else "", count(w.concurrency),
                                       count(w.in_flight), count(w.delivered), count(w.failed), seen]))
        self.query_one(LiveTable).sync(rows)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        key = self.query_one(LiveTable).current_key
        found = self.by_id.get(key) if key else None
        if found is None:
            self.notify("no worker selected", severity="warning", timeout=3)
            return
        pool = self.courier.pool
        embedded = pool is not None and pool.state.worker_id == found.worker_id
        self.app.push_screen(worker_detail(found, self.courier.clock(), self.courier.tz, embedded))

    def _draw_pool(self) -> None:
        pool = self.courier.pool
        widget = self.query_one("#pool-state", Static)
        if pool is None:
            widget.update("No embedded pool: this console only watches. Start one with "
                          "`courier console --workers N`, or run `courier worker` anywhere.")
            return
        state = pool.state
        colors = self.app.get_css_variables()
        text = Text()
        text.append("embedded pool  ", style="bold")
        text.append_text(state_text("running" if state.running else "stopped", colors))
        text.append(f"   {state.concurrency} in flight at most")
        if state.pid:
            text.append(f"   pid {state.pid}", style="dim")
        if not state.running and state.exit_code not in (None, 0):
            text.append(f"   exited with {state.exit_code}", style=colors["text-error"])
        text.append("\ns start · x stop (drains) · + / - scale by one · = set size", style="dim")
        widget.update(text)

    def _pool_or_warn(self):
        if self.courier.pool is None:
            self.notify("this console has no embedded pool (start it with --workers N)", severity="warning",
                        timeout=4)
        return self.courier.pool

    def action_start_pool(self) -> None:
        if pool := self._pool_or_warn():
            self._pool_call(pool.start, "embedded pool started")

    def action_stop_pool(self) -> None:
        if pool := self._pool_or_warn():
            self.notify("draining the embedded pool…", timeout=3)
            self._pool_call(pool.stop, "embedded pool stopped")

    def action_scale(self, delta: int) -> None:
        if pool := self._pool_or_warn():
            target = max(1, min(MAX_CONCURRENCY, pool.state.concurrency + delta))
            self._pool_call(lambda: pool.scale(target), f"embedded pool scaled to {target}")

    def action_set_scale(self) -> None:
        if pool := self._pool_or_warn():
            def chosen(value: int | None) -> None:
                if value:
                    self._pool_call(lambda: pool.scale(value), f"embedded pool scaled to {value}")
            self.app.push_screen(ConcurrencyPrompt(pool.state.concurrency), chosen)

    @work(thread=True, exit_on_error=False, group="pool")
    def _pool_call(self, action, done: str) -> None:
        try:
            action()
        except Exception as error:  # a failed spawn or a bad value: say it, stay up
            self.app.call_from_thread(self.notify, f"{type(error).__name__}: {error}", severity="error", timeout=6)
            return
        self.app.call_from_thread(self.notify, done, timeout=3)
        self.app.call_from_thread(self._draw_pool)
        self.app.call_from_thread(self.poll_now)
