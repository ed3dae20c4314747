"""`courier archive ...`: the monthly archive partitions, the messages in them, and replays out
of the archive."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import click
from rich.filesize import decimal
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sqlkit import archive
from sqlkit.archive import ReplayRange

from .context import (
    ROW_ID,
    common_options,
    console,
    emit,
    field_names,
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

REPLAY_BATCH = 1000
STATUSES = ["completed", "failed", "expired", "cancelled", "purged"]


@click.group("archive")
def archive_group() -> None:
    """Finished messages, partitioned by month, and replaying them."""


@archive_group.command("partitions")
@click.option("--exact", is_flag=True, help="Count every partition's rows (a scan) instead of estimating.")
@common_options
def partitions(exact: bool) -> None:
    """Each monthly partition with its row count and size."""
    with open_connection() as conn:
        found = archive.partitions(conn)
        rows = [{**vars(p), "rows": archive.count_partition(conn, p.partition_name) if exact else p.estimated_rows}
                for p in found]

    def render() -> None:
        table = Table(title=f"{len(rows)} archive partition(s)",
                      caption=None if exact else "rows are planner estimates; --exact counts them")
        table.add_column("partition", no_wrap=True)
        table.add_column("from (UTC)")
        table.add_column("to (UTC)")
        table.add_column("rows" if exact else "rows (est.)", justify="right")
        table.add_column("size", justify="right")
        for row in rows:
            table.add_row(row["partition_name"], _day(row["range_from"]), _day(row["range_to"]),
                          f"{row['rows']:,}", decimal(row["total_bytes"]))
        print_table(table)

    emit(rows, render, columns=[*field_names(archive.ArchivePartition), "rows"])


@archive_group.command("list")
@click.option("--endpoint", help="Only this endpoint's messages.")
@click.option("--status", type=click.Choice(STATUSES), help="Only messages that ended in this status.")
@click.option("--from", "from_ts", type=click.DateTime(), help="Created at or after (UTC).")
@click.option("--to", "to_ts", type=click.DateTime(), help="Created before (UTC).")
@click.option("--ordering-key", help="Only messages with this ordering key.")
@click.option("--correlation-id", type=click.UUID, help="Only messages with this correlation id.")
@paging_options("Continue after archive ID (the last one the previous page printed): the messages older than it. "
                "Messages archived meanwhile do not shift the pages.")
@common_options
def list_command(endpoint: str | None, status: str | None, from_ts: datetime | None, to_ts: datetime | None,
                 ordering_key: str | None, correlation_id: UUID | None, limit: int | None, everything: bool,
                 after: int | None, envelope: bool) -> None:
    """Archived messages, newest first, 50 unless --limit or --all says otherwise, with the ids
    `courier archive replay-message` takes.

    Payloads are left out (in every format); errors are redacted. When more messages match
    than were printed, a note on stderr says so and gives the --after ID that prints the next
    page (in every output format; stdout holds only the data). --json prints the list; add
    --envelope to get {"items": [...], "count": N, "more": true|false, "next_after": ID|null}
    instead.

    An endpoint's page is quick while its messages are frequent among the newest; --from and
    --to narrow the partitions read."""
    wanted = page_limit(limit, everything, envelope)
    if from_ts is not None and to_ts is not None and from_ts >= to_ts:
        raise click.BadParameter("must be later than --from", param_hint="--to")
    with open_connection() as conn:
        chosen = archive.ArchiveFilter(
            endpoint_id=archive.endpoint_id(conn, endpoint) if endpoint is not None else None, status=status,
            from_ts=_utc(from_ts) if from_ts else None, to_ts=_utc(to_ts) if to_ts else None,
            correlation_id=correlation_id, ordering_key=ordering_key)
        rows, more = read_pages(lambda cursor, n: archive.list_messages_page(conn, chosen, n, cursor), after, wanted)
    next_after = rows[-1].id if more and rows else None

    def render() -> None:
        noun = f"archived message{'' if len(rows) == 1 else 's'}"
        where = f" after {after}" if after is not None else ""
        table = Table(title=f"first {len(rows)} {noun}{where} (more follow)" if more else f"{len(rows)} {noun}{where}")
        table.add_column("id", justify="right")
        table.add_column("endpoint", no_wrap=True)
        table.add_column("status")
        table.add_column("tries", justify="right")
        table.add_column("created", no_wrap=True)
        table.add_column("finished", no_wrap=True)
        table.add_column("last error", overflow="ellipsis", max_width=36)
        for row in rows:
            table.add_row(str(row.id), row.endpoint_name, row.status, str(row.retry_count), when(row.created_at),
                          when(row.completed_at), row.last_error or "")
        print_table(table)

    if envelope:
        emit(page_envelope(rows, more, next_after))
    else:
        emit(rows, render, columns=archive.ArchivedMessage)
    if more:
        stopped_early("archived messages", len(rows), next_after)


@archive_group.command("replay")
@click.option("--endpoint", required=True, help="The endpoint whose archived messages to replay.")
@click.option("--from", "from_ts", required=True, type=click.DateTime(), help="Created at or after (UTC).")
@click.option("--to", "to_ts", required=True, type=click.DateTime(), help="Created before (UTC).")
@click.option("--status", type=click.Choice(STATUSES),
              help="Only messages that ended in this status (default: every status but cancelled and purged).")
@click.option("--again", is_flag=True, help="Enqueue a fresh copy even of messages replayed before.")
@click.option("--dry-run", is_flag=True, help="Count what would be enqueued and what was replayed before, and stop.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=REPLAY_BATCH, show_default=True,
              help="Archived messages walked per transaction.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def replay(endpoint: str, from_ts: datetime, to_ts: datetime, status: str | None, again: bool, dry_run: bool,
           batch_size: int, yes: bool) -> None:
    """Enqueue archived messages again, as new pending messages.

    A message is replayed once: one replayed before (by this command, replay-message, the
    console or `courier pipeline replay`) is skipped unless --again asks for a fresh copy.
    The replay runs in batches, each in its own short transaction; interrupted, it resumes
    where it stopped when run again with the same range.
    """
    if from_ts >= to_ts:
        raise click.BadParameter("must be later than --from", param_hint="--to")
    with open_connection() as conn:
        chosen = ReplayRange(archive.endpoint_id(conn, endpoint), _utc(from_ts), _utc(to_ts), status, again)
        counted = archive.count_replayable(conn, chosen)
        total = counted.would_enqueue
        resumed = archive.running_replay(conn, chosen)
        summary = {"endpoint": endpoint, "from": chosen.from_ts, "to": chosen.to_ts, "status": status, "again": again,
                   "resumed_replay_id": resumed.id if resumed else None,
                   "already_replayed": counted.already_replayed}
        if dry_run:
            notes = _skipped_note(counted, again) + _resume_note(resumed)
            emit({**summary, "would_replay": total}, lambda: console.print(
                f"would replay {total:,} message(s) of {endpoint}{notes}", highlight=False))
            return
        if total and not yes and not machine_output():
            click.confirm(f"Replay {total:,} message(s) of {endpoint}{_resume_note(resumed)}?", abort=True)
        done = 0
        with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=machine_output() or total == 0) as progress:
            task = progress.add_task("replay", total=total)
            finished = False
            while not finished:
                n, finished = archive.replay_batch(conn, chosen, batch_size)
                done += n
                progress.update(task, completed=done)
    emit({**summary, "replayed": done},
         lambda: console.print(f"replayed {done:,} message(s) of {endpoint}{_skipped_note(counted, again)}",
                               highlight=False))


@archive_group.command("replay-message")
@click.argument("archive_id", type=ROW_ID)
@click.option("--again", is_flag=True, help="Enqueue a fresh copy even if the message was replayed before.")
@common_options
def replay_message(archive_id: int, again: bool) -> None:
    """Enqueue one archived message again; prints the new message's id. A message replayed
    before is not enqueued again (its earlier copy is named) unless --again."""
    with open_connection() as conn:
        copy = archive.replay_message(conn, archive_id, again)
    as_message = "" if copy.message_id is None else f" as message {copy.message_id}"
    emit({"archive_id": archive_id, "message_id": copy.message_id, "enqueued": copy.enqueued},
         lambda: console.print(f"replayed archived message {archive_id}{as_message}" if copy.enqueued else
                               f"archived message {archive_id} was replayed before{as_message}; nothing enqueued "
                               "(--again enqueues a fresh copy)", highlight=False))


def _skipped_note(counted: archive.ReplayCount, again: bool) -> str:
    if not counted.already_replayed:
        return ""
    if again:
        return f"; {counted.already_replayed:,} of them replayed before, copied again (--again)"
    return f"; {counted.already_replayed:,} replayed before, skipped (--again enqueues fresh copies)"


def _utc(value: datetime) -> datetime:
    """click parses naive datetimes; the archive's months are UTC, so read them as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _resume_note(resumed: archive.RunningReplay | None) -> str:
    if resumed is None:
        return ""
    return f" (resuming replay #{resumed.id})"


def _day(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d")


COMMANDS = [archive_group]
