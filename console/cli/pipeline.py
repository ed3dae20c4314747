"""`courier pipeline ...`: bulk work over the message history on Apache Spark (analytics,
export to Parquet, replay, ingest). Each command is a thin layer over console.pipeline."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from .context import common_options, console, database_url, emit, error_console, wants_json

DEFAULT_MASTER = os.environ.get("COURIER_SPARK_MASTER", "local[*]")


def spark_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--verbose", is_flag=True, help="Show Spark's own log output.")(func)
    return click.option("--master", default=DEFAULT_MASTER, show_default=True,
                        help="Spark master: local[N], or spark://host:port of a Spark 4 cluster.")(func)


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _session(master: str, verbose: bool) -> Any:
    from console.pipeline.session import get_session

    if not verbose and not wants_json():
        error_console.print(f"[dim]starting Spark ({master}); --verbose shows its log[/]", highlight=False)
    return get_session(master, verbose=verbose)


@click.group("pipeline")
def pipeline_group() -> None:
    """Bulk work over the message history on Apache Spark (needs Java 17 or 21)."""


@pipeline_group.command("analytics")
@click.option("--since", type=click.DateTime(), help="Messages completed at or after this (UTC); default: all.")
@click.option("--until", type=click.DateTime(), help="Messages completed before this (UTC); default: now.")
@spark_options
@common_options
def analytics_command(since: datetime | None, until: datetime | None, master: str, verbose: bool) -> None:
    """Per endpoint and hour: outcomes, latency percentiles, attempts and top error classes.

    Results go to courier.analytics_* tables (the console's Analytics pane draws them);
    running again over the same range replaces those hours."""
    from console.pipeline import analytics
    from console.pipeline.session import progress

    dsn = database_url()
    spark = _session(master, verbose)
    with progress(spark, "analysing the archive", enabled=not wants_json()):
        result = analytics.run(spark, dsn, _utc(since), _utc(until), master)
    rows = [{"endpoint": e.endpoint, "delivered": e.delivered, "failed": e.failed, "expired": e.expired,
             "dead_lettered": e.dead_lettered, "p50_ms": e.p50_ms, "p95_ms": e.p95_ms, "p99_ms": e.p99_ms}
            for e in result.endpoints]

    def render() -> None:
        since_text = result.range_from.strftime("%Y-%m-%d %H:%M") if result.range_from else "the beginning"
        table = Table(title=f"{result.rows_read:,} archived message(s) from {since_text} to "
                            f"{result.range_to:%Y-%m-%d %H:%M} UTC, {result.hours:,} endpoint-hour(s) stored "
                            f"(run {result.run_id})")
        for name in ("endpoint", "delivered", "failed", "expired", "dead_lettered", "p50_ms", "p95_ms", "p99_ms"):
            table.add_column(name.replace("_", " "), justify="left" if name == "endpoint" else "right")
        for row in rows:
            counts = (f"{row[k]:,}" for k in ("delivered", "failed", "expired", "dead_lettered"))
            table.add_row(row["endpoint"], *counts,
                          *("-" if row[k] is None else f"{row[k]:,.1f}" for k in ("p50_ms", "p95_ms", "p99_ms")))
        console.print(table)

    emit(rows, render)


COMMANDS = [pipeline_group]
