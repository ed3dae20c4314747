"""`courier dlq ...`: browse, redrive and clean up the dead-letter queue."""

from __future__ import annotations

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sqlkit import dlq, exact_json

from .context import (
    common_options,
    console,
    emit,
    machine_output,
    open_connection,
    page_envelope,
    page_limit,
    paging_options,
    print_table,
    read_pages,
    stopped_early,
    when,
)

REDRIVE_BATCH = 1000


@click.group("dlq")
def dlq_group() -> None:
    """The dead-letter queue: messages that failed permanently or ran out of retries."""


@dlq_group.command("list")
@click.option("--endpoint", help="Only this endpoint's entries.")
@click.option("--status", type=click.Choice(["failed", "redriven", "acked"]), help="Only entries in this state.")
@paging_options("Continue after entry ID (the last one the previous page printed): the entries older than it. "
                "New entries do not shift the pages.")
@common_options
def list_command(endpoint: str | None, status: str | None, limit: int | None, everything: bool, after: int | None,
                 envelope: bool) -> None:
    """Newest entries first, 50 unless --limit or --all says otherwise.

    When more entries match than were printed, a note on stderr says so and gives the
    --after ID that prints the next page (in every output format; stdout holds only the
    data). --json prints the list of entries as it always has; add --envelope to get
    {"items": [...], "count": N, "more": true|false, "next_after": ID|null} instead, so a
    script can tell a full page from the whole DLQ."""
    wanted = page_limit(limit, everything, envelope)
    with open_connection() as conn:
        rows, more = read_pages(lambda cursor, n: dlq.list_entries_page(conn, endpoint, status, n, cursor),
                                after, wanted)
    next_after = rows[-1].id if more and rows else None

    def render() -> None:
        table = Table(title=_title(len(rows), more, after))
        table.add_column("id", justify="right")
        table.add_column("endpoint", no_wrap=True)
        table.add_column("status")
        table.add_column("tries", justify="right")
        table.add_column("failed at", no_wrap=True)
        table.add_column("last error", overflow="ellipsis", max_width=36)
        for row in rows:
            table.add_row(str(row.id), row.endpoint_name, row.status, str(row.retry_count),
                          when(row.failed_at), row.last_error or "")
        print_table(table)

    if envelope:
        emit(page_envelope(rows, more, next_after))
    else:
        emit(rows, render, columns=dlq.DlqEntry)
    if more:
        stopped_early("DLQ entries", len(rows), next_after)


def _title(shown: int, more: bool, after: int | None) -> str:
    """What the table holds, claiming no total it does not know: with more to come, a page."""
    noun = f"DLQ entr{'y' if shown == 1 else 'ies'}"
    where = f" after {after}" if after is not None else ""
    return f"first {shown} {noun}{where} (more follow)" if more else f"{shown} {noun}{where}"


@dlq_group.command("show")
@click.argument("dlq_id", type=click.IntRange(1, 9_223_372_036_854_775_807))
@common_options
def show(dlq_id: int) -> None:
    """One entry with its payload, headers and every attempt's error."""
    with open_connection() as conn:
        row = dlq.get(conn, dlq_id)

    def render() -> None:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for key in ("id", "original_message_id", "endpoint_name", "status", "retry_count", "correlation_id",
                    "ordering_key", "original_created_at", "failed_at", "redriven_at", "redriven_message_id"):
            value = getattr(row, key)
            grid.add_row(key, str(value) if value is not None else "-")
        grid.add_row("payload", exact_json.dumps_like(row.payload, indent=2))
        grid.add_row("headers", exact_json.dumps_like(row.headers, indent=2))
        history = Table("attempt", "at", "outcome", "error", title="error history")
        for attempt in row.error_history:
            history.add_row(str(attempt.get("attempt")), str(attempt.get("at")), str(attempt.get("outcome", "")),
                            str(attempt.get("error")))
        print_table(grid, history)

    emit(row, render)


@dlq_group.command("summary")
@common_options
def summary() -> None:
    """Failed and redriven counts per endpoint."""
    with open_connection() as conn:
        rows = dlq.summary(conn)

    def render() -> None:
        table = Table("endpoint", "failed", "redriven", "oldest failure", "newest failure", title="DLQ")
        for row in rows:
            table.add_row(row.endpoint_name, str(row.failed_count), str(row.redriven_count),
                          when(row.oldest_failure), when(row.newest_failure))
        print_table(table)

    emit(rows, render, columns=dlq.DlqSummary)


@dlq_group.command("redrive")
@click.argument("dlq_ids", type=click.IntRange(1, 9_223_372_036_854_775_807), nargs=-1)
@click.option("--endpoint", help="Redrive every failed entry of this endpoint.")
@click.option("--all", "everything", is_flag=True, help="Redrive every failed entry.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def redrive(dlq_ids: tuple[int, ...], endpoint: str | None, everything: bool, yes: bool) -> None:
    """Re-queue DLQ entries by id, for an endpoint, or all of them."""
    chosen = sum(bool(x) for x in (dlq_ids, endpoint, everything))
    if chosen != 1:
        raise click.UsageError("give DLQ ids, --endpoint NAME or --all (exactly one)")
    with open_connection() as conn:
        if dlq_ids:
            requeued = [dlq.redrive_message(conn, i) for i in dlq_ids]
            emit({"redriven": len(requeued), "message_ids": requeued},
                 lambda: console.print(f"redrove {len(requeued)} entr{'y' if len(requeued) == 1 else 'ies'} "
                                       f"as message(s) {', '.join(map(str, requeued))}", highlight=False))
            return
        total = dlq.failed_count(conn, endpoint)
        scope = f"endpoint {endpoint}" if endpoint else "all endpoints"
        if total and not yes and not machine_output():
            click.confirm(f"Redrive {total} failed message(s) of {scope}?", abort=True)
        with Progress(TextColumn("redriving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=machine_output() or total == 0) as progress:
            task = progress.add_task("redrive", total=total)
            done = dlq.redrive_everything(conn, endpoint, REDRIVE_BATCH,
                                          progress=lambda so_far: progress.update(task, completed=so_far))
    emit({"redriven": done, "scope": scope}, lambda: console.print(f"redrove {done} message(s) of {scope}",
                                                                    highlight=False))


@dlq_group.command("cleanup")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def cleanup(yes: bool) -> None:
    """Delete entries older than dlq_retention_days, after asking (as redrive does)."""
    with open_connection() as conn:
        due = dlq.cleanup_due(conn)
        if due and not yes and not machine_output():
            click.confirm(f"Delete {due} DLQ entr{'y' if due == 1 else 'ies'} older than dlq_retention_days "
                          "for good?", abort=True)
        deleted = dlq.cleanup(conn) if due else 0
    emit({"deleted": deleted}, lambda: console.print(f"deleted {deleted} DLQ entr{'y' if deleted == 1 else 'ies'}"))


COMMANDS = [dlq_group]
