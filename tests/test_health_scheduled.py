"""health_check does not call a message scheduled for later old (issue 10, item 16)."""

from __future__ import annotations

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
