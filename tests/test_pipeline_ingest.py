"""courier pipeline ingest in Spark local mode: bad rows reported with their line numbers,
good rows enqueued exactly once however often the file is ingested."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from tests.test_pipeline import spark  # noqa: F401 - the shared session

pytest.importorskip("pyspark")


@pytest.fixture
def billing(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_payload_size', '2048')")
    return "billing"


def _ingest(dsn: str, *args: str):
    from console.cli.pipeline import pipeline_group

    return CliRunner().invoke(pipeline_group, ["ingest", "--dsn", dsn, "--master", "local[2]", *args])


def test_jsonl_with_bad_rows_reports_them_and_enqueues_the_good_ones_once(spark, dsn, conn, billing, tmp_path):  # noqa: F811
    lines = [json.dumps({"n": n}) for n in range(1, 41)]
    lines[4] = '{"n": 5,'                                   # line 5: cut short
    lines[9] = '{"n": NaN}'                                 # line 10: not JSON for PostgreSQL
    lines[14] = '{"n": "\\u0000"}'                          # line 15: jsonb cannot hold it
    lines[19] = json.dumps({"blob": "x" * 4000})            # line 20: over max_payload_size
    lines[24] = ""                                          # line 25: blank, skipped quietly
    path = tmp_path / "backfill.jsonl"
    path.write_text("\n".join(lines) + "\n")

    first = _ingest(dsn, str(path), "--endpoint", "billing", "--priority", "3")
    assert first.exit_code == 1, first.output
    for line, reason in ((5, "invalid JSON"), (10, "invalid JSON"), (15, "\\u0000"), (20, "max_payload_size")):
        assert f"backfill.jsonl:{line}: " in first.stderr and reason in first.stderr
    assert "enqueued 35 of 35 good row(s)" in first.stdout and "4 bad row(s)" in first.stdout

    second = _ingest(dsn, str(path), "--endpoint", "billing", "--priority", "3", "--json")
    result = json.loads(second.stdout)
    assert (result["good"], result["enqueued"], result["already_ingested"], result["bad"]) == (35, 0, 35, 4)
    assert [e["line"] for e in result["errors"]] == [5, 10, 15, 20]
    rows = conn.execute("SELECT (payload->>'n')::int, priority FROM courier.queue ORDER BY 1").fetchall()
    assert rows == [(n, 3) for n in range(1, 41) if n not in (5, 10, 15, 20, 25)]


def test_csv_rows_become_objects_and_short_rows_are_reported(spark, dsn, conn, billing, tmp_path):  # noqa: F811
    path = tmp_path / "orders.csv"
    path.write_text('order,total,note\nA1,10,"first, with a comma"\nA2,20\nA3,30,third\n')
    result = _ingest(dsn, str(path), "--endpoint", "billing")
    assert result.exit_code == 1
    assert "orders.csv:3: expected 3 fields, got 2" in result.stderr
    assert conn.execute("SELECT payload FROM courier.queue ORDER BY payload->>'order'").fetchall() == [
        ({"order": "A1", "total": "10", "note": "first, with a comma"},),
        ({"order": "A3", "total": "30", "note": "third"},)]


def test_parquet_rows_and_an_unknown_endpoint(spark, dsn, conn, billing, tmp_path):  # noqa: F811
    folder = tmp_path / "rows.parquet"
    spark.createDataFrame([(i, f"o{i}") for i in range(25)], "n int, ref string").write.parquet(str(folder))
    ok = _ingest(dsn, str(folder), "--endpoint", "billing", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["enqueued"] == 25
    assert conn.execute("SELECT count(DISTINCT payload->>'ref') FROM courier.queue").fetchone()[0] == 25
    missing = _ingest(dsn, str(folder), "--endpoint", "nope")
    assert missing.exit_code == 1 and 'endpoint "nope" does not exist' in str(missing.exception or missing.output)


def test_an_ingested_message_keeps_every_field_and_bad_fields_are_reported(spark, dsn, conn, billing, tmp_path):  # noqa: F811
    correlation = "0b8e4c3a-4a8f-4f58-9a52-2c1f7d6f8b11"
    full = {"payload": {"order": 1}, "priority": 7, "scheduled_at": "2030-01-01T00:00:00+00:00",
            "idempotency_key": "order-1", "correlation_id": correlation, "expires_at": "2030-01-02T00:00:00Z",
            "ordering_key": "customer-9", "headers": {"X-Tenant": "acme"}, "metadata": {"source": "backfill"}}
    lines = [json.dumps(full), json.dumps({"payload": [1, 2]}),
             json.dumps({"payload": {}, "priority": 11}),                  # line 3
             json.dumps({"payload": {}, "correlation_id": "nope"}),        # line 4
             json.dumps({"payload": {}, "headers": {"X-A": 1}}),           # line 5
             json.dumps({"payload": {}, "colour": "red"}),                 # line 6
             json.dumps({"priority": 1})]                                  # line 7
    path = tmp_path / "messages.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = _ingest(dsn, str(path), "--endpoint", "billing", "--envelope", "--priority", "2")
    assert result.exit_code == 1, result.output
    for line, reason in ((3, "priority must be between 0 and 10, got 11"), (4, "correlation_id is not a UUID"),
                         (5, "header X-A must have a string value, not number"), (6, "unknown field colour"),
                         (7, "payload is missing")):
        assert f"messages.jsonl:{line}: {reason}" in result.stderr
    queued = conn.execute("SELECT payload, priority, scheduled_at, idempotency_key, correlation_id::text, expires_at, "
                          "ordering_key, headers, metadata FROM courier.queue ORDER BY priority DESC").fetchall()
    assert queued == [
        ({"order": 1}, 7, datetime(2030, 1, 1, tzinfo=UTC), "order-1", correlation, datetime(2030, 1, 2, tzinfo=UTC),
         "customer-9", {"X-Tenant": "acme"}, {"source": "backfill"}),
        ([1, 2], 2, None, None, None, None, None, {}, {})]


def test_rows_the_send_path_refuses_are_reported_by_line_and_the_rest_enqueued_once(spark, dsn, conn, billing,  # noqa: F811
                                                                                    tmp_path):
    """The database's own send rules decide (a header Courier sets, metadata nested past 32
    levels, a key too long, priority out of range, an idempotency key conflict), each bad row
    is named by its line, and the good rows of every Spark partition are enqueued once."""
    deep: dict = {}
    for _ in range(40):
        deep = {"d": deep}
    held = conn.execute("SELECT courier.send_with_options('billing', '{\"other\": 1}', "
                        "p_idempotency_key := 'taken')").fetchone()[0]
    lines = [json.dumps({"payload": {"n": n}, "ordering_key": f"customer-{n % 4}"}) for n in range(1, 41)]
    bad = {3: ({"headers": {"Host": "evil.example"}}, "header Host is set by Courier"),
           8: ({"headers": {"X-Courier-Attempt": "1"}}, "header X-Courier-Attempt is set by Courier"),
           13: ({"metadata": deep}, "metadata is nested more than 32 levels deep"),
           16: ({"priority": 10 ** 12}, "priority must be an integer, got 1000000000000"),
           17: ({"metadata": {"x": 1e400}}, "invalid input syntax for type json"),  # fails the whole array: halved
           21: ({"ordering_key": "k" * 300}, "idempotency and ordering keys must be 1 to 255 characters"),
           26: ({"priority": 11}, "priority must be between 0 and 10, got 11"),
           34: ({"idempotency_key": "taken"}, "idempotency key 'taken' conflict"),
           39: ({"payload": {"blob": "x" * 4000}}, "exceeds max_payload_size (2048 bytes)")}
    for line, (fields, _) in bad.items():
        lines[line - 1] = json.dumps({**json.loads(lines[line - 1]), **fields})
    path = tmp_path / "messages.jsonl"
    path.write_text("\n".join(lines) + "\n")

    first = _ingest(dsn, str(path), "--endpoint", "billing", "--envelope", "--json")
    assert first.exit_code == 1, first.output
    result = json.loads(first.stdout)
    errors = {e["line"]: e["error"] for e in result["errors"]}
    assert sorted(errors) == sorted(bad) and all(reason in errors[line] for line, (_, reason) in bad.items()), errors
    assert (result["rows"], result["good"], result["enqueued"], result["bad"]) == (40, 31, 31, 9)
    good = sorted(n for n in range(1, 41) if n not in bad)
    queued = "SELECT (payload->>'n')::int FROM courier.queue WHERE id <> %s ORDER BY 1"
    assert [r[0] for r in conn.execute(queued, (held,))] == good

    text = _ingest(dsn, str(path), "--endpoint", "billing", "--envelope")
    for line, (_, reason) in bad.items():
        assert f"messages.jsonl:{line}: " in text.stderr and reason in text.stderr
    said = " ".join(text.stdout.split())
    assert "enqueued 0 of 31 good row(s)" in said and "9 bad row(s) skipped" in said
    assert [r[0] for r in conn.execute(queued, (held,))] == good


def _settled_count(conn, session) -> int:
    """The queue's count once the failed job's tasks are done: a task already running when
    its job failed is not interrupted, and may commit its partition after the stage is gone."""
    tracker = session.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    counts = [-1]
    while time.monotonic() < deadline:
        counts.append(conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0])
        if not tracker.getActiveStageIds() and counts[-6:].count(counts[-1]) == 6:  # unchanged for 2.5 s
            break
        time.sleep(0.5)
    return counts[-1]


def test_a_rerun_after_a_failed_ingest_writes_the_rest_exactly_once(spark, dsn, conn, billing, tmp_path):  # noqa: F811
    """A failure that is not a row's (the endpoint full) stops the job after some Spark
    partitions committed; run again, the file's rows end up enqueued exactly once. (The first
    run takes the path of a large file, 8 partitions; the second, of a small one, one task.)"""
    from console.pipeline import ingest

    conn.execute("SELECT courier.alter_endpoint('billing', p_config := '{\"max_depth\": 12}')")
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(json.dumps({"payload": {"n": n}, "ordering_key": f"c{n % 8}"}) + "\n"
                            for n in range(1, 41)))
    conf = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "8"}  # 8 partitions, one per key
    saved = {name: spark.conf.get(name) for name in conf}
    try:
        for name, value in conf.items():
            spark.conf.set(name, value)
        with pytest.raises(Exception, match="max_depth"):
            ingest.run(spark, dsn, path, "billing", envelope=True, input_rows=None)
        partial = _settled_count(conn, spark)
        assert 0 < partial < 40  # the partitions that fitted committed
        conn.execute("SELECT courier.alter_endpoint('billing', p_config := '{\"max_depth\": 0}')")
        done = json.loads(_ingest(dsn, str(path), "--endpoint", "billing", "--envelope", "--json").stdout)
    finally:
        for name, value in saved.items():
            spark.conf.set(name, value)
    assert (done["already_ingested"], done["enqueued"], done["bad"]) == (partial, 40 - partial, 0)
    assert [r[0] for r in conn.execute("SELECT (payload->>'n')::int FROM courier.queue ORDER BY 1")] == \
        list(range(1, 41))


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_large_file_checked_by_spark_tasks_gives_what_the_driver_gives(spark, dsn, conn, billing, tmp_path,  # noqa: F811
                                                                        kind):
    """A file over SMALL_INPUT_ROWS is checked by Spark tasks, a small one in the driver: the
    same rows good and bad, with the same line numbers (\\r\\n, \\r and blank lines included)."""
    from console.pipeline import ingest

    if kind == "jsonl":
        text = '{"n": 1}\r\n{"n": 2,\n\n{"n": NaN}\r{"n": 5}\n'
    else:
        text = 'order,total\r\nA1,10\nA2\r\nA3,30\n'
    small, large = tmp_path / f"small.{kind}", tmp_path / f"large.{kind}"
    small.write_text(text, newline="")
    large.write_text(text, newline="")  # another file name: ingested afresh
    driver = ingest.run(spark, dsn, small, "billing", input_rows=ingest.estimate_rows(small))
    tasks = ingest.run(spark, dsn, large, "billing", input_rows=None)
    assert ingest.estimate_rows(small) <= 5
    assert (driver.rows, driver.good, driver.enqueued, driver.bad, driver.errors) \
        == (tasks.rows, tasks.good, tasks.enqueued, tasks.bad, tasks.errors)
    assert [e.line for e in driver.errors] == ([2, 4] if kind == "jsonl" else [3])
    assert driver.enqueued == driver.good == 2
