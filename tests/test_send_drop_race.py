"""A send racing drop_endpoint (issue 10, item 16): two real connections, no orphan left."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.helpers import claim, complete, report, scalar


def active_counted(conn) -> int:
    return scalar(conn, "SELECT coalesce(sum(messages), 0) FROM courier.queue_depth "
                        "WHERE status IN ('pending', 'processing')")


@pytest.mark.parametrize("protocol, send_sql", [
    ("noop", "SELECT courier.send('doomed', '{\"n\": 1}')"),
    ("noop", "SELECT courier.send_batch('doomed', ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[])"),
    ("noop", "SELECT courier.send_batch_with_options('doomed', ARRAY['{\"n\": 1}']::jsonb[])"),
    ("noop", "SELECT courier.publish('doomed.event', '{\"n\": 1}')"),
    ("pull", "SELECT courier.enqueue('doomed', '{\"n\": 1}')"),
])
def test_a_drop_waits_for_a_send_under_way_and_takes_its_messages(dsn, conn, protocol, send_sql):
    conn.execute("SELECT courier.create_endpoint('doomed', %s, '{}')", (protocol,))
    conn.execute("SELECT courier.create_event_type('doomed.event'), courier.subscribe('doomed.event', 'doomed')")
    with psycopg.connect(dsn) as sender, ThreadPoolExecutor(1) as pool:
        sender.execute(send_sql)  # in a transaction not yet committed
        dropping = pool.submit(conn.execute, "SELECT courier.drop_endpoint('doomed', true)")
        time.sleep(0.5)
        assert not dropping.done()  # it waits for the send
        sender.commit()
        dropping.result(timeout=10)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0  # was left behind, endpoint-less
    assert active_counted(conn) == 0  # and counted as active forever


def test_a_drop_without_force_refuses_once_the_racing_send_commits(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('doomed', 'noop', '{}')")
    with psycopg.connect(dsn) as sender, ThreadPoolExecutor(1) as pool:
        sender.execute("SELECT courier.send('doomed', '{}')")
        dropping = pool.submit(conn.execute, "SELECT courier.drop_endpoint('doomed')")
        time.sleep(0.3)
        sender.commit()
        with pytest.raises(psycopg.errors.ObjectInUse, match="still has 1 active message"):
            dropping.result(timeout=10)
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints WHERE name = 'doomed'") == 1


def test_a_send_behind_a_drop_is_told_the_endpoint_is_gone(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('doomed', 'noop', '{}')")
    with psycopg.connect(dsn) as dropper, ThreadPoolExecutor(1) as pool:
        dropper.execute("SELECT courier.drop_endpoint('doomed')")
        sending = pool.submit(conn.execute, "SELECT courier.send('doomed', '{}')")
        time.sleep(0.3)
        dropper.commit()
        with pytest.raises(psycopg.errors.NoDataFound, match='endpoint "doomed" does not exist'):
            sending.result(timeout=10)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def dead_lettered(conn) -> int:
    message = scalar(conn, "SELECT courier.send('doomed', '{}')")
    claim(conn)
    report(conn, [message], ["permanent"], ["[PERMANENT] HTTP 400"])
    return scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message,))


def delivered(conn) -> int:
    message = scalar(conn, "SELECT courier.send('doomed', '{}')")
    claim(conn)
    complete(conn, [message])
    return message


REQUEUES = {  # how to requeue, and what it requeues
    "redrive_message": ("SELECT courier.redrive_message(%s)", dead_lettered),
    "redrive_endpoint": ("SELECT courier.redrive_endpoint('doomed') + 0 * %s", dead_lettered),
    "redrive_all": ("SELECT courier.redrive_all() + 0 * %s", dead_lettered),
    "replay_message": ("SELECT courier.replay_message(%s)", delivered),
}


@pytest.mark.parametrize("requeue", list(REQUEUES))
def test_a_drop_waits_for_a_redrive_or_replay_under_way(dsn, conn, requeue):
    endpoint = scalar(conn, "SELECT courier.create_endpoint('doomed', 'noop', '{}')")
    query, make = REQUEUES[requeue]
    source = make(conn)
    with psycopg.connect(dsn) as operator, ThreadPoolExecutor(1) as pool:
        operator.execute(query, (source,))  # not yet committed
        dropping = pool.submit(conn.execute, "SELECT courier.drop_endpoint('doomed', true)")
        time.sleep(0.5)
        assert not dropping.done()  # was not waiting: the requeued message outlived its endpoint
        operator.commit()
        dropping.result(timeout=10)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE endpoint_id = %s", (endpoint,)) == 0
    assert active_counted(conn) == 0


def test_a_drop_waits_for_a_pull_requeue_under_way(dsn, conn):
    topic = scalar(conn, "SELECT courier.create_endpoint('doomed', 'pull', '{\"max_retries\": 0}')")
    message = scalar(conn, "SELECT courier.enqueue('doomed', '{}')")
    lease = scalar(conn, "SELECT lease FROM courier.dequeue('doomed', 1)")
    assert scalar(conn, "SELECT courier.nack(%s::bigint, %s::integer, 'boom')", (message, lease)) == "dead_lettered"
    dead = scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message,))
    with psycopg.connect(dsn) as operator, ThreadPoolExecutor(1) as pool:
        operator.execute("SELECT courier.requeue(%s)", (dead,))  # not yet committed
        dropping = pool.submit(conn.execute, "SELECT courier.drop_endpoint('doomed', true)")
        time.sleep(0.5)
        assert not dropping.done()  # was not waiting: the requeued message outlived its topic
        operator.commit()
        dropping.result(timeout=10)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE endpoint_id = %s", (topic,)) == 0
    assert active_counted(conn) == 0
