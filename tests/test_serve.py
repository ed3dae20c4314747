"""`courier serve` as a user runs it: a real server process on loopback against the test's own
database, called with aiohttp's client and with curl, as queue-ti's users do."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from sqlkit import tokens
from tests.helpers import scalar

COURIER = Path(sys.executable).parent / "courier"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(dsn: str, *options: str, scheme: str = "http") -> tuple[subprocess.Popen[str], str]:
    """A `courier serve` process serving the database, and its base URL, once it accepts."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("COURIER_DSN", "DATABASE_URL")}
    process = subprocess.Popen([str(COURIER), "serve", "--listen", f"127.0.0.1:{port}", "--dsn", dsn, *options],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, f"{scheme}://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"courier serve did not start: {process.stderr.read()}") from None
            time.sleep(0.05)


def stop_server(process: subprocess.Popen[str], signalled: bool = False) -> str:
    """SIGTERM (unless it was sent already), as a service manager stops it; its stderr."""
    if not signalled:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=35)
    finally:
        if process.poll() is None:
            process.kill()
    return process.stderr.read()


@pytest.fixture
def server(dsn: str) -> Iterator[str]:
    """The base URL of a `courier serve` process serving the test's database."""
    process, base = start_server(dsn)
    yield base
    assert "Traceback" not in stop_server(process)


@pytest.fixture
def orders(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    return "orders"


def token(conn: psycopg.Connection, name: str, actions: list[str], topics: list[str] = ("*",)) -> str:
    return tokens.create_token(conn, name, topics=list(topics), endpoints=[], actions=actions)


def call(base: str, method: str, path: str, secret: str | None = None, body: Any = None,
         raw: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    async def go() -> tuple[int, Any, dict[str, str]]:
        sent = dict(headers or {})
        if secret:
            sent["Authorization"] = f"Bearer {secret}"
        async with aiohttp.ClientSession() as session, session.request(
                method, base + path, json=body if raw is None else None, data=raw, headers=sent) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None, dict(response.headers)
    return asyncio.run(go())


def b64(value: Any) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def test_every_request_needs_a_live_token_and_the_probes_none(server, conn, orders):
    status, body, headers = call(server, "POST", "/api/messages", body={"topic": "orders", "payload": b64(1)})
    assert status == 401 and body["error"] == "unauthorized" and "Bearer" in headers["WWW-Authenticate"]
    assert call(server, "POST", "/api/messages", "courier_guess", {"topic": "orders", "payload": b64(1)})[0] == 401
    assert call(server, "GET", "/healthz")[:2] == (200, {"status": "ok"})
    assert call(server, "GET", "/readyz")[:2] == (200, {"status": "ready"})
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_the_seed_examples_run_with_curl(server, conn, orders):
    """queue-ti's examples, verbatim but for the host and a token header (Courier authenticates
    every request)."""
    secret = token(conn, "app", ["enqueue", "consume"])
    auth = ["-H", f"Authorization: Bearer {secret}"]

    def curl(*args: str) -> Any:
        done = subprocess.run(["curl", "-sS", *auth, *args], capture_output=True, text=True, timeout=30, check=True)
        return json.loads(done.stdout)

    first = curl("-X", "POST", f"{server}/api/messages", "-H", "Content-Type: application/json",
                 "-d", '{"topic": "orders", "key": "order-42", "payload": "eyJhbW91bnQiOjk5fQ=="}')
    again = curl("-X", "POST", f"{server}/api/messages", "-H", "Content-Type: application/json",
                 "-d", '{"topic": "orders", "key": "order-42", "payload": "eyJhbW91bnQiOjEwMH0="}')
    assert first == again == {"id": first["id"]}  # upserted, not duplicated
    leased = curl("-X", "POST", f"{server}/api/messages/dequeue", "-H", "Content-Type: application/json",
                  "-d", '{"topic": "orders", "count": 1, "visibility_timeout_seconds": 60}')
    (message,) = leased["messages"]
    assert message["id"] == first["id"] and base64.b64decode(message["payload"]) == b'{"amount":100}'
    assert message["key"] == "order-42" and message["retry_count"] == 0
    visible_for = scalar(conn, "SELECT visible_at - now() FROM courier.queue WHERE id = %s", (int(first["id"]),))
    assert 55 < visible_for.total_seconds() <= 60
    acked = curl("-X", "POST", f"{server}/api/messages/{message['id']}/ack", "-H", "Content-Type: application/json",
                 "-d", json.dumps({"receipt": message["receipt"]}))
    assert acked == {"id": first["id"], "result": "acked"}


def test_tokens_are_scoped_to_actions_and_topics(server, conn, orders):
    conn.execute("SELECT courier.create_endpoint('invoices', 'pull', '{}')")
    producer = token(conn, "producer", ["enqueue"], ["orders"])
    consumer = token(conn, "consumer", ["consume"], ["orders"])
    assert call(server, "POST", "/api/messages", producer, {"topic": "orders", "payload": b64(1)})[0] == 201
    status, body, _ = call(server, "POST", "/api/messages", producer, {"topic": "invoices", "payload": b64(1)})
    assert status == 403 and "invoices" in body["message"]
    assert call(server, "POST", "/api/messages/dequeue", producer, {"topic": "orders"})[0] == 403
    assert call(server, "POST", "/api/messages", consumer, {"topic": "orders", "payload": b64(2)})[0] == 403
    (message,) = call(server, "POST", "/api/messages/dequeue", consumer, {"topic": "orders"})[1]["messages"]
    # A consumer of another topic cannot settle this one's messages, whatever receipt it has.
    other = token(conn, "other", ["consume"], ["invoices"])
    assert call(server, "POST", f"/api/messages/{message['id']}/ack", other, {"receipt": message["receipt"]})[0] == 403
    assert call(server, "POST", f"/api/messages/{message['id']}/ack", consumer,
                {"receipt": message["receipt"]})[:2] == (200, {"id": message["id"], "result": "acked"})


def test_a_late_consumer_cannot_settle_a_message_leased_again(server, conn, orders):
    """Fenced by the receipt: consumer A's visibility timeout passes, B dequeues the message
    again; A's ack is refused with lease_lost and B's stands."""
    secret = token(conn, "app", ["enqueue", "consume"])
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64({"n": 1})})
    (first,) = call(server, "POST", "/api/messages/dequeue", secret,
                    {"topic": "orders", "visibility_timeout_seconds": 1})[1]["messages"]
    time.sleep(1.2)
    (second,) = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[1]["messages"]
    assert second["id"] == first["id"] and second["receipt"] != first["receipt"]
    for verb in ("ack", "nack", "extend"):
        status, body, _ = call(server, "POST", f"/api/messages/{first['id']}/{verb}", secret,
                               {"receipt": first["receipt"], **({"visibility_timeout_seconds": 30}
                                                                if verb == "extend" else {})})
        assert (status, body["error"]) == (409, "lease_lost"), verb
    status, body, _ = call(server, "POST", f"/api/messages/{second['id']}/extend", secret,
                           {"receipt": second["receipt"], "visibility_timeout_seconds": 30})
    assert status == 200 and body["result"] == "extended" and body["visible_until"]
    status, body, _ = call(server, "POST", f"/api/messages/{second['id']}/nack", secret,
                           {"receipt": second["receipt"], "error": "try later"})
    assert (status, body["result"]) == (200, "nacked")
    # The lapsed lease counted as an attempt, and the nack as another.
    assert scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s", (int(first["id"]),)) == 2
    status, body, _ = call(server, "POST", f"/api/messages/{second['id']}/ack", secret, {"receipt": second["receipt"]})
    assert (status, body["error"]) == (404, "not_found")


def test_a_receipt_settles_only_the_dequeue_of_the_message_it_was_issued_for(server, conn, orders):
    """Issue 40: receipts were the lease counter ("1" on a first dequeue), so consumer A acking
    message 9 with its own receipt for message 8 deleted B's message. A receipt is opaque and
    names its message and dequeue: another message's receipt, a forged one and an older one
    settle nothing."""
    secret = token(conn, "app", ["enqueue", "consume"])
    for n in range(2):
        call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(n)})
    (held_by_a,) = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[1]["messages"]
    (held_by_b,) = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[1]["messages"]
    assert held_by_a["receipt"] != held_by_b["receipt"] and not held_by_a["receipt"].isdigit()
    for verb, extra in (("ack", {}), ("nack", {}), ("extend", {"visibility_timeout_seconds": 30})):
        status, body, _ = call(server, "POST", f"/api/messages/{held_by_b['id']}/{verb}", secret,
                               {"receipt": held_by_a["receipt"], **extra})
        assert (status, body["error"], body["field"]) == (409, "receipt_mismatch", "receipt"), verb
    # A receipt forged for B's message with a guessed lease (the old counter's first value).
    forged = base64.urlsafe_b64encode(int(held_by_b["id"]).to_bytes(8, "big") + (1).to_bytes(4, "big")).decode()
    status, body, _ = call(server, "POST", f"/api/messages/{held_by_b['id']}/ack", secret, {"receipt": forged})
    assert (status, body["error"]) == (409, "lease_lost")
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 2
    assert call(server, "POST", f"/api/messages/{held_by_b['id']}/ack", secret,
                {"receipt": held_by_b["receipt"]})[:2] == (200, {"id": held_by_b["id"], "result": "acked"})
    assert call(server, "POST", f"/api/messages/{held_by_a['id']}/ack", secret,
                {"receipt": held_by_a["receipt"]})[0] == 200


@pytest.mark.parametrize("receipt", ["1", "9999999999", "¹", "AAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAA+", 7, None])
def test_a_receipt_that_no_dequeue_issued_is_refused_naming_the_field(server, conn, orders, receipt):
    secret = token(conn, "app", ["enqueue", "consume"])
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(1)})
    (held,) = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[1]["messages"]
    status, body, _ = call(server, "POST", f"/api/messages/{held['id']}/ack", secret, {"receipt": receipt})
    assert (status, body["field"]) == (400, "receipt")
    status, body, _ = call(server, "POST", "/api/messages/ack", secret,
                           {"messages": [{"id": held["id"], "receipt": receipt}]})
    assert (status, body["field"]) == (400, "messages[0].receipt")


def test_batches_enqueue_together_and_settle_per_message(server, conn, orders):
    secret = token(conn, "app", ["enqueue", "consume"])
    status, body, _ = call(server, "POST", "/api/messages/batch", secret,
                           {"messages": [{"topic": "orders", "payload": b64(n)} for n in range(3)]})
    assert status == 201 and len(body["ids"]) == 3
    status, body, _ = call(server, "POST", "/api/messages/batch", secret,
                           {"messages": [{"topic": "orders", "payload": b64(9)}, {"topic": "orders"}]})
    assert (status, body["field"]) == (400, "messages[1].payload")
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 3  # all or nothing
    leased = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders", "count": 10})[1]["messages"]
    assert len(leased) == 3
    settle = [{"id": m["id"], "receipt": m["receipt"]} for m in reversed(leased)]
    settle[2]["receipt"] = settle[1]["receipt"]  # another message's receipt settles nothing
    status, body, _ = call(server, "POST", "/api/messages/ack", secret, {"messages": settle})
    assert status == 200  # a result per message, in the request's order
    assert [(r["id"], r["result"]) for r in body["results"]] == [
        (settle[0]["id"], "acked"), (settle[1]["id"], "acked"), (settle[2]["id"], "receipt_mismatch")]
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (int(settle[2]["id"]),)) == "processing"


@pytest.mark.parametrize("body, field", [
    ({"payload": b64(1)}, "topic"),
    ({"topic": "orders"}, "payload"),
    ({"topic": "orders", "payload": "not base64!"}, "payload"),
    ({"topic": "orders", "payload": b64(1), "colour": "red"}, "colour"),
    ({"topic": "orders", "payload": b64(1), "metadata": [1]}, "metadata"),
    ({"topic": "orders", "payload": b64(1), "scheduled_at": "tomorrow"}, "scheduled_at"),
    ({"topic": "orders", "payload": b64(1), "ttl_seconds": 0}, "ttl_seconds"),
    ({"topic": 7, "payload": b64(1)}, "topic"),
    # Text PostgreSQL cannot store: psycopg failed to send it (a 500), or jsonb refused it naming nothing.
    ({"topic": "orders", "payload": b64(1), "key": "a\x00b"}, "key"),
    ({"topic": "orders", "payload": b64(1), "metadata": {"note": ["ok", "\x00"]}}, "metadata.note[1]"),
    ({"topic": "orders", "payload": b64(1), "metadata": {"k\x00": 1}}, "metadata.k\x00"),
    ({"topic": "orders\ud83d", "payload": b64(1)}, "topic"),  # half of a surrogate pair: not UTF-8
])
def test_bad_input_is_a_400_naming_the_field(server, conn, orders, body, field):
    secret = token(conn, "app", ["enqueue"])
    status, answer, _ = call(server, "POST", "/api/messages", secret, body)
    assert (status, answer["error"], answer["field"]) == (400, "invalid", field)
    assert "Traceback" not in json.dumps(answer)


def test_bodies_that_are_not_json_too_deep_or_too_large_are_refused(server, conn, orders):
    secret = token(conn, "app", ["enqueue", "consume"])
    assert call(server, "POST", "/api/messages", secret, raw=b"{nope")[:1] == (400,)
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    status, body, _ = call(server, "POST", "/api/messages", secret,
                           {"topic": "orders", "payload": b64(1), "metadata": {"x": deep}})
    assert status == 400 and "nested" in body["message"]
    status, body, _ = call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": "A" * 3_000_000})
    assert (status, body["error"]) == (413, "payload_too_large")
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders", "count": 0})
    assert (status, body["field"]) == (400, "count")
    assert call(server, "POST", "/api/messages", secret, {"topic": "nowhere", "payload": b64(1)})[0] == 404


def test_a_full_topic_answers_429_with_retry_after(server, conn):
    conn.execute("SELECT courier.create_endpoint('small', 'pull', '{\"max_depth\": 1}')")
    secret = token(conn, "app", ["enqueue"])
    assert call(server, "POST", "/api/messages", secret, {"topic": "small", "payload": b64(1)})[0] == 201
    status, body, headers = call(server, "POST", "/api/messages", secret, {"topic": "small", "payload": b64(2)})
    assert (status, body["error"]) == (429, "full") and int(headers["Retry-After"]) >= 1
    assert call(server, "POST", "/api/messages", secret,
                {"topic": "small", "payload": base64.b64encode(b"x" * 1_100_000).decode()})[0] == 413


def test_a_long_poll_returns_as_soon_as_a_message_is_enqueued(server, conn, orders):
    secret = token(conn, "app", ["consume"])

    async def main() -> tuple[float, list[Any]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as session:
            async def poll() -> tuple[float, list[Any]]:
                async with session.post(server + "/api/messages/dequeue",
                                        json={"topic": "orders", "wait_seconds": 10}) as response:
                    assert response.status == 200
                    return time.monotonic(), (await response.json())["messages"]
            waiting = asyncio.create_task(poll())
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await asyncio.to_thread(conn.execute, "SELECT courier.enqueue('orders', '{\"n\": 1}')")
            committed = time.monotonic()
            answered, messages = await waiting
            return answered - committed, messages

    took, messages = asyncio.run(main())
    assert len(messages) == 1
    assert took < 0.1, f"the long poll answered {took * 1000:.0f} ms after the enqueue"


def test_a_revoked_token_is_refused_and_the_cli_never_shows_a_secret(server, conn, orders, dsn):
    made = subprocess.run([str(COURIER), "token", "create", "ci", "--topics", "orders", "--can", "enqueue",
                           "--json", "--dsn", dsn], capture_output=True, text=True, check=True)
    secret = json.loads(made.stdout)["token"]
    assert call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(1)})[0] == 201
    listed = subprocess.run([str(COURIER), "token", "list", "--dsn", dsn], capture_output=True, text=True, check=True)
    assert "ci" in listed.stdout and secret not in listed.stdout and secret[8:20] not in listed.stdout
    listed_json = subprocess.run([str(COURIER), "token", "list", "--json", "--dsn", dsn],
                                 capture_output=True, text=True, check=True).stdout
    assert secret not in listed_json and "hash" not in listed_json
    assert secret not in json.dumps(conn.execute("SELECT * FROM courier.api_tokens").fetchall(), default=str)
    subprocess.run([str(COURIER), "token", "revoke", "ci", "--dsn", dsn], check=True, capture_output=True)
    time.sleep(1.1)
    assert call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(2)})[0] == 401


def test_sigterm_answers_long_polls_and_lets_requests_finish(dsn, conn, orders):
    secret = token(conn, "app", ["consume"])
    process, base = start_server(dsn)

    async def main() -> tuple[int, Any, float]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as session:
            async def poll() -> tuple[int, Any]:
                async with session.post(base + "/api/messages/dequeue",
                                        json={"topic": "orders", "wait_seconds": 20}) as response:
                    return response.status, await response.json()
            waiting = asyncio.create_task(poll())
            await asyncio.sleep(0.5)
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            status, body = await waiting
            return status, body, time.monotonic() - began

    status, body, took = asyncio.run(main())
    assert (status, body) == (200, {"messages": []})
    assert took < 3, f"the long poll took {took:.1f} s to answer after SIGTERM"
    assert "Traceback" not in stop_server(process, signalled=True)
    assert process.returncode == 0


def test_topics_show_depth_and_limits_to_tokens_scoped_to_them(server, conn, orders):
    conn.execute("SELECT courier.create_endpoint('invoices', 'pull', '{\"max_depth\": 100}')")
    conn.execute("SELECT courier.enqueue('invoices', '{}')")
    scoped = token(conn, "scoped", ["consume"], ["invoices"])
    status, body, _ = call(server, "GET", "/api/topics", scoped)
    assert status == 200 and [t["topic"] for t in body["topics"]] == ["invoices"]
    (invoices,) = body["topics"]
    assert (invoices["pending"], invoices["leased"], invoices["max_depth"]) == (1, 0, 100)
    assert call(server, "GET", "/api/topics/invoices", scoped)[1] == invoices
    assert call(server, "GET", "/api/topics/orders", scoped)[0] == 403
    admin = token(conn, "admin", ["admin"])
    assert call(server, "GET", "/api/topics/nowhere", admin)[0] == 404


def test_an_admin_requeues_a_dead_letter_with_basic_auth_as_in_the_seed(server, conn):
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{\"max_retries\": 0}')")
    app = token(conn, "app", ["enqueue", "consume"])
    call(server, "POST", "/api/messages", app, {"topic": "orders", "payload": b64({"n": 1})})
    (leased,) = call(server, "POST", "/api/messages/dequeue", app, {"topic": "orders"})[1]["messages"]
    status, body, _ = call(server, "POST", f"/api/messages/{leased['id']}/nack", app,
                           {"receipt": leased["receipt"], "error": "boom"})
    assert (status, body["result"]) == (200, "dead_lettered")
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq WHERE original_topic = 'orders'")
    assert call(server, "POST", f"/api/messages/{dlq_id}/requeue", app)[0] == 403
    secret = token(conn, "admin", ["admin"])
    path = f"/api/messages/{dlq_id}/requeue"

    def basic(user: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}

    status, body, _ = call(server, "POST", path, headers=basic("admin"))
    assert status == 200
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (int(body["id"]),)) == "pending"
    assert call(server, "POST", path, headers=basic("someone"))[0] == 401


# Issue 40: a long poll whose client has gone leases nothing. It stops waiting when the client
# disconnects, and a dequeue whose answer cannot be written gives its leases back untouched
# (no attempt counted), instead of holding the messages for their visibility timeout.


def abandoned_poll(base: str, secret: str, wait: float = 5.0) -> socket.socket:
    """A dequeue with a long poll, sent whole, whose client then hangs up without reading."""
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"topic": "orders", "wait_seconds": wait, "visibility_timeout_seconds": 600}).encode()
    client = socket.create_connection((host, int(port)))
    client.sendall(b"POST /api/messages/dequeue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + secret.encode() + b"\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return client


@pytest.mark.parametrize("hang_up_after, enqueue_after", [(0.2, 1.5), (0.0, 0.05), (0.3, 0.3)])
def test_a_poll_whose_client_left_leases_nothing(server, conn, orders, hang_up_after, enqueue_after):
    secret = token(conn, "app", ["enqueue", "consume"])
    client = abandoned_poll(server, secret)
    time.sleep(hang_up_after)
    client.close()
    time.sleep(enqueue_after)
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64({"n": 1})})
    time.sleep(1.0)  # past the poll's client check, and a release if it had leased
    row = conn.execute("SELECT status, retry_count FROM courier.queue").fetchone()
    assert row == ("pending", 0)
    # A consumer that is still there gets it at once.
    (message,) = call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[1]["messages"]
    assert message["retry_count"] == 0


def test_a_poll_whose_client_left_stops_waiting(server, conn, orders):
    """It does not hold a place in the topic's line to its timeout: the next poll is woken
    by the next message at once."""
    secret = token(conn, "app", ["enqueue", "consume"])
    for _ in range(3):
        abandoned_poll(server, secret, wait=20).close()
    time.sleep(1.0)
    started = time.monotonic()
    waiting = abandoned_poll(server, secret, wait=10)
    time.sleep(0.2)
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64({"n": 1})})
    waiting.settimeout(5)
    answer = waiting.recv(65536).decode()
    waiting.close()
    assert answer.startswith("HTTP/1.1 200") and '"messages":[{' in answer
    assert time.monotonic() - started < 3
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 1


def test_the_server_listens_only_while_polls_wait(server, conn, orders):
    """Issue 40: with no poll waiting, every producer's NOTIFY still reached the server (6% of
    its CPU under an enqueue load). It LISTENs while polls wait, and a poll that joins after a
    quiet spell still gets a message enqueued just after its first, empty dequeue."""
    def listening() -> int:
        return scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND application_name = 'courier-serve' AND query LIKE 'LISTEN%%'")
    secret = token(conn, "app", ["enqueue", "consume"])
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(0)})
    assert call(server, "POST", "/api/messages/dequeue", secret, {"topic": "orders"})[0] == 200
    assert listening() == 0
    poll = abandoned_poll(server, secret, wait=10)
    deadline = time.monotonic() + 5
    while not listening():
        assert time.monotonic() < deadline, "no LISTEN while a poll waits"
        time.sleep(0.05)
    call(server, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(1)})
    poll.settimeout(5)
    assert '"messages":[{' in poll.recv(65536).decode()
    poll.close()
