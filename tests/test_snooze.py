"""Snooze (issue 42, River's JobSnooze) and nack with a delay, for pull topics: through SQL, the
Python Consumer, the CLI and the HTTP API, against a real database."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from sqlkit import pull
from sqlkit.consumer import Consumer
from tests.helpers import scalar
from tests.test_cli import assert_ok, courier  # noqa: F401  (the fixture)
from tests.test_serve import call, server, token  # noqa: F401  (the server fixture)

TOPIC = "orders"


@pytest.fixture
def topic(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint(%s, 'pull', %s)", (TOPIC, json.dumps({"max_retries": 1})))
    return TOPIC


def leased(conn: psycopg.Connection, payload: str = '{"n": 1}') -> tuple[int, int]:
    conn.execute("SELECT courier.enqueue(%s, %s::jsonb)", (TOPIC, payload))
    [(message_id, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 600)", (TOPIC,)).fetchall()
    return message_id, lease


def state(conn: psycopg.Connection, message_id: int) -> tuple:
    """status, attempts, history length, seconds until due (rounded)."""
    return conn.execute("SELECT status, retry_count, jsonb_array_length(error_history), "
                        "round(extract(epoch FROM visible_at - now())) FROM courier.queue WHERE id = %s",
                        (message_id,)).fetchone()


def test_a_snoozed_message_comes_back_after_its_delay_with_no_attempt_counted(conn, topic):
    message_id, lease = leased(conn)
    [(got, result, until)] = conn.execute("SELECT * FROM courier.snooze(%s::bigint[], %s::integer[], 30)",
                                          ([message_id], [lease])).fetchall()
    assert (got, result) == (message_id, "snoozed") and until is not None
    assert state(conn, message_id) == ("pending", 0, 0, 30)
    assert conn.execute("SELECT count(*) FROM courier.dequeue(%s, 10, 60)", (TOPIC,)).fetchone()[0] == 0  # not yet
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (message_id,))
    [(again, _)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 60)", (TOPIC,)).fetchall()
    assert again == message_id
    # The old lease is fenced: a late snooze or ack from the first holder changes nothing.
    assert scalar(conn, "SELECT courier.snooze(%s, %s, 5)", (message_id, lease)) == "lease_lost"
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, lease)) == "lease_lost"


def test_snoozing_never_dead_letters_and_a_delayed_nack_counts_its_attempt(conn, topic):
    """The topic allows one retry: a snooze at the limit keeps the message; a nack spends an attempt."""
    message_id, lease = leased(conn)
    for _ in range(3):
        assert scalar(conn, "SELECT courier.nack(%s, %s, 'waiting on stock', 0, false)", (message_id, lease)) == \
            "snoozed"
        conn.execute("UPDATE courier.queue SET visible_at = now() WHERE id = %s", (message_id,))
        [(_, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 60)", (TOPIC,)).fetchall()
    assert state(conn, message_id)[:3] == ("processing", 0, 0)
    assert pull.nack(conn, [message_id], [lease], "upstream 503", delay_seconds=120)[0].result == "nacked"
    assert state(conn, message_id) == ("pending", 1, 1, 120)
    conn.execute("UPDATE courier.queue SET visible_at = now() WHERE id = %s", (message_id,))
    [(_, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 60)", (TOPIC,)).fetchall()
    assert pull.nack(conn, [message_id], [lease], "still 503")[0].result == "dead_lettered"


@pytest.mark.parametrize("delay", [-1, 43_201, None])
def test_a_delay_out_of_range_is_refused_naming_it(conn, topic, delay):
    message_id, lease = leased(conn)
    for call_sql in ("SELECT courier.snooze(%s, %s, %s)", "SELECT courier.nack(%s, %s, 'x', %s)"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="delay_seconds"):
            conn.execute(call_sql, (message_id, lease, delay))
        conn.rollback()
    assert state(conn, message_id)[:2] == ("processing", 0)  # nothing changed


def test_the_consumer_snoozes_and_nacks_with_a_delay(dsn, conn, topic):
    first, _ = leased(conn)
    conn.execute("UPDATE courier.queue SET status = 'pending', visible_at = now() WHERE id = %s", (first,))
    conn.execute("SELECT courier.enqueue(%s, '{\"n\": 2}')", (TOPIC,))

    async def run() -> list[dict[int, str]]:
        results = []
        async with Consumer(dsn, TOPIC, batch_size=2) as consumer:
            async for message in consumer:
                if message.id == first:
                    results.append(await consumer.snooze(message, 45))
                else:
                    results.append(await consumer.nack(message, "later", delay_seconds=90))
                if len(results) == 2:
                    return results
        raise AssertionError("no messages")

    results = asyncio.run(run())
    assert {first: "snoozed"} in results and any(r != {first: "snoozed"} and "nacked" in r.values() for r in results)
    assert state(conn, first) == ("pending", 0, 0, 45)
    assert conn.execute("SELECT retry_count, round(extract(epoch FROM visible_at - now())) FROM courier.queue "
                        "WHERE id <> %s", (first,)).fetchone() == (1, 90)


def test_the_cli_snoozes_and_nacks_with_a_delay(courier, conn, topic):  # noqa: F811
    message_id, lease = leased(conn)
    out = assert_ok(courier("snooze", str(message_id), str(lease), "60", "-o", "json")).out
    assert json.loads(out)["result"] == "snoozed"
    # The CLI's statement ran a moment before this one (a process start on a loaded machine).
    status, attempts, history, due_in = state(conn, message_id)
    assert (status, attempts, history) == ("pending", 0, 0) and 57 <= due_in <= 60
    conn.execute("UPDATE courier.queue SET visible_at = now() WHERE id = %s", (message_id,))
    [(_, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 60)", (TOPIC,)).fetchall()
    assert_ok(courier("nack", str(message_id), str(lease), "--error", "busy", "--delay", "15"))
    status, attempts, history, due_in = state(conn, message_id)
    assert (status, attempts, history) == ("pending", 1, 1) and 12 <= due_in <= 15
    refused = courier("snooze", str(message_id), str(lease), "50000")
    assert refused.code == 2 and "SECONDS" in refused.err and "Traceback" not in refused.err


def test_the_http_api_snoozes_by_receipt(server, conn, topic):  # noqa: F811
    secret = token(conn, "worker", ["consume"])
    conn.execute("SELECT courier.enqueue(%s, '{\"n\": 1}')", (TOPIC,))
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret, {"topic": TOPIC, "count": 1})
    assert status == 200
    [message] = body["messages"]
    path = f"/api/messages/{message['id']}/snooze"
    status, body, _ = call(server, "POST", path, secret, {"receipt": message["receipt"]})
    assert status == 400 and "delay_seconds" in json.dumps(body)  # the delay is required, by name
    status, body, _ = call(server, "POST", path, secret, {"receipt": message["receipt"], "delay_seconds": 30})
    assert status == 200 and body["result"] == "snoozed" and body["visible_until"]
    assert state(conn, int(message["id"])) == ("pending", 0, 0, 30)
    status, body, _ = call(server, "POST", path, secret, {"receipt": message["receipt"], "delay_seconds": 30})
    assert status in (404, 409)  # that dequeue no longer holds it
