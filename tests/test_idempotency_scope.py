"""Idempotency keys are scoped per endpoint (issue 10, item 13)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.helpers import claim, complete, queue_rows, scalar


def send(conn, endpoint: str, payload: str, key: str) -> int:
    return scalar(conn, "SELECT courier.send_with_options(%s, %s::jsonb, p_idempotency_key := %s)",
                  (endpoint, payload, key))


@pytest.fixture
def two_endpoints(conn) -> None:
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('shipping', 'noop', '{}')")


def test_the_same_key_on_two_endpoints_names_two_messages(conn, two_endpoints):
    billed = send(conn, "billing", '{"order": 1}', "order-1")
    shipped = send(conn, "shipping", '{"order": 1}', "order-1")  # was dropped as billed's duplicate
    assert billed != shipped
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 2
    assert send(conn, "billing", '{"order": 1}', "order-1") == billed  # within an endpoint: still one


def test_a_conflict_names_only_the_same_endpoints_message(conn, two_endpoints):
    send(conn, "shipping", '{"order": 1}', "order-1")
    billed = send(conn, "billing", '{"order": 1}', "order-1")
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        send(conn, "billing", '{"order": 2}', "order-1")
    retention = scalar(conn, "SELECT courier._setting_int('idempotency_retention_seconds')")
    assert caught.value.diag.message_hint == (f"Message {billed} holds this key while it is queued, and for "
                                              f"idempotency_retention_seconds ({retention}) after it is delivered")


def deliver_all(conn) -> None:
    ids = [row[0] for row in claim(conn)]
    complete(conn, ids)


def test_a_duplicate_after_delivery_and_archiving_is_not_delivered_again(conn, two_endpoints):
    billed = send(conn, "billing", '{"order": 1}', "order-1")
    deliver_all(conn)
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE id = %s", (billed,)) == 1
    assert send(conn, "billing", '{"order": 1}', "order-1") == billed  # was a second message, delivered again
    assert queue_rows(conn) == 0
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        send(conn, "billing", '{"order": 2}', "order-1")
    assert f"Message {billed} was delivered under this key" in caught.value.diag.message_hint
    assert send(conn, "shipping", '{"order": 1}', "order-1") != billed  # other endpoints: their own keys


def test_a_delivered_key_is_free_again_after_the_retention(conn, two_endpoints):
    billed = send(conn, "billing", '{"order": 1}', "order-1")
    deliver_all(conn)
    conn.execute("UPDATE courier.archive SET completed_at = now() - interval '2 hours' WHERE id = %s", (billed,))
    assert send(conn, "billing", '{"order": 1}', "order-1") == billed  # default retention: a day
    conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', '3600')")
    again = send(conn, "billing", '{"order": 1}', "order-1")
    assert again != billed and queue_rows(conn) == 1


def test_the_retention_setting_has_a_range(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="idempotency_retention_seconds"):
        conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', '-1')")
    conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', '0')")  # 0: only while queued


def test_a_duplicate_sent_while_its_holder_is_being_archived_waits_and_is_turned_away(dsn, conn, two_endpoints):
    billed = send(conn, "billing", '{"order": 1}', "order-1")
    [(claimed, *_)] = claim(conn)
    with psycopg.connect(dsn, autocommit=False) as reporter:
        complete(reporter, [claimed])  # delivered and archived, not yet committed
        with ThreadPoolExecutor(1) as pool:
            duplicate = pool.submit(send, conn, "billing", '{"order": 1}', "order-1")
            time.sleep(0.5)
            assert not duplicate.done()  # waits on the holder's unique-index entry
            reporter.commit()
            assert duplicate.result(timeout=10) == billed
    assert queue_rows(conn) == 0
