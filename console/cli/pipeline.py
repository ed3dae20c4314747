"""`courier pipeline ...`: bulk work over the message history on Apache Spark (analytics,
export to Parquet, replay, ingest). Each command is a thin layer over console.pipeline."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from .context import common_options, console, database_url, emit, error_console, print_table, wants_json

DEFAULT_MASTER = os.environ.get("COURIER_SPARK_MASTER", "local[*]")


def spark_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--verbose", is_flag=True,
                        help="Print each phase and Spark job with its time, and where this run's Spark log is "
                             "(stderr).")(func)
    return click.option("--master", default=DEFAULT_MASTER, show_default=True,
                        help="Spark master: local[N], or spark://host:port of a Spark 4 cluster.")(func)


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _begin(verbose: bool) -> Any:
    """Every pipeline command starts here: the spark extra checked (before pyspark is
    imported), then this run's clock and phases. Spark itself starts only if the job needs it
    (_session): an empty or tiny job is answered without it (console/pipeline/plan.py)."""
    from console.extras import require

    require("spark", "courier pipeline")
    from console.pipeline.session import start_run

    return start_run(verbose)


def _session(run: Any, master: str, verbose: bool, input_rows: int | None) -> Any:
    from console.pipeline.session import get_session, java_executable

    if not wants_json() and java_executable():
        size = "" if input_rows is None else f" for {input_rows:,} row(s)"
        more = f"Spark's log: {run.log_path}" if verbose else "--verbose shows where the time goes"
        error_console.print(Text(f"starting Spark ({master}){size}; {more}", style="dim"), highlight=False)
    return get_session(master, verbose=verbose, input_rows=input_rows)


def _without_spark(run: Any, rows: int) -> None:
    """Says (under --verbose) that this run needs no Spark, and why."""
    from console.pipeline.plan import tiny_rows

    if run.verbose and not wants_json():
        why = "nothing to read" if not rows else f"{rows:,} row(s), at most {tiny_rows():,}: done here"
        error_console.print(Text(f"no Spark: {why}", style="dim"), highlight=False)


def _finish(run: Any, spark: Any, before: set[int], what: str, rows: int) -> None:
    """The last line of every command (stderr): rows and time; under --verbose each Spark job first."""
    from console.pipeline.session import print_jobs

    if run.verbose and spark is not None:
        print_jobs(spark, before)
    if not wants_json():
        error_console.print(Text(f"{what}: {rows:,} row(s) in {run.elapsed:.1f} s", style="dim"), highlight=False)


def _progress(spark: Any, label: str) -> Any:
    import contextlib

    from console.pipeline.session import progress

    return contextlib.nullcontext() if spark is None else progress(spark, label, enabled=not wants_json())


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
    run = _begin(verbose)
    from console.pipeline import analytics
    from console.pipeline.plan import tiny
    from console.pipeline.session import job_ids, one_line_errors, progress

    dsn = database_url()
    range_from, range_to = analytics.bounds(_utc(since), _utc(until))
    size = analytics.count(dsn, range_from, range_to)
    spark, before = None, set()
    if tiny(size):  # the same aggregation in PostgreSQL: no Spark to start
        _without_spark(run, size)
        result = analytics.run(None, dsn, range_from, range_to, master, input_rows=size)
    else:
        spark = _session(run, master, verbose, size)
        before = job_ids(spark)
        with one_line_errors(), progress(spark, "analysing the archive", enabled=not wants_json()):
            result = analytics.run(spark, dsn, range_from, range_to, master, input_rows=size)
    rows = [{"endpoint": e.endpoint, "delivered": e.delivered, "failed": e.failed, "expired": e.expired,
             "dead_lettered": e.dead_lettered, "p50_ms": e.p50_ms, "p95_ms": e.p95_ms, "p99_ms": e.p99_ms}
            for e in result.endpoints]

    def render() -> None:
        since_text = result.range_from.strftime("%Y-%m-%d %H:%M") if result.range_from else "the beginning"
        table = Table(title=f"{result.rows_read:,} archived message(s) from {since_text} to "
                            f"{result.range_to:%Y-%m-%d %H:%M} UTC, {result.hours:,} endpoint-hour(s) stored "
                            f"(run {result.run_id})")
        table.add_column("endpoint", no_wrap=True)
        for header in ("delivered", "failed", "expired", "DLQ", "p50 ms", "p95 ms", "p99 ms"):
            table.add_column(header, justify="right", no_wrap=True)
        for row in rows:
            counts = (f"{row[k]:,}" for k in ("delivered", "failed", "expired", "dead_lettered"))
            table.add_row(row["endpoint"], *counts,
                          *("-" if row[k] is None else f"{row[k]:,.1f}" for k in ("p50_ms", "p95_ms", "p99_ms")))
        print_table(table)  # piped: whole values, as wide as they are

    emit(rows, render)
    _finish(run, spark, before, "analytics", result.rows_read)



@pipeline_group.command("export")
@click.option("--before", "older_than", required=True, type=click.DateTime(),
              help="Export whole months created before this (UTC).")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the Parquet files (month=YYYY-MM/endpoint=NAME/).")
@click.option("--drop", is_flag=True, help="Drop each month from the archive once its files are verified.")
@spark_options
@common_options
def export_command(older_than: datetime, to: Path, drop: bool, master: str, verbose: bool) -> None:
    """Archive months to Parquet, verified by row count and checksum, optionally dropped.

    Interrupted, it resumes: verified months are skipped and unverified files redone."""
    run = _begin(verbose)
    from console.pipeline import export
    from console.pipeline.session import job_ids, one_line_errors

    dsn = database_url()
    states = export.plan(dsn, _utc(older_than), to)
    size = export.rows_to_write(states)
    spark, before = None, set()
    if any(state.needs_spark for state in states):  # Parquet is written (and read back) by Spark
        spark = _session(run, master, verbose, size)
        before = job_ids(spark)
    else:
        _without_spark(run, 0)

    def report(month: export.MonthExport) -> None:
        if not wants_json():
            dropped = ", dropped from the archive" if month.dropped else ""
            console.print(f"{month.month}: {month.state}, {month.rows:,} row(s), checksum {month.checksum}{dropped}",
                          highlight=False)

    with one_line_errors(), _progress(spark, "exporting"):
        done = export.run(spark, dsn, _utc(older_than), to, drop=drop, on_month=report, input_rows=size,
                          states=states)
    emit([vars(m) for m in done], lambda: console.print(
        f"{len(done)} month(s) in {to}" if done else "no whole month of the archive is older than --before",
        highlight=False))
    _finish(run, spark, before, "export", sum(m.rows for m in done))


@pipeline_group.command("replay")
@click.option("--from", "source", type=click.Path(exists=True, path_type=Path),
              help="Replay from Parquet written by `courier pipeline export` (default: the archive).")
@click.option("--endpoint", "endpoints", multiple=True, help="Only this endpoint's messages (repeatable).")
@click.option("--since", type=click.DateTime(), help="Created at or after (UTC).")
@click.option("--until", type=click.DateTime(), help="Created before (UTC).")
@click.option("--status", "statuses", multiple=True, type=click.Choice(["completed", "failed", "expired"]),
              help="Only messages archived with this status (repeatable).")
@click.option("--correlation-id", "correlation_ids", multiple=True, help="Only these correlation ids (repeatable).")
@click.option("--where", "where", multiple=True, metavar="PREDICATE",
              help="A JSON-path test on the payload, e.g. '$.order.total > 100' (repeatable, all must hold).")
@click.option("--again", is_flag=True, help="Enqueue a fresh copy even of messages replayed before.")
@click.option("--dry-run", is_flag=True, help="Count what would be enqueued and what was replayed before, and stop.")
@spark_options
@common_options
def replay_command(source: Path | None, endpoints: tuple[str, ...], since: datetime | None, until: datetime | None,
                   statuses: tuple[str, ...], correlation_ids: tuple[str, ...], where: tuple[str, ...],
                   again: bool, dry_run: bool, master: str, verbose: bool) -> None:
    """Enqueue archived messages again, selected by endpoint, time, status, correlation id
    and payload. A message is replayed once: one replayed before (by this command, `courier
    archive replay`, replay-message or the console) is skipped unless --again."""
    run = _begin(verbose)
    from console.pipeline import predicates, replay
    from console.pipeline.session import job_ids, one_line_errors, progress

    for text in where:
        predicates.parse(text)  # a typo fails before Spark starts
    selection = replay.Selection(endpoints, _utc(since), _utc(until), statuses, correlation_ids, where)
    if source is not None:
        replay.check_source(source)
    from console.pipeline.plan import tiny

    dsn = database_url()
    spark, before = None, set()
    if source is None:
        # One SQL count first: a dry run's whole answer, and what decides whether Spark is needed.
        counted = replay.count(dsn, selection, dry_run=dry_run, again=again)
        size: int | None = counted.matched
        local = dry_run or tiny(size) or not counted.would_enqueue
    else:
        size = replay.source_rows(source)
        local = size == 0
        counted = replay.ReplayResult(0, 0, dry_run=dry_run, again=again)
    if local:
        _without_spark(run, counted.matched)
        result = replay.run_without_spark(dsn, selection, counted, dry_run=dry_run, again=again)
    else:
        spark = _session(run, master, verbose, size)
        before = job_ids(spark)
        with one_line_errors(), progress(spark, "replaying", enabled=not wants_json()):
            result = replay.run(spark, dsn, selection, source, dry_run=dry_run, again=again, input_rows=size)
    skipped = "copied again (--again)" if again else "skipped (--again enqueues fresh copies)"

    def render() -> None:
        if dry_run:
            console.print(f"would replay {result.would_enqueue:,} message(s): {result.matched:,} match, "
                          f"{result.already_replayed:,} replayed before, {skipped}", highlight=False)
        else:
            console.print(f"replayed {result.enqueued:,} message(s) of {result.matched:,} matching; "
                          f"{result.already_replayed:,} replayed before, {skipped}", highlight=False)

    emit({**vars(result), "would_enqueue": result.would_enqueue}, render)
    _finish(run, spark, before, "replay (dry run)" if dry_run else "replay", result.matched)


@pipeline_group.command("ingest")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--endpoint", required=True, help="The endpoint to enqueue the rows for.")
@click.option("--priority", type=click.IntRange(0, 10), default=0, show_default=True,
              help="For rows that do not set their own.")
@click.option("--format", "file_format", type=click.Choice(["jsonl", "csv", "parquet"]),
              help="Default: from the file name.")
@click.option("--envelope", is_flag=True,
              help="Each JSONL line or CSV row is a message: payload plus any of priority, scheduled_at, "
                   "idempotency_key, correlation_id, expires_at, ordering_key, headers, metadata.")
@spark_options
@common_options
def ingest_command(path: Path, endpoint: str, priority: int, file_format: str | None, envelope: bool,
                   master: str, verbose: bool) -> None:
    """Backfill the queue from a file: each JSONL line, CSV row (an object of its columns)
    or Parquet row (its payload column, or all columns) is one message. With --envelope (and
    always for Parquet with a payload column) a row also sets that message's own fields.

    Bad rows (any the send path refuses, with the reason it gives) are reported by line
    and skipped; good rows are enqueued once, even if the same file is ingested again, so a
    run that failed part way is finished by running it again. Exits 1 if any row was bad."""
    run = _begin(verbose)
    from console.pipeline import ingest
    from console.pipeline.session import job_ids, one_line_errors

    dsn = database_url()
    size = ingest.estimate_rows(path, file_format)
    spark, before = None, set()
    if ingest.needs_no_spark(path, file_format, size):  # checked and enqueued here
        _without_spark(run, size or 0)
    else:
        spark = _session(run, master, verbose, size)
        before = job_ids(spark)
    with one_line_errors(), _progress(spark, "ingesting"):
        result = ingest.run(spark, dsn, path, endpoint, priority=priority, file_format=file_format,
                            envelope=envelope, input_rows=size)

    def render() -> None:
        for problem in result.errors:
            error_console.print(f"{path.name}:{problem.line}: {problem.error}", highlight=False, markup=False)
        if result.bad > len(result.errors):
            error_console.print(f"... and {result.bad - len(result.errors):,} more bad row(s)", highlight=False)
        console.print(f"enqueued {result.enqueued:,} of {result.good:,} good row(s) for {endpoint}"
                      f"{'' if result.enqueued == result.good else ' (the rest were ingested before)'}; "
                      f"{result.bad:,} bad row(s) skipped", highlight=False)

    emit(vars(result), render)
    _finish(run, spark, before, "ingest", result.rows)
    if result.bad:
        sys.exit(1)


COMMANDS = [pipeline_group]
