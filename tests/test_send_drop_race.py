"""A send racing drop_endpoint (issue 10, item 16): two real connections, no orphan left."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.helpers import scalar


def active_counted(conn) -> int:
    return scalar(conn, "SELECT coalesce(sum(messages), 0) FROM courier.queue_depth "
                        "WHERE status IN ('pending', 'processing')")


@pytest.mark.parametrize("send_sql", [
    "SELECT courier.send('doomed', '{\"n\": 1}')",
    "SELECT courier.send_batch('doomed', ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[])",
])
def test_a_drop_waits_for_a_send_under_way_and_takes_its_messages(dsn, conn, send_sql):
    conn.execute("SELECT courier.create_endpoint('doomed', 'noop', '{}')")
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
