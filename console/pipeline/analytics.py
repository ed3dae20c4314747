"""`courier pipeline analytics`: per endpoint and UTC hour of completion, the outcomes,
latency percentiles, attempts and top error classes of archived messages, written back to
PostgreSQL (replacing the hours analysed, so re-runs never duplicate rows)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit.connection import connect

from .session import phase, small_input
from .source import load

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOP_ERRORS = 5
ERROR_ENTRY = "array<struct<outcome:string,error:string>>"
HOURLY = ("endpoint_id", "hour", "delivered", "failed", "expired", "dead_lettered", "p50_ms", "p95_ms", "p99_ms",
          "run_id")
COLUMNS = "endpoint_id,status,retry_count,error_history,completed_at,created_at"
# Error classes as courier.error_class() (functions/observability.sql) derives them: the
# monitor role reads them, so they are words of Courier's, never an application's text.
NOT_DELIVERY_ENDINGS = ("expired", "cancelled", "purged")
"""Archived statuses left out of the attempts histogram: the message's deliveries did not end it
(it expired, or was cancelled or purged, issue 42); its failed attempts still count."""
OUTCOMES_OF_THEIR_OWN_CLASS = ("nack", "receive_failed", "stale", "lease_expired")
WORKER_OUTCOMES = ("retryable", "permanent", "disable")
HTTP_STATUS = r"^(\[[A-Z]+\] )?(HTTP [0-9]{3})"
ERROR_CLASSES = (("timeout|timed out", "timeout"), ("back-pressure", "back-pressure"),
                 ("too large|larger than", "too large"), ("connection", "connection"),
                 ("internal address", "internal address"), ("refused|denied|permission", "refused"),
                 ("not found|does not exist|no jetstream stream", "not found"))


@dataclass(frozen=True)
class EndpointSummary:
    endpoint: str
    endpoint_id: int
    delivered: int
    failed: int
    expired: int
    dead_lettered: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class AnalyticsResult:
    run_id: int
    range_from: datetime | None
    range_to: datetime
    rows_read: int
    hours: int
    endpoints: list[EndpointSummary]


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _outcomes(df: DataFrame, *keys: str, rows: bool = False) -> DataFrame:
    from pyspark.sql import functions as F

    def percentile(p: float) -> Any:
        return F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY latency_us)") / F.lit(1000.0)

    return df.groupBy(*keys).agg(
        F.count_if(F.col("status") == "completed").alias("delivered"),
        F.coalesce(F.sum("failures"), F.lit(0)).cast("long").alias("failed"),
        F.count_if(F.col("status") == "expired").alias("expired"),
        F.count_if(F.col("status") == "failed").alias("dead_lettered"),
        percentile(0.5).alias("p50_ms"), percentile(0.95).alias("p95_ms"), percentile(0.99).alias("p99_ms"),
        *([F.count(F.lit(1)).alias("rows")] if rows else []))


def compute(spark: SparkSession, dsn: str, since: datetime | None, until: datetime, *,
            local: bool = False) -> dict[str, Any]:
    """The job's results as plain rows: hourly, attempts, errors, summary, rows_read. local: a
    small archive, read in the driver (source.load)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    options = read_options(dsn, since, until)
    # Only the derived columns are cached: the raw error histories are the bulk of each row.
    def error_class(entry: Any) -> Any:
        outcome, error = entry["outcome"], entry["error"]
        found = F.when(outcome.isin(*OUTCOMES_OF_THEIR_OWN_CLASS), outcome).when(
            error.rlike(HTTP_STATUS), F.regexp_extract(error, HTTP_STATUS, 2))
        for pattern, name in ERROR_CLASSES:
            found = found.when(error.rlike(f"(?i){pattern}"), F.lit(name))
        return found.when(outcome.isin(*WORKER_OUTCOMES), outcome).otherwise(F.lit("unknown"))

    with phase("analytics: read the archive here, in the driver" if local else
               "analytics: plan the archive's read (the data source's schema)"):
        loaded = load(spark, options, local=local)
    archived = (loaded.select(
        "endpoint_id", "status", "retry_count", F.date_trunc("hour", "completed_at").alias("hour"),
        F.when(F.col("status") == "completed",
               F.unix_micros("completed_at") - F.unix_micros("created_at")).alias("latency_us"),
        F.transform(F.from_json("error_history", ERROR_ENTRY), error_class).alias("error_classes"),
    ).withColumn("failures", F.size("error_classes")))
    if not local:  # a local relation is in memory already: caching it again costs more than it saves
        archived = archived.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        hourly = _outcomes(archived, "endpoint_id", "hour")
        summary = _outcomes(archived, "endpoint_id", rows=True)  # rows_read too: no count job of its own
        attempts = (archived.where(~F.col("status").isin(*NOT_DELIVERY_ENDINGS))
                    .groupBy("endpoint_id", "hour", (F.col("retry_count") + 1).alias("attempts"))
                    .agg(F.count(F.lit(1)).alias("messages")))
        classes = (archived.select("endpoint_id", "hour", F.explode("error_classes").alias("error_class"))
                   .groupBy("endpoint_id", "hour", "error_class").agg(F.count(F.lit(1)).alias("occurrences")))
        ranked = Window.partitionBy("endpoint_id", "hour").orderBy(F.desc("occurrences"), F.asc("error_class"))
        errors = (classes.withColumn("rank", F.row_number().over(ranked)).where(F.col("rank") <= TOP_ERRORS)
                  .drop("rank"))
        found: dict[str, Any] = {}
        # The summary first: its job reads the archive into the cache the other three reuse.
        for name, frame in (("summary", summary), ("hourly", hourly), ("attempts", attempts), ("errors", errors)):
            with phase(f"analytics: {name} (Spark job)"):
                spark.sparkContext.setJobDescription(f"analytics: {name}")
                found[name] = frame.toArrow().to_pylist()
        spark.sparkContext.setJobDescription(None)
        found["rows_read"] = sum(row.pop("rows") for row in found["summary"])
        return found
    finally:
        archived.unpersist()


def _copy_in(conn: Any, table: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """Many result rows in one COPY, where row-by-row INSERTs would cost a round trip each."""
    from psycopg import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier("courier", table), sql.SQL(", ").join(map(sql.Identifier, columns)))
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row([row[c] for c in columns])


# What analytics_runs.master records for a run computed in PostgreSQL, without Spark.
IN_SQL = "PostgreSQL (no Spark)"


def bounds(since: datetime | None, until: datetime | None, now: datetime | None = None) -> tuple[
        datetime | None, datetime]:
    """The range a run analyses: from the hour of `since` (None: the beginning) to `until` (now)."""
    return (floor_hour(since) if since is not None else None,
            (until or now or datetime.now(UTC)).astimezone(UTC))


def read_options(dsn: str, since: datetime | None, until: datetime) -> dict[str, Any]:
    options = {"dsn": dsn, "table": "archive", "columns": COLUMNS, "time_column": "completed_at",
               "until": until.isoformat()}
    if since is not None:
        options["since"] = since.isoformat()
    return options


def count(dsn: str, since: datetime | None, until: datetime | None) -> int:
    """The archived messages a run over this range reads, counted exactly in SQL (no Spark)."""
    from .plan import count_archive

    range_from, range_to = bounds(since, until)
    with phase("count the archive's rows in range (SQL)"):
        return count_archive(dsn, read_options(dsn, range_from, range_to))


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A SQL result row as the Spark path gives it: numeric as float (a double in Spark)."""
    return {key: float(value) if isinstance(value, Decimal) else value for key, value in row.items()}


def compute_in_sql(dsn: str, since: datetime | None, until: datetime) -> dict[str, Any]:
    """compute()'s results by the same aggregation in PostgreSQL (sqlkit/pipeline.sql's
    sql_analytics_* queries, which tests/test_pipeline.py holds equal to the Spark job), for a
    tiny range (plan.TINY_ROWS) or an empty one: no Spark to start."""
    params = {"from": since, "to": until, "top": TOP_ERRORS}
    found: dict[str, Any] = {}
    with phase("analytics: aggregate in PostgreSQL"), connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for name in ("summary", "hourly", "attempts", "errors"):
            found[name] = [_plain(row) for row in store.rows(conn, f"sql_analytics_{name}", params)]
    found["rows_read"] = sum(row.pop("rows") for row in found["summary"])
    return found


def run(spark: SparkSession | None, dsn: str, since: datetime | None, until: datetime | None = None,
        master: str = "local[*]", input_rows: int | None = None) -> AnalyticsResult:
    """input_rows: the archive's size in range; up to SMALL_INPUT_ROWS it is read in the driver.
    spark None: computed in PostgreSQL (compute_in_sql), for an empty or tiny range."""
    started = datetime.now(UTC)
    range_from, range_to = bounds(since, until, started)
    if spark is None:
        found, master = compute_in_sql(dsn, range_from, range_to), IN_SQL
    else:
        found = compute(spark, dsn, range_from, range_to, local=small_input(input_rows))
    with phase("analytics: store the results in PostgreSQL"), connect(dsn, autocommit=False) as conn, \
            conn.transaction():
        names = store.endpoint_names(conn)
        endpoints = sorted((EndpointSummary(endpoint=names.get(row["endpoint_id"], f"#{row['endpoint_id']}"), **row)
                            for row in found["summary"]), key=lambda s: s.endpoint)
        span = {"from": range_from, "to": range_to}
        for table in ("hourly", "attempts", "errors"):
            store.value(conn, f"clear_analytics_{table}", span)
        run_id = store.value(conn, "insert_analytics_run", {
            **span, "master": master, "rows_read": found["rows_read"], "started_at": started,
            "endpoints": json.dumps([asdict(e) for e in endpoints])})
        _copy_in(conn, "analytics_hourly", [{**row, "run_id": run_id} for row in found["hourly"]], HOURLY)
        _copy_in(conn, "analytics_attempts", found["attempts"], ("endpoint_id", "hour", "attempts", "messages"))
        _copy_in(conn, "analytics_errors", found["errors"], ("endpoint_id", "hour", "error_class", "occurrences"))
    return AnalyticsResult(run_id, range_from, range_to, found["rows_read"], len(found["hourly"]), endpoints)
