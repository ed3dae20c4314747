"""Overview: depth by status and endpoint, throughput and depth over time, oldest pending
message, DLQ depth and workers."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from datetime import datetime

import psycopg
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from sqlkit import observability
from sqlkit.observability import DeliveryTotals, EndpointHealth, QueueStatus

from ..formatting import age, count, rate, state_text
from ..live import LivePane
from ..rates import DeliveryRates
from ..widgets.chart import Chart, line_chart
from ..widgets.live_table import LiveTable

WINDOW_SECONDS = 300.0  # the charts show the last five minutes
HISTORY = 300  # samples kept for them: five minutes at the default 2 s poll, with room to spare


@dataclass(frozen=True)
class OverviewData:
    status: QueueStatus
    health: list[EndpointHealth]
    totals: dict[str, DeliveryTotals]


@dataclass(frozen=True)
class Sample:
    at: datetime
    delivered: int
    pending: int
    processing: int


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

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self.rates = DeliveryRates()

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
        return OverviewData(observability.queue_status(conn), observability.endpoint_health(conn),
                            observability.delivery_totals(conn))

    def show(self, data: OverviewData) -> None:
        now = self.courier.clock()
        protocols = {h.endpoint_name: h.protocol for h in data.health}
        self.rates.update(data.totals, now)
        depth = data.status.queue_depth
        delivered = sum(t.delivered for t in data.totals.values())
        if self.samples and now <= self.samples[-1].at:
            # Two polls at one instant (a fixed clock) keep the later; a clock set back starts over.
            if now < self.samples[-1].at:
                self.samples.clear()
            else:
                self.samples.pop()
        self.samples.append(Sample(now, delivered, depth.get("pending", 0), depth.get("processing", 0)))
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
        self._draw_charts()
        table = self.query_one("#overview-endpoints", LiveTable)
        table.sync(
            (e.endpoint, [e.endpoint, self._circuit(e.circuit, e.enabled, protocols.get(e.endpoint), colors),
                          count(e.pending),
                          count(e.processing), count(e.dlq_failed), rate(self.rates.of(e.endpoint))])
            for e in data.status.endpoints)

    def _tile(self, selector: str, label: str, value: str | Text) -> None:
        tile = self.query_one(selector, Static)
        tile.border_title = label
        text = value if isinstance(value, Text) else Text(value, style="bold")
        text.justify = "center"
        tile.update(text)

    @staticmethod
    def _circuit(circuit: str, enabled: bool, protocol: str | None, colors: dict[str, str]) -> Text:
        if not enabled:
            return state_text("disabled", colors)
        if protocol == "pull":  # a topic: consumers take its messages, no circuit guards them
            return Text("—", style="dim")
        return state_text(circuit, colors)

    def _draw_charts(self) -> None:
        """Both charts over the samples of the last WINDOW_SECONDS: the x axis in minutes
        before now, the y axis from 0 to a round number above the highest value. Until there
        are two points to join, each chart says it is collecting instead of drawing axes
        around nothing."""
        now = self.samples[-1].at
        samples = [s for s in self.samples if (now - s.at).total_seconds() <= WINDOW_SECONDS]
        # A rate needs two polls; the counters only grow, so a drop (a reset) counts as 0.
        rates = [((b.at - now).total_seconds(),
                  max(0, b.delivered - a.delivered) / (b.at - a.at).total_seconds())
                 for a, b in itertools.pairwise(samples) if b.at > a.at]
        depth_xs = [(s.at - now).total_seconds() for s in samples]
        throughput = self.query_one("#throughput-chart", Chart)
        if len(rates) < 2:
            throughput.wait("delivered/s")
        else:
            xs, ys = zip(*rates, strict=True)
            throughput.replot(lambda plt: line_chart(plt, "delivered/s", [("delivered", xs, ys)],
                                                     span=-depth_xs[0], whole=False))
        depth = self.query_one("#depth-chart", Chart)
        if len(samples) < 2:
            depth.wait("depth")
        else:
            depth.replot(lambda plt: line_chart(plt, "depth", [
                ("pending", depth_xs, [s.pending for s in samples]),
                ("in flight", depth_xs, [s.processing for s in samples])], span=-depth_xs[0]))
