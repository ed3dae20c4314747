"""Issue 42's verbs against a real database: cancel (by id and by key, pending, scheduled or in
processing, fenced against the holder's late report), purge (pending only, exact depth counters,
archived or dropped, and a DLQ), and delete by id without a lease. Each error names its field."""

from __future__ import annotations

import json

import psycopg
import pytest

from sqlkit import verbs
from sqlkit.errors import InvalidInput, NotFound, WrongState
from tests.helpers import claim, leases, message_status, scalar
from tests.test_roles_and_psql import login_as  # noqa: F401  (the fixture)


def send(conn: psycopg.Connection, endpoint: str, n: int = 1, **options: object) -> int:
    names = "".join(f", {k} := %({k})s" for k in options)
    return scalar(conn, f"SELECT courier.send_with_options(%(e)s, %(p)s::jsonb{names})",
                  {"e": endpoint, "p": json.dumps({"n": n}), **options})


def depth_is_exact(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """The depth counters agree with a count of the queue, per (endpoint, status); returns them."""
    counted = dict(((e, s), n) for e, s, n in conn.execute(
        "SELECT e.name, q.status, count(*) FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id "
        "GROUP BY 1, 2").fetchall())
    kept = dict(((e, s), int(n)) for e, s, n in conn.execute(
        "SELECT e.name, d.status, sum(d.messages) FROM courier._depth_by_endpoint() d "
        "JOIN courier.endpoints e ON e.id = d.endpoint_id GROUP BY 1, 2 HAVING sum(d.messages) <> 0").fetchall())
    assert kept == counted
    return counted


def dlq_depth_is_exact(conn: psycopg.Connection) -> None:
    counted = conn.execute("SELECT endpoint_id, status, count(*) FROM courier.dlq "
                           "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    kept = conn.execute("SELECT endpoint_id, status, sum(messages)::bigint FROM courier.dlq_depth "
                        "GROUP BY 1, 2 HAVING sum(messages) <> 0 ORDER BY 1, 2").fetchall()
    assert kept == counted


def events(conn: psycopg.Connection, kind: str) -> list[tuple[str, dict]]:
    return conn.execute("SELECT actor, details FROM courier.event_log WHERE event_type = %s ORDER BY id",
                        (kind,)).fetchall()


@pytest.fixture
def billing(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('billing', 'noop')")
    return "billing"


@pytest.fixture
def orders(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    return "orders"


# Cancel ------------------------------------------------------------------------------------


def test_cancel_a_pending_or_scheduled_message_archives_it_as_cancelled_with_who(conn, billing):
    ready = send(conn, billing, 1)
    later = send(conn, billing, 2, p_scheduled_at="2999-01-01T00:00:00Z")
    kept = send(conn, billing, 3)
    assert verbs.cancel(conn, ready, actor="ops:ann") == verbs.Cancelled(ready, "billing", "pending")
    assert verbs.cancel(conn, later).was == "scheduled"
    assert message_status(conn, ready) == message_status(conn, later) == "cancelled"
    assert [row[0] for row in claim(conn)] == [kept]  # what is left is delivered as before
    assert depth_is_exact(conn) == {("billing", "processing"): 1}
    (first, second) = events(conn, "message.cancelled")
    assert first[0] == scalar(conn, "SELECT session_user")
    assert first[1] == {"message_id": ready, "was": "pending", "by": "ops:ann"}
    assert second[1] == {"message_id": later, "was": "scheduled"}


def test_cancel_twice_is_a_no_op_and_a_finished_or_unknown_message_is_refused_naming_the_id(conn, billing):
    one = send(conn, billing)
    verbs.cancel(conn, one)
    assert verbs.cancel(conn, one).was == "cancelled"
    assert len(events(conn, "message.cancelled")) == 1

    done = send(conn, billing)
    claim(conn)
    conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, '{success}', '{NULL}')",
                 ([done], leases(conn, [done])))
    with pytest.raises(WrongState) as refused:
        verbs.cancel(conn, done)
    assert refused.value.field == "id" and refused.value.sqlstate == "55000"
    assert f"cannot cancel message {done}: it already finished and is in the archive as completed" in str(refused.value)

    with pytest.raises(NotFound) as unknown:
        verbs.cancel(conn, 987654)
    assert (unknown.value.field, unknown.value.sqlstate) == ("id", "P0002")
    assert unknown.value.message == "id: message 987654 does not exist"
    with pytest.raises(InvalidInput) as missing:
        verbs.cancel(conn, None)  # type: ignore[arg-type]
    assert missing.value.field == "id"


def test_cancel_by_idempotency_key_or_pull_key(conn, billing, orders):
    keyed = send(conn, billing, p_idempotency_key="order-7")
    pulled = scalar(conn, "SELECT courier.enqueue('orders', '{\"n\": 1}', 'cart-9')")
    assert verbs.cancel_by_key(conn, "billing", "order-7") == [verbs.Cancelled(keyed, "billing", "pending")]
    assert verbs.cancel_by_key(conn, "orders", "cart-9") == [verbs.Cancelled(pulled, "orders", "pending")]
    assert message_status(conn, keyed) == message_status(conn, pulled) == "cancelled"
    # The key is free again, as when a message finishes: a new send is a new message.
    assert send(conn, billing, p_idempotency_key="order-7") != keyed

    with pytest.raises(NotFound) as none:
        verbs.cancel_by_key(conn, "orders", "cart-9")
    assert none.value.field == "key"
    assert 'no pending or processing message of "orders" has key "cart-9"' in str(none.value)
    with pytest.raises(NotFound) as nowhere:
        verbs.cancel_by_key(conn, "nowhere", "k")
    assert nowhere.value.field == "endpoint" and 'endpoint "nowhere" does not exist' in str(nowhere.value)
    with pytest.raises(InvalidInput) as blank:
        verbs.cancel_by_key(conn, "billing", "")
    assert blank.value.field == "key"
    with pytest.raises(InvalidInput) as dead_letters:
        verbs.cancel_by_key(conn, "orders.dlq", "cart-9")
    assert dead_letters.value.field == "endpoint" and "names a DLQ" in dead_letters.value.message


def test_cancel_in_processing_fences_the_workers_late_report_and_nothing_delivers_it_again(conn, billing):
    """The holder's report (retryable, which would otherwise queue it again) is a no-op counted
    as stale; stale and dead-worker recovery find nothing; no claim ever returns it."""
    message = send(conn, billing)
    claim(conn, worker="w1")
    (lease,) = leases(conn, [message])
    assert verbs.cancel(conn, message, actor="ops").was == "processing"
    assert message_status(conn, message) == "cancelled"
    (event,) = events(conn, "message.cancelled")
    assert event[1] == {"message_id": message, "was": "processing", "by": "ops", "worker_id": "w1"}

    report = conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, '{retryable}', '{boom}')",
                          ([message], [lease])).fetchone()
    assert report == (0, 0, 0, 1)  # delivered, retried, dead-lettered, stale
    both = conn.execute("SELECT delivered, retried, dead_lettered, stale FROM courier.report_and_claim("
                        "'w1', 10, %s, %s, %s, '{success}', '{NULL}')",
                        (scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'billing'"), [message],
                         [lease])).fetchone()
    assert both == (0, 0, 0, 1)
    assert scalar(conn, "SELECT courier.renew_leases(%s, %s)", ([message], [lease])) == 0
    assert scalar(conn, "SELECT courier.release_batch(%s, %s)", ([message], [lease])) == 0
    assert scalar(conn, "SELECT courier.recover_stale_messages(0)") == 0
    assert scalar(conn, "SELECT courier.recover_dead_workers_claims(0)") == 0
    assert claim(conn) == []
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (message,)) == "cancelled"
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE id = %s", (message,)) == 1
    # Stale: the report, the report carried by a claim, and the release.
    assert scalar(conn, "SELECT sum(total) FROM courier.delivery_totals WHERE outcome = 'stale_report'") == 3
    assert depth_is_exact(conn) == {}


def test_a_keyed_message_cancelled_in_flight_holds_its_key_until_its_delivery_ends(conn, billing):
    """The next message of the ordering key must not start while the cancelled one's delivery
    is still under way, or the receiver could see them out of order. The cancelled message is
    archived as cancelled at once; its key is free when its worker reports (or releases, or is
    recovered as stale or dead), and that report changes nothing else."""
    first = send(conn, billing, 1, p_ordering_key="account-7")
    second = send(conn, billing, 2, p_ordering_key="account-7")
    assert [row[0] for row in claim(conn, worker="w1")] == [first]
    (lease,) = leases(conn, [first])
    assert verbs.cancel(conn, first, actor="ops").was == "processing"
    assert verbs.cancel(conn, first).was == "cancelled"  # again: nothing more happens
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (first,)) == "cancelled"
    assert claim(conn, worker="w2") == []  # the key is still held by the delivery under way
    assert depth_is_exact(conn) == {("billing", "processing"): 1, ("billing", "pending"): 1}

    report = conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, '{success}', '{NULL}')",
                          ([first], [lease])).fetchone()
    assert report == (0, 0, 0, 1)  # its outcome discarded: counted as a stale report
    assert [row[0] for row in claim(conn, worker="w2")] == [second]
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE id = %s", (first,)) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (first,)) == 0
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0

    # A worker that dies instead: recovery frees the key, and delivers nothing again.
    third = send(conn, billing, 3, p_ordering_key="account-8")
    claim(conn, worker="w3")
    verbs.cancel(conn, third)
    assert scalar(conn, "SELECT courier.recover_stale_messages(0)") == 1  # second's claim, not third
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (third,)) == 0
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE id = %s AND status = 'cancelled'", (third,)) == 1
    depth_is_exact(conn)


def test_cancel_a_leased_pull_message_answers_its_consumers_ack_not_found(conn, orders):
    message = scalar(conn, "SELECT courier.enqueue('orders', '{\"n\": 1}')")
    (lease,) = conn.execute("SELECT lease FROM courier.dequeue('orders', 1, 30)").fetchone()
    assert verbs.cancel(conn, message).was == "processing"
    assert scalar(conn, "SELECT courier.ack(%s::bigint, %s)", (message, lease)) == "not_found"
    assert scalar(conn, "SELECT courier.nack(%s::bigint, %s, 'x')", (message, lease)) == "not_found"
    assert conn.execute("SELECT * FROM courier.dequeue('orders', 10, 30)").fetchall() == []
    assert message_status(conn, message) == "cancelled"


def test_the_application_role_may_cancel_but_not_purge_or_delete(conn, billing, login_as):  # noqa: F811
    app = login_as("courier_application")
    mine = scalar(app, "SELECT courier.send_with_options('billing', '{}', p_idempotency_key := 'k')")
    assert app.execute("SELECT id, was FROM courier.cancel_message_by_key('billing', 'k')").fetchall() == [
        (mine, "pending")]
    other = scalar(app, "SELECT courier.send('billing', '{}')")
    assert app.execute("SELECT was FROM courier.cancel_message(%s)", (other,)).fetchone() == ("pending",)
    third = scalar(app, "SELECT courier.send('billing', '{}')")
    for statement in ("SELECT courier.purge_queue('billing')", f"SELECT courier.delete_message({third})",
                      "SELECT courier.purge_queue_count('billing')"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(statement)
    assert message_status(conn, third) == "pending"


# Purge -------------------------------------------------------------------------------------


def test_purge_takes_pending_scheduled_and_retrying_never_processing_and_keeps_depth_exact(conn, billing):
    conn.execute("SELECT courier.create_endpoint('other', 'noop')")
    for n in range(5):
        send(conn, billing, n)
    held = [row[0] for row in claim(conn, batch=2)]
    send(conn, billing, 9, p_scheduled_at="2999-01-01T00:00:00Z")
    retrying = send(conn, billing, 10, p_priority=10)
    (claimed,) = claim(conn, batch=1)
    assert claimed[0] == retrying
    conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, '{retryable}', '{later}')",
                 ([retrying], leases(conn, [retrying])))
    untouched = send(conn, "other", 1)
    assert depth_is_exact(conn)[("billing", "pending")] == 5

    assert verbs.purge_count(conn, "billing") == 5
    assert verbs.purge(conn, "billing", actor="ops") == 5
    assert depth_is_exact(conn) == {("billing", "processing"): 2, ("other", "pending"): 1}
    assert sorted(r[0] for r in conn.execute("SELECT id FROM courier.queue WHERE status = 'processing'")) == held
    assert message_status(conn, untouched) == "pending"
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'purged'") == 5
    assert events(conn, "queue.purged")[0][1] == {"name": "billing", "count": 5, "archived": True, "by": "ops"}
    assert verbs.purge(conn, "billing") == 0  # nothing left: no event either
    assert len(events(conn, "queue.purged")) == 1
    # The held messages are delivered as usual afterwards.
    assert conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, '{success,success}', '{NULL,NULL}')",
                        (held, leases(conn, held))).fetchone() == (2, 0, 0, 0)


def test_purge_without_archive_drops_them_and_a_pull_topic_keeps_its_leased_messages(conn, orders):
    for n in range(4):
        conn.execute("SELECT courier.enqueue('orders', %s::jsonb)", (json.dumps({"n": n}),))
    conn.execute("SELECT courier.enqueue('orders', '{}', p_scheduled_at := '2999-01-01T00:00:00Z')")
    (leased,) = conn.execute("SELECT id, lease FROM courier.dequeue('orders', 1, 30)").fetchall()
    assert verbs.purge_count(conn, "orders") == 4
    assert verbs.purge(conn, "orders", archive=False) == 4
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 0
    assert depth_is_exact(conn) == {("orders", "processing"): 1}
    assert scalar(conn, "SELECT courier.ack(%s::bigint, %s)", leased) == "acked"
    assert events(conn, "queue.purged")[0][1] == {"name": "orders", "count": 4, "archived": False}


def test_purge_a_dlq_by_flag_or_by_its_dot_dlq_name(conn, billing, orders):
    conn.execute("SELECT courier.alter_endpoint('billing', p_retry_policy := '{\"max_retries\": 0}')")
    for n in range(3):
        send(conn, billing, n)
    ids = [row[0] for row in claim(conn, batch=3)]
    conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, %s, %s)",
                 (ids, leases(conn, ids), ["permanent"] * 3, ["gone"] * 3))
    redriven = scalar(conn, "SELECT min(id) FROM courier.dlq")
    conn.execute("SELECT courier.redrive_message(%s)", (redriven,))
    pending = send(conn, billing, 7)
    assert verbs.purge_count(conn, "billing", dlq=True) == 2
    assert verbs.purge(conn, "billing", dlq=True) == 2
    assert conn.execute("SELECT status FROM courier.dlq").fetchall() == [("redriven",)]  # the audit trail stays
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'failed'") == 3  # as they were
    assert message_status(conn, pending) == "pending"
    dlq_depth_is_exact(conn)

    conn.execute("SELECT courier.alter_topic('orders', '{\"max_retries\": 0}')")
    conn.execute("SELECT courier.enqueue('orders', '{}')")
    (dead, lease) = conn.execute("SELECT id, lease FROM courier.dequeue('orders', 1, 30)").fetchone()
    conn.execute("SELECT courier.nack(%s::bigint, %s, 'bad')", (dead, lease))
    assert verbs.purge_count(conn, "orders.dlq") == 1
    assert verbs.purge(conn, "orders.dlq") == 1
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'failed'") == 0
    dlq_depth_is_exact(conn)
    assert [d["count"] for _, d in events(conn, "dlq.purged")] == [2, 1]


def test_purge_of_an_unknown_endpoint_names_the_field(conn):
    with pytest.raises(NotFound) as unknown:
        verbs.purge(conn, "nowhere")
    assert unknown.value.field == "endpoint" and unknown.value.sqlstate == "P0002"
    with pytest.raises(NotFound):
        verbs.purge_count(conn, "nowhere.dlq")
    with pytest.raises(InvalidInput) as blank:
        verbs.purge(conn, "")
    assert blank.value.field == "endpoint"


# Delete ------------------------------------------------------------------------------------


def test_delete_by_id_without_a_lease_leaves_no_archive_row_but_an_event(conn, billing):
    pending = send(conn, billing)
    later = send(conn, billing, p_scheduled_at="2999-01-01T00:00:00Z")
    assert verbs.delete(conn, pending, actor="ops") == "pending"
    assert verbs.delete(conn, later) == "scheduled"
    assert message_status(conn, pending) is None and message_status(conn, later) is None
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 0
    assert [d for _, d in events(conn, "message.deleted")] == [
        {"message_id": pending, "was": "pending", "by": "ops"}, {"message_id": later, "was": "scheduled"}]
    assert depth_is_exact(conn) == {}


def test_delete_refuses_a_message_in_processing_and_says_to_cancel_it(conn, billing):
    message = send(conn, billing)
    claim(conn, worker="w9")
    with pytest.raises(WrongState) as refused:
        verbs.delete(conn, message)
    assert refused.value.field == "id"
    assert "in processing (worker w9)" in refused.value.message
    assert "courier message cancel" in (refused.value.hint or "")
    assert message_status(conn, message) == "processing"
    with pytest.raises(NotFound) as unknown:
        verbs.delete(conn, 424242)
    assert unknown.value.field == "id" and unknown.value.message == "id: message 424242 does not exist"
