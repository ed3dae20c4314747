"""What a detail shows is what is stored (issue 41, section 6): a number a producer stored beyond
float precision prints exactly on every path that shows a payload (`courier dlq show`, a
dequeue or receive, the console's message and DLQ details, -o json and tsv), and a message's
attempts and history agree with its status. Against a real database and the real CLI."""

from __future__ import annotations

import json

import psycopg
import pytest

from console.app.panes.dlq import dlq_detail
from console.app.panes.messages import message_detail
from console.app.widgets.detail import _shown_json
from sqlkit import dlq, exact_json, messages, pull
from sqlkit.exact_json import JsonNumber
from tests.helpers import claim, complete, report, scalar
from tests.test_cli import run

PAYLOAD = '{"n": 12345678901234567890123, "f": 0.1000000000000000055511151231257827, "plain": 1.5}'
DIGITS = ("12345678901234567890123", "0.1000000000000000055511151231257827")


def shows_exactly(text: str) -> bool:
    return all(digits in text for digits in DIGITS) and "0.1," not in text and "0.1\n" not in text


@pytest.fixture
def topic(conn) -> str:
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    return "orders"


def dead_letter(conn, topic: str) -> int:
    message_id = scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb, p_metadata => %s::jsonb)",
                        (topic, PAYLOAD, PAYLOAD))
    [(held, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1)", (topic,)).fetchall()
    assert held == message_id and scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (held, lease)) == "dead_lettered"
    return scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message_id,))


def test_the_readers_keep_what_no_float_holds_and_the_writers_print_it_as_stored():
    value = exact_json.stored_loads(PAYLOAD.encode())
    assert value == {"n": 12345678901234567890123, "f": JsonNumber(DIGITS[1]), "plain": 1.5}
    assert exact_json.dumps_like(value) == PAYLOAD
    assert json.loads(exact_json.dumps_like(value, indent=2)) == json.loads(PAYLOAD)
    lookalike = "courier-exact-number-x-0"  # a string is never taken for a number
    assert exact_json.dumps_like([JsonNumber("1e400"), lookalike]) == f'[1e400, "{lookalike}"]'


def test_dlq_show_prints_the_payload_exactly_as_a_table_as_json_and_as_tsv(dsn, conn, topic):
    dlq_id = dead_letter(conn, topic)
    table = run("dlq", "show", str(dlq_id), dsn=dsn)
    assert table.code == 0 and shows_exactly(table.out), table
    as_json = run("dlq", "show", str(dlq_id), "-o", "json", dsn=dsn)
    assert as_json.code == 0, as_json
    shown = exact_json.stored_loads(as_json.out)
    assert shown["payload"] == shown["metadata"] == exact_json.stored_loads(PAYLOAD), as_json.out
    assert scalar(conn, "SELECT %s::jsonb = %s::jsonb", (exact_json.dumps_like(shown["payload"]), PAYLOAD))
    as_tsv = run("dlq", "show", str(dlq_id), "-o", "tsv", dsn=dsn)
    assert as_tsv.code == 0 and shows_exactly(as_tsv.out), as_tsv


@pytest.mark.parametrize("verb", ["dequeue", "receive"])
def test_a_dequeue_and_a_receive_print_the_payload_exactly(dsn, conn, topic, verb):
    for output in ([], ["-o", "json"]):
        conn.execute("SELECT courier.enqueue(%s, %s::jsonb)", (topic, PAYLOAD))
        result = run(verb, topic, *output, dsn=dsn)
        assert result.code == 0 and shows_exactly(result.out), result
    reader = pull.dequeue if verb == "dequeue" else pull.receive
    conn.execute("SELECT courier.enqueue(%s, %s::jsonb)", (topic, PAYLOAD))
    [taken] = reader(conn, topic)
    assert taken.payload["f"] == JsonNumber(DIGITS[1]) and taken.payload["n"] == 12345678901234567890123


def test_the_consoles_message_and_dlq_details_show_the_payload_exactly(conn, topic):
    dlq_id = dead_letter(conn, topic)
    entry = dlq.get(conn, dlq_id)
    assert shows_exactly(_shown_json(dlq_detail(entry, None).payload))
    message_id = scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb)", (topic, PAYLOAD))
    assert shows_exactly(_shown_json(message_detail(messages.get(conn, message_id), None).payload))


@pytest.fixture
def hook(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    return "hook"


def test_a_message_delivered_after_a_failure_shows_both_attempts(conn, hook):
    message_id = scalar(conn, "SELECT courier.send('hook', '{}')")
    [(claimed, *_)] = claim(conn)
    assert claimed == message_id
    report(conn, [message_id], ["retryable"], ["HTTP 503"])
    conn.execute("UPDATE courier.queue SET next_retry_at = now() WHERE id = %s", (message_id,))
    assert [row[0] for row in claim(conn)] == [message_id]
    complete(conn, [message_id])

    message = messages.get(conn, message_id)
    assert (message.status, message.retry_count, message.attempts) == ("completed", 1, 2)
    assert [(a["attempt"], a["outcome"]) for a in message.history] == [(1, "retryable"), (2, "success")]
    assert len(message.error_history) == 1  # what is stored, and what the analytics count, stays the failures
    fields = dict(message_detail(message, None).fields)
    assert fields["attempts"] == 2 and fields["last error"] == "HTTP 503"
    modal = message_detail(message, None)
    assert modal.history[-1]["outcome"] == "success"


def test_a_message_delivered_at_once_shows_one_attempt_and_an_unfinished_one_its_failures(conn, hook):
    delivered = scalar(conn, "SELECT courier.send('hook', '{}')")
    claim(conn)
    complete(conn, [delivered])
    message = messages.get(conn, delivered)
    assert (message.attempts, [a["outcome"] for a in message.history]) == (1, ["success"])

    waiting = scalar(conn, "SELECT courier.send('hook', '{}')")
    claim(conn)
    report(conn, [waiting], ["retryable"], ["HTTP 503"])
    message = messages.get(conn, waiting)
    assert (message.status, message.attempts, [a["outcome"] for a in message.history]) == \
        ("pending", 1, ["retryable"])


# Requeue keeps the message's own expiry (issue 41, section 8) --------------------------------


def test_requeue_and_redrive_keep_a_pull_messages_own_expiry(conn, topic):
    entries = []
    for _ in range(3):
        message_id = scalar(conn, "SELECT courier.enqueue(%s, '{}', p_ttl_seconds => 600)", (topic,))
        [(held, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1)", (topic,)).fetchall()
        assert held == message_id and scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (held, lease)) == \
            "dead_lettered"
        entries.append((scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message_id,)),
                        scalar(conn, "SELECT expires_at FROM courier.dlq WHERE original_message_id = %s",
                               (message_id,))))
    by_requeue = scalar(conn, "SELECT courier.requeue(%s)", (entries[0][0],))
    by_redrive = scalar(conn, "SELECT courier.redrive_message(%s)", (entries[1][0],))
    assert scalar(conn, "SELECT courier.redrive_endpoint('orders')") == 1
    by_endpoint = scalar(conn, "SELECT redriven_message_id FROM courier.dlq WHERE id = %s", (entries[2][0],))
    for message_id, (_, expires_at) in zip((by_requeue, by_redrive, by_endpoint), entries, strict=True):
        assert scalar(conn, "SELECT expires_at FROM courier.queue WHERE id = %s", (message_id,)) == expires_at


def test_a_dead_letter_past_its_expiry_is_refused_by_requeue_and_left_by_a_bulk_redrive(conn, topic):
    message_id = scalar(conn, "SELECT courier.enqueue(%s, '{}', p_ttl_seconds => 600)", (topic,))
    [(held, lease)] = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1)", (topic,)).fetchall()
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (held, lease)) == "dead_lettered"
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message_id,))
    conn.execute("UPDATE courier.dlq SET expires_at = now() - interval '1 second' WHERE id = %s", (dlq_id,))
    for call in ("SELECT courier.requeue(%s)", "SELECT courier.redrive_message(%s)"):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="would only expire") as caught:
            conn.execute(call, (dlq_id,))
        assert f"courier dlq show {dlq_id}" in caught.value.diag.message_hint
    assert scalar(conn, "SELECT courier.redrive_endpoint('orders')") == 0
    assert scalar(conn, "SELECT status FROM courier.dlq WHERE id = %s", (dlq_id,)) == "failed"
