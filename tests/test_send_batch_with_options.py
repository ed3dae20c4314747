"""courier.send_batch_with_options: a batch whose messages each keep their own fields, checked
element by element as send_with_options checks one message, all or nothing."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.test_roles_and_psql import login_as  # noqa: F401 - the role fixture

SEND = ("SELECT courier.send_batch_with_options('webhook', %(payloads)s::jsonb[], %(priorities)s::integer[], "
        "%(scheduled_at)s::timestamptz[], %(keys)s::text[], %(correlation_ids)s::uuid[], "
        "%(expires_at)s::timestamptz[], %(ordering_keys)s::text[], %(headers)s::jsonb[], %(metadata)s::jsonb[])")
FIELDS = ("priorities", "scheduled_at", "keys", "correlation_ids", "expires_at", "ordering_keys", "headers", "metadata")


def send(conn: psycopg.Connection, payloads: list, **fields: list) -> list[int]:
    params = {name: fields.get(name) for name in FIELDS}
    for name in ("headers", "metadata"):
        if params[name] is not None:
            params[name] = [None if v is None else json.dumps(v) for v in params[name]]
    return conn.execute(SEND, {"payloads": [json.dumps(p) for p in payloads], **params}).fetchone()[0]


def stored(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT id, payload, priority, scheduled_at, idempotency_key, correlation_id, expires_at, "
                        "ordering_key, headers, metadata FROM courier.queue ORDER BY id").fetchall()


def test_every_message_keeps_its_own_fields_in_order(conn, webhook):
    later = datetime.now(UTC) + timedelta(hours=1)
    correlation = uuid.uuid4()
    ids = send(conn, [{"n": 1}, {"n": 2}, {"n": 3}], priorities=[7, 0, 2], scheduled_at=[later, None, None],
               keys=["k-1", None, None], correlation_ids=[str(correlation), None, None],
               expires_at=[later + timedelta(hours=1), None, None], ordering_keys=["tenant-9", None, "tenant-9"],
               headers=[{"X-Tenant": "acme"}, None, {}], metadata=[{"source": "backfill"}, None, {"n": 3}])
    assert ids == sorted(ids)
    assert stored(conn) == [
        (ids[0], {"n": 1}, 7, later, "k-1", correlation, later + timedelta(hours=1), "tenant-9",
         {"X-Tenant": "acme"}, {"source": "backfill"}),
        (ids[1], {"n": 2}, 0, None, None, None, None, None, {}, {}),
        (ids[2], {"n": 3}, 2, None, None, None, None, "tenant-9", {}, {"n": 3})]


def test_a_held_idempotency_key_yields_its_message_and_a_different_payload_conflicts(conn, webhook):
    first = conn.execute("SELECT courier.send_with_options('webhook', '{\"n\": 1}', p_idempotency_key := 'k')"
                         ).fetchone()[0]
    ids = send(conn, [{"n": 1}, {"n": 2}, {"n": 2}], keys=["k", "j", "j"])
    assert ids[0] == first and ids[1] == ids[2] != first
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 2
    with pytest.raises(psycopg.errors.UniqueViolation, match="batch element 2: idempotency key 'k' conflict"):
        send(conn, [{"n": 3}, {"n": 4}], keys=[None, "k"])
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 2  # nothing of that batch


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"priorities": [0, 11]}, psycopg.errors.InvalidParameterValue,
     "batch element 2: priority must be between 0 and 10, got 11"),
    ({"priorities": [0, None]}, psycopg.errors.InvalidParameterValue, "batch element 2: priority .* got NULL"),
    ({"headers": [None, {"Content-Length": "1"}]}, psycopg.errors.InvalidParameterValue,
     "batch element 2: header Content-Length is set by Courier"),
    ({"headers": [{"X-A": 1}, None]}, psycopg.errors.InvalidParameterValue,
     "batch element 1: header X-A must have a string value"),
    ({"metadata": [None, [1]]}, psycopg.errors.InvalidParameterValue,
     "batch element 2: headers and metadata must be JSON objects"),
    ({"ordering_keys": ["", None]}, psycopg.errors.InvalidParameterValue,
     "batch element 1: idempotency and ordering keys must be 1 to 255 characters"),
    ({"scheduled_at": [None, datetime(2030, 1, 2, tzinfo=UTC)], "expires_at": [None, datetime(2030, 1, 1, tzinfo=UTC)]},
     psycopg.errors.InvalidParameterValue, "batch element 2: expires_at .* is not after scheduled_at"),
    ({"keys": ["a"]}, psycopg.errors.InvalidParameterValue, "one element per payload"),
], ids=["priority", "null-priority", "framing-header", "header-value", "metadata", "ordering-key", "expiry", "lengths"])
def test_an_invalid_element_is_named_and_refuses_the_whole_batch(conn, webhook, fields, error, message):
    with pytest.raises(error, match=message):
        send(conn, [{"n": 1}, {"n": 2}], **fields)
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 0


def test_size_limit_and_backpressure_refuse_the_whole_batch(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="batch element 2: exceeds max_payload_size"):
        send(conn, [{"n": 1}, {"blob": "x" * 2000}])
    conn.execute("SELECT courier.set_setting('max_queue_size', '3')")
    send(conn, [{"n": 1}, {"n": 2}])
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="backpressure"):
        send(conn, [{"n": 3}, {"n": 4}])
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 2


def test_the_application_role_may_send_a_batch_with_options(conn, webhook, login_as):  # noqa: F811
    app = login_as("courier_application")
    ids = app.execute("SELECT courier.send_batch_with_options('webhook', ARRAY['{\"n\": 1}']::jsonb[], "
                      "p_headers := ARRAY['{\"X-Tenant\": \"acme\"}']::jsonb[])").fetchone()[0]
    assert conn.execute("SELECT headers FROM courier.queue WHERE id = %s", (ids[0],)).fetchone()[0] \
        == {"X-Tenant": "acme"}


def test_a_key_delivered_and_archived_turns_its_batch_duplicate_away(conn, webhook):
    from tests.test_idempotency_scope import deliver_all
    first = send(conn, [{"n": 1}], keys=["k"])[0]
    deliver_all(conn)
    assert conn.execute("SELECT count(*) FROM courier.archive WHERE id = %s", (first,)).fetchone()[0] == 1
    assert send(conn, [{"n": 1}, {"n": 2}], keys=["k", None])[0] == first  # not a second delivery
    assert [row[1] for row in stored(conn)] == [{"n": 2}]
    with pytest.raises(psycopg.errors.UniqueViolation):
        send(conn, [{"n": 3}], keys=["k"])


def test_the_batch_path_respects_max_depth_and_reaches_pull_topics(conn, webhook):
    conn.execute("SELECT courier.alter_endpoint('webhook', config || '{\"max_depth\": 2}') FROM courier.endpoints"
                 " WHERE name = 'webhook'")
    with pytest.raises(psycopg.Error) as refused:
        send(conn, [{"n": 1}, {"n": 2}, {"n": 3}])
    assert refused.value.sqlstate == "53401"

    assert stored(conn) == []
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{\"message_ttl_seconds\": 60}')")
    ids = conn.execute("SELECT courier.send_batch_with_options('orders', ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[])"
                       ).fetchone()[0]
    taken = conn.execute("SELECT id, expires_at > now() FROM courier.dequeue('orders', 10) d"
                         " JOIN courier.queue q USING (id) ORDER BY id").fetchall()
    assert taken == [(ids[0], True), (ids[1], True)]
