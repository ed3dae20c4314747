"""send() and a plain enqueue() write their rows themselves, without the general path's call
(sending.sql, pull.sql: a call was 5% of a send). They must make the row the general path makes:
the same columns for the same message, whatever the endpoint's delay, TTL and protocol, and the
same refusals."""

import psycopg
import pytest

from tests.helpers import scalar

# Columns that differ between two messages sent one after the other, whichever path made them.
PER_MESSAGE = {"id", "created_at", "updated_at"}
TIMES = ("scheduled_at", "expires_at", "visible_at")


def _row(conn: psycopg.Connection, message_id: int) -> dict:
    cur = conn.execute("SELECT * FROM courier.queue WHERE id = %s", (message_id,))
    values = cur.fetchone()
    row = {c.name: v for c, v in zip(cur.description, values, strict=True)}
    # A time is made from now() of its own transaction: compare it as an offset from created_at.
    for column in TIMES:
        if row[column] is not None:
            row[column] = round((row[column] - row["created_at"]).total_seconds())
    return {k: v for k, v in row.items() if k not in PER_MESSAGE}


def _depth(conn: psycopg.Connection, endpoint: str) -> int:
    return scalar(conn, "SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d "
                        "JOIN courier.endpoints e ON e.id = d.endpoint_id WHERE e.name = %s", (endpoint,))


@pytest.mark.parametrize("protocol", ["noop", "pull"])
@pytest.mark.parametrize("config", ["{}", '{"delay_seconds": 30}', '{"message_ttl_seconds": 600}',
                                    '{"delay_seconds": 30, "message_ttl_seconds": 600}'])
def test_send_makes_the_row_send_with_options_makes(conn, protocol, config):
    conn.execute("SELECT courier.create_endpoint('e', %s, %s::jsonb)", (protocol, config))
    plain = scalar(conn, "SELECT courier.send('e', '{\"n\": 1}')")
    general = scalar(conn, "SELECT courier.send_with_options('e', '{\"n\": 1}', p_priority => 0)")
    assert _row(conn, plain) == _row(conn, general)
    assert _depth(conn, "e") == 2


@pytest.mark.parametrize("config", ["{}", '{"delay_seconds": 30}', '{"message_ttl_seconds": 600}'])
def test_a_plain_enqueue_makes_the_row_the_general_enqueue_makes(conn, config):
    conn.execute("SELECT courier.create_endpoint('t', 'pull', %s::jsonb)", (config,))
    plain = scalar(conn, "SELECT courier.enqueue('t', '{\"n\": 1}')")
    general = scalar(conn, "SELECT courier.enqueue('t', '{\"n\": 1}', p_metadata => '{}')")
    assert _row(conn, plain) == _row(conn, general)
    assert _depth(conn, "t") == 2


@pytest.mark.parametrize("call", ["send", "enqueue"])
def test_the_plain_paths_refuse_what_the_general_paths_refuse(conn, call):
    conn.execute("SELECT courier.create_endpoint('push', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('t', 'pull', '{\"max_depth\": 1}')")
    with pytest.raises(psycopg.errors.NoDataFound if call == "send" else psycopg.Error, match="nowhere"):
        conn.execute(f"SELECT courier.{call}('nowhere', '{{}}')")
    if call == "enqueue":
        with pytest.raises(psycopg.Error, match="pull"):
            conn.execute("SELECT courier.enqueue('push', '{}')")
    conn.execute(f"SELECT courier.{call}('t', '{{}}')")
    with pytest.raises(psycopg.Error, match="max_depth"):
        conn.execute(f"SELECT courier.{call}('t', '{{}}')")
    conn.execute("SELECT courier.disable_endpoint('push')")
    if call == "send":
        with pytest.raises(psycopg.Error, match="disabled"):
            conn.execute("SELECT courier.send('push', '{}')")
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        conn.execute(f"SELECT courier.{call}('t', NULL)")
    assert _depth(conn, "t") == 1 and _depth(conn, "push") == 0
