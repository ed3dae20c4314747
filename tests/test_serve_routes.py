"""`courier serve` beyond the pull routes: queue-ti's topic configs and reapers (admin), the
push side (a message to an endpoint, an event published), /metrics, the OpenAPI document,
TLS, an embedded worker pool, slow clients and 200 long polls at once. Each against a real
server process on loopback and the test's own database."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from openapi_spec_validator import validate

from console.prometheus import exposition
from console.serve.server import POOL_SIZES
from sqlkit import observability, tokens
from tests.helpers import scalar
from tests.test_serve import COURIER, b64, call, orders, server, start_server, stop_server, token  # noqa: F401

LIMITS = ("max_retries", "message_ttl_seconds", "max_depth", "throughput_limit", "dlq_threshold",
          "visibility_timeout")


def curl(*args: str) -> Any:
    done = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def test_topic_configs_as_in_the_seed_with_basic_auth(server, conn, orders):
    """The seed's PUT verbatim (its `admin:secret` is a token named admin and its secret); a
    field left out or null reverts to the global default; DELETE reverts them all."""
    secret = token(conn, "admin", ["admin"])
    put = curl("-u", f"admin:{secret}", "-X", "PUT", f"{server}/api/topic-configs/orders",
               "-H", "Content-Type: application/json", "-d", """{
    "max_retries": 5,
    "message_ttl_seconds": 3600,
    "max_depth": 1000,
    "throughput_limit": 100
  }""")
    assert put == {"topic": "orders", "max_retries": 5, "message_ttl_seconds": 3600, "max_depth": 1000,
                   "throughput_limit": 100, "dlq_threshold": None, "visibility_timeout": None, "delay_seconds": None}
    assert call(server, "GET", "/api/topic-configs/orders", secret)[1] == put
    (topic,) = call(server, "GET", "/api/topics", secret)[1]["topics"]
    assert (topic["max_retries"], topic["max_depth"], topic["throughput_limit"]) == (5, 1000, 100)

    status, body, _ = call(server, "PUT", "/api/topic-configs/orders", secret, {"max_depth": 10, "max_retries": None})
    assert status == 200 and (body["max_depth"], body["max_retries"], body["message_ttl_seconds"]) == (10, None, None)
    assert call(server, "GET", "/api/topic-configs", secret)[1] == {"topic_configs": [body]}
    (topic,) = call(server, "GET", "/api/topics", secret)[1]["topics"]
    assert (topic["max_retries"], topic["max_depth"]) == (10, 10)  # max_retries: default_max_retries again

    # delay_seconds (SQS delay queues) has no global default: null or left out is none.
    status, body, _ = call(server, "PUT", "/api/topic-configs/orders", secret, {"delay_seconds": 30})
    assert status == 200 and body["delay_seconds"] == 30 and body["max_depth"] is None
    status, body, _ = call(server, "PUT", "/api/topic-configs/orders", secret, {"delay_seconds": 901})
    assert status == 400 and body["field"] == "delay_seconds"

    status, body, _ = call(server, "DELETE", "/api/topic-configs/orders", secret)
    assert status == 200 and all(body[name] is None for name in (*LIMITS, "delay_seconds"))
    assert scalar(conn, "SELECT config FROM courier.endpoints WHERE name = 'orders'") == {}

    status, body, _ = call(server, "PUT", "/api/topic-configs/orders", secret, {"max_depth": -1})
    assert (status, body["field"]) == (400, "max_depth")
    assert call(server, "PUT", "/api/topic-configs/nowhere", secret, {})[0] == 404
    assert call(server, "GET", "/api/topic-configs/nowhere", secret)[0] == 404
    consumer = token(conn, "consumer", ["consume", "enqueue"])
    assert call(server, "GET", "/api/topic-configs/orders", consumer)[0] == 403
    assert call(server, "PUT", "/api/topic-configs/orders", consumer, {"max_depth": 1})[0] == 403


def test_a_topic_without_a_dlq_fails_a_message_past_its_retries(server, conn, orders):
    admin = token(conn, "admin", ["admin"])
    app = token(conn, "app", ["enqueue", "consume"])
    call(server, "PUT", "/api/topic-configs/orders", admin, {"max_retries": 0, "dlq_threshold": 0})
    call(server, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(1)})
    (leased,) = call(server, "POST", "/api/messages/dequeue", app, {"topic": "orders"})[1]["messages"]
    status, body, _ = call(server, "POST", f"/api/messages/{leased['id']}/nack", app,
                           {"receipt": leased["receipt"], "error": "boom"})
    assert (status, body["result"]) == (200, "failed")
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (int(leased["id"]),)) == "failed"
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0


def test_a_message_ttl_and_the_reapers_on_demand(server, conn, orders):
    app = token(conn, "app", ["enqueue", "consume"])
    admin = token(conn, "admin", ["admin"])
    status, body, _ = call(server, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(1),
                                                                 "ttl_seconds": 30})
    assert status == 201
    ttl = scalar(conn, "SELECT extract(epoch FROM expires_at - visible_at) FROM courier.queue WHERE id = %s",
                 (int(body["id"]),))
    assert ttl == 30
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second'")
    assert call(server, "POST", "/api/admin/expiry-reaper/run", app)[0] == 403
    assert call(server, "POST", "/api/admin/expiry-reaper/run", admin)[:2] == (200, {"expired": 1})
    assert scalar(conn, "SELECT status FROM courier.queue") == "expired"
    assert call(server, "POST", "/api/admin/delete-reaper/run", admin)[:2] == (200, {"deleted": 1})
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_push_messages_and_events_for_producers_without_sql(server, conn):
    """ulak's send options over HTTP, an idempotent retry answered with the first id, and a
    publish fanned out to the subscribers; each token scoped to its endpoint or event type."""
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('audit', 'noop', '{}')")
    producer = tokens.create_token(conn, "producer", topics=[], endpoints=["billing"], actions=["enqueue"])
    options = {"payload": {"amount": 99}, "priority": 7, "ordering_key": "customer-1", "idempotency_key": "order-42",
               "scheduled_at": "2030-01-01T00:00:00Z", "correlation_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
               "headers": {"X-Tenant": "acme"}, "metadata": {"source": "checkout"}}
    status, body, _ = call(server, "POST", "/api/endpoints/billing/messages", producer, options)
    assert status == 201
    row = conn.execute("SELECT payload, priority, ordering_key, idempotency_key, scheduled_at::text, "
                       "correlation_id::text, headers, metadata FROM courier.queue WHERE id = %s",
                       (int(body["id"]),)).fetchone()
    assert row == ({"amount": 99}, 7, "customer-1", "order-42", "2030-01-01 00:00:00+00",
                   "0f8fad5b-d9cb-469f-a165-70867728950e", {"X-Tenant": "acme"}, {"source": "checkout"})
    assert call(server, "POST", "/api/endpoints/billing/messages", producer, options)[:2] == (201, body)
    assert call(server, "POST", "/api/endpoints/audit/messages", producer, {"payload": 1})[0] == 403
    # Every endpoint is not every topic: a pull topic takes a send only from a token scoped to it.
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    every_endpoint = tokens.create_token(conn, "pusher", topics=[], endpoints=["*"], actions=["enqueue"])
    assert call(server, "POST", "/api/endpoints/audit/messages", every_endpoint, {"payload": 1})[0] == 201
    assert call(server, "POST", "/api/endpoints/orders/messages", every_endpoint, {"payload": 1})[0] == 403
    topic_too = tokens.create_token(conn, "both", topics=["orders"], endpoints=["orders"], actions=["enqueue"])
    assert call(server, "POST", "/api/endpoints/orders/messages", topic_too, {"payload": 1, "priority": 9})[0] == 201
    status, answer, _ = call(server, "POST", "/api/endpoints/billing/messages", producer,
                             {"payload": 1, "priority": 11})
    assert (status, answer["field"]) == (400, "priority")
    admin = token(conn, "admin", ["admin"])
    assert call(server, "POST", "/api/endpoints/nowhere/messages", admin, {"payload": 1})[0] == 404

    conn.execute("SELECT courier.create_event_type('order.created')")
    conn.execute("SELECT courier.subscribe('order.created', 'billing')")
    conn.execute("SELECT courier.subscribe('order.created', 'audit')")
    publisher = tokens.create_token(conn, "publisher", topics=["order.created"], endpoints=[], actions=["publish"])
    status, body, _ = call(server, "POST", "/api/events/order.created", publisher, {"payload": {"order": 42}})
    assert (status, body) == (201, {"event_type": "order.created", "messages": 2})
    assert call(server, "POST", "/api/events/order.cancelled", publisher, {"payload": {}})[0] == 403
    assert call(server, "POST", "/api/events/order.created", producer, {"payload": {}})[0] == 403


def test_a_topic_made_after_a_refused_send_is_still_out_of_a_tokens_scope(server, conn):
    """Issue 40: the server remembered "not a pull topic" for 10 s and skipped the topic-scope
    check, so a token not scoped to `payroll` stored a message there right after an admin made
    it. The scope is checked in the statement that writes."""
    producer = tokens.create_token(conn, "every-endpoint", topics=["orders"], endpoints=["*"], actions=["enqueue"])
    assert call(server, "POST", "/api/endpoints/payroll/messages", producer, {"payload": 1})[0] == 404
    conn.execute("SELECT courier.create_endpoint('payroll', 'pull', '{}')")
    status, body, _ = call(server, "POST", "/api/endpoints/payroll/messages", producer, {"payload": 1})
    assert (status, body["error"]) == (403, "forbidden") and "payroll" in body["message"]
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    assert call(server, "POST", "/api/endpoints/orders/messages", producer, {"payload": 1})[0] == 201


def test_metrics_are_the_cli_families_for_a_monitoring_token(server, conn, orders):
    monitor = tokens.create_token(conn, "prometheus", topics=["*"], endpoints=[], actions=["monitor"])
    async def scrape() -> tuple[int, str, str]:
        async with aiohttp.ClientSession() as session, session.get(
                server + "/metrics", headers={"Authorization": f"Bearer {monitor}"}) as response:
            return response.status, response.headers["Content-Type"], await response.text()

    status, content_type, text = asyncio.run(scrape())
    assert status == 200 and content_type.startswith("text/plain")

    def families(exposed: str) -> set[str]:
        return {line.split()[2] for line in exposed.splitlines() if line.startswith("# TYPE")}

    this_server = {"courier_serve_long_polls_waiting", "courier_serve_long_polls_woken_total"}
    assert families(text) == families(exposition(observability.metrics(conn))) | this_server
    assert "courier_messages_failed_total" in families(text)
    # A monitor token reads depths but cannot touch messages.
    assert call(server, "GET", "/api/topics/orders", monitor)[0] == 200
    assert call(server, "POST", "/api/messages/dequeue", monitor, {"topic": "orders"})[0] == 403
    consumer = token(conn, "consumer", ["consume"])
    assert call(server, "GET", "/metrics", consumer)[0] == 403


def test_the_openapi_document_is_valid_and_matches_what_the_server_accepts(server, conn, orders):
    """Valid OpenAPI 3.1; and for every route with a body, the server names the first required
    field the document lists when it is left out, and refuses a field the document lacks."""
    status, document, _ = call(server, "GET", "/api/openapi.json")
    assert status == 200
    validate(document)
    operations = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert {("POST", "/api/messages"), ("POST", "/api/messages/dequeue"), ("PUT", "/api/topic-configs/{topic}"),
            ("POST", "/api/endpoints/{name}/messages"), ("POST", "/api/events/{type}"), ("GET", "/metrics"),
            ("POST", "/api/admin/delete-reaper/run"), ("GET", "/readyz")} <= operations
    admin = token(conn, "admin", ["admin"])
    checked = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if "requestBody" not in operation:
                continue
            url = path.format(id="1", topic="orders", name="orders", type="orders")
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            status, body, _ = call(server, method.upper(), url, admin, {"not_a_field": 1})
            assert (status, body["field"]) == (400, "not_a_field"), (method, path)
            if schema.get("required"):
                status, body, _ = call(server, method.upper(), url, admin, {})
                assert (status, body["field"]) == (400, schema["required"][0]), (method, path)
            checked += 1
    assert checked >= 12


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_https_with_a_certificate_and_key(dsn, conn, orders, tmp_path):
    cert, key = self_signed(tmp_path)
    process, base = start_server(dsn, "--tls-cert", str(cert), "--tls-key", str(key), scheme="https")
    try:
        secret = token(conn, "app", ["enqueue"])
        answer = curl("--cacert", str(cert), "-H", f"Authorization: Bearer {secret}", "-X", "POST",
                      f"{base}/api/messages", "-d", json.dumps({"topic": "orders", "payload": b64(1)}))
        assert set(answer) == {"id"}
        plain = subprocess.run(["curl", "-sS", base.replace("https", "http") + "/healthz"], capture_output=True,
                               timeout=30)
        assert plain.returncode != 0 or b"ok" not in plain.stdout  # no plain HTTP on the TLS port
    finally:
        assert "Traceback" not in stop_server(process)
    half = subprocess.run([str(COURIER), "serve", "--tls-cert", str(cert), "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)
    assert half.returncode == 2 and "--tls-key" in half.stderr and "Traceback" not in half.stderr


def test_workers_beside_the_server_deliver_and_stop_with_it(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    process, base = start_server(dsn, "--workers", "1")
    children = worker_children(process)
    try:
        producer = tokens.create_token(conn, "producer", topics=[], endpoints=["billing"], actions=["enqueue"])
        status, body, _ = call(base, "POST", "/api/endpoints/billing/messages", producer, {"payload": {"n": 1}})
        assert status == 201
        deadline = time.monotonic() + 30
        while scalar(conn, "SELECT count(*) FROM courier.queue") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (int(body["id"]),)) == "completed"
    finally:
        assert "Traceback" not in stop_server(process)
    assert children and not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)


def worker_children(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """The server's worker pool processes, once it has started them (just after it bound)."""
    deadline = time.monotonic() + 15
    while not (children := psutil.Process(process.pid).children(recursive=True)):
        assert time.monotonic() < deadline, "serve --workers started no worker"
        time.sleep(0.05)
    return children


def test_a_worker_pool_that_dies_is_restarted_and_logged(dsn, conn):
    """Issue 40: --workers N watches its child: a pool killed outright is started again after a
    back-off, the server says so in its log, and messages are delivered again."""
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    process, _ = start_server(dsn, "--workers", "1")
    try:
        (first, *_) = worker_children(process)
        first.kill()
        first.wait(10)
        deadline = time.monotonic() + 20
        while not (again := [c for c in psutil.Process(process.pid).children() if c.pid != first.pid]):
            assert time.monotonic() < deadline, "the worker pool was not restarted"
            time.sleep(0.1)
        conn.execute("SELECT courier.send('billing', '{}')")
        deadline = time.monotonic() + 30
        while scalar(conn, "SELECT count(*) FROM courier.queue") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'") == 1
    finally:
        log = stop_server(process)
    restarted = [json.loads(line) for line in log.splitlines() if "exited; restarting" in line]
    assert restarted and restarted[0]["signal"] == "SIGKILL" and restarted[0]["level"] == "warning", log
    assert "Traceback" not in log
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in again)


def test_a_slow_client_is_answered_408_or_cut_off_and_holds_nothing(dsn, conn, orders):
    process, base = start_server(dsn, "--client-timeout", "1")
    try:
        secret = token(conn, "app", ["enqueue"])
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"POST /api/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + secret.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"topic\"")
            began = time.monotonic()
            try:
                answer = slow.recv(4096)
            except ConnectionResetError:
                # Closed with the unread body pending, the connection is reset, and the kernel may
                # drop the 408 before it is read: cut off, which is as correct.
                answer = b""
        assert (answer.startswith(b"HTTP/1.1 408") or answer == b"") and time.monotonic() - began < 5, answer
        # Headers sent a line at a time never end: the connection is closed at the client timeout.
        assert _seconds_until_closed(port, b"X-Slow: 1\r\n") < 3
        assert _seconds_until_closed(port, b"") < 3  # a connection that sends nothing at all
        assert call(base, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(1)})[0] == 201
    finally:
        assert "Traceback" not in stop_server(process)


def _seconds_until_closed(port: int, trickle: bytes) -> float:
    """Start a request and send `trickle` every 0.2 s for up to 10 s: how long the server took
    to close the connection."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n" if trickle else b"")
        while time.monotonic() - began < 10:
            try:
                if slow.recv(4096) == b"":
                    return time.monotonic() - began
            except TimeoutError:
                pass
            except ConnectionResetError:  # closed with our bytes unread: as closed
                return time.monotonic() - began
            try:
                slow.sendall(trickle)
            except OSError:
                return time.monotonic() - began
    return time.monotonic() - began


def test_200_long_polls_are_held_at_once_and_all_served_without_leaks(dsn, conn, orders):
    """200 clients wait at once on the server's few database connections; 200 messages
    enqueued in one transaction reach 200 different clients, none twice; afterwards the server
    holds no more connections or file descriptors than before."""
    process, base = start_server(dsn)
    server_process = psutil.Process(process.pid)
    secret = token(conn, "app", ["consume"])
    try:
        call(base, "GET", "/api/topics", secret)  # warm: the pool has opened
        fds_before = server_process.num_fds()

        async def main() -> tuple[list[list[dict]], int, float]:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector,
                                             headers={"Authorization": f"Bearer {secret}"}) as session:
                async def poll() -> list[dict]:
                    async with session.post(base + "/api/messages/dequeue",
                                            json={"topic": "orders", "wait_seconds": 15}) as response:
                        assert response.status == 200
                        return (await response.json())["messages"]
                polls = [asyncio.create_task(poll()) for _ in range(200)]
                await asyncio.sleep(2)
                waiting = sum(not p.done() for p in polls)
                backends = scalar(conn, "SELECT count(*) FROM pg_stat_activity "
                                        "WHERE application_name = 'courier-serve' AND datname = current_database()")
                began = time.monotonic()
                await asyncio.to_thread(conn.execute, "SELECT courier.enqueue('orders', jsonb_build_object('n', g)) "
                                                      "FROM generate_series(1, 200) g")
                got = await asyncio.gather(*polls)
                return got, waiting, backends, time.monotonic() - began

        got, waiting, backends, took = asyncio.run(main())
        assert waiting == 200
        assert backends <= sum(high for _, high in POOL_SIZES.values()) + 1  # the pools and the LISTEN connection
        ids = [message["id"] for messages in got for message in messages]
        assert len(ids) == len(set(ids)) == 200, "every message to one client, none twice"
        assert took < 10
        time.sleep(1)
        port = int(base.rsplit(":", 1)[1])
        open_to_clients = [c for c in server_process.net_connections("tcp")
                           if c.laddr.port == port and c.status != psutil.CONN_LISTEN]
        assert open_to_clients == []
        # Beyond the sockets it had, only the pools' own connections are still open.
        assert server_process.num_fds() <= fds_before + sum(high for _, high in POOL_SIZES.values())
    finally:
        assert "Traceback" not in stop_server(process)


def test_the_token_cli_takes_monitor_and_refuses_unknown_actions(dsn, conn):
    courier = str(COURIER)
    made = subprocess.run([courier, "token", "create", "scraper", "--topics", "*", "--can", "monitor", "--dsn", dsn,
                           "--json"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["token"]
    assert secret.startswith(tokens.PREFIX)
    listed = subprocess.run([courier, "token", "list", "--dsn", dsn], capture_output=True, text=True, timeout=60)
    assert "scraper" in listed.stdout and "monitor" in listed.stdout and secret not in listed.stdout
    refused = subprocess.run([courier, "token", "create", "x", "--can", "drop", "--dsn", dsn], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr


def test_a_message_wakes_one_waiting_poll_not_all_of_them(dsn, conn, orders):
    """50 polls wait on a topic; one message wakes one (and the two it passes a full batch on
    to), not 50: the server's own counter says how many it woke. A burst of 49 in one
    transaction (one NOTIFY) then reaches every waiting poll, passed along the line."""
    process, base = start_server(dsn)
    secret = token(conn, "app", ["consume", "monitor"])

    def woken_and_waiting() -> tuple[float, float]:
        text = call_text(base, "/metrics", secret)
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                  if line.startswith("courier_serve_long_polls")}
        return values["courier_serve_long_polls_woken_total"], values["courier_serve_long_polls_waiting"]

    try:
        async def main() -> tuple[tuple[float, float], tuple[float, float], list[list[dict]], float]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             headers={"Authorization": f"Bearer {secret}"}) as session:
                async def poll() -> list[dict]:
                    async with session.post(base + "/api/messages/dequeue",
                                            json={"topic": "orders", "wait_seconds": 15}) as response:
                        return (await response.json())["messages"]
                polls = [asyncio.create_task(poll()) for _ in range(50)]
                await asyncio.sleep(1.5)
                await asyncio.to_thread(conn.execute, "SELECT courier.enqueue('orders', '{}')")
                await asyncio.sleep(1)
                after_one = await asyncio.to_thread(woken_and_waiting)
                began = time.monotonic()
                await asyncio.to_thread(conn.execute, "SELECT courier.enqueue('orders', jsonb_build_object('n', g)) "
                                                      "FROM generate_series(1, 49) g")
                got = await asyncio.gather(*polls)
                took = time.monotonic() - began
                return after_one, await asyncio.to_thread(woken_and_waiting), got, took

        (woken, waiting), (woken_after, waiting_after), got, took = asyncio.run(main())
        # One, the two a full batch passes on, and one more: the server began to LISTEN when
        # the polls came, and looks once for a producer whose NOTIFY it may have missed.
        assert woken <= 4 and waiting == 49, (woken, waiting)
        ids = [message["id"] for messages in got for message in messages]
        assert len(ids) == len(set(ids)) == 50
        assert took < 5 and waiting_after == 0
        assert woken_after <= 2 * 50  # at most about two wake-ups a message (a full batch wakes two), not 50
    finally:
        assert "Traceback" not in stop_server(process)


def call_text(base: str, path: str, secret: str) -> str:
    async def go() -> str:
        async with aiohttp.ClientSession() as session, session.get(
                base + path, headers={"Authorization": f"Bearer {secret}"}) as response:
            return await response.text()
    return asyncio.run(go())


def test_every_surface_takes_the_same_topic_limits():
    """The HTTP API, the CLI, the console's editor and the SQL API's list of a topic's limits
    are one list."""
    from console.app.widgets.topic_limits import LIMITS as EDITOR
    from console.cli.pull import LIMIT_OPTIONS
    from console.serve.configs import LIMITS
    from sqlkit.pull import TOPIC_LIMITS

    assert tuple(LIMITS) == tuple(LIMIT_OPTIONS) == tuple(limit.key for limit in EDITOR) == TOPIC_LIMITS


def test_processes_share_one_address_and_stop_together(dsn, conn, orders):
    """serve --processes 2: two server processes accept on one port (SO_REUSEPORT), both serve
    requests, and SIGTERM stops both."""
    process, base = start_server(dsn, "--processes", "2")
    secret = token(conn, "app", ["enqueue", "consume"])
    try:
        (sibling,) = worker_children(process)
        assert "--sibling" in sibling.cmdline()
        port = int(base.rsplit(":", 1)[1])
        deadline = time.monotonic() + 20
        while not any(c.laddr.port == port for c in sibling.net_connections("tcp")):
            assert time.monotonic() < deadline, "the sibling never listened"
            time.sleep(0.1)
        for n in range(10):
            assert call(base, "POST", "/api/messages", secret, {"topic": "orders", "payload": b64(n)})[0] == 201
        assert scalar(conn, "SELECT count(*) FROM courier.queue") == 10
        # 20 connections held open: the kernel hands each to one of the listening processes,
        # by its source port, and each process holds those it accepted.
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            deadline = time.monotonic() + 10
            while True:
                held = {owner.pid: sum(1 for c in owner.net_connections("tcp")
                                       if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
                        for owner in (psutil.Process(process.pid), sibling)}
                if sum(held.values()) == 20 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        finally:
            for client in clients:
                client.close()
        served = {pid for pid, count in held.items() if count}
        assert served == {process.pid, sibling.pid}
    finally:
        log = stop_server(process)
    assert "Traceback" not in log
    assert not sibling.is_running() or sibling.status() == psutil.STATUS_ZOMBIE
