"""`courier pipeline export`: archive months to Parquet under month=YYYY-MM/endpoint=NAME/,
each verified (row count and checksum of the files read back against PostgreSQL) before it
counts as exported, and dropped from the archive only after a fresh check under lock. An
interrupted run leaves only a staging folder, which the next run clears and redoes."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit import archive
from sqlkit.connection import connect

from .session import PipelineError, phase, small_input
from .source import load

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MANIFEST = "_courier_export.json"


@dataclass(frozen=True)
class MonthExport:
    month: str
    rows: int
    checksum: str
    location: str
    state: str          # exported | already exported
    dropped: bool


def next_month(month: datetime) -> datetime:
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)


def month_folder(root: Path, month: datetime) -> Path:
    return root / f"month={month:%Y-%m}"


def months_before(conn: Any, before: datetime) -> list[datetime]:
    """Whole months of archived messages created before `before`, oldest first."""
    found = {p.range_from for p in archive.partitions(conn)
             if p.range_from is not None and p.range_to is not None and p.range_to <= before}
    found |= {row["month"] for row in store.rows(conn, "archive_default_months", {"before": before})
              if next_month(row["month"]) <= before}
    return sorted(m.astimezone(UTC) for m in found)


def pg_checksum(conn: Any, month: datetime) -> tuple[int, str]:
    row = store.rows(conn, "archive_month_checksum", {"from": month, "to": next_month(month)})[0]
    return int(row["rows"]), row["checksum"]


def frame_checksum(df: DataFrame) -> tuple[int, str]:
    """The same count and checksum as archive_month_checksum, over a DataFrame."""
    from pyspark.sql import functions as F

    line = F.concat_ws("|", F.col("id").cast("string"), F.col("endpoint_id").cast("string"), F.col("status"),
                       F.unix_micros("created_at").cast("string"), "payload", "headers", "metadata")
    digest = F.conv(F.substring(F.md5(line), 1, 15), 16, 10).cast("decimal(38,0)")
    row = df.agg(F.count(F.lit(1)).alias("rows"), F.sum(digest).alias("checksum")).collect()[0]
    return int(row["rows"]), str(row["checksum"] if row["checksum"] is not None else 0)


def read_month(spark: SparkSession, dsn: str, month: datetime, *, local: bool = False) -> DataFrame:
    """The month's archived messages with their endpoint's name. local: a small archive, read
    in the driver (source.load)."""
    from pyspark.sql import functions as F

    messages = load(spark, {"dsn": dsn, "table": "archive", "since": month.isoformat(),
                            "until": next_month(month).isoformat()}, local=local)
    with connect(dsn) as conn:  # a few rows: built in the driver, not read by a Python task
        names = spark.createDataFrame(list(store.endpoint_names(conn).items()), "_endpoint_id long, _name string")
    fallback = F.concat(F.lit("#"), F.col("endpoint_id").cast("string"))
    return (messages.join(F.broadcast(names), messages.endpoint_id == names._endpoint_id, "left")
            .withColumn("endpoint", F.coalesce(F.col("_name"), fallback))
            .select(*messages.columns, "endpoint"))


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _publish(staging: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Moves verified files into place; the manifest is written last, so its presence means done."""
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    (final / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


@dataclass(frozen=True)
class MonthState:
    """Where one month stands before it is exported, found in SQL and on disk (no Spark)."""
    month: datetime
    rows: int
    checksum: str
    recorded: Any  # the archive_exports row (sqlkit.analytics.ArchiveExport), or None
    done: bool     # exported, verified and unchanged since: nothing to write
    gone: bool     # exported and dropped before, and no rows since: nothing to do

    @property
    def needs_spark(self) -> bool:
        return not (self.done or self.gone)


def month_state(dsn: str, root: Path, month: datetime) -> MonthState:
    with connect(dsn) as conn:
        rows, checksum = pg_checksum(conn, month)
        recorded = store.archive_export(conn, month)
    manifest = _manifest(month_folder(root, month))
    done = (recorded is not None and manifest is not None and recorded.dropped_at is None
            and (manifest.get("rows"), manifest.get("checksum")) == (recorded.rows, recorded.checksum)
            == (rows, checksum))
    gone = recorded is not None and recorded.dropped_at is not None and rows == 0
    return MonthState(month, rows, checksum, recorded, done, gone)


def plan(dsn: str, before: datetime, root: Path) -> list[MonthState]:
    """Every month an export before `before` covers, with what it needs, without Spark: an
    export whose months all need nothing (or that has no month) starts no Spark."""
    with phase("export: find the months and what each needs (SQL)"):
        with connect(dsn) as conn:
            months = months_before(conn, before)
        return [month_state(dsn, root, month) for month in months]


def export_month(spark: SparkSession | None, dsn: str, root: Path, month: datetime, *, drop: bool,
                 local: bool = False, known: MonthState | None = None) -> MonthExport:
    """known: the month's state found by plan() just before (else found now)."""
    final = month_folder(root, month)
    found = known or month_state(dsn, root, month)
    rows, checksum, recorded, done = found.rows, found.checksum, found.recorded, found.done
    if found.gone:
        return MonthExport(f"{month:%Y-%m}", recorded.rows, recorded.checksum, recorded.location,
                           "already exported", True)
    state = "already exported"
    if not done:
        if spark is None:
            raise PipelineError(f"{month:%Y-%m} needs writing, which needs Spark")
        staging = root / f".staging-month={month:%Y-%m}-{uuid.uuid4().hex[:8]}"
        with phase(f"export: write {month:%Y-%m} to Parquet (Spark job)"):
            spark.sparkContext.setJobDescription(f"export: write {month:%Y-%m}")
            read_month(spark, dsn, month, local=local).write.partitionBy("endpoint").parquet(str(staging))
        with phase(f"export: verify {month:%Y-%m} (Spark job)"):
            spark.sparkContext.setJobDescription(f"export: verify {month:%Y-%m}")
            written = frame_checksum(spark.read.parquet(str(staging)))
        spark.sparkContext.setJobDescription(None)
        if written != (rows, checksum):
            shutil.rmtree(staging, ignore_errors=True)
            raise PipelineError(f"export of {month:%Y-%m} did not verify: PostgreSQL has {rows} row(s), checksum "
                                f"{checksum}; the Parquet files {written[0]} row(s), checksum {written[1]}",
                                hint="Nothing was dropped; run the export again")
        _publish(staging, final, {"month": f"{month:%Y-%m}", "rows": rows, "checksum": checksum,
                                  "exported_at": datetime.now(UTC).isoformat()})
        with connect(dsn) as conn:
            store.value(conn, "record_archive_export", {"month": month, "location": str(final.resolve()),
                                                        "rows": rows, "checksum": checksum})
        state = "exported"
    if drop:
        _drop_month(dsn, month, rows, checksum)
    return MonthExport(f"{month:%Y-%m}", rows, checksum, str(final.resolve()), state, drop)


def _drop_month(dsn: str, month: datetime, rows: int, checksum: str) -> None:
    """Drops the month's partition (and its rows in the default partition) if, under a lock
    that keeps new rows out, it still holds exactly what was exported."""
    with connect(dsn, autocommit=False) as conn, conn.transaction():
        partition = next((p.partition_name for p in archive.partitions(conn)
                          if p.range_from is not None and p.range_from.astimezone(UTC) == month), None)
        if partition:
            store.value(conn, "lock_archive_partition", relation=("courier", partition))
        store.value(conn, "lock_archive_partition", relation=("courier", "archive_default"))
        if pg_checksum(conn, month) != (rows, checksum):
            raise PipelineError(f"{month:%Y-%m} gained or changed rows since it was exported; not dropped",
                                hint="Run the export again: it re-exports that month, then drops it")
        if partition:
            store.value(conn, "drop_archive_partition", relation=("courier", partition))
        store.value(conn, "delete_archive_default_month", {"from": month, "to": next_month(month)})
        store.value(conn, "record_archive_drop", {"month": month})


def rows_to_write(states: list[MonthState]) -> int:
    return sum(state.rows for state in states if state.needs_spark)


def run(spark: SparkSession | None, dsn: str, before: datetime, root: Path, *, drop: bool = False,
        on_month: Callable[[MonthExport], None] | None = None, input_rows: int | None = None,
        states: list[MonthState] | None = None) -> list[MonthExport]:
    """input_rows: the rows to write; up to SMALL_INPUT_ROWS they are read in the driver.
    states: plan()'s answer, found just before; spark may be None when no month needs_spark
    (what remains, the checks and drops, is SQL)."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".staging-month=*"):
        shutil.rmtree(leftover, ignore_errors=True)  # an interrupted run's unverified files
    if states is None:
        states = plan(dsn, before, root)
    done = []
    for state in states:
        result = export_month(spark, dsn, root, state.month, drop=drop, local=small_input(input_rows), known=state)
        done.append(result)
        if on_month:
            on_month(result)
    return done
