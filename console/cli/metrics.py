"""`courier metrics`: metrics() as a table, as JSON, or in Prometheus text exposition."""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from console.prometheus import exposition
from sqlkit import observability

from .context import common_options, emit, open_connection, print_table


@click.command("metrics")
@click.option("--prometheus", is_flag=True, help="Print Prometheus text exposition, ready for a scrape.")
@common_options
def metrics(prometheus: bool) -> None:
    """Every gauge and counter of courier.metrics()."""
    with open_connection() as conn:
        found = observability.metrics(conn)
    if prometheus:
        sys.stdout.write(exposition(found))
        return

    def render() -> None:
        table = Table(title=f"{len(found)} metric(s)")
        table.add_column("metric", no_wrap=True)
        table.add_column("labels")
        table.add_column("value", justify="right")
        table.add_column("type")
        for m in found:
            table.add_row(m.metric_name, json.dumps(m.labels) if m.labels else "", f"{m.metric_value:,.6g}",
                          m.metric_type)
        print_table(table)

    emit(found, render, columns=observability.Metric)


COMMANDS = [metrics]
