"""Analytics: charts of the Spark pipeline's results; until the pipeline exists, an empty
state that says how to get them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Center, Middle
from textual.widgets import Static

from ..live import LivePane

EMPTY_STATE = """[b]No analytics yet[/b]

Analytics are computed by Courier's Spark pipeline over the message history: \
per endpoint and hour, delivered, failed, expired and dead-lettered counts, \
latency percentiles, attempt histograms and the top error classes.

Run [b]courier pipeline analytics[/b] to compute them; the results land in \
PostgreSQL and are charted here.

[dim]The pipeline is not part of this release yet.[/dim]"""


class AnalyticsPane(LivePane):
    TITLE_TEXT = "Analytics"
    REFRESH_SECONDS = 30.0
    DEFAULT_CSS = """
    AnalyticsPane #analytics-empty { width: auto; max-width: 78; border: round $primary-muted; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        with Middle(), Center():
            yield Static(EMPTY_STATE, id="analytics-empty")
