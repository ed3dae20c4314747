"""HTTP delivery through the worker pool against a real server on loopback."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from console.sink import WebhookSink
from console.workers.dispatchers.http import classify, parse_retry_after, standard_webhooks_signature
from console.workers.outcome import OutcomeKind
from sqlkit import exact_json
from sqlkit.exact_json import JsonNumber
from tests.helpers import global_id, message_status, scalar
from tests.workers import run_pool_until


@pytest.fixture
def sink():
    with WebhookSink() as running:
        yield running


def create(conn, name: str, url: str, **config: object) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                 (name, json.dumps({"url": url, "allow_internal": True, **config})))


def send(conn, name: str, payload: dict | None = None, **options: str) -> int:
    names = "".join(f", {k} := %({k})s" for k in options)
    return scalar(conn, f"SELECT courier.send_with_options(%(name)s, %(payload)s::jsonb{names})",
                  {"name": name, "payload": json.dumps(payload or {"n": 1}), **options})


def settled(conn) -> bool:
    """Nothing in flight, and nothing a worker could claim right now."""
    return scalar(conn, "SELECT count(*) FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id "
                        "WHERE q.status = 'processing' OR (q.status = 'pending' AND e.enabled "
                        "AND e.circuit_state = 'closed' AND coalesce(q.next_retry_at, now()) <= now())") == 0


def deliver(dsn, conn, **settings) -> None:
    run_pool_until(dsn, lambda: settled(conn), **settings)


@pytest.mark.parametrize(("status", "kind"), [
    (200, OutcomeKind.SUCCESS), (204, OutcomeKind.SUCCESS), (400, OutcomeKind.PERMANENT),
    (404, OutcomeKind.PERMANENT), (410, OutcomeKind.DISABLE), (429, OutcomeKind.RETRYABLE),
    (500, OutcomeKind.RETRYABLE), (503, OutcomeKind.RETRYABLE),
])
def test_status_classes(status, kind):
    assert classify(status, None).kind is kind


def test_retry_after_parsing():
    assert parse_retry_after("120") == 120
    assert parse_retry_after("999999") == 86400
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 - 30) == 30
    assert parse_retry_after("soon") is None
    assert classify(503, "7").retry_after == 7
    assert classify(500, "7").retry_after is None  # only 429 and 503 carry it


def test_standard_webhooks_signature_matches_the_spec_vector():
    signature = standard_webhooks_signature("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                                            1614265330, b'{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_success_is_delivered_once_with_headers_and_body(dsn, conn, sink):
    create(conn, "ok", f"{sink.url}/healthy", headers={"X-Team": "billing"})
    message = send(conn, "ok", {"order": 1}, p_correlation_id="550e8400-e29b-41d4-a716-446655440000",
                   p_headers='{"X-Tenant": "acme"}')
    deliver(dsn, conn)
    assert message_status(conn, message) == "completed"
    (request,) = sink.received
    assert json.loads(request.body) == {"order": 1}
    assert request.headers["x-team"] == "billing" and request.headers["x-tenant"] == "acme"
    assert request.headers["x-courier-message-id"] == str(message)
    assert request.headers["x-courier-global-id"] == global_id(conn, message)
    assert request.headers["x-correlation-id"] == "550e8400-e29b-41d4-a716-446655440000"


def test_permanent_error_dead_letters_at_once(dsn, conn, sink):
    create(conn, "bad", f"{sink.url}/status/422")
    send(conn, "bad")
    deliver(dsn, conn)
    assert sink.count() == 1
    assert scalar(conn, "SELECT last_error FROM courier.dlq") == "[PERMANENT] HTTP 422"


def test_gone_auto_disables_the_endpoint(dsn, conn, sink):
    create(conn, "gone", f"{sink.url}/status/410", auto_disable_on_gone=True)
    send(conn, "gone")
    deliver(dsn, conn)
    assert scalar(conn, "SELECT enabled FROM courier.endpoints") is False
    assert scalar(conn, "SELECT last_error FROM courier.dlq") == "[DISABLE] HTTP 410 Gone"


def test_server_errors_retry_with_backoff(dsn, conn, sink):
    create(conn, "busy", f"{sink.url}/status/503")
    message = send(conn, "busy")
    deliver(dsn, conn)
    row = conn.execute("SELECT status, retry_count, extract(epoch FROM next_retry_at - now())::int "
                       "FROM courier.queue WHERE id = %s", (message,)).fetchone()
    assert row[0:2] == ("pending", 1) and 8 <= row[2] <= 10


def test_retry_after_is_honoured(dsn, conn, sink):
    create(conn, "limited", f"{sink.url}/status/429?retry_after=90")
    message = send(conn, "limited")
    deliver(dsn, conn)
    delay = scalar(conn, "SELECT extract(epoch FROM next_retry_at - now())::int FROM courier.queue WHERE id = %s",
                   (message,))
    assert 88 <= delay <= 90


@pytest.mark.parametrize("status", [202, 429])
def test_a_listed_status_with_retry_after_snoozes_without_spending_an_attempt(dsn, conn, sink, status):
    """snooze_statuses (issue 42): the receiver says "not yet", and the message comes back then
    with its attempts, history and the endpoint's circuit untouched."""
    create(conn, "later", f"{sink.url}/status/{status}?retry_after=120", snooze_statuses=[202, 429])
    conn.execute("UPDATE courier.endpoints SET retry_policy = '{\"max_retries\": 0}' WHERE name = 'later'")
    message = send(conn, "later")
    deliver(dsn, conn)
    row = conn.execute("SELECT status, retry_count, error_history, last_error, "
                       "extract(epoch FROM next_retry_at - now())::int FROM courier.queue WHERE id = %s",
                       (message,)).fetchone()
    assert row[:4] == ("pending", 0, [], None) and 118 <= row[4] <= 120  # max_retries 0, and not dead-lettered
    assert conn.execute("SELECT circuit_failure_count, last_failure_at FROM courier.endpoints "
                        "WHERE name = 'later'").fetchone() == (0, None)
    assert sink.count(f"/status/{status}") == 1


def test_a_listed_status_without_retry_after_is_classed_as_usual(dsn, conn, sink):
    create(conn, "plain", f"{sink.url}/status/429", snooze_statuses=[429])
    message = send(conn, "plain")
    deliver(dsn, conn)
    assert conn.execute("SELECT status, retry_count FROM courier.queue WHERE id = %s",
                        (message,)).fetchone() == ("pending", 1)
    assert classify(202, "30", [202]).kind is OutcomeKind.SNOOZE and classify(202, "30").kind is OutcomeKind.SUCCESS


@pytest.mark.parametrize("bad", ['"429"', '[429, "x"]', "[99]", "[600]", "[4.5]"])
def test_snooze_statuses_are_checked_where_they_enter(conn, bad):
    with pytest.raises(Exception, match="snooze_statuses"):
        conn.execute("SELECT courier.create_endpoint('h', 'http', %s::jsonb)",
                     (f'{{"url": "http://example.com/", "snooze_statuses": {bad}}}',))


def test_timeout_is_retryable(dsn, conn, sink):
    create(conn, "slow", f"{sink.url}/sleep/2000", timeout=0.3)
    message = send(conn, "slow")
    deliver(dsn, conn)
    assert scalar(conn, "SELECT last_error FROM courier.queue WHERE id = %s", (message,)).startswith(
        "[RETRYABLE] timeout")


def test_connection_refused_is_retryable(dsn, conn):
    create(conn, "down", "http://127.0.0.1:9/hook")
    message = send(conn, "down")
    deliver(dsn, conn)
    assert scalar(conn, "SELECT last_error FROM courier.queue WHERE id = %s", (message,)).startswith(
        "[RETRYABLE] connection error")


def test_internal_address_is_blocked_unless_allowed(dsn, conn, sink):
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    conn.execute("SELECT courier.create_endpoint('internal', 'http', %s::jsonb)",
                 (json.dumps({"url": f"{sink.url}/healthy"}),))
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'false')")  # after creating it
    send(conn, "internal")
    deliver(dsn, conn)
    assert sink.count() == 0
    assert "internal address 127.0.0.1 blocked" in scalar(conn, "SELECT last_error FROM courier.dlq")

    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    send(conn, "internal")
    deliver(dsn, conn)
    assert sink.count() == 1


def test_basic_and_bearer_auth(dsn, conn, sink):
    create(conn, "basic", f"{sink.url}/healthy", auth={"type": "basic", "username": "u", "password": "p"})
    create(conn, "bearer", f"{sink.url}/healthy", auth={"type": "bearer", "token": "t0k"})
    send(conn, "basic")
    send(conn, "bearer")
    deliver(dsn, conn)
    authorizations = sorted(r.headers["authorization"] for r in sink.received)
    assert authorizations == ["Basic " + base64.b64encode(b"u:p").decode(), "Bearer t0k"]


def test_standard_webhooks_signature_verifies(dsn, conn, sink):
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    create(conn, "signed", f"{sink.url}/healthy", signing={"secret": secret})
    message = send(conn, "signed", {"amount": 5})
    deliver(dsn, conn)
    (request,) = sink.received
    assert request.headers["webhook-id"] == global_id(conn, message)  # what receivers deduplicate on
    signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode() + request.body
    expected = base64.b64encode(hmac.new(b"0123456789abcdef0123456789abcdef", signed, hashlib.sha256).digest())
    assert request.headers["webhook-signature"] == "v1," + expected.decode()


def test_cloudevents_binary_and_structured(dsn, conn, sink):
    create(conn, "ce-binary", f"{sink.url}/binary", cloudevents={"mode": "binary", "type": "order.created"})
    create(conn, "ce-structured", f"{sink.url}/structured", cloudevents={"mode": "structured", "source": "shop"})
    first = send(conn, "ce-binary", {"order": 1})
    second = send(conn, "ce-structured", {"order": 2})
    deliver(dsn, conn)
    by_path = {r.path: r for r in sink.received}
    binary = by_path["/binary"]
    assert binary.headers["ce-specversion"] == "1.0" and binary.headers["ce-type"] == "order.created"
    assert binary.headers["ce-id"] == global_id(conn, first)
    assert json.loads(binary.body) == {"order": 1}
    structured = by_path["/structured"]
    assert structured.headers["content-type"] == "application/cloudevents+json"
    envelope = json.loads(structured.body)
    assert envelope["source"] == "shop" and envelope["data"] == {"order": 2} and envelope["specversion"] == "1.0"
    assert envelope["id"] == global_id(conn, second)


def test_structured_cloudevents_carry_the_payload_exactly_as_stored(dsn, conn, sink):
    """The envelope's data is the stored payload's text: parsed and dumped again, the float
    reader rounded 12345678901234567.89 to 12345678901234568.0 on its way to the receiver."""
    create(conn, "ce-exact", f"{sink.url}/structured", cloudevents={"mode": "structured"})
    stored = '{"amount": 12345678901234567.89, "id": 123456789012345678901234567890, "name": "Zoë"}'
    scalar(conn, "SELECT courier.send('ce-exact', %s::jsonb)", (stored,))
    deliver(dsn, conn)
    (request,) = sink.received
    data = exact_json.loads(request.body)["data"]
    assert data == {"amount": JsonNumber("12345678901234567.89"), "id": JsonNumber("123456789012345678901234567890"),
                    "name": "Zoë"}


def test_response_capture_with_correlation_id(dsn, conn, sink):
    create(conn, "captured", f"{sink.url}/healthy", capture_response=True)
    message = send(conn, "captured", p_correlation_id="550e8400-e29b-41d4-a716-446655440000")
    deliver(dsn, conn)
    response = scalar(conn, "SELECT response FROM courier.archive WHERE id = %s", (message,))
    assert response == {"status": 200, "body": "{}", "truncated": False,
                        "correlation_id": "550e8400-e29b-41d4-a716-446655440000"}


class _PiecemealBody(BaseHTTPRequestHandler):
    """Answers with a body of `size` bytes sent in two pieces, a pause between them."""

    size = 3000

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", str(self.size))
        self.end_headers()
        half = self.size // 2
        self.wfile.write(b"a" * half)
        self.wfile.flush()
        time.sleep(0.2)
        self.wfile.write(b"b" * (self.size - half))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def piecemeal_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PiecemealBody)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("limit", "kept", "truncated"), [(65536, 3000, False), (2000, 2000, True)])
def test_a_body_arriving_in_pieces_is_captured_whole_or_labelled_truncated(dsn, conn, piecemeal_server,
                                                                           limit, kept, truncated):
    conn.execute("SELECT courier.set_setting('response_body_max_size', %s)", (str(limit),))
    create(conn, "piecemeal", piecemeal_server, capture_response=True)
    message = send(conn, "piecemeal")
    deliver(dsn, conn)
    response = scalar(conn, "SELECT response FROM courier.archive WHERE id = %s", (message,))
    # Was the first piece only (1500 bytes), labelled complete.
    assert (len(response["body"]), response["truncated"]) == (kept, truncated)


def test_circuit_opens_and_stops_calling_a_failing_endpoint(dsn, conn, sink):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '3')")
    create(conn, "flapping", f"{sink.url}/status/500")
    for _ in range(10):
        send(conn, "flapping")
    deliver(dsn, conn, batch_size=1, concurrency=1)
    assert scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "open"
    # No claim goes out while failures are unreported, so the third failure is the last call.
    calls = sink.count()
    assert calls == 3
    run_pool_until(dsn, lambda: False, timeout=1.5, poll_interval=0.1)
    assert sink.count() == calls


def test_an_opening_circuit_stops_calls_beyond_those_in_flight(dsn, conn, sink):
    """At the pool's default batch size, only the calls already in flight when the
    failures arrive are made; no later claim reaches the endpoint."""
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '3')")
    create(conn, "flapping", f"{sink.url}/status/500", concurrency=4)
    for _ in range(60):
        send(conn, "flapping")
    run_pool_until(dsn, lambda: scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "open", timeout=20)
    run_pool_until(dsn, lambda: False, timeout=1.5)
    assert sink.count() == 4  # the first claim: four in flight at once, all failing
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 60
