"""`courier archive ...`: the monthly archive partitions, and replays out of the archive."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from rich.filesize import decimal
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sqlkit import archive
from sqlkit.archive import ReplayRange

from .context import common_options, console, emit, open_connection, wants_json

REPLAY_BATCH = 1000
STATUSES = ["completed", "failed", "expired"]


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
        console.print(table)

    emit(rows, render)


@archive_group.command("replay")
@click.option("--endpoint", required=True, help="The endpoint whose archived messages to replay.")
@click.option("--from", "from_ts", required=True, type=click.DateTime(), help="Created at or after (UTC).")
@click.option("--to", "to_ts", required=True, type=click.DateTime(), help="Created before (UTC).")
@click.option("--status", type=click.Choice(STATUSES), help="Only messages that ended in this status.")
@click.option("--dry-run", is_flag=True, help="Count what would be replayed, and stop.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=REPLAY_BATCH, show_default=True,
              help="Messages enqueued per transaction.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def replay(endpoint: str, from_ts: datetime, to_ts: datetime, status: str | None, dry_run: bool,
           batch_size: int, yes: bool) -> None:
    """Enqueue archived messages again, as new pending messages.

    The replay runs in batches, each in its own short transaction. Interrupted, it resumes
    where it stopped when run again with the same range, without enqueueing anything twice.
    """
    if from_ts >= to_ts:
        raise click.BadParameter("must be later than --from", param_hint="--to")
    with open_connection() as conn:
        chosen = ReplayRange(archive.endpoint_id(conn, endpoint), _utc(from_ts), _utc(to_ts), status)
        total = archive.count_replayable(conn, chosen)
        resumed = archive.running_replay(conn, chosen)
        summary = {"endpoint": endpoint, "from": chosen.from_ts, "to": chosen.to_ts, "status": status,
                   "resumed_replay_id": resumed.id if resumed else None,
                   "already_replayed": resumed.replayed if resumed else 0}
        if dry_run:
            emit({**summary, "would_replay": total}, lambda: console.print(
                f"would replay {total:,} message(s) of {endpoint}{_resume_note(resumed)}", highlight=False))
            return
        if total and not yes and not wants_json():
            click.confirm(f"Replay {total:,} message(s) of {endpoint}{_resume_note(resumed)}?", abort=True)
        done = 0
        with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=wants_json() or total == 0) as progress:
            task = progress.add_task("replay", total=total)
            while True:
                n = archive.replay_batch(conn, chosen, batch_size)
                done += n
                progress.update(task, completed=done)
                if n < batch_size:
                    break
    emit({**summary, "replayed": done},
         lambda: console.print(f"replayed {done:,} message(s) of {endpoint}", highlight=False))


@archive_group.command("replay-message")
@click.argument("archive_id", type=int)
@common_options
def replay_message(archive_id: int) -> None:
    """Enqueue one archived message again; prints the new message's id."""
    with open_connection() as conn:
        message_id = archive.replay_message(conn, archive_id)
    emit({"archive_id": archive_id, "message_id": message_id},
         lambda: console.print(f"replayed archived message {archive_id} as message {message_id}", highlight=False))


def _utc(value: datetime) -> datetime:
    """click parses naive datetimes; the archive's months are UTC, so read them as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _resume_note(resumed: archive.RunningReplay | None) -> str:
    if resumed is None:
        return ""
    return f" (resuming replay #{resumed.id}, {resumed.replayed:,} already replayed)"


def _day(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d")


COMMANDS = [archive_group]
