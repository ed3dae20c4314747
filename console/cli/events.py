"""`courier events`: the event log (circuit transitions, endpoint and config changes,
redrives, replays, maintenance), newest last, optionally followed live."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import click
import psycopg
from rich.text import Text

from sqlkit import observability
from sqlkit.observability import Event

from ..literal import literal
from .context import (
    PAGE_SIZE,
    FiniteFloatRange,
    common_options,
    console,
    emit,
    field_names,
    open_connection,
    output_format,
    page_envelope,
    page_limit,
    paging_options,
    plain,
    stopped_early,
    text_row,
    when,
)


@click.command("events")
@paging_options("Print the events logged after event ID, oldest first (0: from the first event); the last id a "
                "page printed continues it. Without --after (or --all), the newest events.")
@click.option("--type", "event_type", help="Only events whose type starts with this, e.g. circuit or archive.replay.")
@click.option("--endpoint", help="Only this endpoint's events.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are logged (Ctrl-C stops).")
@click.option("--interval", type=FiniteFloatRange(0.1, 60), default=1.0, show_default=True,
              help="Seconds between looks for new events under --follow.")
@common_options
def events(limit: int | None, everything: bool, after: int | None, envelope: bool, event_type: str | None,
           endpoint: str | None, follow: bool, interval: float) -> None:
    """Show the event log, oldest first: the newest 50 events (or --limit N), every event
    (--all), or a page of the events after an id (--after ID). --json prints one JSON object
    per line, --output tsv or csv one row per event.

    When events matching the filters were left out, a note on stderr says which and how to
    get them (in every output format; stdout holds only the events). --json --envelope prints
    one object {"items": [...], "count": N, "more": true|false, "next_after": ID|null}
    instead of lines: with --after or --all, next_after continues the listing; for the newest
    events, more means older ones were left out, and next_after is null (--all or --after 0
    reads them)."""
    wanted = page_limit(limit, everything, envelope)
    if envelope and follow:
        raise click.UsageError("--envelope prints one object once; it cannot be combined with --follow")
    if output_format() in ("tsv", "csv"):
        sys.stdout.write(text_row(field_names(Event)))
    collected: list[Event] = []
    show = collected.append if envelope else _print
    with open_connection() as conn:
        if after is None and wanted is not None:
            newest, more = observability.latest_events_page(conn, wanted, event_type, endpoint)
            for event in newest:
                show(event)
            last_id, older = (newest[-1].id if newest else 0), True
        else:
            last_id, more = _print_after(conn, after or 0, wanted, event_type, endpoint, show)
            older = False
        next_after = last_id if more and not older else None
        if envelope:
            emit(page_envelope(collected, more, next_after))
        if more and not (follow and not older):  # --follow prints what follows a page anyway
            stopped_early("events", wanted or 0, next_after, older=older)
        while follow:
            time.sleep(interval)
            for event in observability.events_after(conn, last_id, event_type, endpoint):
                _print(event)
                last_id = event.id


def _print_after(conn: psycopg.Connection, after: int, wanted: int | None, event_type: str | None,
                 endpoint: str | None, show: Callable[[Event], None]) -> tuple[int, bool]:
    """Show the events after `after`: `wanted` of them, or (None) every one, a page at a time
    as they are read. Returns the last id shown (else `after`) and whether more follow it."""
    while True:
        page, more = observability.events_after_page(conn, after, wanted or PAGE_SIZE, event_type, endpoint)
        for event in page:
            show(event)
        after = page[-1].id if page else after
        if wanted is not None or not more or not page:
            return after, more


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
