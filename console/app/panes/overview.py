"""Overview: depth by status and endpoint, throughput and depth over the last minutes from the
maintenance leader's samples (with their gaps), oldest pending message, DLQ depth and workers;
enter opens an endpoint's row whole."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar

import psycopg
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Static

from sqlkit import observability, samples
from sqlkit.observability import EndpointDepth, EndpointHealth, QueueStatus
from sqlkit.samples import MetricSample

from ..formatting import age, count, rate, since, state_text, when
from ..live import LivePane
from ..widgets.chart import Chart, line_chart
from ..widgets.detail import DetailModal
from ..widgets.live_table import LiveTable

WINDOW_SECONDS = 300.0  # the charts show the last five minutes
NO_SAMPLES = "no samples: a running worker's\nmaintenance leader takes one every 10 s"


@dataclass(frozen=True)
class OverviewData:
    status: QueueStatus
    health: list[EndpointHealth]
    samples: list[MetricSample]
    """The whole queue's samples of the last WINDOW_SECONDS, oldest first."""
    rates: dict[str, float]
    """Each endpoint's delivered/s in the newest sample, when it has one."""


def endpoint_row_detail(e: EndpointDepth, health: EndpointHealth | None, per_second: float | None, now, tz
                        ) -> DetailModal:
    """An Overview row whole, with what the endpoint's health adds to it (the Endpoints pane's
    detail has its last error, config and policy)."""
    pull = health is not None and health.protocol == "pull"
    fields = [("endpoint", e.endpoint), ("protocol", health.protocol if health else None),
              ("enabled", "yes" if e.enabled else "no"), ("circuit", "-" if pull else e.circuit.replace("_", "-")),
              ("pending", e.pending), ("in flight", e.processing), ("dlq", e.dlq_failed),
              ("delivered", rate(per_second))]
    if health is not None:
        oldest = health.oldest_pending_message
        fields += [("failures", health.circuit_failure_count),
                   ("oldest pending", f"{when(oldest, tz)} ({since(oldest, now)} ago)" if oldest else None),
                   ("last success", when(health.last_success_at, tz)),
                   ("last failure", when(health.last_failure_at, tz))]
    return DetailModal(f"Endpoint {e.endpoint}", fields)


class OverviewPane(LivePane):
    TITLE_TEXT = "Overview"
    DEFAULT_CSS = """
    OverviewPane #tiles { height: 3; }
    OverviewPane .tile {
        width: 1fr; height: 3; border: round $primary-muted; padding: 0 1; content-align: center middle;
        border-title-color: $text-muted; border-title-align: left;
    }
    OverviewPane #charts { height: 1fr; min-height: 9; }
    OverviewPane Chart { width: 1fr; height: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "open", "Open", tooltip="Open the endpoint: its counts, last success and failure whole (enter)",
                show=False, id="overview.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.samples: list[MetricSample] = []
        """What the charts draw: the whole queue's samples of the last WINDOW_SECONDS."""
        self.data: OverviewData | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="tiles"):
            yield Static(id="tile-pending", classes="tile")
            yield Static(id="tile-processing", classes="tile")
            yield Static(id="tile-oldest", classes="tile")
            yield Static(id="tile-dlq", classes="tile")
            yield Static(id="tile-workers", classes="tile")
        with Horizontal(id="charts"):
            yield Chart(id="throughput-chart")
            yield Chart(id="depth-chart")
        yield LiveTable([("endpoint", "endpoint"), ("circuit", "circuit"), ("pending", "pending"),
                         ("processing", "in flight"), ("dlq", "dlq"), ("rate", "delivered")],
                        id="overview-endpoints")

    def fetch(self, conn: psycopg.Connection) -> OverviewData:
        now = self.courier.clock()
        history = samples.history(conn, now - timedelta(seconds=WINDOW_SECONDS), now)
        rates: dict[str, float] = {}
        if history and _fresh(history[-1], now):
            # The newest sample per endpoint, with the one before it for its rate.
            rates = samples.latest_rates(samples.history(conn, history[-1].sampled_at, now, per_endpoint=True))
        return OverviewData(observability.queue_status(conn), observability.endpoint_health(conn), history, rates)

    def show(self, data: OverviewData) -> None:
        now = self.courier.clock()
        protocols = {h.endpoint_name: h.protocol for h in data.health}
        depth = data.status.queue_depth
        self.samples = data.samples
        self.data = data
        oldest = min((h.oldest_pending_message for h in data.health if h.oldest_pending_message), default=None)
        colors = self.app.get_css_variables()
        self._tile("#tile-pending", "pending", count(depth.get("pending", 0)))
        self._tile("#tile-processing", "in flight", count(depth.get("processing", 0)))
        self._tile("#tile-oldest", "oldest", age((now - oldest).total_seconds()) if oldest else "-")
        dlq_style = f"bold {colors['text-error']}" if data.status.dlq_depth else "bold"
        dlq = Text(count(data.status.dlq_depth), style=dlq_style)
        self._tile("#tile-dlq", "DLQ", dlq)
        alive = [w for w in data.status.workers if w.alive_at(now)]
        leader = any(w.maintenance_leader for w in alive)
        self._tile("#tile-workers", "workers", f"{len(alive)}{' ★' if leader else ''}")
        self._draw_charts(now)
        table = self.query_one("#overview-endpoints", LiveTable)
        table.sync(
            (e.endpoint, [e.endpoint, self._circuit(e.circuit, e.enabled, protocols.get(e.endpoint), colors, e.paused),
                          count(e.pending),
                          count(e.processing), count(e.dlq_failed), rate(data.rates.get(e.endpoint))])
            for e in data.status.endpoints)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        key = self.query_one("#overview-endpoints", LiveTable).current_key
        data = self.data
        found = next((e for e in data.status.endpoints if e.endpoint == key), None) if data and key else None
        if data is None or found is None:
            self.notify("no endpoint selected", severity="warning", timeout=3)
            return
        health = next((h for h in data.health if h.endpoint_name == key), None)
        self.app.push_screen(endpoint_row_detail(found, health, data.rates.get(key), self.courier.clock(),
                                                 self.courier.tz))

    def _tile(self, selector: str, label: str, value: str | Text) -> None:
        tile = self.query_one(selector, Static)
        tile.border_title = label
        text = value if isinstance(value, Text) else Text(value, style="bold")
        text.justify = "center"
        tile.update(text)

    @staticmethod
    def _circuit(circuit: str, enabled: bool, protocol: str | None, colors: dict[str, str],
                 paused: bool = False) -> Text:
        if not enabled:
            return state_text("disabled", colors)
        if paused:  # pause_endpoint: sends accepted, nothing delivered or dequeued
            return state_text("paused", colors)
        if protocol == "pull":  # a topic: consumers take its messages, no circuit guards them
            return Text("—", style="dim")
        return state_text(circuit, colors)

    def _draw_charts(self, now: datetime) -> None:
        """Both charts over the samples of the last WINDOW_SECONDS, the x axis in minutes before
        now and the y axis from 0 to a round number above the highest value. A line joins only
        consecutive samples: none is drawn across a gap (no leader sampled), nor after the newest
        sample to now. Until there is something to draw, each chart says why instead of drawing
        axes around nothing."""
        history = self.samples
        stale = "" if not history or _fresh(history[-1], now) else \
            f" · no sample for {age((now - history[-1].sampled_at).total_seconds())}"
        rates = _segments(history, lambda s: s.delivered_per_second, now)
        throughput = self.query_one("#throughput-chart", Chart)
        if not any(len(segment) > 1 for segment in rates):
            throughput.wait("delivered/s", "collecting…" if history else NO_SAMPLES)
        else:
            throughput.replot(lambda plt: line_chart(plt, "delivered/s" + stale, [("delivered", rates)],
                                                     span=WINDOW_SECONDS, whole=False))
        depth = self.query_one("#depth-chart", Chart)
        pending = _segments(history, lambda s: s.pending, now)
        if not any(len(segment) > 1 for segment in pending):
            depth.wait("depth", "collecting…" if history else NO_SAMPLES)
        else:
            in_flight = _segments(history, lambda s: s.processing, now)
            depth.replot(lambda plt: line_chart(plt, "depth" + stale, [("pending", pending), ("in flight", in_flight)],
                                                span=WINDOW_SECONDS))


def _fresh(sample: MetricSample, now: datetime) -> bool:
    """Whether the leader is still sampling: its newest sample is at most two intervals old."""
    return (now - sample.sampled_at).total_seconds() <= 2 * sample.interval_seconds


def _segments(history: Sequence[MetricSample], value: Callable[[MetricSample], float | None],
              now: datetime) -> list[list[tuple[float, float]]]:
    """The (seconds before now, value) points of the samples, in runs without a gap: a new run
    starts after each gap, and wherever the value is unknown (the rate of a gap's sample)."""
    runs: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for sample in history:
        y = value(sample)
        if sample.gap or y is None:
            if current:
                runs.append(current)
            current = []
        if y is not None:
            current.append(((sample.sampled_at - now).total_seconds(), float(y)))
    if current:
        runs.append(current)
    return runs
