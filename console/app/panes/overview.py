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
from ..widgets.chart import Chart
from ..widgets.live_table import LiveTable

HISTORY = 120  # samples kept for the charts (4 minutes at the default 2 s poll)


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
    OverviewPane #charts { height: 9; }
    OverviewPane Chart { width: 1fr; height: 9; }
    OverviewPane #overview-endpoints { height: 1fr; }
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
        self.rates.update(data.totals, now)
        depth = data.status.queue_depth
        delivered = sum(t.delivered for t in data.totals.values())
        self.samples.append(Sample(now, delivered, depth.get("pending", 0), depth.get("processing", 0)))
        oldest = min((h.oldest_pending_message for h in data.health if h.oldest_pending_message), default=None)
        colors = self.app.get_css_variables()
        self._tile("#tile-pending", "pending", count(depth.get("pending", 0)))
        self._tile("#tile-processing", "in flight", count(depth.get("processing", 0)))
        self._tile("#tile-oldest", "oldest", age((now - oldest).total_seconds()) if oldest else "-")
        dlq_style = f"bold {colors['text-error']}" if data.status.dlq_depth else "bold"
        dlq = Text(count(data.status.dlq_depth), style=dlq_style)
        self._tile("#tile-dlq", "DLQ", dlq)
        alive = [w for w in data.status.workers if (now - w.last_heartbeat).total_seconds() < 30]
        leader = any(w.maintenance_leader for w in alive)
        self._tile("#tile-workers", "workers", f"{len(alive)}{' ★' if leader else ''}")
        self._draw_charts()
        table = self.query_one("#overview-endpoints", LiveTable)
        table.sync(
            (e.endpoint, [e.endpoint, state_text(e.circuit if e.enabled else "disabled", colors), count(e.pending),
                          count(e.processing), count(e.dlq_failed), rate(self.rates.of(e.endpoint))])
            for e in data.status.endpoints)

    def _tile(self, selector: str, label: str, value: str | Text) -> None:
        tile = self.query_one(selector, Static)
        tile.border_title = label
        text = value if isinstance(value, Text) else Text(value, style="bold")
        text.justify = "center"
        tile.update(text)

    def _draw_charts(self) -> None:
        samples = list(self.samples)
        now = samples[-1].at
        xs = [(s.at - now).total_seconds() for s in samples]
        throughput = [0.0] + [max(0, b.delivered - a.delivered) / max((b.at - a.at).total_seconds(), 1e-9)
                              for a, b in itertools.pairwise(samples)]
        for widget_id, title, series in (
            ("#throughput-chart", "delivered/s", [("delivered", throughput)]),
            ("#depth-chart", "depth", [("pending", [s.pending for s in samples]),
                                       ("in flight", [s.processing for s in samples])]),
        ):
            def draw(plt, title=title, series=series) -> None:
                plt.title(title)
                for label, ys in series:
                    plt.plot(xs, ys, label=label if len(series) > 1 else None, marker="braille")
                plt.xlabel("seconds ago")
            self.query_one(widget_id, Chart).replot(draw)
