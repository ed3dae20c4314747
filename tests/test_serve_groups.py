"""Requests that arrive together at `courier serve` are written together (console/serve/
groups.py: enqueues, dequeues and single settles): each request still gets its own message, id
or result, committed before its answer, and one refused message fails alone."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import psycopg

from sqlkit import tokens
from tests.helpers import scalar
from tests.test_serve import server, start_server, stop_server, token  # noqa: F401 - the server fixture

CONCURRENT = 200


def post_all(base: str, secret: str, requests: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, Any]]:
    """POST every (path, body) at once, over up to 50 connections; (status, answer) in order."""
    async def go() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50),
                                         headers={"Authorization": f"Bearer {secret}"}) as session:
            async def one(path: str, sent: dict[str, Any]) -> tuple[int, Any]:
                async with session.post(base + path, json=sent) as response:
                    return response.status, json.loads(await response.text())
            return list(await asyncio.gather(*(one(path, sent) for path, sent in requests)))
    return asyncio.run(go())


def enqueue_all(base: str, secret: str, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return post_all(base, secret, [("/api/messages", sent) for sent in bodies])


def count_function_calls(conn: psycopg.Connection) -> None:
    """pg_stat_user_functions counts the calls of the server's sessions in this database."""
    conn.execute("ALTER DATABASE " + scalar(conn, "SELECT quote_ident(current_database())")
                 + " SET track_functions = 'all'")


def filled_topic(conn: psycopg.Connection, messages: int, config: str = "{}") -> None:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', %s)", (config,))
    conn.execute("SELECT courier.enqueue_batch('orders', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, %s) g", (messages,))


def body(n: int, topic: str = "orders", **extra: Any) -> dict[str, Any]:
    return {"topic": topic, "payload": base64.b64encode(f"message {n}".encode()).decode(), **extra}


def test_concurrent_enqueues_each_get_their_own_message_in_fewer_statements(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    count_function_calls(conn)
    secret = token(conn, "app", ["enqueue"])
    process, base = start_server(dsn)
    try:
        answers = enqueue_all(base, secret, [body(n, metadata={"n": str(n)}, max_retries=n % 7)
                                             for n in range(CONCURRENT)])
    finally:
        assert "Traceback" not in stop_server(process)
    assert all(status == 201 for status, _ in answers), answers
    ids = [int(answer["id"]) for _, answer in answers]
    assert len(set(ids)) == CONCURRENT
    stored = dict((row[0], row[1:]) for row in conn.execute(
        "SELECT id, payload_binary, metadata, max_retries FROM courier.queue").fetchall())
    # Every request's id names the message it sent, with its own options, and nothing else is there.
    assert {i: stored[i] for i in ids} == {i: (f"message {n}".encode(), {"n": str(n)}, n % 7)
                                           for n, i in enumerate(ids)}
    assert len(stored) == CONCURRENT
    assert scalar(conn, "SELECT sum(messages) FROM courier.queue_depth WHERE status = 'pending'") == CONCURRENT
    calls = dict(conn.execute("SELECT funcname, calls FROM pg_stat_user_functions "
                              "WHERE funcname IN ('enqueue', 'enqueue_batch')").fetchall())
    assert calls.get("enqueue_batch", 0) > 0 and calls.get("enqueue", 0) + calls["enqueue_batch"] < CONCURRENT


def test_a_refused_message_fails_alone_and_the_rest_are_enqueued(server, conn):  # noqa: F811
    """A topic with room for 30 of 60 concurrent enqueues: exactly 30 are answered 201 and stored,
    the rest 429; an oversized one among them 413, and a keyed pair still replaces."""
    conn.execute("SELECT courier.create_endpoint('small', 'pull', '{\"max_depth\": 30}')")
    conn.execute("SELECT courier.set_setting('max_payload_size', '2000')")
    secret = token(conn, "app", ["enqueue"])
    bodies = [body(n, topic="small") for n in range(60)]
    bodies[7] = {"topic": "small", "payload": base64.b64encode(b"x" * 4000).decode()}
    answers = enqueue_all(server, secret, bodies)
    statuses = [status for status, _ in answers]
    assert statuses[7] == 413 and answers[7][1]["error"] == "payload_too_large"
    assert statuses.count(201) == 30 and statuses.count(429) == 29
    stored = {row[0] for row in conn.execute("SELECT id FROM courier.queue").fetchall()}
    assert stored == {int(answer["id"]) for status, answer in answers if status == 201}


def test_keyed_enqueues_sent_together_replace_one_another(server, conn):  # noqa: F811
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    secret = token(conn, "app", ["enqueue"])
    answers = enqueue_all(server, secret, [body(n, key="order-42") for n in range(20)]
                          + [body(n) for n in range(20, 40)])
    assert all(status == 201 for status, _ in answers)
    assert len({answer["id"] for _, answer in answers[:20]}) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 21


def test_a_stopped_database_answers_every_waiting_enqueue_503(dsn, server_dsn, conn):
    """Killed sessions: the grouped write fails as a whole, and each request is answered, none hangs."""
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    secret = token(conn, "app", ["enqueue"])
    process, base = start_server(dsn)
    try:
        assert enqueue_all(base, secret, [body(0)])[0][0] == 201
        database = scalar(conn, "SELECT quote_ident(current_database())")
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND application_name = 'courier-serve'", (database,))
            try:
                answers = enqueue_all(base, secret, [body(n) for n in range(1, 41)])
            finally:
                admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
        assert {status for status, _ in answers} == {503}
        assert enqueue_all(base, secret, [body(99)])[0][0] == 201
    finally:
        assert "Traceback" not in stop_server(process)


def test_a_batch_request_writes_each_run_of_one_topic_in_one_statement_all_or_none(server, conn):  # noqa: F811
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('audit', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('small', 'pull', '{\"max_depth\": 1}')")
    secret = token(conn, "app", ["enqueue"])

    def post(items: list[dict[str, Any]]) -> tuple[int, Any]:
        return post_all(server, secret, [("/api/messages/batch", {"messages": items})])[0]

    items = [body(0), body(1, ttl_seconds=60), body(2, topic="audit"), body(3, key="k"), body(4), body(5)]
    status, answer = post(items)
    assert status == 201
    ids = [int(i) for i in answer["ids"]]
    rows = dict((row[0], row[1:]) for row in conn.execute(
        "SELECT q.id, e.name, q.payload_binary, q.key, q.expires_at IS NOT NULL "
        "FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id").fetchall())
    assert [rows[i] for i in ids] == [("orders", b"message 0", None, False), ("orders", b"message 1", None, True),
                                      ("audit", b"message 2", None, False), ("orders", b"message 3", "k", False),
                                      ("orders", b"message 4", None, False), ("orders", b"message 5", None, False)]
    assert ids == sorted(ids)  # due in the order given

    # A later run refused (small has room for one): nothing of the request is stored.
    status, answer = post([body(6), body(7), body(8, topic="small"), body(9, topic="small")])
    assert (status, answer["error"]) == (429, "full")
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 6


def test_concurrent_single_settles_each_get_their_own_message_s_result(dsn, conn):
    """100 acks and 20 nacks, each of its own message but two acks of one, sent at once: every
    request is answered for its own message (a nack's error is its own), in fewer calls."""
    filled_topic(conn, 120, '{"max_retries": 5}')
    count_function_calls(conn)
    secret = token(conn, "app", ["consume"])
    process, base = start_server(dsn)
    try:
        ((status, leased),) = post_all(base, secret, [("/api/messages/dequeue", {"topic": "orders", "count": 120})])
        messages = leased["messages"]
        assert status == 200 and len(messages) == 120
        acks = [(f"/api/messages/{m['id']}/ack", {"receipt": m["receipt"]}) for m in messages[:100]]
        acks.append(acks[0])  # the same message twice: one ack settles it, the other finds it gone
        nacks = [(f"/api/messages/{m['id']}/nack", {"receipt": m["receipt"], "error": f"failed {m['id']}"})
                 for m in messages[100:]]
        answers = post_all(base, secret, acks + nacks)
    finally:
        assert "Traceback" not in stop_server(process)
    first, again = answers[0], answers[100]
    assert sorted([first[0], again[0]]) == [200, 404]
    assert all(answer == (200, {"id": m["id"], "result": "acked"})
               for answer, m in zip(answers[1:100], messages[1:100], strict=True))
    assert all(status == 200 and answer["result"] == "nacked" for status, answer in answers[101:])
    errors = dict(conn.execute("SELECT id::text, last_error FROM courier.queue").fetchall())
    assert errors == {m["id"]: f"failed {m['id']}" for m in messages[100:]}
    calls = scalar(conn, "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'settle_in_topics'")
    assert calls < 120


def test_concurrent_dequeues_share_one_dequeue_and_each_gets_its_own_messages(dsn, conn):
    """60 requests for 1-3 messages each against 100 messages: each gets at most its count, no
    message twice, every one leased is handed to someone, and each receipt acks its message."""
    filled_topic(conn, 100)
    count_function_calls(conn)
    secret = token(conn, "app", ["consume"])
    counts = [1 + n % 3 for n in range(60)]  # 120 asked for, 100 there
    process, base = start_server(dsn)
    try:
        answers = post_all(base, secret, [("/api/messages/dequeue", {"topic": "orders", "count": count})
                                            for count in counts])
        assert all(status == 200 for status, _ in answers)
        handed = [m for _, answer in answers for m in answer["messages"]]
        assert all(len(answer["messages"]) <= count for (_, answer), count in zip(answers, counts, strict=True))
        assert len(handed) == len({m["id"] for m in handed}) == 100
        acks = post_all(base, secret, [("/api/messages/ack", {"messages": [
            {"id": m["id"], "receipt": m["receipt"]} for m in handed]})])
        assert {r["result"] for r in acks[0][1]["results"]} == {"acked"}
    finally:
        assert "Traceback" not in stop_server(process)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert scalar(conn, "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'dequeue'") < 60


def test_concurrent_plain_sends_to_a_push_endpoint_go_together_in_the_token_s_scope(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('payroll', 'pull', '{}')")
    count_function_calls(conn)
    sender = tokens.create_token(conn, "sender", topics=["orders"], endpoints=["*"], actions=["enqueue"])
    process, base = start_server(dsn)
    try:
        answers = post_all(base, sender, [("/api/endpoints/hook/messages", {"payload": {"n": n}})
                                            for n in range(100)]
                             + [("/api/endpoints/hook/messages", {"payload": {"n": 100}, "priority": 5})])
        refused = post_all(base, sender, [("/api/endpoints/payroll/messages", {"payload": {"n": n}})
                                            for n in range(20)])
    finally:
        assert "Traceback" not in stop_server(process)
    assert all(status == 201 for status, _ in answers)
    stored = dict(conn.execute("SELECT id::text, payload FROM courier.queue").fetchall())
    assert [stored[answer["id"]] for _, answer in answers] == [{"n": n} for n in range(101)]
    assert {status for status, _ in refused} == {403}  # payroll is a topic outside the token's scope
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 101
    calls = dict(conn.execute("SELECT funcname, calls FROM pg_stat_user_functions "
                              "WHERE funcname IN ('send_batch', 'send_with_options')").fetchall())
    assert calls["send_batch"] > 0 and calls["send_batch"] + calls["send_with_options"] < 101


def test_dequeues_asking_for_more_than_one_dequeue_takes_are_cut_into_several(dsn, conn):
    filled_topic(conn, 15_000)
    secret = token(conn, "app", ["consume"])
    process, base = start_server(dsn)
    try:
        answers = post_all(base, secret, [("/api/messages/dequeue", {"topic": "orders", "count": 1000})] * 16)
    finally:
        assert "Traceback" not in stop_server(process)
    assert all(status == 200 for status, _ in answers)
    handed = [m["id"] for _, answer in answers for m in answer["messages"]]
    assert len(handed) == len(set(handed)) == 15_000
    from console.serve.dequeues import _chunks
    assert _chunks([1000] * 16) == [[1000] * 10, [1000] * 6]  # no dequeue asks for more than 10,000
    assert _chunks([3, 9_999, 1]) == [[3], [9_999, 1]]


def test_hostile_text_goes_through_every_group_literally_and_secrets_stay_out_of_the_log(dsn, conn):
    """The hostile-text corpus as the metadata of grouped enqueues, the payloads of grouped push
    sends and the errors of grouped nacks: stored and answered byte for byte, and a token's secret
    in a refused message's text reaches neither the answer nor the server's log."""
    from tests.test_hostile_text import CORPUS, MEGABYTE
    values = [*CORPUS.values(), MEGABYTE[:9_000]]  # a huge line, within the 10,000 a nack error may hold
    filled_topic(conn, len(values))
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    secret = tokens.create_token(conn, "app", topics=["*"], endpoints=["*"], actions=["enqueue", "consume"])
    process, base = start_server(dsn)
    try:
        enqueued = post_all(base, secret, [("/api/messages", {"topic": "orders", "payload": b64(value),
                                                              "metadata": {"v": value}}) for value in values])
        sent = post_all(base, secret, [("/api/endpoints/hook/messages", {"payload": {"v": value}})
                                       for value in values])
        leased = post_all(base, secret, [("/api/messages/dequeue", {"topic": "orders", "count": 1})] * len(values))
        nacked = post_all(base, secret, [(f"/api/messages/{answer['messages'][0]['id']}/nack",
                                          {"receipt": answer["messages"][0]["receipt"], "error": value})
                                         for (_, answer), value in zip(leased, values, strict=True)])
        # Over max_payload_size among others: refused in the group, then alone.
        oversized = {"topic": "orders", "payload": b64("x" * 1_100_000 + secret)}
        leaked = enqueue_all(base, secret, [oversized] + [body(n) for n in range(10)])
    finally:
        log = stop_server(process)
    assert "Traceback" not in log and secret not in log
    assert leaked[0][0] == 413 and {status for status, _ in leaked[1:]} == {201}
    assert secret not in json.dumps(leaked)
    assert all(status == 201 for status, _ in enqueued + sent) and all(s == 200 for s, _ in nacked)
    stored = dict(conn.execute("SELECT id::text, metadata ->> 'v' FROM courier.queue "
                               "WHERE endpoint_id = (SELECT id FROM courier.endpoints WHERE name = 'orders') "
                               "AND metadata ? 'v'").fetchall())
    assert [stored[answer["id"]] for _, answer in enqueued] == values
    payloads = dict(conn.execute("SELECT id::text, payload ->> 'v' FROM courier.queue WHERE payload ? 'v'").fetchall())
    assert [payloads[answer["id"]] for _, answer in sent] == values
    errors = [row[0] for row in conn.execute("SELECT last_error FROM courier.queue WHERE last_error IS NOT NULL")]
    assert sorted(errors) == sorted(values)


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()
