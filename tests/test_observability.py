"""metrics() and get_endpoint_health(): ulak's shapes, with exact depths from the counters."""

from __future__ import annotations

import psycopg

from tests.helpers import claim, complete, report, scalar


def metric(conn: psycopg.Connection, name: str, **labels: str) -> float:
    rows = conn.execute("SELECT metric_value, labels FROM courier.metrics() WHERE metric_name = %s",
                        (name,)).fetchall()
    matching = [value for value, row_labels in rows if all(row_labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, f"{name} {labels}: {rows}"
    return matching[0]


def real_depth(conn: psycopg.Connection, status: str) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = %s", (status,))


def test_metrics_have_ulak_columns(conn, webhook):
    described = conn.execute("SELECT * FROM courier.metrics() LIMIT 0").description
    assert [(c.name) for c in described] == ["metric_name", "metric_value", "labels", "metric_type"]


def test_depths_are_exact_through_the_lifecycle(dsn, conn, webhook):
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 40) g))")
    conn.execute("SELECT courier.send_batch('other', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 7) g))")
    # A second connection (another backend's counter rows) and a rolled-back send.
    with psycopg.connect(dsn) as other:
        other.execute("SELECT courier.send('webhook', '{}')")
        other.rollback()
        other.execute("SELECT courier.send('webhook', '{}')")
        other.commit()
    ids = [row[0] for row in claim(conn, 15)]
    complete(conn, ids[:10])
    report(conn, ids[10:], ["permanent"] * 5, ["boom"] * 5)
    conn.execute("DELETE FROM courier.queue WHERE id = (SELECT max(id) FROM courier.queue WHERE status = 'pending')")

    for status in ("pending", "processing", "completed", "failed", "expired"):
        assert metric(conn, "queue_depth", status=status) == real_depth(conn, status), status
    assert metric(conn, "queue_depth_by_endpoint", endpoint="other", status="pending") == scalar(
        conn, "SELECT count(*) FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id "
              "WHERE e.name = 'other' AND status = 'pending'")
    assert metric(conn, "messages_delivered_total", endpoint="webhook") + metric(
        conn, "messages_delivered_total", endpoint="other") == 10
    assert metric(conn, "delivery_failures_total", endpoint="webhook") + metric(
        conn, "delivery_failures_total", endpoint="other") == 5


def test_compaction_folds_finished_backends_and_keeps_totals(dsn, conn, webhook):
    for _ in range(5):
        with psycopg.connect(dsn, autocommit=True) as short_lived:
            short_lived.execute("SELECT courier.send('webhook', '{}')")
    before = metric(conn, "queue_depth", status="pending")
    rows_before = scalar(conn, "SELECT count(*) FROM courier.queue_depth")
    conn.execute("SELECT courier.compact_queue_depth()")
    assert scalar(conn, "SELECT count(*) FROM courier.queue_depth") < rows_before
    assert metric(conn, "queue_depth", status="pending") == before == 5


def test_truncate_resets_depth(conn, webhook):
    conn.execute("SELECT courier.send('webhook', '{}')")
    conn.execute("TRUNCATE courier.queue")
    assert metric(conn, "queue_depth", status="pending") == 0


def test_oldest_message_age(conn, webhook):
    assert metric(conn, "oldest_message_age_seconds") == 0
    conn.execute("SELECT courier.send_with_options('webhook', '{}'::jsonb, p_priority := 3)")
    conn.execute("UPDATE courier.queue SET created_at = now() - interval '90 seconds'")
    conn.execute("SELECT courier.send_with_options('webhook', '{}'::jsonb, p_priority := 9)")
    assert 89 <= metric(conn, "oldest_message_age_seconds") <= 120


def test_endpoint_circuit_state_gauge(conn, webhook):
    assert metric(conn, "endpoint_circuit_state", endpoint="webhook") == 0
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'half_open'")
    assert metric(conn, "endpoint_circuit_state", endpoint="webhook") == 1
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open'")
    assert metric(conn, "endpoint_circuit_state", endpoint="webhook") == 2


def test_get_endpoint_health_columns_and_values(conn, webhook):
    conn.execute("SELECT courier.send('webhook', '{}')")
    conn.execute("SELECT courier.send('webhook', '{}')")
    cursor = conn.execute("SELECT * FROM courier.get_endpoint_health()")
    assert [c.name for c in cursor.description] == [
        "endpoint_name", "protocol", "enabled", "circuit_state", "circuit_failure_count",
        "last_success_at", "last_failure_at", "pending_messages", "oldest_pending_message"]
    (row,) = cursor.fetchall()
    assert row[:5] == ("webhook", "http", True, "closed", 0)
    assert row[7] == 2 and row[8] is not None
    assert conn.execute("SELECT * FROM courier.get_endpoint_health('nope')").fetchall() == []


def test_event_log_records_changes_with_secrets_redacted(conn):
    conn.execute("""SELECT courier.create_endpoint('secure', 'http', '{"url": "https://api.test/hook",
                    "auth": {"type": "bearer", "token": "s3cret-token"}, "signing": {"secret": "whsec_YWJj"}}')""")
    conn.execute("SELECT courier.disable_endpoint('secure')")
    conn.execute("SELECT courier.set_setting('retry_base_delay', '20')")
    events = conn.execute("SELECT event_type, details::text FROM courier.event_log "
                          "WHERE event_type NOT LIKE 'archive.%' ORDER BY id").fetchall()
    assert [e[0] for e in events] == ["endpoint.created", "endpoint.disabled", "config.changed"]
    assert "s3cret-token" not in events[0][1] and "whsec_YWJj" not in events[0][1]
    assert '"token": "***"' in events[0][1]
    assert '"new_value": "20"' in events[2][1]
