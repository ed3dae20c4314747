"""Pull topics keep what they promise under hostile or careless callers (issue 23): no send path
takes a time that never comes, one fenced call names a message once, idempotency keys outlive
the ack or receive that completes their message, receive_failed touches only a message that was
received, a redriven dead letter comes back as a requeued one, and the hints tell the truth."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers import scalar
from tests.test_cli import COURIER, ENV, courier  # noqa: F401 (fixture)

NON_FINITE = ["-infinity", "infinity"]


@pytest.fixture
def orders(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    return "orders"


def dequeue(conn, count: int = 1, topic: str = "orders") -> list[tuple[int, int]]:
    return conn.execute("SELECT id, lease FROM courier.dequeue(%s, %s)", (topic, count)).fetchall()


def status(conn, message_id: int) -> str | None:
    return scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (message_id,))


# Item 3: non-finite times ---------------------------------------------------------------------


@pytest.mark.parametrize("when", NON_FINITE)
@pytest.mark.parametrize("field", ["scheduled_at", "expires_at"])
def test_send_with_options_refuses_a_time_that_never_comes(conn, orders, webhook, field, when):
    for endpoint in (orders, webhook):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"{field} must be a finite time"):
            conn.execute(f"SELECT courier.send_with_options(%s, '{{}}', p_{field} => %s::timestamptz)",
                         (endpoint, when))
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


@pytest.mark.parametrize("when", NON_FINITE)
@pytest.mark.parametrize("field", ["scheduled_at", "expires_at"])
def test_send_batch_with_options_names_the_element_and_field(conn, orders, field, when):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"batch element 2: {field} must be a finite time"):
        conn.execute(f"SELECT courier.send_batch_with_options('orders', ARRAY['{{}}', '{{}}']::jsonb[], "
                     f"p_{field} => ARRAY[NULL, %s]::timestamptz[])", (when,))
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


@pytest.mark.parametrize("when", NON_FINITE)
def test_enqueue_refuses_a_time_that_never_comes(conn, orders, when):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="scheduled_at must be a finite time"):
        conn.execute("SELECT courier.enqueue('orders', '{}', p_scheduled_at => %s::timestamptz)", (when,))


def test_a_message_scheduled_at_minus_infinity_is_not_dead_lettered_while_a_consumer_holds_it(dsn, conn, orders):
    # A row written before sends refused -infinity: dequeue's DLQ probe must take only the rows
    # it parked itself, not one another consumer is leasing (its snapshot still shows it pending).
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    conn.execute("UPDATE courier.queue SET visible_at = '-infinity', scheduled_at = '-infinity' WHERE id = %s",
                 (message_id,))
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as other:
        [(held, lease)] = dequeue(holder)
        assert held == message_id
        other.execute("SET lock_timeout = '3s'")
        assert dequeue(other, 5) == []
        holder.commit()
    assert status(conn, message_id) == "processing"
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
    assert conn.execute("SELECT * FROM courier.ack(%s, %s)", ([message_id], [lease])).fetchall() == [
        (message_id, "acked")]


@pytest.mark.parametrize(("command", "option"), [("send", "--scheduled-at"), ("send", "--expires-at"),
                                                  ("enqueue", "--scheduled-at")])
def test_the_cli_refuses_a_time_that_never_comes_as_a_usage_error(courier, dsn, orders, command, option):  # noqa: F811
    for when in NON_FINITE:
        refused = courier(command, "orders", "{}", option, when)
        assert refused.code == 2 and "Traceback" not in refused.err, refused
        [error] = [line for line in refused.err.splitlines() if line.startswith("Error:")]
        assert option in error and repr(when) in error
    # West of UTC, year 1 in local time falls off Python's calendar: a usage error, not a traceback.
    refused = subprocess.run([str(COURIER), command, "orders", "{}", option, "0001-01-01T00:00:00", "--dsn", dsn],
                             capture_output=True, text=True, env={**ENV, "TZ": "America/New_York"}, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "out of range" in refused.stderr


# Item 8: a repeated id in one fenced call ------------------------------------------------------------


@pytest.mark.parametrize("call", [
    "SELECT * FROM courier.ack(%(ids)s, %(leases)s)",
    "SELECT * FROM courier.nack(%(ids)s, %(leases)s, 'boom')",
    "SELECT * FROM courier.extend_lease(%(ids)s, %(leases)s, 60)",
    "SELECT * FROM courier.release(%(ids)s, %(leases)s)",
])
def test_a_repeated_id_in_one_fenced_call_is_refused_and_changes_nothing(conn, orders, call):
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    [(_, lease)] = dequeue(conn)
    before = conn.execute("SELECT status, lease, visible_at, retry_count FROM courier.queue WHERE id = %s",
                          (message_id,)).fetchone()
    for leases in ([lease, lease - 1], [lease - 1, lease], [lease, lease]):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"ids: message {message_id} is given 2 times"):
            conn.execute(call, {"ids": [message_id, message_id], "leases": leases})
        assert conn.execute("SELECT status, lease, visible_at, retry_count FROM courier.queue WHERE id = %s",
                            (message_id,)).fetchone() == before
    # The valid lease alone still works.
    assert conn.execute("SELECT * FROM courier.ack(%s, %s)", ([message_id], [lease])).fetchall() == [
        (message_id, "acked")]
