"""`courier pipeline ingest`: a JSONL, CSV or Parquet file into the queue through the batch
path. Bad rows are reported by line (or row) number and skipped, good rows are enqueued once,
however often the same file is ingested (a ledger keyed by line, written with the messages).

Whether a row is good is the send path's to say: send_batch_with_options checks each row as
send_with_options checks one message, and the writer leaves out and reports each row it
refuses (skip_refused). Python checks only what must hold before a row can be passed at all:
its JSON parses as PostgreSQL parses it, and each field has the type its array needs."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlkit import analytics as store
from sqlkit.connection import connect

from .session import PipelineError, phase, small_input
from .source import MESSAGE_FIELDS, in_order, write_here

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


def check_payload(text: str) -> str | None:
    """Why PostgreSQL could not read this text as jsonb, or None if it can. (Its size, like
    every other send rule, is the send path's to check.)"""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        parsed = json.loads(text, parse_constant=refuse)
    except ValueError as error:
        return f"invalid JSON: {error}"
    return _storable(text, parsed)


def _storable(text: str, parsed: Any) -> str | None:
    if "\\u0000" in text or "\x00" in text:
        return "contains \\u0000, which PostgreSQL cannot store in jsonb"
    try:
        json.dumps(parsed, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which PostgreSQL cannot store in jsonb"
    return None


# A checked row: its line, the payload's JSON text, why it is bad, and the message fields.
ROW_SCHEMA = ("line long, payload string, error string, priority int, scheduled_at string, idempotency_key string, "
              "correlation_id string, expires_at string, ordering_key string, headers string, metadata string")
ENVELOPE_FIELDS = ("payload", *MESSAGE_FIELDS)
_NO_FIELDS = (None,) * len(MESSAGE_FIELDS)


def _moment(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name} is not an ISO 8601 time: {value!r}") from None
    else:
        raise ValueError(f"{name} must be an ISO 8601 time, not {type(value).__name__}")
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def _json_text(value: Any, name: str) -> str | None:
    """headers or metadata as JSON text (that they are objects, and what they hold, is checked
    by the send path)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{name} is not JSON") from None
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False)
    problem = _storable(text, value)
    if problem:
        raise ValueError(f"{name} {problem}")
    return text


def _key(value: Any, name: str) -> str | None:
    """A key as text (its length is the send path's to check)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name} contains NUL, which PostgreSQL cannot store in text")
    return value


def check_envelope(record: Any, *, payload_is_text: bool = False) -> tuple[
        str | None, str | None, tuple[Any, ...]]:
    """A message given as an object of ENVELOPE_FIELDS: (payload text, error, fields), each
    field checked for the type its array needs, so that a bad one is reported with its line
    (its value is then the send path's to check). The payload is any JSON value, or (a CSV
    cell, a Parquet column) its JSON text."""
    if not isinstance(record, dict):
        return None, "a message must be a JSON object with a payload", _NO_FIELDS
    unknown = sorted(set(record) - set(ENVELOPE_FIELDS))
    if unknown:
        return None, f"unknown field {', '.join(unknown)} (a message has {', '.join(ENVELOPE_FIELDS)})", _NO_FIELDS
    if record.get("payload") is None:
        return None, "payload is missing", _NO_FIELDS
    payload = record["payload"]
    text = str(payload) if payload_is_text else json.dumps(payload, ensure_ascii=False)
    try:
        priority = record.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                     or not -2 ** 31 <= priority < 2 ** 31):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        scheduled, expires = _moment(record.get("scheduled_at"), "scheduled_at"), _moment(
            record.get("expires_at"), "expires_at")
        correlation = record.get("correlation_id")
        if correlation is not None:
            try:
                correlation = str(uuid.UUID(str(correlation)))
            except ValueError:
                raise ValueError(f"correlation_id is not a UUID: {correlation!r}") from None
        fields = (priority, scheduled, _key(record.get("idempotency_key"), "idempotency_key"), correlation, expires,
                  _key(record.get("ordering_key"), "ordering_key"), _json_text(record.get("headers"), "headers"),
                  _json_text(record.get("metadata"), "metadata"))
    except ValueError as error:
        return None, str(error), _NO_FIELDS
    error = check_payload(text)
    return (None, error, _NO_FIELDS) if error else (text, None, fields)


def _jsonl(envelope: bool) -> Any:
    def check(item: tuple[str, int]) -> tuple[Any, ...] | None:
        text, index = item
        text = text.strip()
        if not text:
            return None
        if envelope:
            try:
                record = json.loads(text)
            except ValueError as error:
                return index + 1, None, f"invalid JSON: {error}", *_NO_FIELDS
            payload, error, fields = check_envelope(record)
            return index + 1, payload, error, *fields
        error = check_payload(text)
        return index + 1, None if error else text, error, *_NO_FIELDS
    return check


def _csv(header: list[str], envelope: bool) -> Any:
    def check(item: tuple[str, int]) -> tuple[Any, ...] | None:
        text, index = item
        if not text.strip():
            return None
        try:
            values = next(csv.reader([text]))
        except csv.Error as error:
            return index + 1, None, f"unreadable CSV: {error}", *_NO_FIELDS
        if len(values) != len(header):
            return index + 1, None, f"expected {len(header)} fields, got {len(values)}", *_NO_FIELDS
        row = dict(zip(header, values, strict=True))
        if envelope:
            record: dict[str, Any] = {k: v for k, v in row.items() if v != ""}
            try:
                if "priority" in record:
                    record["priority"] = int(record["priority"])
            except ValueError:
                return index + 1, None, f"priority must be an integer, got {record['priority']!r}", *_NO_FIELDS
            for name in ("headers", "metadata"):
                if name in record:
                    record[name] = _parsed(record[name])
            payload, error, fields = check_envelope(record, payload_is_text=True)
            return index + 1, payload, error, *fields
        payload = json.dumps(row, ensure_ascii=False)
        error = check_payload(payload)
        return index + 1, None if error else payload, error, *_NO_FIELDS
    return check


def _parsed(text: str) -> Any:
    """A CSV cell holding JSON, or the text itself if it is not JSON (check_envelope says why)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parquet_row(fields: list[str]) -> Any:
    def check(item: tuple[Any, int]) -> tuple[Any, ...]:
        row, index = item
        if not fields:
            text = row[0]
            if text is None:
                return index + 1, None, "payload is null", *_NO_FIELDS
            error = check_payload(text)
            return index + 1, None if error else text, error, *_NO_FIELDS
        record = {name: row[name] for name in ("payload", *fields) if row[name] is not None}
        payload, error, checked = check_envelope(record, payload_is_text=True)
        return index + 1, payload, error, *checked
    return check


def estimate_rows(path: Path, file_format: str | None = None) -> int | None:
    """About how many rows the file holds, without Spark: a text file's lines (its size over
    64 past 64 MB, which is large either way), a Parquet file's footer count; None if unknown."""
    try:
        kind = detect_format(path, file_format)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        if kind == "parquet":
            import pyarrow.parquet as pq

            return sum(pq.read_metadata(f).num_rows for f in files if not f.name.startswith(("_", ".")))
        size = sum(f.stat().st_size for f in files)
        if size > 64 << 20:
            return size // 64
        return sum(_line_count(f.read_bytes()) for f in files)
    except (PipelineError, OSError, ValueError):
        return None


def _line_count(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _text_lines(path: Path) -> list[str]:
    """The file's lines as Spark's textFile splits them (\\n, \\r\\n or \\r, no trailing empty line)."""
    lines = _LINE_BREAK.split(path.read_bytes().decode("utf-8", errors="replace"))
    return lines[:-1] if lines and lines[-1] == "" else lines


def _csv_header(path: Path, first: str, envelope: bool) -> list[str]:
    header = next(csv.reader([first]))
    if envelope and "payload" not in header:
        raise PipelineError(f"{path.name} has no payload column",
                            hint="With --envelope the CSV needs a payload column of JSON")
    return header


def _checked_lines(path: Path, kind: str, envelope: bool) -> list[tuple[Any, ...]]:
    """A text file's rows checked in this process: (line, payload, error, *fields) each."""
    lines = _text_lines(path)
    if kind == "csv":
        if not lines:
            raise PipelineError(f"{path.name} is empty: a CSV file needs a header line")
        check = _csv(_csv_header(path, lines[0], envelope), envelope)
        items = [(text, index) for index, text in enumerate(lines) if index > 0]
    else:
        check, items = _jsonl(envelope), [(text, index) for index, text in enumerate(lines)]
    return [row for row in map(check, items) if row is not None]


def _checked_rdd(spark: SparkSession, path: Path, kind: str, envelope: bool) -> Any:
    """The same rows checked by Spark tasks, for files too large for one process."""
    from pyspark.sql import functions as F

    if kind == "parquet":
        df = spark.read.parquet(str(path))
        if "payload" in df.columns:
            fields = [name for name in MESSAGE_FIELDS if name in df.columns]
            types = dict(df.dtypes)
            columns = [F.col(n) if types[n] in ("string", "int", "bigint", "smallint") else
                       F.col(n).cast("string") if types[n].startswith("timestamp") else F.to_json(n).alias(n)
                       for n in ("payload", *fields)]
            checked = df.select(*columns).rdd.zipWithIndex().map(_parquet_row(fields))
        else:
            checked = df.select(F.to_json(F.struct(*df.columns))).rdd.zipWithIndex().map(_parquet_row([]))
    else:
        lines = spark.sparkContext.textFile(str(path)).zipWithIndex()
        if kind == "csv":
            first = lines.filter(lambda item: item[1] == 0).collect()
            if not first:
                raise PipelineError(f"{path.name} is empty: a CSV file needs a header line")
            header = _csv_header(path, first[0][0], envelope)
            checked = lines.filter(lambda item: item[1] > 0).map(_csv(header, envelope))
        else:
            checked = lines.map(_jsonl(envelope))
    return checked.filter(lambda r: r is not None)


def _write(good: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The good rows through the courier writer, each ordering key's rows in line order."""
    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="courier-ingest-") as folder:
        report = Path(folder) / "report.json"
        writing = (in_order(good, "line").select(F.col("line").cast("string").alias("key"), "payload", *MESSAGE_FIELDS)
                   .write.format("courier").mode("append").option("report", str(report)))
        for key, value in options.items():
            writing = writing.option(key, value)
        writing.save()
        return json.loads(report.read_text()) if report.exists() else {}


def needs_no_spark(path: Path, file_format: str | None, input_rows: int | None) -> bool:
    """A text file of up to plan.TINY_ROWS lines is checked and enqueued here, without Spark
    (Parquet is read by Spark whatever its size)."""
    from .plan import tiny

    try:
        kind = detect_format(path, file_format)
    except PipelineError:
        return False
    return kind != "parquet" and path.is_file() and small_input(input_rows) and tiny(input_rows)


def run(spark: SparkSession | None, dsn: str, path: Path, endpoint: str, *, priority: int = 0,
        file_format: str | None = None, batch_size: int = 1000, envelope: bool = False,
        input_rows: int | None = None) -> IngestResult:
    """With envelope, each JSONL line or CSV row is a message object (ENVELOPE_FIELDS); a Parquet
    file with a payload column always is. `priority` is the default for rows that set none.
    A small text file (input_rows up to SMALL_INPUT_ROWS and plan.TINY_ROWS) is checked and
    enqueued here, without Spark (spark may be None); a larger one is checked by Spark tasks."""
    from pyspark.sql import functions as F

    if not path.exists():
        raise PipelineError(f"{path} does not exist")
    kind = detect_format(path, file_format)
    with connect(dsn) as conn:
        state = {row["name"]: row["enabled"] for row in store.rows(conn, "endpoint_names")}
    if endpoint not in state:
        raise PipelineError(f'endpoint "{endpoint}" does not exist', "P0002",
                            "Create it with `courier endpoint create`")
    if not state[endpoint]:
        raise PipelineError(f'endpoint "{endpoint}" is disabled', "55000",
                            "Enable it with `courier endpoint enable`")
    scope = f"ingest:{endpoint}:{fingerprint(path)}"
    small = needs_no_spark(path, file_format, input_rows)
    if not small and spark is None:
        raise PipelineError(f"{path.name} needs Spark: it is not a small text file")
    if small:
        with phase("ingest: read and check the rows (in the driver)"):
            checked = _checked_lines(path, kind, envelope)
            bad_rows = sorted((r[0], r[2]) for r in checked if r[2] is not None)
            totals = {"rows": len(checked), "bad": len(bad_rows)}
            errors = [RowError(line, error) for line, error in bad_rows[:REPORTED_ERRORS]]
    else:
        with phase("ingest: read and check the rows (Spark jobs)"):
            rows = spark.createDataFrame(_checked_rdd(spark, path, kind, envelope), ROW_SCHEMA).cache()
            totals = rows.agg(F.count(F.lit(1)).alias("rows"), F.count("error").alias("bad")).collect()[0]
            errors = [RowError(r["line"], r["error"]) for r in
                      rows.where(F.col("error").isNotNull()).orderBy("line").limit(REPORTED_ERRORS).collect()]
    try:
        with connect(dsn) as conn:
            already = int(store.value(conn, "ledger_count", {"scope": scope}))
        options = {"dsn": dsn, "endpoint": endpoint, "priority": priority, "scope": scope, "batch_size": batch_size,
                   "skip_refused": "true"}
        if small:  # here, by the same writer a Spark task runs: one transaction, in line order
            with phase("ingest: enqueue the good rows (here, in one transaction)"):
                written = write_here([
                    {"key": str(row[0]), "payload": row[1], **dict(zip(MESSAGE_FIELDS, row[3:], strict=True))}
                    for row in sorted(checked, key=lambda r: r[0]) if row[2] is None], options)
        else:
            with phase("ingest: enqueue the good rows (Spark job)"):
                spark.sparkContext.setJobDescription("ingest: enqueue")
                written = _write(rows.where(F.col("error").isNull()), options)
                spark.sparkContext.setJobDescription(None)
    finally:
        if not small:
            rows.unpersist()
    refused = [RowError(int(line), reason) for line, reason in written.get("refused", [])]
    bad = totals["bad"] + written.get("refused_count", 0)
    errors = sorted(errors + refused, key=lambda e: e.line)[:REPORTED_ERRORS]
    return IngestResult(str(path), totals["rows"], totals["rows"] - bad, written.get("sent", 0), already, bad, errors)
