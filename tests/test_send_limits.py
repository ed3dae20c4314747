"""courier.send_limits: the settings a send reads, as one row that courier.settings' trigger
rewrites after every change. Whatever way a setting changes, the next send
obeys it; concurrent changes all land; nobody writes the copy directly."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests import test_roles_and_psql
from tests.helpers import scalar

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role

BIG = '{"text": "' + "x" * 4000 + '"}'


@pytest.fixture
def noop(conn) -> int:
    return scalar(conn, "SELECT courier.create_endpoint('sink', 'noop', '{}')")


def limits(conn: psycopg.Connection) -> tuple:
    return conn.execute("SELECT max_payload_size, max_queue_size, notify_on_send FROM courier.send_limits").fetchone()


def test_a_setting_changed_by_set_setting_binds_the_next_send(conn, noop):
    conn.execute("SELECT courier.send('sink', %s::jsonb)", (BIG,))
    conn.execute("SELECT courier.set_setting('max_payload_size', '2048')")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="max_payload_size"):
        conn.execute("SELECT courier.send('sink', %s::jsonb)", (BIG,))


def test_an_admin_updating_the_settings_table_directly_binds_the_next_send(conn, noop, login_as):
    admin = login_as("courier_admin")
    admin.execute("UPDATE courier.settings SET value = '1' WHERE name = 'max_queue_size'")
    assert limits(conn)[1] == 1
    conn.execute("SELECT courier.send('sink', '{}')")
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="backpressure"):
        conn.execute("SELECT courier.send('sink', '{}')")


def test_two_settings_changed_at_once_both_land(dsn, conn):
    """The second change waits for the first to commit and then reads it, rather than writing
    back the value its own snapshot held."""
    first = psycopg.connect(dsn)
    try:
        first.execute("SELECT courier.set_setting('max_queue_size', '777')")  # not committed yet

        def second() -> None:
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("SELECT courier.set_setting('max_payload_size', '4096')")

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1)
        assert thread.is_alive()  # waiting for the first change to commit
        first.commit()
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        first.close()
    assert limits(conn)[:2] == (4096, 777)


def test_notify_on_send_is_read_from_the_row(conn):
    conn.execute("SELECT courier.set_setting('notify_on_send', 'false')")
    assert limits(conn)[2] is False
    conn.execute("SELECT courier.set_setting('notify_on_send', 'true')")
    assert limits(conn)[2] is True


@pytest.mark.parametrize("statement", [
    "UPDATE courier.send_limits SET max_queue_size = 0",
    "DELETE FROM courier.send_limits",
    "INSERT INTO courier.send_limits (singleton) VALUES (false)",
    "UPDATE courier.consume_limits SET claim_slots = 0",
    "DELETE FROM courier.consume_limits",
])
def test_no_role_writes_the_copy_directly(conn, login_as, statement):
    admin = login_as("courier_admin")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        admin.execute(statement)


def test_a_lost_row_gives_a_clear_error_and_any_setting_change_restores_it(conn, noop):
    conn.execute("DELETE FROM courier.send_limits")  # only the owner (or a superuser) can
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="send_limits"):
        conn.execute("SELECT courier.send('sink', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '1000000')")
    assert scalar(conn, "SELECT courier.send('sink', '{}')") > 0


def test_the_pull_settings_a_dequeue_reads_follow_every_change(conn):
    """dequeue reads visibility_timeout, default_max_retries, default_throughput_limit and
    default_dlq_threshold from the row too (migration 0049): a change binds the next dequeue."""
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.enqueue_batch('jobs', array_fill('{}'::jsonb, ARRAY[3]))")
    conn.execute("SELECT courier.set_setting('visibility_timeout', '120')")
    assert scalar(conn, "SELECT visibility_timeout FROM courier.consume_limits") == 120
    lease = "SELECT round(extract(epoch FROM visible_until - now())) FROM courier.dequeue('jobs')"
    assert conn.execute(lease).fetchone() == (120,)
    conn.execute("UPDATE courier.settings SET value = '1' WHERE name = 'default_throughput_limit'")
    assert conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 2)").fetchone() == (1,)  # one token in the bucket
    conn.execute("SELECT courier.set_setting('default_max_retries', '3')")
    conn.execute("SELECT courier.set_setting('default_dlq_threshold', '7')")
    row = "SELECT default_max_retries, default_dlq_threshold FROM courier.consume_limits"
    assert conn.execute(row).fetchone() == (3, 7)


def test_a_lost_row_gives_a_dequeue_the_same_clear_error(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("DELETE FROM courier.consume_limits")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="consume_limits"):
        conn.execute("SELECT * FROM courier.dequeue('jobs')")
    conn.execute("SELECT courier.set_setting('visibility_timeout', '30')")
    assert conn.execute("SELECT * FROM courier.dequeue('jobs')").fetchall() == []


def room_until(conn: psycopg.Connection):
    return scalar(conn, "SELECT room_until FROM courier.send_limits")


def test_room_until_follows_the_limit_and_the_leaders_estimate(conn, noop):
    """A single send takes its fast answer from send_limits.room_until (migration 0051): it must
    say 'no limit' only with none set, and 'room' only while the estimate is fresh and leaves the
    queue at most half full, as _room_for trusts it."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    assert scalar(conn, "SELECT room_until = 'infinity' FROM courier.send_limits")
    conn.execute("SELECT courier.set_setting('max_queue_size', '6')")
    assert room_until(conn) is None  # no estimate yet: every send counts exactly
    conn.execute("SELECT courier.estimate_active_messages()")
    assert scalar(conn, "SELECT room_until BETWEEN estimated_at + interval '2 seconds' - interval '1 ms'"
                        " AND estimated_at + interval '2 seconds' FROM courier.send_limits")
    for _ in range(3):
        conn.execute("SELECT courier.send('sink', '{}')")
    conn.execute("SELECT courier.estimate_active_messages()")
    assert room_until(conn) is None  # 3 + 1 is past half of 6
    conn.execute("SELECT courier.set_setting('max_queue_size', '8')")  # 3 + 1 is half of 8 now
    assert scalar(conn, "SELECT room_until = estimated_at + interval '2 seconds' FROM courier.send_limits")
    # Any write of the estimate keeps it (a trigger on the row), not only the leader's.
    conn.execute("UPDATE courier.send_limits SET active_estimate = 7")
    assert room_until(conn) is None


@pytest.mark.parametrize("protocol, send", [
    ("noop", "SELECT courier.send('ep', '{}')"),
    ("pull", "SELECT courier.enqueue('ep', '{}')"),
])
def test_a_near_full_estimate_leaves_the_limit_exact(conn, protocol, send):
    """Past half the limit the sends count the queue, so the limit holds to the message."""
    conn.execute("SELECT courier.create_endpoint('ep', %s, '{}')", (protocol,))
    conn.execute("SELECT courier.set_setting('max_queue_size', '4')")
    conn.execute("SELECT courier.estimate_active_messages()")  # empty: room for two seconds
    for _ in range(3):
        conn.execute(send)
    conn.execute("SELECT courier.estimate_active_messages()")  # 3 of 4: no fast answer
    conn.execute(send)
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="backpressure"):
        conn.execute(send)


@pytest.mark.parametrize("protocol, send", [
    ("noop", "SELECT courier.send('ep', '{}')"),
    ("pull", "SELECT courier.enqueue('ep', '{}')"),
    ("noop", "SELECT courier.send_with_options('ep', '{}', p_priority => 3)"),
])
def test_an_endpoints_delay_ttl_and_max_depth_bind_the_next_send_after_a_change(conn, protocol, send):
    """The sends read config's typed columns (migration 0051), which follow every config change."""
    conn.execute("SELECT courier.create_endpoint('ep', %s, '{}')", (protocol,))
    first = scalar(conn, send)
    assert conn.execute("SELECT scheduled_at, expires_at FROM courier.queue WHERE id = %s", (first,)).fetchone() == (
        None, None)
    conn.execute("""SELECT courier.alter_endpoint('ep', '{"delay_seconds": 30, "message_ttl_seconds": 600,
                                                        "max_depth": 2}')""")
    second = scalar(conn, send)
    delay, ttl = conn.execute(
        "SELECT extract(epoch FROM scheduled_at - created_at), extract(epoch FROM expires_at - scheduled_at)"
        " FROM courier.queue WHERE id = %s", (second,)).fetchone()
    assert (delay, ttl) == (30, 600)
    with pytest.raises(psycopg.Error, match="exceed its max_depth 2"):
        conn.execute(send)
    conn.execute("SELECT courier.alter_endpoint('ep', '{}')")
    assert conn.execute("SELECT config_delay, config_ttl_seconds, config_max_depth FROM courier.endpoints"
                        " WHERE name = 'ep'").fetchone() == (None, None, None)
    third = scalar(conn, send)
    assert conn.execute("SELECT scheduled_at FROM courier.queue WHERE id = %s", (third,)).fetchone() == (None,)


def test_a_topics_own_consumer_limits_bind_the_next_dequeue_after_a_change(conn):
    """dequeue reads the topic's visibility_timeout, max_retries, throughput_limit and
    dlq_threshold from config's typed columns (migration 0051), which follow every change; a
    limit cleared back to null falls to the setting again."""
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.enqueue_batch('jobs', array_fill('{}'::jsonb, ARRAY[6]))")
    lease = "SELECT round(extract(epoch FROM visible_until - now())) FROM courier.dequeue('jobs')"
    conn.execute("""SELECT courier.alter_topic('jobs', '{"visibility_timeout": 45, "max_retries": 2,
                                                         "dlq_threshold": 9, "throughput_limit": 1}')""")
    assert conn.execute(lease).fetchone() == (45,)
    typed = conn.execute("SELECT config_visibility_timeout, config_max_retries, config_dlq_threshold, "
                         "config_throughput_limit FROM courier.endpoints WHERE name = 'jobs'").fetchone()
    assert typed == (45, 2, 9, 1)
    conn.execute("""SELECT courier.alter_topic('jobs', '{"visibility_timeout": null, "throughput_limit": null}')""")
    default = scalar(conn, "SELECT visibility_timeout FROM courier.consume_limits")
    assert conn.execute(lease).fetchone() == (default,)
    conn.execute("SELECT courier.alter_endpoint('jobs', p_retry_policy => '{\"max_retries\": 4}')")
    conn.execute("""SELECT courier.alter_topic('jobs', '{"max_retries": null}')""")
    assert scalar(conn, "SELECT config_max_retries FROM courier.endpoints WHERE name = 'jobs'") == 4  # the policy's
