"""The `courier` Spark data source (Python Data Source API): reads the queue, the DLQ and the
archive in parallel slices (archive partition x id range) with COPY, and writes messages into
the queue through send_batch, one transaction per Spark partition.

    spark.read.format("courier").option("dsn", dsn).option("table", "archive").load()
    df.write.format("courier").option("dsn", dsn).option("endpoint", "billing").mode("append").save()
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

TABLES = {"archive": "created_at", "queue": "created_at", "dlq": "failed_at", "endpoints": "created_at"}
# Rows per read task: each task costs ~0.1 CPU-second of its own (a Python worker's setup, a
# connection, a plan), so tasks of a few thousand rows cost more than their rows.
DEFAULT_SLICE_ROWS = 250_000
DEFAULT_BATCH = 1000
BLOCK_BYTES = 8 << 20
DEFAULT_BACKPRESSURE_WAIT = 300.0
BACKPRESSURE = "53400"

# PostgreSQL type -> (Spark type, Arrow type name). Anything else is read as its text form.
_TYPES: dict[str, tuple[DataType, str]] = {
    "bigint": (LongType(), "int64"),
    "integer": (IntegerType(), "int32"),
    "smallint": (ShortType(), "int16"),
    "boolean": (BooleanType(), "bool"),
    "double precision": (DoubleType(), "float64"),
    "timestamp with time zone": (TimestampType(), "timestamp"),
}


@dataclass(frozen=True)
class Column:
    name: str
    pg_type: str

    @property
    def spark_type(self) -> DataType:
        return _TYPES.get(self.pg_type, (StringType(), "string"))[0]

    @property
    def arrow_type(self) -> Any:
        import pyarrow as pa

        kind = _TYPES.get(self.pg_type, (None, "string"))[1]
        return pa.timestamp("us", tz="UTC") if kind == "timestamp" else pa.type_for_alias(kind)

    @property
    def is_text(self) -> bool:
        return self.pg_type not in _TYPES


def _options(options: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _connect(dsn: str, *, autocommit: bool = True) -> Any:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=autocommit, application_name="courier pipeline")
    conn.execute("SET TimeZone = 'UTC'")
    return conn


def load(spark: Any, options: dict[str, Any], *, local: bool = False) -> Any:
    """A frame of the courier data source with these options. local (for a small input): the
    same reader runs here, in the driver, and hands Spark its rows as one Arrow table, so no
    Python planner or task process is started for it; the frame is then a local relation."""
    if not local:
        reader = spark.read.format("courier")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()
    schema, table = read_here(options)
    return spark.createDataFrame(table, schema=schema)


def read_here(options: dict[str, Any], pushed: Sequence[tuple[str, str, Any]] = ()) -> tuple[StructType, Any]:
    """The data source's rows read in this process, without Spark: its schema and one Arrow
    table. pushed: filters as pushFilters keeps them, (column, op, value), applied by
    PostgreSQL as a Spark read applies the filters it pushes down."""
    import pyarrow as pa

    source = CourierDataSource({key: str(value) for key, value in options.items()})
    schema = source.schema()
    reader = source.reader(schema)
    reader.pushed.extend(pushed)
    batches = [batch for part in reader.partitions() for batch in reader.read(part)]
    return schema, pa.Table.from_batches(batches, schema=pa.schema([(c.name, c.arrow_type) for c in reader.columns]))


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class CourierDataSource(DataSource):
    """Options: dsn (required); table = archive | queue | dlq | endpoints (reading);
    columns (comma-separated, to prune); since / until (ISO times on time_column, which
    defaults to created_at, failed_at for the DLQ); payload_filter (a jsonpath predicate, or a
    JSON list of them, that PostgreSQL applies as `payload @@ path`); slice_rows (rows per read
    task, by the planner's estimate; default 250,000) or slice_ids (ids per read task).
    Writing: endpoint, priority, scope (the ledger scope deduplicating rows by their `key`
    column), replay ("once" or "again": the `key` column holds archived ids, deduplicated by
    the replay rule courier.claim_replays), batch_size, backpressure_wait (seconds), report (a
    file for the totals)."""

    @classmethod
    def name(cls) -> str:
        return "courier"

    def _columns(self) -> list[Column]:
        from sqlkit import analytics

        opts = _options(self.options)
        table = opts.get("table", "archive")
        if table not in TABLES:
            raise ValueError(f"courier data source: table must be one of {', '.join(TABLES)}, got {table!r}")
        with _connect(opts["dsn"]) as conn:
            found = [Column(n, t) for n, t in analytics.table_columns(conn, f"courier.{table}")]
        wanted = [c.strip() for c in opts.get("columns", "").split(",") if c.strip()]
        if wanted:
            by_name = {c.name: c for c in found}
            missing = [w for w in wanted if w not in by_name]
            if missing:
                raise ValueError(f"courier data source: courier.{table} has no column {', '.join(missing)}")
            found = [by_name[w] for w in wanted]
        return found

    def schema(self) -> StructType:
        return StructType([StructField(c.name, c.spark_type, True) for c in self._columns()])

    def reader(self, schema: StructType) -> CourierReader:
        return CourierReader(_options(self.options), self._columns())

    def writer(self, schema: StructType, overwrite: bool) -> CourierWriter:
        if overwrite:
            raise ValueError("courier data source: messages are only ever appended; use mode('append')")
        return CourierWriter(_options(self.options), [f.name for f in schema.fields])


@dataclass
class Slice(InputPartition):
    """One read task: an id range of one table or archive partition."""
    relation: str | None
    low: int = 0
    high: int = -1
    value: Any = field(default=None, repr=False)


_PUSHABLE = (EqualTo, In, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, IsNull, IsNotNull)
_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}


class CourierReader(DataSourceReader):
    def __init__(self, options: dict[str, str], columns: list[Column]) -> None:
        self.options = options
        self.columns = columns
        self.table = options.get("table", "archive")
        self.time_column = options.get("time_column", TABLES[self.table])
        self.since = _timestamp(options.get("since"))
        self.until = _timestamp(options.get("until"))
        self.pushed: list[tuple[str, str, Any]] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        kinds = {c.name: c for c in self.columns}
        for item in filters:
            column = kinds.get(item.attribute[0]) if len(item.attribute) == 1 else None
            plain = column is not None and column.pg_type != "timestamp with time zone"
            if plain and isinstance(item, _PUSHABLE):
                if isinstance(item, IsNull | IsNotNull):
                    self.pushed.append((column.name, "null" if isinstance(item, IsNull) else "not null", None))
                elif isinstance(item, In):
                    self.pushed.append((column.name, "in", list(item.value)))
                else:
                    self.pushed.append((column.name, _OPS[type(item)], item.value))
            else:
                yield item

    def partitions(self) -> Sequence[Slice]:
        from sqlkit import analytics, archive

        given_ids = self.options.get("slice_ids")
        per_slice_rows = int(self.options.get("slice_rows", DEFAULT_SLICE_ROWS))
        relations: list[str] = []
        with _connect(self.options["dsn"]) as conn:
            if self.table == "archive":
                for part in archive.partitions(conn):
                    if self.time_column == "created_at" and part.range_from is not None:
                        if self.until and part.range_from >= self.until:
                            continue
                        if self.since and part.range_to is not None and part.range_to <= self.since:
                            continue
                    relations.append(part.partition_name)
            else:
                relations.append(self.table)
            slices: list[Slice] = []
            for relation in relations:
                bounds = analytics.rows(conn, "id_bounds", relation=("courier", relation))[0]
                if bounds["low"] is None:
                    continue
                low, high = int(bounds["low"]), int(bounds["high"])
                if given_ids:
                    count = max(1, math.ceil((high - low + 1) / int(given_ids)))
                else:  # ids interleave across months, so size by the planner's row estimate
                    estimate = analytics.value(conn, "relation_rows", {"relation": f"courier.{relation}"})
                    rows = estimate if estimate and estimate > 0 else high - low + 1
                    count = max(1, math.ceil(rows / per_slice_rows))
                step = math.ceil((high - low + 1) / count)
                slices += [Slice(relation, start, min(start + step - 1, high)) for start in range(low, high + 1, step)]
        return slices or [Slice(None)]

    def _select(self, part: Slice) -> Any:
        from psycopg import sql

        selected = sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(c.name)) if c.is_text and c.pg_type not in ("text", "jsonb")
            else sql.Identifier(c.name) for c in self.columns)
        where = [sql.SQL("id BETWEEN {} AND {}").format(sql.Literal(part.low), sql.Literal(part.high)),
                 *self.conditions()]
        return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT WITH (FORMAT csv)").format(
            selected, sql.Identifier("courier", part.relation), sql.SQL(" AND ").join(where))

    def conditions(self) -> list[Any]:
        """The WHERE conditions of every slice but its id range: the time range, the payload
        filters and the pushed filters. plan.py counts with the same ones."""
        from psycopg import sql

        where = []
        if self.since:
            where.append(sql.SQL("{} >= {}").format(sql.Identifier(self.time_column), sql.Literal(self.since)))
        if self.until:
            where.append(sql.SQL("{} < {}").format(sql.Identifier(self.time_column), sql.Literal(self.until)))
        for path in _payload_filters(self.options.get("payload_filter")):
            where.append(sql.SQL("payload @@ {}::jsonpath").format(sql.Literal(path)))
        for name, op, value in self.pushed:
            column = sql.Identifier(name)
            if op in ("null", "not null"):
                where.append(sql.SQL("{} IS " + op.upper()).format(column))
            elif op == "in":
                where.append(sql.SQL("{} = ANY({})").format(column, sql.Literal(value)))
            else:
                where.append(sql.SQL("{} " + op + " {}").format(column, sql.Literal(value)))
        return where

    def read(self, partition: Slice) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        if partition.relation is None:
            return
        names = [c.name for c in self.columns]
        read_options = pacsv.ReadOptions(column_names=names, block_size=BLOCK_BYTES, use_threads=False)
        convert = pacsv.ConvertOptions(
            column_types={c.name: c.arrow_type for c in self.columns},
            strings_can_be_null=True, quoted_strings_can_be_null=False,
            true_values=["t"], false_values=["f"])
        schema = pa.schema([(c.name, c.arrow_type) for c in self.columns])
        with _connect(self.options["dsn"]) as conn:
            for block in copy_out_blocks(conn, self._select(partition)):
                table = pacsv.read_csv(pa.py_buffer(block), read_options=read_options, convert_options=convert)
                for batch in table.to_batches():
                    yield batch.cast(schema) if batch.schema != schema else batch


def _payload_filters(option: str | None) -> list[str]:
    """The payload_filter option: one jsonpath predicate, or a JSON list of them."""
    if not option:
        return []
    if option.lstrip().startswith("["):
        return [str(path) for path in json.loads(option)]
    return [option]


def copy_out_blocks(conn: Any, statement: Any, size: int = BLOCK_BYTES) -> Iterator[bytearray]:
    """COPY ... TO STDOUT's output in blocks of whole rows (PostgreSQL sends each row as one
    message), read straight off libpq into one growing buffer. psycopg's Copy.read() costs a
    generator round trip per row, and a list of per-row buffers wakes the garbage collector
    over and over: together they were two thirds of the reader's CPU time."""
    from psycopg import errors, pq

    pgconn = conn.pgconn
    pgconn.send_query(statement.as_bytes(conn) if hasattr(statement, "as_bytes") else statement)
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        raise errors.error_from_result(result, encoding=conn.info.encoding) if result is not None \
            else errors.OperationalError(pgconn.get_error_message())
    read = pgconn.get_copy_data
    block = bytearray()
    while True:
        length, row = read(0)  # waits in libpq for a whole row; -1 once the COPY is over
        if length < 0:
            break
        block += row
        if len(block) >= size:
            yield block
            block = bytearray()
    while (result := pgconn.get_result()) is not None:  # the COPY's closing result, or its error
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=conn.info.encoding)
    if block:
        yield block


# The per-message fields a written row may carry, besides payload, endpoint and key; each is
# passed to courier.send_batch_with_options as one array per batch.
MESSAGE_FIELDS = ("priority", "scheduled_at", "idempotency_key", "correlation_id", "expires_at", "ordering_key",
                  "headers", "metadata")
_JSON_FIELDS = ("payload", "headers", "metadata")
_TIME_FIELDS = ("scheduled_at", "expires_at")


def _first_of_each(chunk: list[dict[str, Any]], fresh: set[str]) -> list[dict[str, Any]]:
    """The unkeyed rows, and the first row of each key the ledger had not seen."""
    kept = []
    for record in chunk:
        key = record.get("key")
        if key is None or key in fresh:
            kept.append(record)
            fresh.discard(key)  # a key repeated within the selection is enqueued once
    return kept


def _message(record: dict[str, Any], default_priority: int) -> dict[str, Any]:
    """A row as send_batch_with_options' fields: JSON as text, times with their zone, ids as text."""
    message = {name: record.get(name) for name in ("payload", "key", *MESSAGE_FIELDS)}
    if message["key"] is not None:
        message["key"] = str(message["key"])
    if message["priority"] is None:
        message["priority"] = default_priority
    for name in _JSON_FIELDS:
        if message[name] is not None and not isinstance(message[name], str):
            message[name] = json.dumps(message[name])
    for name in _TIME_FIELDS:
        moment = message[name]
        if isinstance(moment, datetime):  # Spark hands timestamps over as naive local times
            message[name] = moment.astimezone(UTC)
    if message["correlation_id"] is not None:
        message["correlation_id"] = str(message["correlation_id"])
    return message


def in_order(df: Any, position: str) -> Any:
    """The rows laid out for writing so that each ordering key keeps its order: all of one
    endpoint's ordering key in one Spark partition (one transaction), sorted by `position`."""
    return df.repartition("endpoint", "ordering_key").sortWithinPartitions(position) \
        if "endpoint" in df.columns else df.repartition("ordering_key").sortWithinPartitions(position)


@dataclass
class Sent(WriterCommitMessage):
    rows: int
    sent: int
    skipped: int
    refused: list[tuple[str | None, str]] = field(default_factory=list)  # (key, why): the first REPORTED_REFUSALS
    refused_count: int = 0


REPORTED_REFUSALS = 1000


class _Refused(Exception):
    """send_batch_with_options refused one row of a chunk for its content."""

    def __init__(self, error: Exception, message: dict[str, Any], reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.message = message
        self.reason = reason


# A batch element the send path refused for its own content: send_batch_with_options names the
# first such element ("batch element 3: ..."), with a data exception, a key conflict or a size.
_REFUSED_ELEMENT = re.compile(r"^batch element (\d+): (.*)$", re.DOTALL)
_ROW_SQLSTATES = ("22", "23505", "54000")


def _refused_element(error: Exception) -> tuple[int, str] | None:
    """The 1-based element and the reason, if the error is one row's refusal."""
    sqlstate = getattr(error, "sqlstate", None) or ""
    found = _REFUSED_ELEMENT.match(getattr(error, "message", ""))
    if found is None or not any(sqlstate.startswith(prefix) for prefix in _ROW_SQLSTATES):
        return None
    return int(found.group(1)), found.group(2)


class CourierWriter(DataSourceWriter):
    """Each Spark partition's rows are enqueued in one transaction: a failed or retried task
    leaves nothing behind. Rows need `payload` (JSON text) and, unless the endpoint option is
    set, `endpoint`; they may carry any of MESSAGE_FIELDS (headers and metadata as JSON text),
    each kept on its message, and `key`. With a scope, a row whose key that scope already
    enqueued (a re-run, a retried task) is skipped. With skip_refused, a row the send path
    refuses (its rules, in the database) is left out and reported by its key, and the rest
    is enqueued: each refusal rolls back only its batch's attempt (a savepoint) and the batch
    is sent again without that row."""

    def __init__(self, options: dict[str, str], fields: list[str]) -> None:
        self.options = options
        self.fields = fields
        if "payload" not in fields:
            raise ValueError("courier data source: the rows to write need a payload column")
        if "endpoint" not in fields and not options.get("endpoint"):
            raise ValueError("courier data source: give the endpoint option or an endpoint column")
        if "key" in fields and not options.get("scope") and not options.get("replay"):
            raise ValueError("courier data source: rows with a key column need the scope or replay option")
        if options.get("replay") not in (None, "once", "again"):
            raise ValueError(f"courier data source: replay must be once or again, got {options['replay']!r}")

    def write(self, iterator: Iterator[Any]) -> Sent:
        default_endpoint = self.options.get("endpoint")
        default_priority = int(self.options.get("priority", 0))
        groups: dict[str, list[dict[str, Any]]] = {}
        rows = 0
        for row in iterator:
            rows += 1
            record = row.asDict()
            groups.setdefault(record.get("endpoint") or default_endpoint, []).append(
                _message(record, default_priority))
        if not rows:
            return Sent(0, 0, 0)
        wait = float(self.options.get("backpressure_wait", DEFAULT_BACKPRESSURE_WAIT))
        deadline = time.monotonic() + wait
        delay = 0.2
        while True:
            try:
                sent, refused = self._send(groups)
                return Sent(rows, sent, rows - sent - len(refused), refused[:REPORTED_REFUSALS], len(refused))
            except Exception as error:
                if getattr(error, "sqlstate", None) != BACKPRESSURE or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)  # the workers drain the queue meanwhile
                delay = min(delay * 2, 5.0)

    def _send(self, groups: dict[str, list[dict[str, Any]]]) -> tuple[int, list[tuple[str | None, str]]]:
        size = int(self.options.get("batch_size", DEFAULT_BATCH))
        skip_refused = self.options.get("skip_refused") == "true"
        sent = 0
        refused: list[tuple[str | None, str]] = []
        with _connect(self.options["dsn"], autocommit=False) as conn, conn.transaction():
            for endpoint, items in groups.items():
                for start in range(0, len(items), size):
                    chunk = items[start:start + size]
                    if skip_refused:
                        sent += self._send_skipping(conn, endpoint, chunk, refused)
                    else:
                        try:
                            sent += self._send_chunk(conn, endpoint, chunk)
                        except _Refused as refusal:
                            raise refusal.error from None
        return sent, refused

    def _send_skipping(self, conn: Any, endpoint: str, chunk: list[dict[str, Any]],
                       refused: list[tuple[str | None, str]]) -> int:
        """Send the chunk without the rows the database refuses, adding those to refused. A
        refusal that names no element (a value PostgreSQL cannot convert, failing the whole
        array) is narrowed down by halves."""
        while chunk:
            try:
                with conn.transaction():  # a savepoint: a refused row undoes only this attempt
                    return self._send_chunk(conn, endpoint, chunk)
            except _Refused as refusal:
                refused.append((refusal.message["key"], refusal.reason))
                chunk = [m for m in chunk if m is not refusal.message]
            except Exception as error:
                if not str(getattr(error, "sqlstate", None) or "").startswith("22"):
                    raise
                if len(chunk) == 1:
                    refused.append((chunk[0]["key"], getattr(error, "message", str(error))))
                    return 0
                half = len(chunk) // 2
                return (self._send_skipping(conn, endpoint, chunk[:half], refused)
                        + self._send_skipping(conn, endpoint, chunk[half:], refused))
        return 0

    def _send_chunk(self, conn: Any, endpoint: str, chunk: list[dict[str, Any]]) -> int:
        """Enqueue the chunk's rows its ledger has not seen; raises _Refused naming a refused row."""
        from sqlkit import analytics

        scope = self.options.get("scope")
        replay = self.options.get("replay")
        carried = [name for name in MESSAGE_FIELDS if name in self.fields]
        if scope:
            keys = [m["key"] for m in chunk if m["key"] is not None]
            fresh = {row["source_key"] for row in analytics.rows(
                conn, "ledger_claim", {"scope": scope, "keys": keys})}
            chunk = _first_of_each(chunk, fresh)
        elif replay:
            archive_ids = [int(m["key"]) for m in chunk if m["key"] is not None]
            fresh = {str(row["archive_id"]) for row in analytics.rows(
                conn, "claim_replays", {"archive_ids": archive_ids, "again": replay == "again"})}
            chunk = _first_of_each(chunk, fresh)
        if not chunk:
            return 0
        fields = {name: [m[name] for m in chunk] if name in carried or name == "priority" else None
                  for name in MESSAGE_FIELDS}
        try:
            ids = analytics.value(conn, "send_batch_with_options", {
                "endpoint": endpoint, "payloads": [m["payload"] for m in chunk], **fields})
        except Exception as error:
            element = _refused_element(error)
            if element is None or not 1 <= element[0] <= len(chunk):
                raise
            raise _Refused(error, chunk[element[0] - 1], element[1]) from error
        if replay:
            copies = [(int(m["key"]), i) for m, i in zip(chunk, ids, strict=True) if m["key"] is not None]
            analytics.rows(conn, "record_replay_copies", {
                "archive_ids": [a for a, _ in copies], "message_ids": [i for _, i in copies]})
        return len(chunk)

    def totals(self, messages: list[Sent | None]) -> dict[str, Any]:
        """What the tasks wrote, summed (the report)."""
        done = [m for m in messages if m is not None]
        totals: dict[str, Any] = {"rows": sum(m.rows for m in done), "sent": sum(m.sent for m in done),
                                  "skipped": sum(m.skipped for m in done)}
        if self.options.get("skip_refused") == "true":
            totals["refused"] = [list(item) for m in done for item in m.refused]
            totals["refused_count"] = sum(m.refused_count for m in done)
        return totals

    def commit(self, messages: list[Sent | None]) -> None:
        report = self.options.get("report")
        if report:
            with open(report, "w", encoding="utf-8") as out:
                json.dump(self.totals(messages), out)


def write_here(rows: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """A few rows (dicts of the writer's columns, in order) enqueued by the courier writer in
    this process, in one transaction, without Spark: what write_in_one_task does in a Spark task."""
    from pyspark.sql import Row

    if not rows:
        return {"rows": 0, "sent": 0, "skipped": 0, "refused": [], "refused_count": 0}
    writer = CourierWriter({key: str(value) for key, value in options.items()}, list(rows[0]))
    return writer.totals([writer.write(iter([Row(**row) for row in rows]))])


def write_in_one_task(spark: Any, rows: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """A few rows (dicts of the writer's columns, in order) enqueued by the courier writer in
    one Spark task, one transaction: the same writer as df.write.format("courier"), without
    the Python planner processes a data source write starts (its writer, its commit)."""
    from pyspark.sql import Row

    if not rows:
        return {"rows": 0, "sent": 0, "skipped": 0, "refused": [], "refused_count": 0}
    writer = CourierWriter({key: str(value) for key, value in options.items()}, list(rows[0]))
    sent = spark.sparkContext.parallelize([Row(**row) for row in rows], 1).mapPartitions(
        lambda part: [writer.write(part)]).collect()
    return writer.totals(sent)
