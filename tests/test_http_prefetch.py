"""A webhook's prefetch: the pool claims a batch ahead of the endpoint's free slots, so a freed
slot takes its next message at once, without letting the endpoint see more requests at once
than its limit, and without keeping what it prefetched when it stops or a failure arrives."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import scalar
from tests.workers import run_pool_until


class ConcurrencyRecordingSink:
    """Answers 200 after `delay` seconds and remembers the most requests it had at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.received = 0
        self.busy = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with sink._lock:
                    sink.busy += 1
                    sink.most_at_once = max(sink.most_at_once, sink.busy)
                time.sleep(sink.delay)
                with sink._lock:
                    sink.busy -= 1
                    sink.received += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def slow_sink():
    sink = ConcurrencyRecordingSink(delay=0.05)
    yield sink
    sink.close()


def _webhook(conn, url: str, concurrency: int) -> None:
    conn.execute("SELECT courier.create_endpoint('hook', 'http', %s::jsonb)",
                 (json.dumps({"url": url, "allow_internal": True, "concurrency": concurrency}),))


def _send(conn, count: int) -> None:
    conn.execute("SELECT courier.send_batch('hook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, %s) g))", (count,))


def _deliver_counting_claims(dsn, conn, count: int) -> int:
    """Run a pool until `count` messages are delivered; the most it had claimed at once."""
    most_claimed = 0

    def done() -> bool:
        nonlocal most_claimed
        most_claimed = max(most_claimed, scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'"))
        return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'") == count

    run_pool_until(dsn, done, timeout=30)
    return most_claimed


def test_the_endpoint_never_sees_more_requests_than_its_limit_while_more_are_claimed(dsn, conn, slow_sink):
    _webhook(conn, slow_sink.url, concurrency=3)
    _send(conn, 60)
    most_claimed = _deliver_counting_claims(dsn, conn, 60)
    assert slow_sink.received == 60
    assert slow_sink.most_at_once == 3
    # Claimed ahead of the three slots, but never more than four times the limit beyond them.
    assert 3 < most_claimed <= 3 + 12


def test_a_stop_gives_prefetched_messages_back_without_counting_an_attempt(dsn, conn, slow_sink):
    slow_sink.delay = 0.3
    _webhook(conn, slow_sink.url, concurrency=2)
    _send(conn, 20)
    run_pool_until(dsn, lambda: slow_sink.busy == 2, timeout=10)
    delivered = scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'")
    assert delivered == slow_sink.received >= 2
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending' AND retry_count = 0") \
        == 20 - delivered


def test_a_failure_gives_the_prefetch_back_so_the_opening_circuit_stops_it(dsn, conn):
    """One request at a time to an endpoint answering 500: each failure is reported before the
    next request, so the circuit opens after exactly the threshold's calls; the prefetched
    rest is pending again with no attempt counted."""
    failing = ConcurrencyRecordingSink(delay=0.0)
    failing_url = failing.url
    failing.close()  # nothing listens there now: every call is a connection error
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '2')")
    _webhook(conn, failing_url, concurrency=1)
    _send(conn, 10)
    run_pool_until(dsn, lambda: scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "open", timeout=20)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE retry_count > 0") == 2
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending' AND retry_count = 0") == 8


def test_a_rate_limited_webhook_claims_nothing_ahead(dsn, conn, slow_sink):
    """Its tokens are spent at the claim: what it claimed ahead while slow would go out in one
    burst later, past the limit."""
    conn.execute("SELECT courier.create_endpoint('hook', 'http', %s::jsonb)", (json.dumps(
        {"url": slow_sink.url, "allow_internal": True, "concurrency": 2, "rate_limit": {"rate": 50, "burst": 10}}),))
    _send(conn, 30)
    most_claimed = _deliver_counting_claims(dsn, conn, 30)
    assert slow_sink.most_at_once <= 2
    # Two in flight, and for a moment a third claimed while a finished one's outcome is on its
    # way; claiming ahead would have taken the whole burst of ten.
    assert most_claimed <= 3
