"""The DLQ as a topic (issue 42, item 7): a pull topic's dead letters are the messages of
`<topic>.dlq`, dequeued under a lease and acked, nacked, released or extended like any topic's
(queue-ti), through SQL, the Python Consumer, the CLI and HTTP; every settle is fenced by the
lease; sends stay refused, and requeue never takes a dead letter a consumer holds."""
# ruff: noqa: F811  (the `server` fixture comes from test_serve, by import)

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sqlkit.consumer import Consumer
from tests.helpers import scalar
from tests.test_cli import assert_ok, run
from tests.test_serve import b64, call, server, token  # noqa: F401


@pytest.fixture
def orders(conn) -> str:
    """Topic 'orders', whose messages go to orders.dlq at their first nack."""
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    return "orders"


def dead_letters(conn, count: int, topic: str = "orders") -> list[int]:
    """Enqueue `count` messages and nack each past its retries: their DLQ ids, oldest first."""
    for n in range(count):
        conn.execute("SELECT courier.enqueue(%s, %s)", (topic, Jsonb({"n": n})))
    held = conn.execute("SELECT id, lease FROM courier.dequeue(%s, %s)", (topic, count)).fetchall()
    results = conn.execute("SELECT result FROM courier.nack(%s::bigint[], %s::integer[], 'boom')",
                           ([i for i, _ in held], [lease for _, lease in held])).fetchall()
    assert {r for (r,) in results} == {"dead_lettered"}
    return [i for (i,) in conn.execute("SELECT id FROM courier.dlq WHERE original_topic = %s AND status = 'failed' "
                                       "ORDER BY id", (topic,))]


def dequeue(conn, count: int = 1, topic: str = "orders.dlq", timeout: int | None = None) -> list[dict]:
    cur = conn.execute("SELECT * FROM courier.dequeue(%s, %s, %s)", (topic, count, timeout))
    columns = [c.name for c in cur.description]
    return [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]


def settle(conn, verb: str, held: list[dict] | dict, *extra) -> list[str]:
    held = [held] if isinstance(held, dict) else held
    args = ", ".join(["%s::bigint[]", "%s::integer[]", *(["%s"] * len(extra))])
    return [r for (r, *_) in conn.execute(f"SELECT result FROM courier.{verb}({args})",
                                          ([m["id"] for m in held], [m["lease"] for m in held], *extra))]


def lapse(conn, dlq_id: int) -> None:
    """Make a dead letter's lease (or a nack's delay) run out now."""
    conn.execute("UPDATE courier.dlq SET visible_at = now() - interval '1 second' WHERE id = %s", (dlq_id,))


def dlq_status(conn, dlq_id: int) -> str:
    return scalar(conn, "SELECT status FROM courier.dlq WHERE id = %s", (dlq_id,))


# SQL ------------------------------------------------------------------------------------------


def test_dead_letters_are_dequeued_in_order_and_acked_for_the_audit_trail(conn, orders):
    ids = dead_letters(conn, 3)
    assert scalar(conn, "SELECT courier.peek('orders.dlq')") == 3
    held = dequeue(conn, 2)
    assert [m["id"] for m in held] == ids[:2]  # the DLQ entries' own ids, oldest first
    assert all(m["lease"] < 0 for m in held)  # a dead letter's lease is negative: it names the DLQ
    assert [m["payload"] for m in held] == [{"n": 0}, {"n": 1}]
    assert [(m["retry_count"], m["max_retries"]) for m in held] == [(0, 0), (0, 0)]  # queue-ti: max_retries 0
    assert scalar(conn, "SELECT courier.peek('orders.dlq')") == 1  # leased ones are not due
    assert dequeue(conn, 5)[0]["id"] == ids[2]
    assert dequeue(conn, 5) == []

    assert settle(conn, "ack", held) == ["acked", "acked"]
    rows = conn.execute("SELECT status, acked_at IS NOT NULL, leased_at FROM courier.dlq WHERE id = ANY (%s) "
                        "ORDER BY id", (ids[:2],)).fetchall()
    assert rows == [("acked", True, None)] * 2  # kept for the audit trail, until cleanup_dlq()
    event = scalar(conn, "SELECT details FROM courier.event_log WHERE event_type = 'dlq.acked'")
    assert event == {"topic": "orders.dlq", "count": 2, "dlq_ids": ids[:2]}
    assert scalar(conn, "SELECT dead_lettered FROM courier.topics()") == 1  # only the one left to decide on
    assert scalar(conn, "SELECT sum(messages) FROM courier.dlq_depth WHERE status = 'acked'") == 2
    assert settle(conn, "ack", held[0]) == ["not_found"]  # a second ack: done already
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="acked"):
        conn.execute("SELECT courier.requeue(%s)", (ids[0],))
    # The topic's own consumers see none of it.
    assert conn.execute("SELECT * FROM courier.dequeue('orders', 10)").fetchall() == []


def test_nack_snooze_and_release_return_a_dead_letter_to_the_dlq(conn, orders):
    [dlq_id] = dead_letters(conn, 1)
    [held] = dequeue(conn)
    assert settle(conn, "nack", held, "still broken", 60) == ["nacked"]
    assert dequeue(conn) == []  # due again after the delay
    row = conn.execute("SELECT status, retry_count, last_error, error_history -> -1, leased_at "
                       "FROM courier.dlq WHERE id = %s", (dlq_id,)).fetchone()
    assert row[:3] == ("failed", 1, "still broken") and row[4] is None
    assert (row[3]["outcome"], row[3]["error"], row[3]["topic"]) == ("nack", "still broken", "orders.dlq")
    assert settle(conn, "nack", held) == ["not_found"]  # the nack ended the lease

    lapse(conn, dlq_id)
    [held] = dequeue(conn)
    assert held["retry_count"] == 1
    assert settle(conn, "snooze", held, 60) == ["snoozed"]  # no attempt counted
    assert dequeue(conn) == []
    lapse(conn, dlq_id)
    [held] = dequeue(conn)
    assert held["retry_count"] == 1
    assert settle(conn, "release", held) == ["released"]  # due again at once
    [held] = dequeue(conn)
    assert dlq_status(conn, dlq_id) == "failed" and held["retry_count"] == 1


def test_extend_keeps_a_lease_and_a_lapsed_one_is_fenced(conn, orders):
    [dlq_id] = dead_letters(conn, 1)
    [first] = dequeue(conn, timeout=5)
    [row] = conn.execute("SELECT result, visible_until FROM courier.extend_lease(%s::bigint[], %s::integer[], 600)",
                         ([dlq_id], [first["lease"]])).fetchall()
    assert row[0] == "extended" and row[1] > scalar(conn, "SELECT now() + interval '590 seconds'")
    assert dequeue(conn) == []

    lapse(conn, dlq_id)
    [second] = dequeue(conn)  # taken again: the lost attempt counted
    assert second["id"] == dlq_id and second["lease"] != first["lease"] and second["retry_count"] == 1
    assert scalar(conn, "SELECT error_history -> -1 ->> 'outcome' FROM courier.dlq WHERE id = %s",
                  (dlq_id,)) == "lease_expired"
    stale = "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals WHERE outcome = 'stale_report'"
    stale_before = scalar(conn, stale)
    for verb, extra in (("ack", ()), ("nack", ("late",)), ("release", ()), ("snooze", (5,)),
                        ("extend_lease", (30,))):
        assert settle(conn, verb, first, *extra) == ["lease_lost"], verb
    assert dlq_status(conn, dlq_id) == "failed"
    assert scalar(conn, stale) == stale_before + 5  # counted and logged, as a topic's stale settles are
    assert settle(conn, "ack", second) == ["acked"]


def test_a_lease_names_its_table_where_a_dlq_id_is_also_a_message_id(conn, orders):
    """DLQ ids have their own sequence: DLQ entry N and message N can both be leased at once.
    The sign of the lease keeps every settle on its own row."""
    live = scalar(conn, "SELECT courier.enqueue('orders', '{\"live\": true}')")
    conn.execute("SELECT setval(pg_get_serial_sequence('courier.dlq', 'id'), %s, false)", (live,))
    conn.execute("SELECT courier.enqueue('orders', '{\"dead\": true}')")
    doomed = conn.execute("SELECT id, lease FROM courier.dequeue('orders', 2)").fetchall()
    message = next({"id": i, "lease": lease} for i, lease in doomed if i == live)
    other = next({"id": i, "lease": lease} for i, lease in doomed if i != live)
    assert settle(conn, "nack", other, "boom") == ["dead_lettered"]
    [dead] = dequeue(conn)
    assert dead["id"] == live  # the same number, two rows

    assert settle(conn, "ack", dead) == ["acked"]
    assert dlq_status(conn, live) == "acked"
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (live,)) == "processing"
    assert settle(conn, "ack", message) == ["acked"]
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (live,)) == 0
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="several leases"):
        settle(conn, "ack", [message, dead])  # one id under two leases in one call: which was meant?


def test_sends_enqueues_and_receives_to_a_dlq_topic_stay_refused(conn, orders, webhook):
    dead_letters(conn, 1)
    for statement in ("SELECT courier.enqueue('orders.dlq', '{}')",
                      "SELECT courier.send('orders.dlq', '{}')",
                      "SELECT courier.send_with_options('orders.dlq', '{}')",
                      "SELECT * FROM courier.receive('orders.dlq')"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
            conn.execute(statement)
    with pytest.raises(psycopg.errors.NoDataFound, match='"nosuch" does not exist'):
        dequeue(conn, topic="nosuch.dlq")
    with pytest.raises(psycopg.errors.WrongObjectType, match="not a pull topic"):
        dequeue(conn, topic="webhook.dlq")  # a push endpoint's dead letters are redriven, not consumed
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
        dequeue(conn, topic="orders.dlq.dlq")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="count"):
        dequeue(conn, 0)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="visibility_timeout"):
        dequeue(conn, 1, timeout=0)
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 1


def test_requeue_and_redrive_leave_a_held_dead_letter_to_its_consumer(conn, orders):
    held_id, free_id = dead_letters(conn, 2)
    [held] = dequeue(conn)
    assert held["id"] == held_id
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"leased by a consumer of orders\.dlq"):
        conn.execute("SELECT courier.requeue(%s)", (held_id,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="leased"):
        conn.execute("SELECT courier.redrive_message(%s)", (held_id,))
    assert scalar(conn, "SELECT courier.redrive_endpoint('orders')") == 1  # the free one only
    assert (dlq_status(conn, held_id), dlq_status(conn, free_id)) == ("failed", "redriven")
    assert scalar(conn, "SELECT courier.redrive_all()") == 0

    assert settle(conn, "release", held) == ["released"]  # its consumer gives it back: requeue may take it
    new_id = scalar(conn, "SELECT courier.requeue(%s)", (held_id,))
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (new_id,)) == "pending"
    assert dequeue(conn) == []

    # A lease that ran out no longer holds it back, and its holder then settles nothing.
    [again] = dead_letters(conn, 1)
    [late] = dequeue(conn)
    lapse(conn, again)
    assert scalar(conn, "SELECT courier.redrive_all()") == 1
    assert settle(conn, "ack", late) == ["not_found"]
    assert dlq_status(conn, again) == "redriven"


def test_the_long_poll_in_sql_waits_for_a_dead_letter(dsn, conn, orders):
    dead_letters(conn, 1)
    with psycopg.connect(dsn, autocommit=True) as waiting:
        [messages] = waiting.execute("CALL courier.dequeue_wait('orders.dlq', 5, 30, 0)").fetchone()
        assert len(messages) == 1 and messages[0]["lease"] < 0 and messages[0]["payload"] == {"n": 0}
        started = time.monotonic()
        [messages] = waiting.execute("CALL courier.dequeue_wait('orders.dlq', 5, 30, 1)").fetchone()
        assert messages == [] and time.monotonic() - started >= 0.9


def test_the_dlq_dequeue_is_served_by_its_index(conn, orders):
    """LonnyMQ's rule for every dequeue: an index, never a scan, beside 20k dead letters of
    another topic and 20k of its own held under leases."""
    other = scalar(conn, """SELECT courier.create_endpoint('other', 'pull', '{"max_retries": 0}')""")
    mine = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'orders'")
    conn.execute("""INSERT INTO courier.dlq (original_message_id, endpoint_id, endpoint_name, payload,
                                             original_created_at, original_topic, dlq_moved_at, lease, leased_at,
                                             visible_at)
                    SELECT g, e.id, e.name, '{}', now(), e.name, now(), -g, CASE WHEN e.id = %s THEN now() END,
                           CASE WHEN e.id = %s THEN now() + interval '1 hour' ELSE now() END
                    FROM generate_series(1, 20000) g, courier.endpoints e WHERE e.id IN (%s, %s)""",
                 (mine, mine, mine, other))
    dead_letters(conn, 3)
    conn.execute("ANALYZE courier.dlq")
    conn.execute("SELECT pg_stat_force_next_flush()")
    before = scalar(conn, "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_indexes WHERE indexrelname = "
                          "'dlq_topic_due_idx'")
    seq_before = scalar(conn, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'courier.dlq'::regclass")
    assert len(dequeue(conn, 10)) == 3
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert scalar(conn, "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'dlq_topic_due_idx'") > before
    assert scalar(conn, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'courier.dlq'::regclass") == seq_before


# Concurrency ----------------------------------------------------------------------------------


def test_concurrent_consumers_each_get_a_dead_letter_exactly_once(dsn, conn, orders):
    ids = dead_letters(conn, 300)
    taken: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def consume(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as mine:
                start.wait()
                while True:
                    held = dequeue(mine, 7)
                    if not held:
                        return
                    assert settle(mine, "ack", held) == ["acked"] * len(held)
                    taken[n].extend(m["id"] for m in held)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every = [i for mine in taken for i in mine]
    assert sorted(every) == ids and len(set(every)) == len(every)  # each exactly once
    assert sum(1 for mine in taken if mine) > 1  # they did run side by side
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'acked'") == 300


def test_a_consumers_ack_and_an_operators_requeue_race_and_one_wins(dsn, conn, orders):
    """Each lapsed dead letter is acked by its late consumer and requeued by an operator at
    once: exactly one of them applies, never both."""
    ids = dead_letters(conn, 60)
    held = dequeue(conn, 60)
    conn.execute("UPDATE courier.dlq SET visible_at = now() - interval '1 second'")  # lapsed, not retaken
    acked: list[int] = []
    requeued: list[int] = []

    def consumer() -> None:
        with psycopg.connect(dsn, autocommit=True) as mine:
            for m in held:
                if settle(mine, "ack", m) == ["acked"]:
                    acked.append(m["id"])

    def operator() -> None:
        with psycopg.connect(dsn, autocommit=True) as mine:
            for dlq_id in reversed(ids):
                try:
                    mine.execute("SELECT courier.requeue(%s)", (dlq_id,))
                    requeued.append(dlq_id)
                except psycopg.errors.ObjectNotInPrerequisiteState:
                    pass

    threads = [threading.Thread(target=consumer), threading.Thread(target=operator)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(acked + requeued) == ids  # every one settled once, by one side
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == len(requeued)
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'acked'") == len(acked)


# The Python consumer ------------------------------------------------------------------------


def test_a_python_consumer_of_the_dlq_topic_acks_and_nacks_dead_letters(dsn, conn, orders):
    ids = dead_letters(conn, 5)

    async def go() -> tuple[list[int], dict[int, str]]:
        seen: list[int] = []
        results: dict[int, str] = {}
        async with Consumer(dsn, "orders.dlq", batch_size=2, visibility_timeout=3, heartbeat_interval=0.5,
                            poll_interval=0.2) as consumer:
            async for message in consumer:
                seen.append(message.id)
                if message.payload == {"n": 4}:
                    await asyncio.sleep(4)  # past the visibility timeout: the heartbeat keeps it
                    results.update(await consumer.nack(message, "not today", delay_seconds=3600))
                else:
                    results.update(await consumer.ack(message))
                if len(seen) == 5:
                    break
        return seen, results

    seen, results = asyncio.run(go())
    assert seen == ids
    assert results == {**dict.fromkeys(ids[:4], "acked"), ids[4]: "nacked"}
    assert [dlq_status(conn, i) for i in ids] == ["acked"] * 4 + ["failed"]
    assert scalar(conn, "SELECT retry_count FROM courier.dlq WHERE id = %s", (ids[4],)) == 1  # one nack, no lapse


# CLI ------------------------------------------------------------------------------------------


def test_the_cli_dequeues_and_acks_a_dead_letter_with_its_negative_lease(dsn, conn, orders):
    [dlq_id] = dead_letters(conn, 1)
    [message] = json.loads(assert_ok(run("dequeue", "orders.dlq", "--json", dsn=dsn)).out)
    assert message["id"] == dlq_id and message["lease"] < 0
    done = json.loads(assert_ok(run("ack", str(dlq_id), str(message["lease"]), "--json", dsn=dsn)).out)
    assert done == {"id": dlq_id, "lease": message["lease"], "result": "acked"}
    assert dlq_status(conn, dlq_id) == "acked"
    assert run("ack", str(dlq_id), str(message["lease"]), dsn=dsn).code == 1  # not found under a lease now


# HTTP -----------------------------------------------------------------------------------------


def test_http_consumes_a_dlq_topic_with_a_token_scoped_to_it(server, conn, orders):
    ids = dead_letters(conn, 3)
    of_topic = token(conn, "of-topic", ["consume", "enqueue"], ["orders"])
    of_dlq = token(conn, "of-dlq", ["consume"], ["orders.dlq"])
    everything = token(conn, "everything", ["consume", "enqueue"], ["*"])

    # The topic's scope does not reach its dead letters; a scope that names orders.dlq does.
    status, body, _ = call(server, "POST", "/api/messages/dequeue", of_topic, {"topic": "orders.dlq"})
    assert (status, body["error"]) == (403, "forbidden")
    status, body, _ = call(server, "POST", "/api/messages/dequeue", of_dlq, {"topic": "orders.dlq", "count": 2})
    assert status == 200
    first, second = body["messages"]
    assert [first["id"], second["id"]] == [str(i) for i in ids[:2]]
    assert b64decode(first["payload"]) == {"n": 0}
    assert call(server, "POST", "/api/messages/dequeue", of_dlq, {"topic": "orders"})[0] == 403

    # A receipt of orders.dlq settles only in a scope that holds orders.dlq.
    status, body, _ = call(server, "POST", f"/api/messages/{first['id']}/ack", of_topic, {"receipt": first["receipt"]})
    assert (status, body["error"]) == (403, "forbidden")
    status, body, _ = call(server, "POST", f"/api/messages/{first['id']}/extend", of_dlq,
                           {"receipt": first["receipt"], "visibility_timeout_seconds": 120})
    assert status == 200 and body["result"] == "extended" and body["visible_until"]
    assert call(server, "POST", f"/api/messages/{first['id']}/ack", of_dlq,
                {"receipt": first["receipt"]})[:2] == (200, {"id": first["id"], "result": "acked"})
    status, body, _ = call(server, "POST", f"/api/messages/{first['id']}/ack", of_dlq, {"receipt": first["receipt"]})
    assert (status, body["error"]) == (404, "not_found")
    assert call(server, "POST", f"/api/messages/{second['id']}/nack", everything,
                {"receipt": second["receipt"], "error": "later", "delay_seconds": 3600})[:2] == \
        (200, {"id": second["id"], "result": "nacked"})
    assert (dlq_status(conn, ids[0]), dlq_status(conn, ids[1])) == ("acked", "failed")

    # Batch settles, and a stale receipt is refused.
    status, body, _ = call(server, "POST", "/api/messages/dequeue", of_dlq,
                           {"topic": "orders.dlq", "visibility_timeout_seconds": 1})
    (third,) = body["messages"]
    time.sleep(1.2)
    (again,) = call(server, "POST", "/api/messages/dequeue", of_dlq, {"topic": "orders.dlq"})[1]["messages"]
    assert again["id"] == third["id"] and again["receipt"] != third["receipt"]
    status, body, _ = call(server, "POST", f"/api/messages/{third['id']}/ack", of_dlq, {"receipt": third["receipt"]})
    assert (status, body["error"]) == (409, "lease_lost")
    status, body, _ = call(server, "POST", "/api/messages/ack", of_dlq,
                           {"messages": [{"id": again["id"], "receipt": again["receipt"]}]})
    assert (status, body) == (200, {"results": [{"id": again["id"], "result": "acked"}]})

    # Enqueues stay refused, whatever the token.
    status, body, _ = call(server, "POST", "/api/messages", everything, {"topic": "orders.dlq", "payload": b64(1)})
    assert status == 400 and "reserved" in body["message"]


def b64decode(value: str) -> object:
    return json.loads(base64.b64decode(value))


def test_http_long_poll_of_a_dlq_topic_takes_a_dead_letter_when_it_arrives(server, conn, orders):
    secret = token(conn, "app", ["consume", "enqueue"], ["orders", "orders.dlq"])
    conn.execute("SELECT courier.enqueue('orders', '{\"n\": 1}')")
    held = conn.execute("SELECT id, lease FROM courier.dequeue('orders')").fetchone()

    def dead_letter_soon() -> None:
        time.sleep(0.6)
        conn.execute("SELECT courier.nack(%s, %s, 'boom')", held)

    threading.Thread(target=dead_letter_soon).start()
    started = time.monotonic()
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders.dlq", "wait_seconds": 5})
    assert status == 200 and len(body["messages"]) == 1
    assert 0.5 < time.monotonic() - started < 3
    assert b64decode(body["messages"][0]["payload"]) == {"n": 1}
    started = time.monotonic()
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret,
                           {"topic": "orders.dlq", "wait_seconds": 1.5})
    assert (status, body) == (200, {"messages": []}) and time.monotonic() - started >= 1.4
