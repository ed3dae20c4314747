"""`courier events`: the event log (circuit transitions, endpoint and config changes,
redrives, replays, maintenance), newest last, optionally followed live."""

from __future__ import annotations

import json
import sys
import time

import click
from rich.text import Text

from sqlkit import observability
from sqlkit.observability import Event

from ..literal import literal
from .context import (
    FiniteFloatRange,
    common_options,
    console,
    field_names,
    open_connection,
    output_format,
    plain,
    text_row,
    when,
)


@click.command("events")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="How many of the newest events to show first.")
@click.option("--type", "event_type", help="Only events whose type starts with this, e.g. circuit or archive.replay.")
@click.option("--endpoint", help="Only this endpoint's events.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are logged (Ctrl-C stops).")
@click.option("--interval", type=FiniteFloatRange(0.1, 60), default=1.0, show_default=True,
              help="Seconds between looks for new events under --follow.")
@common_options
def events(limit: int, event_type: str | None, endpoint: str | None, follow: bool, interval: float) -> None:
    """Show the event log; --json prints one JSON object per line, --output tsv or csv one row per event."""
    if output_format() in ("tsv", "csv"):
        sys.stdout.write(text_row(field_names(Event)))
    with open_connection() as conn:
        shown = observability.latest_events(conn, limit, event_type, endpoint)
        for event in shown:
            _print(event)
        last_id = shown[-1].id if shown else 0
        while follow:
            time.sleep(interval)
            for event in observability.events_after(conn, last_id, event_type, endpoint):
                _print(event)
                last_id = event.id


def _print(event: Event) -> None:
    chosen = output_format()
    if chosen != "table":
        sys.stdout.write(json.dumps(plain(event)) + "\n" if chosen == "json"
                         else text_row(getattr(event, name) for name in field_names(Event)))
        sys.stdout.flush()
        return
    line = Text.assemble((when(event.created_at), "dim"), f" #{event.id} ", literal(event.event_type, "cyan"))
    if event.endpoint:
        line.append(" ").append(literal(event.endpoint, "bold"))
    if event.details:
        line.append(" ").append(literal(json.dumps(event.details, default=str)))
    console.print(line, highlight=False, soft_wrap=True)


COMMANDS = [events]
