"""Issue 41, item 7: the pipeline's small jobs. One SQL count decides whether a command needs
Spark: an empty job answers at once without starting a JVM, a tiny one is done in SQL and
Python with the same output as the Spark path (both run here on the same data), the count
printed is the filtered range's exact count, the run logs go to a folder of their own, and a
piped analytics table prints whole values."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from tests.helpers import scalar
from tests.test_pipeline import archive_dsn, seed_archive, spark  # noqa: F401 - shared fixtures

pytest.importorskip("pyspark")

from console.pipeline import plan
from console.pipeline import session as run_session

ROOT = Path(__file__).resolve().parent.parent
TINY_ENDPOINT = """
SELECT courier.create_endpoint('tiny', 'noop', '{}');
INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at)
SELECT 900000 + i, (SELECT id FROM courier.endpoints WHERE name = 'tiny'), jsonb_build_object('i', i), 'completed',
       timestamptz '2026-09-10 10:00:00+00' + make_interval(secs => i), timestamptz '2026-09-10 10:00:00+00'
FROM generate_series(1, 3) i;
"""


def _pipeline(*args: str, env: dict[str, str] | None = None):
    from console.cli.pipeline import pipeline_group

    return CliRunner(env=env).invoke(pipeline_group, [*args, "--master", "local[2]"])


def _fake_java(folder: Path) -> tuple[Path, Path]:
    """A JAVA_HOME whose java only leaves a mark: if the mark is there, a JVM was started."""
    marker = folder / "java-ran"
    java = folder / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    java.chmod(0o755)
    return java.parent.parent, marker


def _command(args: list[str], tmp_path: Path, java_home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAVA_HOME": str(java_home), "COURIER_LOG_DIR": str(tmp_path / "logs"), **extra}
    return subprocess.run([sys.executable, "-m", "console", "pipeline", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def _took(stderr: str, what: str) -> float:
    found = re.search(rf"^{re.escape(what)}: [\d,]+ row\(s\) in (\d+\.\d) s$", stderr, re.MULTILINE)
    assert found, stderr
    return float(found.group(1))


def test_an_empty_export_and_replay_dry_run_answer_at_once_without_a_jvm(dsn, conn, tmp_path):
    conn.execute(TINY_ENDPOINT)
    java_home, marker = _fake_java(tmp_path)
    export = _command(["export", "--before", "2026-01-01", "--to", str(tmp_path / "out"), "--dsn", dsn],
                      tmp_path, java_home)
    assert export.returncode == 0, export.stderr
    assert "no whole month of the archive is older than --before" in export.stdout
    assert _took(export.stderr, "export") < 1.5 and "starting Spark" not in export.stderr

    replay = _command(["replay", "--endpoint", "tiny", "--status", "failed", "--dry-run", "--dsn", dsn],
                      tmp_path, java_home)
    assert replay.returncode == 0, replay.stderr
    assert "would replay 0 message(s): 0 match" in replay.stdout
    assert _took(replay.stderr, "replay (dry run)") < 1.5 and "starting Spark" not in replay.stderr
    assert not marker.exists()  # no java process ran
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())  # no run log either

    # The control: a job that does need Spark (forced: no job is tiny) does start the fake java.
    forced = _command(["replay", "--endpoint", "tiny", "--dsn", dsn], tmp_path, java_home,
                      COURIER_PIPELINE_TINY_ROWS="0")
    assert forced.returncode == 1 and "Spark did not start" in forced.stderr
    assert marker.exists()
    log = next((tmp_path / "logs").glob("spark-*.log")).read_text()
    assert re.match(r"# courier pipeline run: .*pipeline replay\n", log) and "Spark did not start" in log
    assert dsn not in log  # the command's name, never its options


def test_the_count_printed_for_a_3_row_endpoint_is_3(spark, archive_dsn, conn, monkeypatch):  # noqa: F811
    conn.execute(TINY_ENDPOINT)  # beside the 3,000 rows of three other endpoints
    assert plan.count_archive(archive_dsn, {"table": "archive"}) == 3003
    quiet = _pipeline("replay", "--endpoint", "tiny", "--dry-run", "--dsn", archive_dsn, "--verbose")
    assert quiet.exit_code == 0, quiet.output
    assert "no Spark: 3 row(s), at most 50,000: done here" in quiet.stderr
    assert "would replay 3 message(s): 3 match" in quiet.stdout

    monkeypatch.setenv(plan.TINY_ROWS_ENV, "0")  # so it goes to Spark, which says what it starts for
    forced = _pipeline("replay", "--endpoint", "tiny", "--dsn", archive_dsn)
    assert forced.exit_code == 0, forced.output
    assert re.search(r"starting Spark \(local\[2\]\) for 3 row\(s\);", forced.stderr), forced.stderr
    assert "replayed 3 message(s) of 3 matching" in forced.stdout

    since = _pipeline("analytics", "--since", "2026-09-10 10:00:00", "--until", "2026-09-10 11:00:00",
                      "--dsn", archive_dsn)
    in_range = conn.execute("SELECT count(*) FROM courier.archive WHERE completed_at >= '2026-09-10 10:00+00' "
                            "AND completed_at < '2026-09-10 11:00+00'").fetchone()[0]
    assert re.search(rf"starting Spark \(local\[2\]\) for {in_range} row\(s\);", since.stderr), since.stderr


def _analytics_state(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    def plain(rows):
        return sorted(tuple(float(v) if isinstance(v, Decimal) else v for v in row) for row in rows)

    return {table: plain(conn.execute(f"SELECT {columns} FROM courier.{table}").fetchall()) for table, columns in (
        ("analytics_hourly", "endpoint_id, hour, delivered, failed, expired, dead_lettered, p50_ms, p95_ms, p99_ms"),
        ("analytics_attempts", "endpoint_id, hour, attempts, messages"),
        ("analytics_errors", "endpoint_id, hour, error_class, occurrences"))}


def test_tiny_analytics_in_sql_equal_the_spark_job(spark, archive_dsn, conn, monkeypatch):  # noqa: F811
    # Cancelled and purged messages (issue 42) are read, and left out of the attempts in both.
    conn.execute("UPDATE courier.archive SET status = 'cancelled' WHERE id IN "
                 "(SELECT id FROM courier.archive WHERE status = 'completed' ORDER BY id LIMIT 7)")
    conn.execute("UPDATE courier.archive SET status = 'purged' WHERE id IN "
                 "(SELECT id FROM courier.archive WHERE status = 'failed' ORDER BY id LIMIT 5)")
    monkeypatch.setenv(plan.TINY_ROWS_ENV, "0")
    through_spark = _pipeline("analytics", "--dsn", archive_dsn, "--json", "--until", "2026-12-01")
    assert through_spark.exit_code == 0, through_spark.output
    spark_state = _analytics_state(conn)
    conn.execute("DELETE FROM courier.analytics_hourly; DELETE FROM courier.analytics_attempts; "
                 "DELETE FROM courier.analytics_errors")
    monkeypatch.delenv(plan.TINY_ROWS_ENV)
    in_sql = _pipeline("analytics", "--dsn", archive_dsn, "--json", "--until", "2026-12-01", "--verbose")
    assert in_sql.exit_code == 0, in_sql.output
    assert "analytics: aggregate in PostgreSQL" in in_sql.stderr and "Spark job" not in in_sql.stderr
    assert json.loads(in_sql.stdout) == json.loads(through_spark.stdout)
    assert _analytics_state(conn) == spark_state
    assert len(spark_state["analytics_hourly"]) > 1000 and spark_state["analytics_errors"]
    runs = conn.execute("SELECT master, rows_read, endpoints FROM courier.analytics_runs ORDER BY id").fetchall()
    assert [(m, r) for m, r, _ in runs] == [("local[2]", 3000), ("PostgreSQL (no Spark)", 3000)]
    assert runs[0][2] == runs[1][2]  # the per-endpoint summary the console's pane shows
    attempted = sum(row[-1] for row in spark_state["analytics_attempts"])
    assert attempted == scalar(conn, "SELECT count(*) FROM courier.archive "
                                     "WHERE status NOT IN ('expired', 'cancelled', 'purged')")


def _queue(conn: psycopg.Connection) -> list[tuple]:
    return sorted(conn.execute(
        "SELECT e.name, q.payload::text, q.priority, q.headers::text, q.metadata::text, q.ordering_key, "
        "q.correlation_id FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id").fetchall())


def test_a_tiny_replay_done_here_equals_the_spark_replay(spark, archive_dsn, conn, monkeypatch):  # noqa: F811
    conn.execute("UPDATE courier.archive SET metadata = '{\"source\": \"crm\", \"replayed_from\": 1}', "
                 "headers = '{\"x-trace\": \"t\"}', ordering_key = 'k' || (id % 4) WHERE id % 7 = 0")
    args = ["replay", "--endpoint", "billing", "--endpoint", "audit", "--status", "completed", "--status", "failed",
            "--where", "$.order.total > 120", "--since", "2026-08-15", "--until", "2026-10-15", "--dsn", archive_dsn,
            "--json"]
    monkeypatch.setenv(plan.TINY_ROWS_ENV, "0")
    through_spark = _pipeline(*args)
    assert through_spark.exit_code == 0, through_spark.output
    spark_queue = _queue(conn)
    conn.execute("DELETE FROM courier.queue; DELETE FROM courier.replayed_messages")
    monkeypatch.delenv(plan.TINY_ROWS_ENV)
    here = _pipeline(*args[:-1], "--verbose")
    assert here.exit_code == 0, here.output
    assert "no Spark:" in here.stderr and "starting Spark" not in here.stderr
    assert _queue(conn) == spark_queue
    assert len(spark_queue) > 100 and any('"source": "crm"' in row[4] for row in spark_queue)
    result = json.loads(through_spark.stdout)
    assert result["enqueued"] == result["matched"] == len(spark_queue)
    assert f"replayed {len(spark_queue):,} message(s) of {len(spark_queue):,} matching" in here.stdout
    # A dry run is the SQL count, whatever its size; the Spark path counts the same.
    from datetime import UTC, datetime

    from console.pipeline import replay

    dry = json.loads(_pipeline(*args, "--dry-run").stdout)
    selection = replay.Selection(("billing", "audit"), datetime(2026, 8, 15, tzinfo=UTC),
                                 datetime(2026, 10, 15, tzinfo=UTC), ("completed", "failed"), (),
                                 ("$.order.total > 120",))
    counted = replay.run(spark, archive_dsn, selection, dry_run=True, input_rows=None)
    assert (dry["matched"], dry["already_replayed"], dry["by_endpoint"]) \
        == (counted.matched, counted.already_replayed, counted.by_endpoint) == (len(spark_queue), len(spark_queue),
                                                                            dry["by_endpoint"])
    assert set(dry["by_endpoint"]) == {"billing", "audit"}


def test_an_export_with_nothing_left_to_write_starts_no_spark(spark, archive_dsn, tmp_path):  # noqa: F811
    first = _pipeline("export", "--before", "2026-10-01", "--to", str(tmp_path), "--dsn", archive_dsn)
    assert first.exit_code == 0, first.output
    assert "starting Spark" in first.stderr and "2026-08: exported" in first.stdout
    again = _pipeline("export", "--before", "2026-10-01", "--to", str(tmp_path), "--dsn", archive_dsn, "--verbose")
    assert again.exit_code == 0, again.output
    assert "starting Spark" not in again.stderr and "no Spark: nothing to read" in again.stderr
    assert "2026-08: already exported" in again.stdout and "2026-09: already exported" in again.stdout


def test_a_piped_analytics_table_prints_whole_values(spark, archive_dsn, conn):  # noqa: F811
    long_name = "an-endpoint-whose-name-is-far-longer-than-eighty-columns-" + "x" * 40
    conn.execute("UPDATE courier.endpoints SET name = %s WHERE name = 'billing'", (long_name,))
    result = _pipeline("analytics", "--dsn", archive_dsn)  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0, result.output
    assert long_name in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 120


def test_run_logs_go_to_their_own_folder_and_hold_the_runs_warnings_and_errors(spark, dsn, tmp_path):  # noqa: F811
    import platformdirs

    assert run_session.log_dir() == Path(os.environ["COURIER_LOG_DIR"])
    assert run_session.log_dir() != Path(platformdirs.user_log_dir("courier"))
    folder = tmp_path / "not-an-export"
    folder.mkdir()
    spark.createDataFrame([(1,)], "x int").write.parquet(str(folder / "part"))
    result = _pipeline("replay", "--from", str(folder), "--dry-run", "--dsn", dsn)
    assert result.exit_code == 1
    log = Path(re.search(r"Spark's log of this run: (\S+)", result.exception.one_line()).group(1))
    assert log.parent == run_session.log_dir()
    text = log.read_text()
    assert text.startswith("# courier pipeline run: ") and "warnings and errors" in text
    assert "the Spark job failed" in text
    failure = text.split("the Spark job failed", 1)[1]
    assert "UNABLE_TO_INFER_SCHEMA" in failure and "Traceback" in failure  # the whole error, with where it rose
