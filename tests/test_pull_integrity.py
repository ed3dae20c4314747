"""Pull topics keep what they promise under hostile or careless callers (issue 23): no send path
takes a time that never comes, one fenced call names a message once, idempotency keys outlive
the ack or receive that completes their message, receive_failed touches only a message that was
received, a redriven dead letter comes back as a requeued one, and the hints tell the truth."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

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
def test_an_id_under_two_leases_in_one_fenced_call_is_refused_and_changes_nothing(conn, orders, call):
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    [(_, lease)] = dequeue(conn)
    before = conn.execute("SELECT status, lease, visible_at, retry_count FROM courier.queue WHERE id = %s",
                          (message_id,)).fetchone()
    for leases in ([lease, lease - 1], [lease - 1, lease], [lease, lease + 1, lease]):
        with pytest.raises(psycopg.errors.InvalidParameterValue,
                           match=f"ids: message {message_id} is given under several leases"):
            conn.execute(call, {"ids": [message_id] * len(leases), "leases": leases})
        assert conn.execute("SELECT status, lease, visible_at, retry_count FROM courier.queue WHERE id = %s",
                            (message_id,)).fetchone() == before
    # The same id and lease twice is one request: applied once, its result given for both.
    results = conn.execute(call, {"ids": [message_id, message_id], "leases": [lease, lease]}).fetchall()
    assert [row[:2] for row in results] == [(message_id, results[0][1])] * 2 and results[0][1] != "lease_lost"
    retries = scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s", (message_id,))
    assert retries in (None, before[3] + ("nack" in call))


@pytest.mark.parametrize("call", [
    "SELECT * FROM courier.nack(%(ids)s, %(leases)s, 'boom')",
    "SELECT * FROM courier.release(%(ids)s, %(leases)s)",
])
def test_two_settles_of_one_lease_at_once_apply_once(dsn, conn, orders, call):
    """The second waits for the first to commit, then finds the lease settled: one attempt
    counted, one answer that applied. No row lock is taken before the UPDATE (it wrote a lock
    record a message), so the UPDATE's own fenced WHERE must be what keeps them apart."""
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    [(_, lease)] = dequeue(conn)
    params = {"ids": [message_id], "leases": [lease]}
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        [(_, applied)] = first.execute(call, params).fetchall()
        result: list = []
        racer = threading.Thread(target=lambda: result.extend(second.execute(call, params).fetchall()))
        racer.start()
        racer.join(0.5)
        assert racer.is_alive(), "the second settle waits for the first's commit"
        first.commit()
        racer.join(10)
    assert applied in ("nacked", "released")
    assert result and result[0][1] != applied
    if "nack" in call:
        assert scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s", (message_id,)) == 1



def _due_ago(conn, message_id: int, seconds: int) -> None:
    conn.execute("UPDATE courier.queue SET visible_at = now() - make_interval(secs => %s) WHERE id = %s",
                 (seconds, message_id))


@pytest.mark.parametrize("taker", ["dequeue", "receive"])
def test_a_lapsed_lease_and_pending_messages_come_in_one_due_order(dsn, conn, orders, taker):
    """Pending messages and leases live in two indexes (migration 0059); a consumer still gets
    them in one due-time order: a lease that lapsed 20 s ago comes after a message due 30 s ago,
    a running lease not at all, and no two consumers at once get the same message."""
    ids = [scalar(conn, "SELECT courier.enqueue('orders', jsonb_build_object('n', %s::int))", (n,))
           for n in range(4)]
    assert [m for m, _ in dequeue(conn, 2)] == ids[:2]
    _due_ago(conn, ids[1], 20)  # ids[1]'s lease lapsed 20 s ago; ids[0]'s still runs
    _due_ago(conn, ids[2], 30)
    _due_ago(conn, ids[3], 10)

    def take(connection, count: int) -> list[int]:
        return [r[0] for r in connection.execute(f"SELECT id FROM courier.{taker}('orders', %s)", (count,))]

    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        assert take(first, 1) == [ids[2]]  # due 30 s ago, before the lease that lapsed 20 s ago
        concurrent = take(second, 2)  # the lapsed lease too, unless the first still holds it locked
        assert ids[3] in concurrent and ids[2] not in concurrent and ids[0] not in concurrent
        first.commit()
        second.commit()
    later = take(conn, 5)
    assert sorted(concurrent + later) == sorted([ids[3], ids[1]])  # each once; the running lease never
    if taker == "dequeue":
        assert scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s", (ids[1],)) == 1
    assert status(conn, ids[0]) == "processing"


# Item 4: idempotency keys outlive the ack or receive that completes their message --------------


def send_keyed(conn, payload: dict, key: str = "order-42", topic: str = "orders") -> int:
    return scalar(conn, "SELECT courier.send_with_options(%s, %s, p_idempotency_key => %s)",
                  (topic, Jsonb(payload), key))


def ack(conn, message_id: int, lease: int) -> str:
    return scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, lease))


def test_a_retried_send_after_ack_returns_the_delivered_message(conn, orders):
    first = send_keyed(conn, {"n": 1})
    plain = scalar(conn, "SELECT courier.send('orders', '{\"n\": 0}')")
    held = dict(dequeue(conn, 10))
    assert conn.execute("SELECT * FROM courier.ack(%s, %s)", ([first, plain], [held[first], held[plain]])).fetchall() \
        == [(first, "acked"), (plain, "acked")]
    assert send_keyed(conn, {"n": 1}) == first
    batch = conn.execute("SELECT courier.send_batch_with_options('orders', ARRAY[%s]::jsonb[], "
                         "p_idempotency_keys => ARRAY['order-42'])", (Jsonb({"n": 1}),)).fetchone()[0]
    assert batch == [first]
    with pytest.raises(psycopg.errors.UniqueViolation, match="same key with different payload"):
        send_keyed(conn, {"n": 2})
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert dequeue(conn) == []
    # Only the keyed message left a trace: a plain ack still deletes for good.
    assert conn.execute("SELECT id, status FROM courier.archive").fetchall() == [(first, "completed")]
    assert scalar(conn, "SELECT sum(total) FROM courier.delivery_totals WHERE outcome = 'delivered'") == 2


def test_a_retried_send_after_receive_returns_the_received_message(conn, orders):
    first = send_keyed(conn, {"n": 1})
    plain = scalar(conn, "SELECT courier.send('orders', '{\"n\": 0}')")
    received = conn.execute("SELECT id, payload FROM courier.receive('orders', 10)").fetchall()
    assert received == [(first, {"n": 1}), (plain, {"n": 0})]
    assert send_keyed(conn, {"n": 1}) == first
    assert conn.execute("SELECT * FROM courier.receive('orders', 10)").fetchall() == []
    assert conn.execute("SELECT id, status FROM courier.archive").fetchall() == [(first, "completed")]


def test_a_retried_publish_adds_nothing_to_a_topic_that_consumed_it(conn, orders):
    conn.execute("SELECT courier.create_event_type('order.created', 'An order was placed')")
    conn.execute("SELECT courier.subscribe('order.created', 'orders')")
    publish = "SELECT courier.publish('order.created', '{\"id\": 42}', p_idempotency_key => 'order-42')"
    assert scalar(conn, publish) == 1
    [(message_id, lease)] = dequeue(conn)
    assert ack(conn, message_id, lease) == "acked"
    scalar(conn, publish)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_a_key_is_free_again_after_the_retention_and_with_retention_zero(conn, orders):
    first = send_keyed(conn, {"n": 1})
    [(_, lease)] = dequeue(conn)
    ack(conn, first, lease)
    conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', '0')")
    assert send_keyed(conn, {"n": 2}) != first


def test_a_lost_lease_on_a_keyed_message_archives_nothing(conn, orders):
    first = send_keyed(conn, {"n": 1})
    [(_, lease)] = dequeue(conn)
    assert ack(conn, first, lease + 1) == "lease_lost"
    assert status(conn, first) == "processing" and scalar(conn, "SELECT count(*) FROM courier.archive") == 0


# Item 15: receive_failed applies only to a message the caller received ---------------------------


def receive_and_roll_back(dsn, topic: str = "orders") -> int:
    """What ReceiveLoop does when its handler raises: the receive's transaction rolls back."""
    with psycopg.connect(dsn) as receiver:
        [(message_id,)] = receiver.execute("SELECT id FROM courier.receive(%s)", (topic,)).fetchall()
        receiver.rollback()
    return message_id


def receive_failed(conn, message_id: int, topic: str = "orders") -> str:
    return scalar(conn, "SELECT courier.receive_failed(%s, %s, 'handler raised')", (topic, message_id))


def snapshot(conn, message_id: int) -> tuple:
    return conn.execute("SELECT status, retry_count, visible_at, error_history FROM courier.queue WHERE id = %s",
                        (message_id,)).fetchone()


def test_receive_failed_leaves_alone_a_message_nobody_received(conn, orders):
    later = scalar(conn, "SELECT courier.enqueue('orders', '{}', p_scheduled_at => now() + interval '7 days')")
    due = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    before = {m: snapshot(conn, m) for m in (later, due)}
    assert receive_failed(conn, later) == "not_found"  # scheduled 7 days out: must not become visible
    assert receive_failed(conn, due) == "not_found"  # due, but no receive ever took it
    assert {m: snapshot(conn, m) for m in (later, due)} == before


def test_receive_failed_on_a_max_retries_0_topic_dead_letters_only_a_received_message(dsn, conn):
    conn.execute("""SELECT courier.create_endpoint('strict', 'pull', '{"max_retries": 0}')""")
    untouched = scalar(conn, "SELECT courier.enqueue('strict', '{\"n\": 1}')")
    received = scalar(conn, "SELECT courier.enqueue('strict', '{\"n\": 2}')")
    conn.execute("UPDATE courier.queue SET visible_at = visible_at + interval '1 hour' WHERE id = %s", (untouched,))
    assert receive_and_roll_back(dsn, "strict") == received
    conn.execute("UPDATE courier.queue SET visible_at = visible_at - interval '1 hour' WHERE id = %s", (untouched,))
    assert receive_failed(conn, untouched, "strict") == "not_found"
    assert receive_failed(conn, received, "strict") == "dead_lettered"
    assert scalar(conn, "SELECT array_agg(original_message_id) FROM courier.dlq") == [received]
    assert status(conn, untouched) == "pending"


def test_receive_failed_counts_a_received_message_once_and_holds_it_back(dsn, conn, orders):
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    assert receive_and_roll_back(dsn) == message_id
    assert receive_failed(conn, message_id) == "retry"
    status_, retries, visible_at, history = snapshot(conn, message_id)
    assert (status_, retries, history[-1]["outcome"]) == ("pending", 1, "receive_failed")
    assert visible_at > scalar(conn, "SELECT now()")
    # A second report of the same failure finds it held back, not due: nothing more is counted.
    assert receive_failed(conn, message_id) == "not_found"
    assert snapshot(conn, message_id)[1] == 1


def test_receive_failed_leaves_alone_a_leased_or_expired_message(dsn, conn, orders):
    leased = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    [(held, _)] = dequeue(conn)
    assert held == leased and receive_failed(conn, leased) == "not_found"
    expired = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    assert receive_and_roll_back(dsn) == expired
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second' WHERE id = %s", (expired,))
    assert receive_failed(conn, expired) == "not_found"
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0


# Item 16: a redriven pull dead letter comes back as a requeued one ------------------------------------


def dead_letter(conn, key: str | None, topic: str = "orders") -> int:
    """A message of `topic` (max_retries 0) nacked into <topic>.dlq; returns its DLQ entry's id."""
    message_id = scalar(conn, "SELECT courier.enqueue(%s, '{\"n\": 1}', p_key => %s)", (topic, key))
    [(held, lease)] = dequeue(conn, topic=topic)
    assert held == message_id and scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (held, lease)) == "dead_lettered"
    return scalar(conn, "SELECT id FROM courier.dlq WHERE original_message_id = %s", (message_id,))


def requeued(conn, message_id: int) -> tuple:
    return conn.execute("SELECT key, expires_at - now() BETWEEN interval '3590 seconds' AND interval '3600 seconds', "
                        "retry_count, max_retries, status, jsonb_array_length(error_history) "
                        "FROM courier.queue WHERE id = %s", (message_id,)).fetchone()


@pytest.fixture
def ttl_topic(conn) -> str:
    conn.execute("""SELECT courier.create_endpoint('ttl', 'pull', '{"max_retries": 0, "message_ttl_seconds": 3600}')""")
    return "ttl"


def test_redrive_and_requeue_follow_one_rule_for_a_pull_dead_letter(conn, ttl_topic):
    entries = [dead_letter(conn, f"k-{n}", "ttl") for n in range(1, 5)]
    by_requeue = scalar(conn, "SELECT courier.requeue(%s)", (entries[0],))
    by_redrive = scalar(conn, "SELECT courier.redrive_message(%s)", (entries[1],))
    first, second = entries[2:]
    assert scalar(conn, "SELECT courier.redrive_endpoint('ttl')") == 2
    by_endpoint = scalar(conn, "SELECT array_agg(redriven_message_id ORDER BY id) FROM courier.dlq "
                               "WHERE id = ANY (%s)", ([first, second],))
    expected = (True, 0, None, "pending", 1)
    assert requeued(conn, by_requeue) == ("k-1", *expected)
    assert requeued(conn, by_redrive) == ("k-2", *expected)
    assert [requeued(conn, m) for m in by_endpoint] == [("k-3", *expected), ("k-4", *expected)]


def test_redriving_a_dead_letter_whose_key_is_active_again_is_refused_as_requeue_refuses_it(conn, ttl_topic):
    dlq_id = dead_letter(conn, "k-1", "ttl")
    other = dead_letter(conn, "k-2", "ttl")
    active = scalar(conn, "SELECT courier.enqueue('ttl', '{\"n\": 2}', p_key => 'k-1')")
    for call in ("SELECT courier.requeue(%s)", "SELECT courier.redrive_message(%s)"):
        with pytest.raises(psycopg.errors.UniqueViolation, match='key "k-1" is active'):
            conn.execute(call, (dlq_id,))
    # A bulk redrive takes the others and leaves it for later, failed, rather than failing the batch.
    assert scalar(conn, "SELECT courier.redrive_endpoint('ttl')") == 1
    assert conn.execute("SELECT id, status FROM courier.dlq ORDER BY id").fetchall() == [
        (dlq_id, "failed"), (other, "redriven")]
    [(held, lease)] = dequeue(conn, topic="ttl")
    assert held == active and scalar(conn, "SELECT courier.ack(%s, %s)", (held, lease)) == "acked"
    assert scalar(conn, "SELECT courier.redrive_endpoint('ttl')") == 1


def test_a_push_dead_letter_is_still_redriven_without_key_or_expiry(conn, webhook):
    message_id = scalar(conn, "SELECT courier.send_with_options('webhook', '{}', p_idempotency_key => 'i-1', "
                              "p_expires_at => now() + interval '1 hour')")
    endpoint_id = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'webhook'")
    conn.execute("SELECT courier.claim_batch('w', 10, %s)", (endpoint_id,))
    lease = scalar(conn, "SELECT lease FROM courier.queue WHERE id = %s", (message_id,))
    conn.execute("SELECT courier.report_outcomes(%s, %s, %s, %s)", ([message_id], [lease], ["permanent"], ["x"]))
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq")
    again = scalar(conn, "SELECT courier.redrive_message(%s)", (dlq_id,))
    assert conn.execute("SELECT idempotency_key, expires_at FROM courier.queue WHERE id = %s",
                        (again,)).fetchone() == (None, None)


# Item 18: hints that tell the truth, and the fields of a topic's dead letter ---------------------------


def test_a_keyed_enqueue_replaces_a_message_whose_visibility_timeout_passed(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 5}')""")
    first = scalar(conn, "SELECT courier.enqueue('orders', '{\"v\": 1}', p_key => 'k')")
    [(_, lease)] = dequeue(conn)
    with pytest.raises(psycopg.errors.UniqueViolation) as refused:
        conn.execute("SELECT courier.enqueue('orders', '{\"v\": 2}', p_key => 'k')")
    assert "visibility timeout has passed" in refused.value.diag.message_hint
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (first,))
    # As the hint says: once the lease lapsed, the enqueue replaces it in place, the lost attempt counted.
    assert scalar(conn, "SELECT courier.enqueue('orders', '{\"v\": 2}', p_key => 'k')") == first
    row = conn.execute("SELECT status, payload, retry_count, error_history -> -1 ->> 'outcome' FROM courier.queue "
                       "WHERE id = %s", (first,)).fetchone()
    assert row == ("pending", {"v": 2}, 1, "lease_expired")
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first, lease)) == "lease_lost"  # the old holder is fenced
    [(again, new_lease)] = dequeue(conn)
    assert again == first and new_lease != lease  # leases are random (issue 40): only ever a new one


def test_a_keyed_enqueue_dead_letters_a_lapsed_message_past_max_retries_and_queues_the_new_one(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    first = scalar(conn, "SELECT courier.enqueue('orders', '{\"v\": 1}', p_key => 'k')")
    dequeue(conn)
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (first,))
    second = scalar(conn, "SELECT courier.enqueue('orders', '{\"v\": 2}', p_key => 'k')")
    assert second != first and status(conn, second) == "pending"
    assert scalar(conn, "SELECT original_message_id FROM courier.dlq") == first


def test_dlq_show_json_has_a_topic_dead_letters_fields(courier, conn):  # noqa: F811
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    dlq_id = dead_letter(conn, "k-1")
    shown = courier("dlq", "show", str(dlq_id), "--json")
    assert shown.code == 0, shown
    entry = json.loads(shown.out)
    assert entry["original_topic"] == "orders" and entry["max_retries"] == 0 and entry["key"] == "k-1"
    assert entry["dlq_moved_at"] is not None


# Item 14: ordering keys on pull topics ---------------------------------------------------------------


def send_ordered(conn, n: int, ordering_key: str | None, topic: str = "orders") -> int:
    return scalar(conn, "SELECT courier.send_with_options(%s, %s, p_ordering_key => %s)",
                  (topic, Jsonb({"n": n}), ordering_key))


def test_one_dequeue_never_leases_two_messages_of_an_ordering_key(conn, orders):
    a1, a2, b1, plain = (send_ordered(conn, 1, "cust-a"), send_ordered(conn, 2, "cust-a"),
                         send_ordered(conn, 3, "cust-b"), send_ordered(conn, 4, None))
    held = dict(dequeue(conn, 10))
    assert sorted(held) == [a1, b1, plain]
    assert dequeue(conn, 10) == []  # a2 waits while a1 is in processing
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (a1, held[a1])) == "acked"
    assert [m for m, _ in dequeue(conn, 10)] == [a2]


def test_a_lapsed_lease_is_taken_again_before_the_next_message_of_its_key(conn, orders):
    first, second = send_ordered(conn, 1, "cust-a"), send_ordered(conn, 2, "cust-a")
    [(taken, _)] = dequeue(conn, 10)
    assert taken == first
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (first,))
    assert [m for m, _ in dequeue(conn, 10)] == [first]
    assert status(conn, second) == "pending"


def test_a_nacked_message_keeps_its_place_at_the_head_of_its_key(conn, orders):
    first, second = send_ordered(conn, 1, "cust-a"), send_ordered(conn, 2, "cust-a")
    [(taken, lease)] = dequeue(conn, 10)
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'retry')", (taken, lease)) == "nacked"
    assert [m for m, _ in dequeue(conn, 10)] == [first]
    assert status(conn, second) == "pending"


def test_receive_takes_one_message_of_an_ordering_key_at_a_time(dsn, conn, orders):
    a1, a2, b1 = send_ordered(conn, 1, "cust-a"), send_ordered(conn, 2, "cust-a"), send_ordered(conn, 3, "cust-b")
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        assert [r[0] for r in first.execute("SELECT id FROM courier.receive('orders', 10)")] == [a1, b1]
        assert second.execute("SELECT id FROM courier.receive('orders', 10)").fetchall() == []  # a1 not yet done
        first.commit()
        second.rollback()
        assert [r[0] for r in second.execute("SELECT id FROM courier.receive('orders', 10)")] == [a2]



def test_receive_checks_ordering_keys_from_the_first_keyed_message_a_topic_gets(dsn, conn, orders):
    """Until a topic's messages carry an ordering key, receive skips the checks (migration 0048).
    The write of the first keyed message marks the topic (migration 0050); a keyed message that
    receive meets on a topic not marked turns the checks on before anything is taken, so a key
    whose message is leased is still held back, and the topic stays checked."""
    ordering_keys = "SELECT ordering_keys FROM courier.endpoints WHERE name = 'orders'"
    send_ordered(conn, 1, None)
    assert [r[0] for r in conn.execute("SELECT payload FROM courier.receive('orders', 10)")] == [{"n": 1}]
    assert scalar(conn, ordering_keys) is False
    held = send_ordered(conn, 2, "cust-a")
    assert scalar(conn, ordering_keys) is True  # marked by the send
    assert scalar(conn, "SELECT id FROM courier.dequeue('orders', 1)") == held
    after, free = send_ordered(conn, 3, "cust-a"), send_ordered(conn, 4, None)
    conn.execute("UPDATE courier.endpoints SET ordering_keys = false WHERE name = 'orders'")
    assert [r[0] for r in conn.execute("SELECT id FROM courier.receive('orders', 10)")] == [free]
    assert scalar(conn, ordering_keys) is True  # and again by receive, which met a key
    conn.execute("UPDATE courier.endpoints SET ordering_keys = false WHERE name = 'orders'")
    with psycopg.connect(dsn) as marking:  # another receive marking the topic holds its row
        marking.execute("SELECT id FROM courier.endpoints WHERE name = 'orders' FOR UPDATE")
        assert conn.execute("SELECT id FROM courier.receive('orders', 10)").fetchall() == []  # no wait, still checked
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (after,)) == 1

KEYED_WRITES = {
    "send_with_options": "SELECT courier.send_with_options(%s, '{}', p_ordering_key => 'cust-a')",
    "send_batch_with_options": "SELECT courier.send_batch_with_options(%s, ARRAY['{}', '{}']::jsonb[], "
                               "p_ordering_keys => ARRAY[NULL, 'cust-a'])",
}


@pytest.mark.parametrize("protocol", ["pull", "noop"])
@pytest.mark.parametrize("write", sorted(KEYED_WRITES))
def test_every_write_of_a_keyed_message_marks_its_endpoint(conn, protocol, write):
    """dequeue takes keyed messages only on a marked topic (migration 0050), so the write that
    brings the first one marks it in its own transaction: the counted single send, the batch the
    insert trigger counts, a push endpoint as a topic. A message without a key marks nothing."""
    conn.execute("SELECT courier.create_endpoint('sink', %s, '{}')", (protocol,))
    marked = "SELECT ordering_keys FROM courier.endpoints WHERE name = 'sink'"
    conn.execute("SELECT courier.send_with_options('sink', '{}', p_priority => 3)")
    conn.execute("SELECT courier.send_batch('sink', ARRAY['{}']::jsonb[])")
    assert scalar(conn, marked) is False
    with conn.transaction():
        conn.execute(KEYED_WRITES[write], ("sink",))
        assert scalar(conn, marked) is True


def test_a_replayed_keyed_message_marks_its_endpoint_again(conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    first = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_ordering_key => 'cust-a')")
    [(taken, lease)] = conn.execute("SELECT id, lease FROM courier.claim_batch('w', 10, %s)", (hook,)).fetchall()
    conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, ARRAY['success'], ARRAY[NULL])", ([taken], [lease]))
    conn.execute("UPDATE courier.endpoints SET ordering_keys = false WHERE name = 'hook'")
    copy = scalar(conn, "SELECT courier.replay_message(%s)", (first,))
    assert scalar(conn, "SELECT ordering_key FROM courier.queue WHERE id = %s", (copy,)) == "cust-a"
    assert scalar(conn, "SELECT ordering_keys FROM courier.endpoints WHERE name = 'hook'") is True


def test_dequeue_on_an_unmarked_topic_hands_out_no_keyed_message(conn, orders):
    """The mark decides only whether dequeue checks keys, never whether a key is honoured: on a
    topic not marked (as one read just before its first keyed message committed) dequeue takes
    only messages without a key, and the next dequeue, reading the mark, takes the key's head."""
    a1, a2, plain = send_ordered(conn, 1, "cust-a"), send_ordered(conn, 2, "cust-a"), send_ordered(conn, 3, None)
    conn.execute("UPDATE courier.endpoints SET ordering_keys = false WHERE name = 'orders'")
    assert [m for m, _ in dequeue(conn, 10)] == [plain]
    assert dequeue(conn, 10) == []
    conn.execute("UPDATE courier.endpoints SET ordering_keys = true WHERE name = 'orders'")
    assert [m for m, _ in dequeue(conn, 10)] == [a1]
    assert status(conn, a2) == "pending"


def test_dequeues_two_statements_differ_only_in_the_ordering_key_test():
    """dequeue has one statement for marked topics and one for the rest (migration 0050); a
    change to one that misses the other would make the two kinds of topic behave apart."""
    source = (Path(__file__).parents[1] / "sqlkit" / "functions" / "pull.sql").read_text()
    body = source[source.index("CREATE OR REPLACE FUNCTION courier.dequeue(p_topic text"):]
    split = body.index("\n        ELSE  -- the same statement")  # inside the loop over queue and stage
    checked = body[body.index("        IF v_topic.ordering_keys THEN\n"):split]
    plain = body[split:body.index("\n        END IF;\n", split)]
    # The rule is explained once and tested in both ranges (pending messages, lapsed leases).
    explained = re.compile(r"\n *-- Ordering keys, as the push claim's rule.*?instead of 32 ms\)\.", re.S)
    rule = re.compile(r"\n *AND \(q\.ordering_key IS NULL OR \(.*?q2\.id < q\.id\)\)\)", re.S)
    assert len(explained.findall(checked)) == 1 and len(rule.findall(checked)) == 2
    statement = lambda text: text[text.index("RETURN QUERY"):]  # noqa: E731
    assert statement(rule.sub("", explained.sub("", checked))) == statement(plain).replace(
        "\n                              AND q.ordering_key IS NULL  -- the topic has never had one (see above)", "")


# Item 14, second half: priority on pull topics ------------------------------------------------


def send_with_priority(conn, priorities: list[int], topic: str = "orders",
                       ordering_key: str | None = None) -> list[tuple[int, int]]:
    """Sends one message per priority, in the order given; returns (priority, id) pairs."""
    return [(p, scalar(conn, "SELECT courier.send_with_options(%s, %s, p_priority => %s, p_ordering_key => %s)",
                       (topic, Jsonb({"p": p}), p, ordering_key)))
            for p in priorities]


def expected_order(sent: list[tuple[int, int]]) -> list[int]:
    return [m for _, m in sorted(sent, key=lambda pm: (-pm[0], pm[1]))]


PRIORITIES = [3, 0, 10, 7, 7, 1, 10, 5, 0, 9, 2, 4, 6, 8, 6, 5, 3, 1, 9, 2, 8, 4]  # each of 0-10, shuffled


def test_dequeue_hands_out_higher_priority_first_across_batches(conn, orders):
    sent = send_with_priority(conn, PRIORITIES)
    taken: list[int] = []
    while batch := conn.execute("SELECT id FROM courier.dequeue('orders', 4)").fetchall():
        taken += [m for (m,) in batch]
    assert taken == expected_order(sent)


def test_receive_and_the_cli_follow_the_same_order(courier, dsn, conn, orders):  # noqa: F811
    sent = send_with_priority(conn, PRIORITIES)
    first = [m for (m,) in conn.execute("SELECT id FROM courier.receive('orders', 5)")]
    shown = courier("dequeue", "orders", "--count", "5", "--json").json()
    rest = [m for (m,) in conn.execute("SELECT id FROM courier.receive('orders', 100)")]
    assert first + [m["id"] for m in shown] + rest == expected_order(sent)


def test_a_lapsed_lease_comes_back_in_its_priority_not_ahead_of_higher_ones(conn, orders):
    [(_, low)] = send_with_priority(conn, [2])
    [(taken, _)] = dequeue(conn, 1)
    assert taken == low
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (low,))
    sent = send_with_priority(conn, [0, 9, 2])
    assert [m for m, _ in dequeue(conn, 10)] == [sent[1][1], low, sent[2][1], sent[0][1]]


def test_an_ordering_key_keeps_its_id_order_whatever_the_priorities(conn, orders):
    (_, first), (_, urgent) = send_with_priority(conn, [0, 10], ordering_key="cust-a")
    [(_, other)] = send_with_priority(conn, [5])
    assert [m for m, _ in dequeue(conn, 10)] == [other, first]  # urgent waits behind its key's first
    assert status(conn, urgent) == "pending"


def test_scheduled_messages_wait_whatever_their_priority(conn, orders):
    later = scalar(conn, "SELECT courier.send_with_options('orders', '{}', p_priority => 10, "
                         "p_scheduled_at => now() + interval '1 hour')")
    sent = send_with_priority(conn, [0, 4])
    assert scalar(conn, "SELECT courier.peek('orders')") == 2
    assert [m for m, _ in dequeue(conn, 10)] == [sent[1][1], sent[0][1]]
    assert status(conn, later) == "pending"


# Issue 40: a lease cannot be guessed --------------------------------------------------------------


def test_a_lease_settles_only_its_own_message_and_cannot_be_guessed(conn, orders):
    """Leases were a counter, 1 on every first dequeue: a consumer that acked the wrong id with
    its own lease settled another consumer's message. A lease is drawn at random, never the one
    it replaces and never 0, for push claims as for pull dequeues."""
    conn.execute("SELECT courier.send_batch('orders', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 200) g")
    held = dequeue(conn, 200)
    leases = [lease for _, lease in held]
    assert len(set(leases)) == len(leases) and 0 not in leases
    ids = [message_id for message_id, _ in held]
    # Each message settled with its neighbour's lease: nothing is acked.
    results = conn.execute("SELECT result FROM courier.ack(%s::bigint[], %s::integer[])",
                           (ids, leases[1:] + leases[:1])).fetchall()
    assert {result for (result,) in results} == {"lease_lost"}
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 200
    # A lapsed lease taken again gets another random lease; the first one is fenced out.
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (ids[0],))
    [(again_id, again_lease)] = [row for row in dequeue(conn, 5) if row[0] == ids[0]]
    assert again_lease not in (0, leases[0]) and ack(conn, ids[0], leases[0]) == "lease_lost"
    assert ack(conn, again_id, again_lease) == "acked"


def test_push_claims_take_random_leases_too(conn, webhook):
    conn.execute("SELECT courier.send_batch('webhook', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 50) g")
    endpoint = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'webhook'")
    leases = [lease for (lease,) in conn.execute("SELECT lease FROM courier.claim_batch('w', 50, %s)",
                                                 (endpoint,)).fetchall()]
    assert len(leases) == 50 and len(set(leases)) == 50 and 0 not in leases
