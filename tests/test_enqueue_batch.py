"""courier.enqueue_batch: many messages for one topic in one statement, each with enqueue()'s
options, all or none, counted and woken as enqueue() does."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers import scalar
from tests.test_depth_counters import ACTUAL, COUNTED
from tests.test_pull import dequeue


@pytest.fixture
def orders(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{\"message_ttl_seconds\": 3600}')")
    return "orders"


def enqueue_batch(conn, payloads=None, binary=None, metadata=None, scheduled_at=None, ttl=None, max_retries=None,
                  topic: str = "orders") -> list[int]:
    return scalar(conn, "SELECT courier.enqueue_batch(%s, %s::jsonb[], %s::bytea[], %s::jsonb[], "
                        "%s::timestamptz[], %s::integer[], %s::integer[])",
                  (topic, payloads, binary, metadata, scheduled_at, ttl, max_retries))


def test_each_message_gets_its_own_options_and_comes_back_in_order(conn, orders):
    later = scalar(conn, "SELECT now() + interval '1 hour'")
    ids = enqueue_batch(conn, payloads=[Jsonb({"n": 1}), None, Jsonb({"n": 3})],
                        binary=[None, b"\x00\xff", None],
                        metadata=[Jsonb({"trace": "a"}), None, None],
                        scheduled_at=[None, None, later], ttl=[60, None, None], max_retries=[None, 2, None])
    assert ids == sorted(ids) and len(ids) == 3
    rows = conn.execute("""SELECT payload, payload_binary, metadata, max_retries, scheduled_at,
                                  round(extract(epoch FROM expires_at - visible_at))
                           FROM courier.queue WHERE id = ANY(%s) ORDER BY id""", (ids,)).fetchall()
    assert rows[0][:4] == ({"n": 1}, None, {"trace": "a"}, None) and rows[0][5] == 60
    assert rows[1][:4] == (None, b"\x00\xff", {}, 2) and rows[1][5] == 3600  # the topic's TTL
    assert rows[2][4] == later
    # The two due now, in the order given; the scheduled one waits.
    assert [m["id"] for m in dequeue(conn, 10)] == ids[:2]
    assert scalar(conn, COUNTED) == scalar(conn, ACTUAL)


def test_one_bad_element_refuses_the_batch_and_is_named(conn, orders):
    cases = [
        ({"payloads": [Jsonb({}), None]}, psycopg.errors.NullValueNotAllowed,
         "batch element 2: payload must not be NULL"),
        ({"payloads": [Jsonb({})], "metadata": [Jsonb([1])]}, psycopg.errors.InvalidParameterValue,
         "batch element 1: metadata must be a JSON object"),
        ({"payloads": [Jsonb({}), Jsonb({})], "ttl": [None, 0]}, psycopg.errors.InvalidParameterValue,
         "batch element 2: ttl_seconds must be between 1 and 31536000, got 0"),
        ({"payloads": [Jsonb({})], "max_retries": [1001]}, psycopg.errors.InvalidParameterValue,
         "max_retries must be between 0 and 1000"),
        ({"payloads": [Jsonb({})], "scheduled_at": ["infinity"]}, psycopg.errors.InvalidParameterValue,
         "scheduled_at must be a finite time"),
        ({"payloads": [Jsonb({})], "ttl": [1, 2]}, psycopg.errors.InvalidParameterValue,
         "one element per message"),
    ]
    for arguments, error, message in cases:
        with pytest.raises(error, match=message):
            enqueue_batch(conn, **arguments)
        conn.rollback()
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_limits_and_names_refuse_the_whole_batch_as_enqueue_does(conn, orders):
    conn.execute("SELECT courier.create_endpoint('small', 'pull', '{\"max_depth\": 2}')")
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.commit()
    with pytest.raises(psycopg.Error, match="max_depth") as refused:
        enqueue_batch(conn, payloads=[Jsonb({})] * 3, topic="small")
    assert refused.value.sqlstate == "53401"
    conn.rollback()
    assert len(enqueue_batch(conn, payloads=[Jsonb({})] * 2, topic="small")) == 2
    with pytest.raises(psycopg.errors.WrongObjectType, match="not a pull topic"):
        enqueue_batch(conn, payloads=[Jsonb({})], topic="hook")
    conn.rollback()
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        enqueue_batch(conn, payloads=[Jsonb({})], topic="nope")
    conn.rollback()
    assert enqueue_batch(conn, payloads=[]) == []
    conn.execute("SELECT courier.disable_endpoint('orders')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="disabled"):
        enqueue_batch(conn, payloads=[Jsonb({})])


def test_a_batch_wakes_waiting_consumers_once_at_commit_and_a_scheduled_one_not_at_all(dsn, conn, orders):
    topic_id = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'orders'")
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as producer:
        listener.execute("LISTEN courier_new_msg")
        enqueue_batch(producer, payloads=[Jsonb({"n": 1})],
                      scheduled_at=[scalar(producer, "SELECT now() + interval '1 hour'")])
        producer.commit()
        assert list(listener.notifies(timeout=0.5)) == []
        enqueue_batch(producer, payloads=[Jsonb({"n": n}) for n in range(5)])
        assert list(listener.notifies(timeout=0.3)) == []  # not before the commit
        producer.commit()
        assert [n.payload for n in listener.notifies(timeout=1)] == [str(topic_id)]


def test_the_application_role_may_call_it(conn, orders):
    conn.execute("SET ROLE courier_application")
    assert len(enqueue_batch(conn, payloads=[Jsonb({"n": 1})])) == 1


def test_the_python_api_enqueues_a_batch(conn, orders):
    from sqlkit import pull
    ids = pull.enqueue_batch(conn, "orders", [{"n": 1}, [2], "three"], metadata=[None, {"m": 2}, None],
                             max_retries=[None, None, 4])
    assert [(m.id, m.payload, m.metadata, m.max_retries) for m in pull.dequeue(conn, "orders", 10)] == [
        (ids[0], {"n": 1}, {}, 10), (ids[1], [2], {"m": 2}, 10), (ids[2], "three", {}, 4)]  # 10: the default
