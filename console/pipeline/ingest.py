"""`courier pipeline ingest`: a JSONL, CSV or Parquet file into the queue through the batch
path. Every row is checked first; bad rows are reported by line (or row) number and skipped,
good rows are enqueued once, however often the same file is ingested."""

from __future__ import annotations

import csv
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit.connection import connect

from .session import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("jsonl", "csv", "parquet")
REPORTED_ERRORS = 1000


@dataclass(frozen=True)
class RowError:
    line: int
    error: str


@dataclass(frozen=True)
class IngestResult:
    file: str
    rows: int
    good: int
    enqueued: int
    already_ingested: int
    bad: int
    errors: list[RowError] = field(default_factory=list)


def detect_format(path: Path, given: str | None) -> str:
    if given:
        return given
    suffix = path.suffix.lower().lstrip(".")
    if path.is_dir() or suffix == "parquet":
        return "parquet"
    if suffix in ("jsonl", "ndjson", "json"):
        return "jsonl"
    if suffix in ("csv", "tsv"):
        return "csv"
    raise PipelineError(f"cannot tell the format of {path.name}", hint="Pass --format jsonl, csv or parquet")


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for item in files:
        digest.update(str(item.relative_to(path) if path.is_dir() else item.name).encode())
        with item.open("rb") as data:
            for block in iter(lambda d=data: d.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def check_payload(text: str, limit: int) -> str | None:
    """Why PostgreSQL would refuse this payload, or None if it is fine."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError as error:
        return f"invalid JSON: {error}"
    if "\\u0000" in text:
        return "contains \\u0000, which PostgreSQL cannot store in jsonb"
    size = len(text.encode())
    if size > limit:
        return f"payload of {size} bytes exceeds max_payload_size ({limit} bytes)"
    return None


def _jsonl(limit: int) -> Any:
    def check(item: tuple[str, int]) -> tuple[int, str | None, str | None]:
        text, index = item
        text = text.strip()
        if not text:
            return index + 1, None, None
        error = check_payload(text, limit)
        return index + 1, None if error else text, error
    return check


def _csv(header: list[str], limit: int) -> Any:
    def check(item: tuple[str, int]) -> tuple[int, str | None, str | None]:
        text, index = item
        if not text.strip():
            return index + 1, None, None
        try:
            values = next(csv.reader([text]))
        except csv.Error as error:
            return index + 1, None, f"unreadable CSV: {error}"
        if len(values) != len(header):
            return index + 1, None, f"expected {len(header)} fields, got {len(values)}"
        payload = json.dumps(dict(zip(header, values, strict=True)), ensure_ascii=False)
        error = check_payload(payload, limit)
        return index + 1, None if error else payload, error
    return check


def _parquet_row(limit: int) -> Any:
    def check(item: tuple[Any, int]) -> tuple[int, str | None, str | None]:
        row, index = item
        text = row[0]
        if text is None:
            return index + 1, None, "payload is null"
        error = check_payload(text, limit)
        return index + 1, None if error else text, error
    return check


def run(spark: SparkSession, dsn: str, path: Path, endpoint: str, *, priority: int = 0,
        file_format: str | None = None, batch_size: int = 1000) -> IngestResult:
    from pyspark.sql import functions as F

    if not path.exists():
        raise PipelineError(f"{path} does not exist")
    kind = detect_format(path, file_format)
    with connect(dsn) as conn:
        state = {row["name"]: row["enabled"] for row in store.rows(conn, "endpoint_names")}
        limit = int(store.value(conn, "max_payload_size"))
    if endpoint not in state:
        raise PipelineError(f'endpoint "{endpoint}" does not exist', "P0002",
                            "Create it with `courier endpoint create`")
    if not state[endpoint]:
        raise PipelineError(f'endpoint "{endpoint}" is disabled', "55000",
                            "Enable it with `courier endpoint enable`")
    scope = f"ingest:{endpoint}:{fingerprint(path)}"
    sc = spark.sparkContext
    if kind == "parquet":
        df = spark.read.parquet(str(path))
        payload = F.col("payload").cast("string") if "payload" in df.columns else F.to_json(F.struct(*df.columns))
        checked = df.select(payload).rdd.zipWithIndex().map(_parquet_row(limit))
    else:
        lines = sc.textFile(str(path)).zipWithIndex()
        if kind == "csv":
            first = lines.filter(lambda item: item[1] == 0).collect()
            if not first:
                raise PipelineError(f"{path.name} is empty: a CSV file needs a header line")
            header = next(csv.reader([first[0][0]]))
            lines = lines.filter(lambda item: item[1] > 0)
            checked = lines.map(_csv(header, limit))
        else:
            checked = lines.map(_jsonl(limit))
    rows = spark.createDataFrame(checked.filter(lambda r: r[1] is not None or r[2] is not None),
                                 "line long, payload string, error string").cache()
    try:
        totals = rows.agg(F.count(F.lit(1)).alias("rows"), F.count("error").alias("bad")).collect()[0]
        errors = [RowError(r["line"], r["error"]) for r in
                  rows.where(F.col("error").isNotNull()).orderBy("line").limit(REPORTED_ERRORS).collect()]
        with connect(dsn) as conn:
            already = int(store.value(conn, "ledger_count", {"scope": scope}))
        with tempfile.TemporaryDirectory(prefix="courier-ingest-") as folder:
            report = Path(folder) / "report.json"
            good = rows.where(F.col("error").isNull()).select(F.col("line").cast("string").alias("key"), "payload")
            (good.write.format("courier").mode("append").option("dsn", dsn).option("endpoint", endpoint)
             .option("priority", priority).option("scope", scope).option("batch_size", batch_size)
             .option("report", str(report)).save())
            sent = json.loads(report.read_text())["sent"] if report.exists() else 0
    finally:
        rows.unpersist()
    return IngestResult(str(path), totals["rows"], totals["rows"] - totals["bad"], sent, already,
                        totals["bad"], errors)
