"""Batch dispatch on the hot path: a claimed batch's outcomes are recorded message by message,
ordering keys stay FIFO with many workers, a circuit opening mid-batch stops further calls,
a dispatcher's own bug is never the endpoint's failure, and the outcome buffer stays bounded
while the database cannot record outcomes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from console.workers.dispatchers.http import HttpDispatcher
from console.workers.dispatchers.noop import NoopDispatcher
from console.workers.pool import PoolSettings, WorkerPool
from tests.helpers import archived, scalar
from tests.workers import run_pool_until


class ScriptedServer:
    """Answers each request as its JSON body says: {"status": 500}, {"status": 429,
    "retry_after": 120}, {"sleep": 3} ... and records the order requests arrived in."""

    def __init__(self) -> None:
        server = self
        self.received: list[dict] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                with server.lock:
                    server.received.append(body)
                time.sleep(body.get("sleep", 0))
                self.send_response(body.get("status", 200))
                if "retry_after" in body:
                    self.send_header("retry-after", str(body["retry_after"]))
                self.send_header("content-length", "2")
                self.end_headers()
                with _ignored_disconnect():
                    self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _ignored_disconnect:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, *rest) -> bool:
        return kind is not None and issubclass(kind, ConnectionError)


@pytest.fixture
def scripted():
    server = ScriptedServer()
    yield server
    server.close()


def http_endpoint(conn, name: str, url: str, **config: object) -> int:
    return scalar(conn, "SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                  (name, json.dumps({"url": url, "allow_internal": True, **config})))


def send_all(conn, endpoint: str, payloads: list[dict], ordering_keys: list[str] | None = None) -> list[int]:
    ids = []
    for index, payload in enumerate(payloads):
        key = ordering_keys[index] if ordering_keys else None
        ids.append(scalar(conn, "SELECT courier.send_with_options(%s, %s::jsonb, p_ordering_key := %s)",
                          (endpoint, json.dumps(payload), key)))
    return ids


def test_a_batch_of_mixed_http_responses_records_each_outcome_on_its_own_message(dsn, conn, scripted):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '100')")
    http_endpoint(conn, "mixed", scripted.url, timeout=1)
    ok, failed, throttled, gone, slow = send_all(conn, "mixed", [
        {"status": 200}, {"status": 500}, {"status": 429, "retry_after": 120}, {"status": 410}, {"sleep": 3}])

    def settled() -> bool:
        return scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing' "
                            "OR (status = 'pending' AND retry_count = 0)") == 0

    run_pool_until(dsn, settled, timeout=20)
    assert scripted.count() == 5  # each message was sent once, in one claimed batch
    assert archived(conn) == 1 and scalar(conn, "SELECT id FROM courier.archive WHERE status = 'completed'") == ok
    rows = {row[0]: row[1:] for row in conn.execute(
        "SELECT id, status, retry_count, last_error, extract(epoch FROM next_retry_at - now()) "
        "FROM courier.queue")}
    assert rows[failed][:3] == ("pending", 1, "[RETRYABLE] HTTP 500")
    assert rows[throttled][:3] == ("pending", 1, "[RETRYABLE] HTTP 429")
    assert 100 < rows[throttled][3] <= 120  # Retry-After honoured on that message alone
    assert rows[failed][3] < 100
    assert rows[slow][0] == "pending" and rows[slow][1] == 1 and "timeout" in rows[slow][2]
    dead = conn.execute("SELECT original_message_id, last_error FROM courier.dlq").fetchall()
    assert dead == [(gone, "[DISABLE] HTTP 410 Gone")]


def test_ordering_keys_stay_fifo_under_batch_dispatch_with_eight_workers(dsn, conn):
    """200 keys, 10 messages each, sent interleaved; eight pools drain them in batches. Each
    key's messages complete one after another, in the order they were sent."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("SELECT courier.create_endpoint('ordered', 'noop', '{}')")
    conn.execute("SELECT courier.send_with_options('ordered', jsonb_build_object('n', g), "
                 "p_ordering_key := 'key-' || (g % 200)) FROM generate_series(1, 2000) g")
    pools = [WorkerPool(dsn, PoolSettings(poll_interval=0.05, report_interval=0.005, batch_size=50,
                                          worker_id=f"ordered-{n}", maintenance=None)) for n in range(8)]

    async def main() -> None:
        tasks = [asyncio.create_task(pool.run()) for pool in pools]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and await asyncio.to_thread(archived, conn) < 2000:
            await asyncio.sleep(0.1)
        for pool in pools:
            pool.stop()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert archived(conn) == 2000
    assert sum(1 for pool in pools if pool.stats.delivered) >= 2  # the work was shared
    out_of_order = scalar(conn, """
        SELECT count(*) FROM (
            SELECT id, completed_at, lag(completed_at) OVER (PARTITION BY ordering_key ORDER BY id) AS before
            FROM courier.archive) a
        WHERE completed_at <= before""")
    assert out_of_order == 0


def test_a_circuit_opening_mid_batch_sends_nothing_beyond_the_requests_in_flight(dsn, conn, scripted):
    """Ten requests go out at once; three fail fast and open the circuit while seven are still
    in flight. Those seven finish; no further request reaches the endpoint."""
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '3')")
    http_endpoint(conn, "breaking", scripted.url, concurrency=10, timeout=10)
    send_all(conn, "breaking", [{"status": 500}] * 3 + [{"status": 500, "sleep": 1}] * 7
             + [{"status": 500}] * 50)
    run_pool_until(dsn, lambda: scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "open", timeout=20)
    run_pool_until(dsn, lambda: False, timeout=2)
    assert scripted.count() == 10
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE retry_count = 0 AND status = 'pending'") == 50


class BrokenBatch(NoopDispatcher):
    async def deliver_batch(self, target, messages):
        raise KeyError("a bug in the dispatcher")


@pytest.mark.parametrize("protocol", ["http", "noop"])
def test_a_dispatchers_own_exception_never_counts_against_the_endpoint(dsn, conn, scripted, protocol, monkeypatch):
    """A bug or data the dispatcher cannot send fails those messages to the DLQ as local
    errors; the endpoint's circuit never hears of it."""
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '2')")
    if protocol == "http":
        http_endpoint(conn, "buggy", scripted.url)

        def broken(config, message):
            raise ValueError("header value has a line break")

        monkeypatch.setattr(HttpDispatcher, "_request_body", staticmethod(broken))
    else:
        conn.execute("SELECT courier.create_endpoint('buggy', 'noop', '{}')")
        monkeypatch.setattr("console.workers.dispatching.dispatcher_for", lambda protocol, settings: BrokenBatch())
    send_all(conn, "buggy", [{"n": n} for n in range(10)])
    run_pool_until(dsn, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == 10, timeout=20)
    state = conn.execute("SELECT circuit_state, circuit_failure_count FROM courier.endpoints").fetchone()
    assert state == ("closed", 0)
    errors = {row[0] for row in conn.execute("SELECT last_error FROM courier.dlq")}
    assert len(errors) == 1 and errors.pop().startswith("[PERMANENT] local dispatcher error")
    assert scripted.count() == 0


def test_the_outcome_buffer_stays_bounded_while_outcomes_cannot_be_recorded(dsn, conn):
    """While every report fails (the archive is locked and reports give up after 100 ms),
    the pool keeps at most max_unreported outcomes, plus the claims on their way (two of 20),
    and stops claiming; once
    reports go through again, every message is delivered exactly once."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("SELECT courier.create_endpoint('held', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('held', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 2000) g))")
    # The archive move of every report, all successes or not.
    conn.execute("ALTER FUNCTION courier._report_delivered(bigint[], integer[], jsonb[], boolean) "
                 "SET lock_timeout = '100ms'")
    settings = PoolSettings(poll_interval=0.05, report_interval=0.005, batch_size=20, max_unreported=100,
                            maintenance=None)
    pool = WorkerPool(dsn, settings)
    locker = psycopg.connect(dsn, autocommit=True)
    peak = 0

    async def main() -> None:
        nonlocal peak
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE courier.archive IN SHARE MODE")
        task = asyncio.create_task(pool.run())
        until = time.monotonic() + 3
        while time.monotonic() < until:
            peak = max(peak, pool.reporter.unreported())
            await asyncio.sleep(0.005)
        claimed_while_held = await asyncio.to_thread(scalar, conn, "SELECT count(*) FROM courier.queue "
                                                                   "WHERE status = 'processing'")
        locker.execute("ROLLBACK")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and await asyncio.to_thread(archived, conn) < 2000:
            peak = max(peak, pool.reporter.unreported()) if time.monotonic() < until else peak
            await asyncio.sleep(0.05)
        pool.stop()
        await task
        assert 100 <= claimed_while_held <= 100 + 2 * 20

    try:
        asyncio.run(main())
    finally:
        locker.close()
    assert 100 <= peak <= 100 + 2 * 20
    assert archived(conn) == 2000 and scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert pool.stats.delivered == 2000 and pool.stats.stale_reports == 0
