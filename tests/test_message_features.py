"""Each behaviour of the seed ulak-message-features, one test apiece, on a real database."""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers import claim, complete, queue_rows, report, scalar


def send(conn: psycopg.Connection, payload: str, **options: object) -> int:
    names = ", ".join(f"{key} := %({key})s" for key in options)
    query = "SELECT courier.send_with_options('webhook', %(payload)s::jsonb" + (f", {names}" if names else "") + ")"
    return scalar(conn, query, {"payload": payload, **options})


def test_priority_higher_first_then_fifo(conn, webhook):
    low_1 = send(conn, '{"n": 1}')
    high = send(conn, '{"n": 2}', p_priority=10)
    mid = send(conn, '{"n": 3}', p_priority=5)
    low_2 = send(conn, '{"n": 4}')
    assert [row[0] for row in claim(conn, 10)] == [high, mid, low_1, low_2]


def test_priority_default_is_zero(conn, webhook):
    message_id = scalar(conn, "SELECT courier.send('webhook', '{}')")
    assert scalar(conn, "SELECT priority FROM courier.queue WHERE id = %s", (message_id,)) == 0


def test_ordering_key_is_fifo_and_one_at_a_time(conn, webhook):
    first = send(conn, '{"step": 1}', p_ordering_key="order-123")
    second = send(conn, '{"step": 2}', p_ordering_key="order-123", p_priority=10)
    free = send(conn, '{"other": true}')

    # The higher-priority step 2 may not overtake step 1; the unkeyed message is free.
    assert sorted(row[0] for row in claim(conn, 10)) == [first, free]
    # While step 1 is processing, step 2 stays put.
    assert claim(conn, 10) == []
    complete(conn, [first])
    assert [row[0] for row in claim(conn, 10)] == [second]


def test_ordering_key_waits_for_a_retrying_predecessor(conn, webhook):
    first = send(conn, '{"step": 1}', p_ordering_key="k")
    send(conn, '{"step": 2}', p_ordering_key="k")
    assert [row[0] for row in claim(conn)] == [first]
    report(conn, [first], ["retryable"], ["boom"], [3600])
    # Step 1 is pending again but not due; step 2 must still wait behind it.
    assert claim(conn) == []


def test_idempotency_same_payload_returns_same_id(conn, webhook):
    first = send(conn, '{"order_id": 1}', p_idempotency_key="order-1-created")
    again = send(conn, '{"order_id": 1}', p_idempotency_key="order-1-created")
    assert first == again
    assert queue_rows(conn) == 1


def test_idempotency_key_order_of_keys_does_not_matter(conn, webhook):
    first = send(conn, '{"a": 1, "b": 2}', p_idempotency_key="k")
    assert send(conn, '{"b": 2, "a": 1}', p_idempotency_key="k") == first


def test_idempotency_different_payload_raises(conn, webhook):
    send(conn, '{"order_id": 1}', p_idempotency_key="order-1-created")
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        send(conn, '{"order_id": 2}', p_idempotency_key="order-1-created")
    assert "Idempotency key 'order-1-created' conflict: same key with different payload" in str(caught.value)
    assert queue_rows(conn) == 1


@pytest.mark.parametrize(("finish", "retention"), [("complete", "0"), ("fail", "86400")])
def test_idempotency_key_freed_when_message_leaves_active_states(conn, webhook, finish, retention):
    # The seed frees a key once its message is finished; issue 10 keeps a delivered one for
    # idempotency_retention_seconds (tests/test_idempotency_scope.py), 0 restoring the seed's rule.
    conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', %s)", (retention,))
    first = send(conn, '{"order_id": 1}', p_idempotency_key="k")
    claim(conn)
    if finish == "complete":
        complete(conn, [first])
    else:
        report(conn, [first], ["permanent"], ["gone"])
    # Processing still holds the key; a finished message does not, even with another payload.
    second = send(conn, '{"order_id": 2}', p_idempotency_key="k")
    assert second != first


def test_idempotency_key_held_while_processing(conn, webhook):
    first = send(conn, '{"order_id": 1}', p_idempotency_key="k")
    claim(conn)
    assert send(conn, '{"order_id": 1}', p_idempotency_key="k") == first


def test_scheduled_message_waits_until_due(conn, webhook):
    later = send(conn, '{"reminder": true}', p_scheduled_at="2999-01-01T00:00:00Z")
    due = send(conn, '{"report": "daily"}', p_scheduled_at="2025-04-15 09:00:00+00")
    assert [row[0] for row in claim(conn)] == [due]
    conn.execute("UPDATE courier.queue SET scheduled_at = now() - interval '1 second' WHERE id = %s", (later,))
    assert [row[0] for row in claim(conn)] == [later]


def test_expired_message_is_never_claimed(conn, webhook):
    send(conn, '{"offer": "limited"}', p_expires_at="2025-04-14 23:59:59+00")
    fresh = send(conn, '{"flash_sale": true}', p_expires_at="2999-01-01T00:00:00Z")
    assert [row[0] for row in claim(conn)] == [fresh]


def test_expires_before_scheduled_is_rejected(conn, webhook):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not after scheduled_at"):
        send(conn, '{}', p_scheduled_at="2999-01-02T00:00:00Z", p_expires_at="2999-01-01T00:00:00Z")
    assert queue_rows(conn) == 0


def test_correlation_id_is_stored_and_handed_to_the_worker(conn, webhook):
    correlation = "550e8400-e29b-41d4-a716-446655440000"
    send(conn, '{"data": 1}', p_correlation_id=correlation)
    row = conn.execute("SELECT correlation_id::text FROM courier._claim_due('w', 1)").fetchone()
    assert row == (correlation,)


def test_headers_and_metadata_are_stored(conn, webhook):
    message_id = send(conn, '{}', p_headers='{"X-Tenant": "acme"}', p_metadata='{"source": "test"}')
    row = conn.execute("SELECT headers, metadata FROM courier.queue WHERE id = %s", (message_id,)).fetchone()
    assert row == ({"X-Tenant": "acme"}, {"source": "test"})


def test_payload_and_headers_are_immutable(conn, webhook):
    message_id = send(conn, '{"amount": 1}', p_headers='{"a": "b"}')
    for column, value in [("payload", '{"amount": 1000}'), ("headers", '{"a": "c"}')]:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="immutable"):
            conn.execute(f"UPDATE courier.queue SET {column} = %s::jsonb WHERE id = %s", (value, message_id))
    assert scalar(conn, "SELECT payload FROM courier.queue WHERE id = %s", (message_id,)) == {"amount": 1}


def test_send_batch_inserts_in_order_and_returns_ids(conn, webhook):
    ids = scalar(conn, "SELECT courier.send_batch('webhook', ARRAY['{\"id\": 1}'::jsonb, "
                       "'{\"id\": 2}'::jsonb, '{\"id\": 3}'::jsonb])")
    assert len(ids) == 3 and ids == sorted(ids)
    payloads = [row[0] for row in conn.execute(
        "SELECT payload FROM courier.queue WHERE id = ANY(%s) ORDER BY id", (ids,))]
    assert payloads == [{"id": 1}, {"id": 2}, {"id": 3}]


def test_send_batch_with_priority_sets_every_message(conn, webhook):
    ids = scalar(conn, "SELECT courier.send_batch_with_priority('webhook', "
                       "ARRAY['{\"id\": 1}'::jsonb, '{\"id\": 2}'::jsonb], 5)")
    priorities = {row[0] for row in conn.execute(
        "SELECT priority FROM courier.queue WHERE id = ANY(%s)", (ids,))}
    assert priorities == {5}


def test_send_batch_sends_one_notify_per_batch(dsn, conn, webhook):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN courier_new_msg")
        conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                     "FROM generate_series(1, 500) g))")
        notes = list(listener.notifies(timeout=1.0))
    assert len(notes) == 1


def test_single_send_notifies_workers_with_the_endpoint_id(dsn, conn, webhook):
    endpoint_id = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'webhook'")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN courier_new_msg")
        conn.execute("SELECT courier.send('webhook', '{}')")
        notes = list(listener.notifies(timeout=1.0, stop_after=1))
    assert [n.payload for n in notes] == [str(endpoint_id)]


def test_fast_mode_lasts_for_the_transaction_only(dsn, webhook):
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute("SELECT courier.enable_fast_mode()")
            assert scalar(conn, "SHOW synchronous_commit") == "off"
            conn.execute("SELECT courier.send('webhook', '{\"data\": 1}')")
        assert scalar(conn, "SHOW synchronous_commit") == "on"
        assert scalar(conn, "SELECT count(*) FROM courier.queue") == 1


def test_backpressure_rejects_with_53400(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '2')")
    send(conn, '{"n": 1}')
    send(conn, '{"n": 2}')
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as caught:
        send(conn, '{"n": 3}')
    assert caught.value.sqlstate == "53400"
    assert "Queue backpressure" in str(caught.value)
    assert queue_rows(conn) == 2


def test_backpressure_rejects_a_whole_batch(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '5')")
    send(conn, '{"n": 0}')
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
        conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                     "FROM generate_series(1, 5) g))")
    assert queue_rows(conn) == 1
    conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 4) g))")
    assert queue_rows(conn) == 5


def test_backpressure_counts_only_active_messages(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '1')")
    first = send(conn, '{"n": 1}')
    claim(conn)
    complete(conn, [first])
    send(conn, '{"n": 2}')  # the completed message no longer counts


def test_backpressure_zero_means_unlimited(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 50) g))")
    assert queue_rows(conn) == 50
