"""`courier pipeline replay`: archived messages (from the archive or from exported Parquet)
selected by endpoint, time, status, correlation id and JSON-path predicates, enqueued again
through the batch path. A message is replayed once, by whichever replay (this one, `courier
archive replay`, replay-message, the console): the rule is courier.claim_replays, applied in
each batch's transaction; `again` asks for fresh copies."""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit.connection import connect

from . import predicates
from .session import PipelineError, phase, small_input
from .source import in_order, load

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


def endpoint_frame(spark: SparkSession, ids_by_name: dict[str, int]) -> DataFrame:
    """The endpoints' ids and names as a frame built in the driver: a few rows, which a read
    through the data source would cost a Python task (and its start) to fetch."""
    return spark.createDataFrame([(id_, name) for name, id_ in ids_by_name.items()],
                                 "_endpoint_id long, endpoint string")


def check_source(source: Path) -> None:
    """A replay's Parquet folder exists and holds Parquet files (Spark's own answer to an
    empty one is "Unable to infer schema for Parquet"), checked before Spark starts."""
    if not source.exists():
        raise PipelineError(f"{source} does not exist", hint="Give the folder `courier pipeline export` wrote")
    if source.is_dir() and not any(source.rglob("*.parquet")):
        raise PipelineError(f"{source} holds no Parquet files: nothing to replay",
                            hint="Give the folder `courier pipeline export` wrote (it exports whole months "
                                 "older than --before; none may have been old enough)")


def source_rows(source: Path) -> int | None:
    """The rows of the Parquet files under `source`, from their footers (None if unreadable)."""
    import pyarrow.parquet as pq

    try:
        files = [source] if source.is_file() else sorted(source.rglob("*.parquet"))
        return sum(pq.read_metadata(f).num_rows for f in files)
    except (OSError, ValueError):
        return None


def archive_read(dsn: str, selection: Selection) -> tuple[dict[str, Any], list[tuple[str, str, Any]], dict[str, int]]:
    """How the archive is read for a selection: the data source's options, the filters a Spark
    read pushes down to PostgreSQL (as pushFilters keeps them), and the endpoints' ids by name.
    The count before Spark (plan.count_replay) and the read without it use the same ones."""
    options = {"dsn": dsn, "table": "archive", "columns": ",".join(("id", "endpoint_id", "status", "created_at",
                                                                    *CARRIED))}
    if selection.since:
        options["since"] = selection.since.isoformat()
    if selection.until:
        options["until"] = selection.until.isoformat()
    if selection.where:  # evaluated by PostgreSQL itself: payload @@ jsonpath
        options["payload_filter"] = json.dumps([predicates.parse(text).jsonpath for text in selection.where])
    with connect(dsn) as conn:
        known = {name: id_ for id_, name in store.endpoint_names(conn).items()}
    pushed: list[tuple[str, str, Any]] = []
    if selection.endpoints:
        missing = [e for e in selection.endpoints if e not in known]
        if missing:
            raise PipelineError(f"no endpoint named {', '.join(missing)}",
                                hint="List endpoints with `courier endpoint list`")
        pushed.append(("endpoint_id", "in", [known[e] for e in selection.endpoints]))
    if selection.statuses:
        pushed.append(("status", "in", list(selection.statuses)))
    if selection.correlation_ids:
        pushed.append(("correlation_id", "in", list(selection.correlation_ids)))
    return options, pushed, known


def count(dsn: str, selection: Selection, *, dry_run: bool = False, again: bool = False) -> ReplayResult:
    """The selection in the archive counted in one SQL statement, without Spark: what matches,
    per endpoint, and how many were replayed before. A dry run's whole answer."""
    from .plan import count_replay

    options, pushed, _ = archive_read(dsn, selection)
    with phase("replay: count the matching messages (SQL)"):
        found = count_replay(dsn, options, pushed)
    return ReplayResult(found.matched, found.already_replayed, by_endpoint=found.by_endpoint,  # type: ignore[arg-type]
                        dry_run=dry_run, again=again)


def replayed_from_text(metadata: str | None, archive_id: int) -> str:
    """_replayed_from's column expression for one row, in Python (Java's \\s is [ \\t\\n\\x0B\\f\\r],
    Spark's trim removes spaces)."""
    opened = re.sub(r"\}[ \t\n\x0b\f\r]*$", "", "{}" if metadata is None else metadata)
    if opened.strip(" ") == "{":
        return f'{{"replayed_from": {archive_id:d}}}'
    return f'{opened}, "replayed_from": {archive_id:d}}}'


def enqueue_here(dsn: str, selection: Selection, *, again: bool = False, batch_size: int = 1000) -> dict[str, Any]:
    """A tiny selection enqueued without Spark: the archive read here with the data source's
    reader (the same query a Spark task sends), the rows laid out as the Spark path lays them
    out (id order, metadata naming replayed_from), written by the same courier writer in one
    transaction. Returns the writer's totals."""
    from .source import read_here, write_here

    options, pushed, known = archive_read(dsn, selection)
    names = {id_: name for name, id_ in known.items()}
    with phase("replay: read the archive here (SQL)"):
        _, table = read_here(options, pushed)
    rows = sorted(table.to_pylist(), key=lambda row: row["id"])
    records = [{"endpoint": names.get(row["endpoint_id"]),
                **{name: row[name] for name in CARRIED if name != "metadata"},
                "metadata": replayed_from_text(row["metadata"], row["id"]), "key": str(row["id"])} for row in rows]
    with phase("replay: enqueue here, in one transaction"):
        return write_here(records, {"dsn": dsn, "replay": "again" if again else "once", "batch_size": batch_size})


def select(spark: SparkSession, dsn: str, selection: Selection, source: Path | None, *,
           local: bool = False) -> DataFrame:
    """id, endpoint and the CARRIED fields of every selected message. local: a small archive,
    read in the driver (source.load)."""
    from pyspark.sql import functions as F

    tests = [predicates.parse(text) for text in selection.where]
    if source is None:
        options, _, known = archive_read(dsn, selection)
        with phase("replay: read the archive here, in the driver" if local else "replay: plan the archive's read"):
            df = load(spark, options, local=local)
        names = endpoint_frame(spark, known)
        if selection.endpoints:
            df = df.where(F.col("endpoint_id").isin([known[e] for e in selection.endpoints]))
        df = df.join(F.broadcast(names), df.endpoint_id == names._endpoint_id, "left")
    else:
        check_source(source)
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


def replayed_before(dsn: str, ids: list[int]) -> int:
    """How many of these archived ids were replayed before."""
    if not ids:
        return 0
    with connect(dsn) as conn:
        return sum(int(store.value(conn, "count_replayed", {"archive_ids": ids[at:at + 10_000]}))
                   for at in range(0, len(ids), 10_000))


def _count_replayed(dsn: str) -> Any:
    """Per Spark partition of archived ids: how many were replayed before."""
    def count(rows: Any) -> Any:
        return iter([replayed_before(dsn, [row[0] for row in rows])])
    return count


def check_usable(dsn: str, counts: dict[Any, int]) -> None:
    """Every endpoint the selection would replay into exists and is enabled."""
    with connect(dsn) as conn:
        enabled = {row["name"]: row["enabled"] for row in store.rows(conn, "endpoint_names")}
    unusable = sorted(str(e) for e in counts if not enabled.get(e))
    if unusable:
        raise PipelineError(f"cannot replay into {', '.join(unusable)}: no such endpoint, or it is disabled",
                            hint="Create or enable it, or narrow the selection with --endpoint")


def run_without_spark(dsn: str, selection: Selection, counted: ReplayResult, *, dry_run: bool = False,
                      again: bool = False, batch_size: int = 1000) -> ReplayResult:
    """A replay from the archive that needs no Spark: a dry run (the SQL count is its answer),
    nothing matching, nothing left to enqueue (all replayed before, without --again), or a
    tiny selection (plan.TINY_ROWS) enqueued here by enqueue_here."""
    if dry_run or not counted.matched:
        return counted
    check_usable(dsn, counted.by_endpoint)
    if not counted.would_enqueue:  # every match replayed before, and no --again: the writer would skip them all
        return ReplayResult(counted.matched, counted.already_replayed, 0, counted.by_endpoint, again=again)
    totals = enqueue_here(dsn, selection, again=again, batch_size=batch_size)
    return ReplayResult(counted.matched, counted.already_replayed, totals["sent"], counted.by_endpoint, again=again)


def run(spark: SparkSession, dsn: str, selection: Selection, source: Path | None = None, *,
        dry_run: bool = False, batch_size: int = 1000, again: bool = False,
        input_rows: int | None = None) -> ReplayResult:
    """input_rows: the size of the source (an estimate), to choose how to count."""
    from pyspark.sql import functions as F

    small = small_input(input_rows)
    chosen = select(spark, dsn, selection, source, local=small and source is None).cache()
    try:
        if small:
            # Few rows: their ids and endpoints in one job, counted here, instead of a count job
            # and a Python task per partition asking PostgreSQL.
            with phase("replay: select the messages (Spark job)"):
                spark.sparkContext.setJobDescription("replay: select")
                picked = chosen.select("id", "endpoint").toArrow().to_pydict()
                spark.sparkContext.setJobDescription(None)
            counts = dict(Counter(picked["endpoint"]))
            with phase("replay: count those replayed before"):
                already = replayed_before(dsn, picked["id"])
        else:
            with phase("replay: count the messages per endpoint (Spark job)"):
                counts = {row["endpoint"]: row["count"] for row in chosen.groupBy("endpoint").count().collect()}
            with phase("replay: count those replayed before (Spark job)"):
                already = int(chosen.select("id").rdd.mapPartitions(_count_replayed(dsn)).sum()) if counts else 0
        result = ReplayResult(sum(counts.values()), already, by_endpoint=counts, dry_run=dry_run, again=again)
        if dry_run or not counts:
            return result
        check_usable(dsn, counts)
        with phase("replay: enqueue (Spark job)"), tempfile.TemporaryDirectory(prefix="courier-replay-") as folder:
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
