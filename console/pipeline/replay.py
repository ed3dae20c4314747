"""`courier pipeline replay`: archived messages (from the archive or from exported Parquet)
selected by endpoint, time, status, correlation id and JSON-path predicates, enqueued again
through the batch path. A message is replayed once, by whichever replay (this one, `courier
archive replay`, replay-message, the console): the rule is courier.claim_replays, applied in
each batch's transaction; `again` asks for fresh copies."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit.connection import connect

from . import predicates
from .session import PipelineError
from .source import in_order

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# What a replayed message keeps of the archived one, as replay_range does: not its idempotency
# key, schedule or expiry, which belonged to the first delivery.
CARRIED = ("payload", "priority", "headers", "metadata", "ordering_key", "correlation_id")


@dataclass(frozen=True)
class Selection:
    """What to replay."""
    endpoints: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    statuses: tuple[str, ...] = ()
    correlation_ids: tuple[str, ...] = ()
    where: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplayResult:
    matched: int
    already_replayed: int  # of the matching messages, replayed before by any replay
    enqueued: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    again: bool = False

    @property
    def would_enqueue(self) -> int:
        return self.matched if self.again else self.matched - self.already_replayed


def select(spark: SparkSession, dsn: str, selection: Selection, source: Path | None) -> DataFrame:
    """id, endpoint and the CARRIED fields of every selected message."""
    from pyspark.sql import functions as F

    tests = [predicates.parse(text) for text in selection.where]
    if source is None:
        reader = spark.read.format("courier").option("dsn", dsn).option("table", "archive").option(
            "columns", ",".join(("id", "endpoint_id", "status", "created_at", *CARRIED)))
        if selection.since:
            reader = reader.option("since", selection.since.isoformat())
        if selection.until:
            reader = reader.option("until", selection.until.isoformat())
        if tests:  # evaluated by PostgreSQL itself: payload @@ jsonpath
            reader = reader.option("payload_filter", json.dumps([test.jsonpath for test in tests]))
        df = reader.load()
        names = (spark.read.format("courier").option("dsn", dsn).option("table", "endpoints")
                 .option("columns", "id,name").load().withColumnsRenamed({"id": "_endpoint_id", "name": "endpoint"}))
        if selection.endpoints:
            with connect(dsn) as conn:
                known = {name: id_ for id_, name in store.endpoint_names(conn).items()}
            missing = [e for e in selection.endpoints if e not in known]
            if missing:
                raise PipelineError(f"no endpoint named {', '.join(missing)}",
                                    hint="List endpoints with `courier endpoint list`")
            df = df.where(F.col("endpoint_id").isin([known[e] for e in selection.endpoints]))
        df = df.join(F.broadcast(names), df.endpoint_id == names._endpoint_id, "left")
    else:
        if not source.exists():
            raise PipelineError(f"{source} does not exist", hint="Give the folder `courier pipeline export` wrote")
        df = spark.read.option("basePath", str(source)).parquet(str(source))
        if selection.endpoints:
            df = df.where(F.col("endpoint").isin(list(selection.endpoints)))
        if selection.since:
            df = df.where(F.col("created_at") >= F.lit(selection.since))
        if selection.until:
            df = df.where(F.col("created_at") < F.lit(selection.until))
        if tests:  # the same typed semantics, evaluated in Python over the payload's JSON text
            df = df.where(predicates.column(tests))
    if selection.statuses:
        df = df.where(F.col("status").isin(list(selection.statuses)))
    if selection.correlation_ids:
        df = df.where(F.col("correlation_id").isin(list(selection.correlation_ids)))
    return df.select("id", "endpoint", *CARRIED)


def _replayed_from(metadata: Any, archive_id: Any) -> Any:
    """The archived metadata (a JSON object's text) with replayed_from naming the archive row,
    as replay_range sets it. A key written last wins in jsonb, so an earlier replayed_from is replaced."""
    from pyspark.sql import functions as F

    opened = F.regexp_replace(F.coalesce(metadata, F.lit("{}")), r"\}\s*$", "")
    return F.when(F.trim(opened) == "{", F.format_string('{"replayed_from": %d}', archive_id)) \
        .otherwise(F.format_string('%s, "replayed_from": %d}', opened, archive_id))


def _count_replayed(dsn: str) -> Any:
    """Per Spark partition of archived ids: how many were replayed before."""
    def count(rows: Any) -> Any:
        ids = [row[0] for row in rows]
        if not ids:
            return iter([0])
        with connect(dsn) as conn:
            return iter([sum(int(store.value(conn, "count_replayed", {"archive_ids": ids[at:at + 10_000]}))
                             for at in range(0, len(ids), 10_000))])
    return count


def run(spark: SparkSession, dsn: str, selection: Selection, source: Path | None = None, *,
        dry_run: bool = False, batch_size: int = 1000, again: bool = False) -> ReplayResult:
    from pyspark.sql import functions as F

    chosen = select(spark, dsn, selection, source).cache()
    try:
        counts = {row["endpoint"]: row["count"] for row in chosen.groupBy("endpoint").count().collect()}
        already = int(chosen.select("id").rdd.mapPartitions(_count_replayed(dsn)).sum()) if counts else 0
        with connect(dsn) as conn:
            enabled = {row["name"]: row["enabled"] for row in store.rows(conn, "endpoint_names")}
        result = ReplayResult(sum(counts.values()), already, by_endpoint=counts, dry_run=dry_run, again=again)
        if dry_run or not counts:
            return result
        unusable = sorted(str(e) for e in counts if not enabled.get(e))
        if unusable:
            raise PipelineError(f"cannot replay into {', '.join(unusable)}: no such endpoint, or it is disabled",
                                hint="Create or enable it, or narrow the selection with --endpoint")
        with tempfile.TemporaryDirectory(prefix="courier-replay-") as folder:
            report = Path(folder) / "report.json"
            (in_order(chosen, "id")
             .select("endpoint", *(c for c in CARRIED if c != "metadata"),
                     _replayed_from(F.col("metadata"), F.col("id")).alias("metadata"),
                     F.col("id").cast("string").alias("key"))
             .write.format("courier").mode("append").option("dsn", dsn).option("replay", "again" if again else "once")
             .option("batch_size", batch_size).option("report", str(report)).save())
            totals: dict[str, Any] = json.loads(report.read_text())
        return ReplayResult(result.matched, already, totals["sent"], counts, again=again)
    finally:
        chosen.unpersist()
