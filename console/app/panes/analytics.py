"""Analytics: the Spark pipeline's results (courier pipeline analytics), read back from
PostgreSQL: a summary per endpoint over the analysed range and deliveries per hour."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import psycopg
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Center, Middle
from textual.widgets import Static

from sqlkit import analytics
from sqlkit.analytics import AnalyticsRun, HourlyStats

from ...literal import printable
from ..formatting import count, to_the_minute
from ..live import LivePane
from ..widgets.chart import Chart, line_chart
from ..widgets.live_table import LiveTable

CHART_HOURS = 48

EMPTY_STATE = (
    "[b]No analytics yet[/b]\n\n"
    "Analytics are computed by Courier's Spark pipeline over the message history: "
    "per endpoint and hour, delivered, failed, expired and dead-lettered counts, "
    "latency percentiles, attempt histograms and the top error classes.\n\n"
    "Run [b]courier pipeline analytics[/b] to compute them; the results land in "
    "PostgreSQL and are charted here."
)


@dataclass(frozen=True)
class AnalyticsData:
    run: AnalyticsRun | None
    hourly: list[HourlyStats]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


class AnalyticsPane(LivePane):
    TITLE_TEXT = "Analytics"
    REFRESH_SECONDS = 30.0
    DEFAULT_CSS = """
    AnalyticsPane #analytics-empty { width: auto; max-width: 78; border: round $primary-muted; padding: 1 2; }
    AnalyticsPane #analytics-run {
        height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis;
    }
    AnalyticsPane #analytics-chart { height: 2fr; min-height: 10; }
    AnalyticsPane .-hidden { display: none; }
    """

    def compose(self) -> ComposeResult:
        with Middle(id="analytics-empty-box"), Center():
            yield Static(EMPTY_STATE, id="analytics-empty")
        yield Static(id="analytics-run", classes="-hidden")
        yield Chart(id="analytics-chart", classes="-hidden")
        yield LiveTable([("endpoint", "endpoint"), ("delivered", "delivered"), ("failed", "failed"),
                         ("expired", "expired"), ("dead_lettered", "dlq"), ("p50", "p50 ms"), ("p95", "p95 ms"),
                         ("p99", "p99 ms")], id="analytics-table", classes="-hidden")

    def fetch(self, conn: psycopg.Connection) -> AnalyticsData:
        run = analytics.latest_run(conn)
        if run is None:
            return AnalyticsData(None, [])
        return AnalyticsData(run, analytics.hourly(conn, run.range_to - timedelta(hours=CHART_HOURS)))

    def show(self, data: AnalyticsData) -> None:
        has_run = data.run is not None
        self.query_one("#analytics-empty-box").set_class(has_run, "-hidden")
        for selector in ("#analytics-run", "#analytics-chart", "#analytics-table"):
            self.query_one(selector).set_class(not has_run, "-hidden")
        if data.run is None:
            return
        run, tz = data.run, self.courier.tz
        self.query_one("#analytics-run", Static).update(Text(printable(
            f"run {run.id} on {run.master}: {count(run.rows_read)} archived messages, "
            f"{to_the_minute(run.range_from, tz) if run.range_from else 'the start'} "
            f"to {to_the_minute(run.range_to, tz)}, "
            f"finished {to_the_minute(run.finished_at, tz)}"), no_wrap=True, overflow="ellipsis"))
        self.query_one(LiveTable).sync(
            (str(e["endpoint"]), [str(e["endpoint"]), count(e["delivered"]), count(e["failed"]), count(e["expired"]),
                                  count(e["dead_lettered"]), _ms(e["p50_ms"]), _ms(e["p95_ms"]), _ms(e["p99_ms"])])
            for e in run.endpoints)
        self._chart(data.hourly, run)

    def _chart(self, hourly: list[HourlyStats], run: AnalyticsRun) -> None:
        end = run.range_to
        series: dict[str, dict[float, int]] = {}
        for row in hourly:
            series.setdefault(row.endpoint, {})[(row.hour - end).total_seconds() / 3600] = row.delivered
        chart = self.query_one(Chart)
        if not any(len(points) > 1 for points in series.values()):
            chart.wait("delivered per hour", "fewer than two hours analysed")
            return
        span = -min(x for points in series.values() for x in points)
        lines = [(endpoint, sorted(points), [points[x] for x in sorted(points)])
                 for endpoint, points in sorted(series.items())]
        chart.replot(lambda plt: line_chart(plt, "delivered per hour, hours before the end of the run", lines,
                                            span=span, hours=True))
