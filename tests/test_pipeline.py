"""The `courier` Spark data source, in Spark local mode over small generated archives.

One SparkSession serves the whole test session (Spark's start-up is the slow part)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

pyspark = pytest.importorskip("pyspark")

from console.pipeline.session import java_executable  # noqa: E402

if java_executable() is None and not os.environ.get("CI"):
    # A user's machine without Java still runs the rest of the suite; CI has Java and must run these.
    pytest.skip("the Spark pipeline tests need a Java 17+ runtime (none on PATH or JAVA_HOME)",
                allow_module_level=True)

from console.pipeline.session import get_session  # noqa: E402

SEED = """
SELECT courier.create_endpoint('billing', 'noop', '{}');
SELECT courier.create_endpoint('shipping', 'noop', '{}');
SELECT courier.create_endpoint('audit', 'noop', '{}');
INSERT INTO courier.archive (id, endpoint_id, payload, status, priority, retry_count, correlation_id,
                             last_error, error_history, completed_at, created_at)
SELECT i,
       e.id,
       jsonb_build_object('i', i, 'order', jsonb_build_object('total', (i * 37) % 250, 'currency',
                          CASE WHEN i % 3 = 0 THEN 'EUR' ELSE 'USD' END)),
       s.status,
       (i % 4)::smallint,
       r.retries,
       CASE WHEN i % 10 = 0 THEN md5(i::text)::uuid END,
       CASE WHEN r.retries > 0 THEN 'HTTP 503: unavailable' END,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'attempt', a, 'outcome', CASE WHEN a % 2 = 0 THEN 'retryable' ELSE 'permanent' END,
                    'error', CASE WHEN (i + a) % 3 = 0 THEN 'timeout after 10s'
                                  WHEN (i + a) % 3 = 1 THEN 'HTTP 503: unavailable'
                                  ELSE 'connection reset: peer' END))
                 FROM generate_series(1, r.retries) a), '[]'),
       t.created + make_interval(secs => ((i * 7919) % 5000) / 1000.0),
       t.created
FROM generate_series(1, {rows}) i
JOIN courier.endpoints e ON e.name = (ARRAY['billing', 'shipping', 'audit'])[1 + i % 3]
CROSS JOIN LATERAL (SELECT CASE WHEN i % 11 = 0 THEN 'failed' WHEN i % 17 = 0 THEN 'expired'
                                ELSE 'completed' END AS status) s
CROSS JOIN LATERAL (SELECT CASE WHEN s.status = 'failed' THEN 3 ELSE (i % 5) / 3 END AS retries) r
CROSS JOIN LATERAL (SELECT timestamptz '2026-08-01 00:00:00+00'
                           + make_interval(mins => (i * 131) % (60 * 24 * 92)) AS created) t;
SELECT courier.maintain_archive_partitions(0);
"""


def seed_archive(conn: psycopg.Connection, rows: int = 3000) -> None:
    """Archived messages over August to October 2026, on three endpoints, one partition a month."""
    for statement in SEED.split(";\n"):
        if statement.strip():
            conn.execute(statement.replace("{rows}", str(int(rows))))


@pytest.fixture(scope="session")
def spark() -> Iterator[pyspark.sql.SparkSession]:
    session = get_session("local[2]")
    yield session
    session.stop()


@pytest.fixture
def archive_dsn(dsn: str, conn: psycopg.Connection) -> str:
    seed_archive(conn)
    return dsn


def test_reads_the_archive_in_parallel_slices_equal_to_sql(spark, archive_dsn, conn):
    df = (spark.read.format("courier").option("dsn", archive_dsn).option("table", "archive")
          .option("slice_ids", 500).load())
    assert df.rdd.getNumPartitions() >= 6  # three monthly partitions, several id ranges each
    got = sorted((r.id, r.endpoint_id, r.status, r.payload, r.created_at) for r in df.collect())
    want = sorted(conn.execute("SELECT id, endpoint_id, status, payload::text, created_at FROM courier.archive")
                  .fetchall())
    assert len(got) == 3000
    assert [(i, e, s, p) for i, e, s, p, _ in got] == [(i, e, s, p) for i, e, s, p, _ in want]
    assert [c.timestamp() for *_, c in got] == [c.timestamp() for *_, c in want]


def test_prunes_columns_and_pushes_filters_down(spark, archive_dsn, conn):
    df = (spark.read.format("courier").option("dsn", archive_dsn).option("table", "archive")
          .option("columns", "id,endpoint_id,status").load())
    assert df.columns == ["id", "endpoint_id", "status"]
    billing = conn.execute("SELECT id FROM courier.endpoints WHERE name = 'billing'").fetchone()[0]
    picked = df.where((df.endpoint_id == billing) & df.status.isin("failed", "expired"))
    plan = picked._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan courier" in plan and " Filter " not in plan  # PostgreSQL applies both filters
    want = conn.execute("SELECT count(*) FROM courier.archive WHERE endpoint_id = %s "
                        "AND status IN ('failed', 'expired')", (billing,)).fetchone()[0]
    assert picked.count() == want > 0


def test_reads_the_queue_and_the_dlq(spark, dsn, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('billing', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 50) g")
    queue = spark.read.format("courier").option("dsn", dsn).option("table", "queue").load()
    assert queue.where(queue.status == "pending").count() == 50
    dlq = spark.read.format("courier").option("dsn", dsn).option("table", "dlq").load()
    assert dlq.count() == 0 and "original_message_id" in dlq.columns


def test_writes_one_transaction_per_partition_and_skips_keys_already_sent(spark, dsn, conn, tmp_path):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    rows = [(str(i), json.dumps({"n": i}), i % 3) for i in range(200)]
    df = spark.createDataFrame(rows, "key string, payload string, priority int").repartition(4)
    report = tmp_path / "report.json"
    for _ in range(2):
        (df.write.format("courier").mode("append").option("dsn", dsn).option("endpoint", "billing")
         .option("scope", "test:once").option("report", str(report)).save())
    assert json.loads(report.read_text()) == {"rows": 200, "sent": 0, "skipped": 200}
    assert conn.execute("SELECT count(*), count(DISTINCT payload), sum(priority) FROM courier.queue").fetchone() \
        == (200, 200, sum(r[2] for r in rows))


def test_a_failing_partition_writes_nothing(spark, dsn, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    rows = [(json.dumps({"n": i}),) for i in range(99)] + [("not json",)]
    df = spark.createDataFrame(rows, "payload string").coalesce(1)
    with pytest.raises(Exception, match="json"):
        df.write.format("courier").mode("append").option("dsn", dsn).option("endpoint", "billing").save()
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 0


def _analytics_sql(conn: psycopg.Connection, name: str, **params: object) -> list[tuple]:
    from sqlkit import analytics as store

    conn.execute("SET TimeZone = 'UTC'")
    found = store.rows(conn, name, {"from": None, "to": datetime(2100, 1, 1, tzinfo=UTC), "top": 5, **params})
    return sorted(tuple(float(v) if isinstance(v, Decimal) else v for v in row.values()) for row in found)


def _stored(conn: psycopg.Connection, table: str, columns: str) -> list[tuple]:
    return sorted(conn.execute(f"SELECT {columns} FROM courier.{table}").fetchall())


def test_analytics_equal_the_same_aggregation_in_sql_and_rerun_without_duplicates(spark, archive_dsn, conn):
    from click.testing import CliRunner

    from console.cli.pipeline import pipeline_group

    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(pipeline_group, ["analytics", "--dsn", archive_dsn, "--master", "local[2]", "--json"])
        assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    names = dict(conn.execute("SELECT id, name FROM courier.endpoints").fetchall())
    # The SQL summary's last column is its rows read, which the JSON summary does not show.
    want = [(names[row[0]], *row[1:-1]) for row in _analytics_sql(conn, "sql_analytics_summary")]
    assert sorted(tuple(row.values()) for row in summary) == sorted(want)
    assert set(summary[0]) == {"endpoint", "delivered", "failed", "expired", "dead_lettered",
                               "p50_ms", "p95_ms", "p99_ms"}
    assert sum(r["delivered"] + r["expired"] + r["dead_lettered"] for r in summary) == 3000

    hourly = _stored(conn, "analytics_hourly",
                     "endpoint_id, hour, delivered, failed, expired, dead_lettered, p50_ms, p95_ms, p99_ms")
    assert hourly == _analytics_sql(conn, "sql_analytics_hourly")
    assert len(hourly) > 1000
    assert _stored(conn, "analytics_attempts", "endpoint_id, hour, attempts, messages") \
        == _analytics_sql(conn, "sql_analytics_attempts")
    errors = _stored(conn, "analytics_errors", "endpoint_id, hour, error_class, occurrences")
    assert errors == _analytics_sql(conn, "sql_analytics_errors")
    assert {e[2] for e in errors} == {"timeout", "HTTP 503", "connection"}
    assert conn.execute("SELECT count(*) FROM courier.analytics_runs").fetchone()[0] == 2


def test_analytics_since_replaces_only_the_hours_it_analysed(spark, archive_dsn, conn):
    from console.pipeline import analytics

    analytics.run(spark, archive_dsn, None)
    before = _stored(conn, "analytics_hourly", "endpoint_id, hour, delivered")
    since = datetime(2026, 10, 1, tzinfo=UTC)
    result = analytics.run(spark, archive_dsn, since)
    assert result.range_from == since
    assert _stored(conn, "analytics_hourly", "endpoint_id, hour, delivered") == before
    assert result.rows_read == conn.execute("SELECT count(*) FROM courier.archive WHERE completed_at >= %s",
                                            (since,)).fetchone()[0]

    from sqlkit import analytics as store  # what the console's Analytics pane reads

    charted = store.hourly(conn, since)
    assert {h.endpoint for h in charted} == {"billing", "shipping", "audit"}
    assert all(h.hour >= since for h in charted) and charted == sorted(charted, key=lambda h: (h.hour, h.endpoint))
    latest = store.latest_run(conn)
    assert latest is not None and latest.range_from == since and len(latest.endpoints) == 3


def test_a_write_waits_out_backpressure(spark, dsn, conn):
    import threading

    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '150')")
    conn.execute("SELECT courier.send_batch('billing', array_agg(jsonb_build_object('old', g))) "
                 "FROM generate_series(1, 100) g")
    drained = threading.Timer(3.0, lambda: psycopg.connect(dsn, autocommit=True).execute(
        "DELETE FROM courier.queue WHERE payload ? 'old'"))
    drained.start()
    df = spark.createDataFrame([(json.dumps({"n": i}),) for i in range(100)], "payload string").coalesce(1)
    df.write.format("courier").mode("append").option("dsn", dsn).option("endpoint", "billing") \
        .option("backpressure_wait", 60).save()
    drained.join()
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 100
