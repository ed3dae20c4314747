"""Cancel against the real worker pool: a message cancelled while its webhook call is under way
has the worker's late report fenced out (counted stale), and is never delivered again, though
the endpoint answers 500, which would otherwise retry it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sqlkit import verbs
from tests.helpers import message_status, scalar
from tests.workers import run_pool_until


class _Held(BaseHTTPRequestHandler):
    """Holds each request until released, then answers 500 (retryable)."""

    arrived = threading.Event()
    release = threading.Event()
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).arrived.set()
        type(self).release.wait(10)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_message_cancelled_in_flight_is_fenced_and_never_delivered_again(dsn, conn):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Held)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn.execute("SELECT courier.create_endpoint('held', 'http', %s::jsonb, %s::jsonb)",
                     (json.dumps({"url": f"http://127.0.0.1:{server.server_port}/hook", "allow_internal": True}),
                      json.dumps({"backoff": "fixed", "base_delay_seconds": 1, "max_retries": 5})))
        message = scalar(conn, "SELECT courier.send('held', '{\"n\": 1}')")
        stale_before = scalar(conn, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals "
                                    "WHERE outcome = 'stale_report'")
        finished = threading.Event()
        cancelled: list[verbs.Cancelled] = []

        def operator() -> None:
            assert _Held.arrived.wait(15)
            cancelled.append(verbs.cancel(conn, message, actor="test"))
            _Held.release.set()
            # The worker reports its 500 for a lease that is gone: a stale report, then nothing.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and scalar(
                    conn, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals "
                          "WHERE outcome = 'stale_report'") == stale_before:
                time.sleep(0.05)
            time.sleep(2.0)  # time enough for a retry, were there one (base delay 1 s)
            finished.set()

        helper = threading.Thread(target=operator)
        helper.start()
        run_pool_until(dsn, finished.is_set, timeout=30)
        helper.join()
    finally:
        _Held.release.set()
        server.shutdown()
        server.server_close()

    assert cancelled == [verbs.Cancelled(message, "held", "processing")]
    assert _Held.hits == 1
    assert message_status(conn, message) == "cancelled"
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
    assert scalar(conn, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals "
                        "WHERE outcome = 'stale_report'") > stale_before
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'report.stale_lease'") >= 1
