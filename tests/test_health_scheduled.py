"""health_check does not call a message scheduled for later old (issue 10, item 16)."""

from __future__ import annotations

import pytest

from tests.helpers import scalar


def oldest_pending(conn) -> tuple[str, float]:
    return conn.execute("SELECT status, value FROM courier.health_check() "
                        "WHERE check_name = 'oldest_pending'").fetchone()


def test_a_message_scheduled_for_tomorrow_raises_no_alarm(conn):
    conn.execute("SELECT courier.create_endpoint('later', 'noop', '{}')")
    conn.execute("SELECT courier.send_with_options('later', '{}', p_scheduled_at := now() + interval '1 day')")
    conn.execute("UPDATE courier.queue SET created_at = now() - interval '2 hours'")  # sent two hours ago
    assert oldest_pending(conn) == ("ok", 0)  # was critical: 7200 s "old"
    assert scalar(conn, "SELECT metric_value FROM courier.metrics() "
                        "WHERE metric_name = 'oldest_message_age_seconds'") == 0  # the gauge too


def test_a_scheduled_message_is_old_from_when_it_fell_due(conn):
    conn.execute("SELECT courier.create_endpoint('later', 'noop', '{}')")
    conn.execute("SELECT courier.send_with_options('later', '{}', p_scheduled_at := now() - interval '10 minutes')")
    conn.execute("UPDATE courier.queue SET created_at = now() - interval '2 days'")
    status, age = oldest_pending(conn)
    assert status == "warning" and 590 < age < 700
    assert scalar(conn, "SELECT oldest_pending_message IS NOT NULL FROM courier.get_endpoint_health('later')")


def test_messages_waiting_on_a_pull_topic_do_not_call_for_workers(conn):
    def workers() -> str:
        return scalar(conn, "SELECT status FROM courier.health_check() WHERE check_name = 'workers'")

    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    conn.execute("SELECT courier.enqueue('orders', '{}')")
    assert workers() == "warning"  # was critical: no worker would ever take it
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send('hook', '{}')")
    assert workers() == "critical"


def _queue_blocks(conn) -> int:
    """Buffer reads of courier.queue and its indexes so far (hits and reads)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return scalar(conn, """SELECT heap_blks_hit + heap_blks_read + coalesce(idx_blks_hit, 0)
                                  + coalesce(idx_blks_read, 0)
                           FROM pg_statio_user_tables WHERE relid = 'courier.queue'::regclass""")


def test_a_topics_oldest_message_is_found_without_reading_those_scheduled_for_later(conn):
    """Health and metrics read a pull topic's pending messages in due order: 20k messages
    scheduled for tomorrow are neither old nor read (walking them took 0.7 s at 500k)."""
    if scalar(conn, "SELECT current_setting('server_version_num')::int") < 150000:
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    conn.execute("""INSERT INTO courier.queue (endpoint_id, payload, scheduled_at, visible_at)
                    SELECT e.id, '{}', now() + interval '1 day', now() + interval '1 day'
                    FROM courier.endpoints e, generate_series(1, 20000) WHERE e.name = 'orders'""")
    assert scalar(conn, "SELECT oldest_pending_message FROM courier.get_endpoint_health('orders')") is None
    conn.execute("SELECT courier.enqueue('orders', '{}')")
    conn.execute("UPDATE courier.queue SET created_at = now() - interval '10 minutes', "
                 "visible_at = now() - interval '10 minutes' WHERE scheduled_at IS NULL")
    conn.execute("ANALYZE courier.queue")
    status, age = oldest_pending(conn)
    assert status == "warning" and 590 < age < 700
    before = _queue_blocks(conn)
    assert scalar(conn, "SELECT oldest_pending_message < now() FROM courier.get_endpoint_health('orders')")
    # About 80: two probes per priority level for push messages (none here) and one in due
    # order; walking the scheduled ones read over 5,000.
    assert _queue_blocks(conn) - before < 500
