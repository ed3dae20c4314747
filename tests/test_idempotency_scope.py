"""Idempotency keys are scoped per endpoint (issue 10, item 13)."""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers import scalar


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
    assert caught.value.diag.message_hint == f"Message {billed} holds this key until it leaves pending/processing"
