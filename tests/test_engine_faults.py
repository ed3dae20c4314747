"""Faults the worker pool must survive without losing, doubling or reordering messages, and
without wedging: late reports after recovery, long deliveries, poison responses and
messages, reporter exceptions, and a SIGTERM while the database is unreachable."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from console.sink import WebhookSink
from console.workers.pool import PoolSettings, WorkerPool
from console.workers.reporting import Reporter
from sqlkit.errors import CourierError
from tests.helpers import archived, scalar
from tests.tcp_proxy import PostgresProxy
from tests.workers import run_pool_until, start_worker_process, wait_for


@pytest.fixture
def sink():
    with WebhookSink() as running:
        yield running


class NulServer:
    """An endpoint whose 200 response body holds a NUL byte (jsonb cannot store U+0000)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = b'{"ok": "yes\\u0000"} and a raw \x00 byte'
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def create(conn, name: str, url: str, **config: object) -> int:
    return scalar(conn, "SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                  (name, json.dumps({"url": url, "allow_internal": True, "timeout": 30, **config})))


def send(conn, endpoint: str, n: int) -> list[int]:
    return scalar(conn, "SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                        "FROM generate_series(1, %s) g))", (endpoint, n))


def in_queue(conn, where: str = "true") -> int:
    return scalar(conn, f"SELECT count(*) FROM courier.queue WHERE {where}")


def test_a_nul_byte_response_fails_nothing_else_and_the_reporter_keeps_going(dsn, conn, sink):
    nul = NulServer()
    try:
        create(conn, "nul", nul.url, capture_response=True)
        create(conn, "good", f"{sink.url}/ok")
        bad_ids, good_ids = send(conn, "nul", 20), send(conn, "good", 20)
        run_pool_until(dsn, lambda: in_queue(conn) == 0, timeout=30)
    finally:
        nul.close()
    assert in_queue(conn) == 0, "a poisoned outcome batch stalled the reporter"
    assert archived(conn) == 40
    assert Counter(int(r.headers["x-courier-message-id"]) for r in sink.received) == Counter(good_ids)
    bodies = [row[0] for row in conn.execute("SELECT response->>'body' FROM courier.archive WHERE id = ANY (%s)",
                                             (bad_ids,))]
    assert len(bodies) == 20 and all("\ufffd" in body and "\x00" not in body for body in bodies)


class _Unencodable:
    """A captured response psycopg cannot adapt: stands for any bug in a dispatcher's output."""


def test_an_outcome_the_database_refuses_fails_its_message_alone(dsn, conn, sink, monkeypatch):
    from console.workers.dispatchers.noop import NoopDispatcher
    from console.workers.outcome import Outcome

    conn.execute("SELECT courier.create_endpoint('fine', 'noop', '{}')")
    fine = send(conn, "fine", 30)
    poison = fine[7]

    async def deliver(self, target, message):
        return Outcome.success({"body": _Unencodable()} if message.id == poison else None)

    monkeypatch.setattr(NoopDispatcher, "deliver", deliver)
    monkeypatch.setattr(NoopDispatcher, "batched", False)  # one deliver() per message
    run_pool_until(dsn, lambda: archived(conn) == 29 and in_queue(conn, "status = 'processing'") == 0,
                   timeout=20, batch_size=50)
    assert archived(conn) == 29
    row = conn.execute("SELECT status, retry_count, last_error FROM courier.queue WHERE id = %s", (poison,)).fetchone()
    assert row[0] == "pending" and row[1] == 1
    assert "could not record this delivery's outcome" in row[2]


def test_a_database_lost_while_isolating_a_refused_outcome_sends_only_the_rest_again(dsn, conn, monkeypatch):
    """A batch with an outcome the database refuses is split to find it; when the database goes
    away after part of the batch was recorded, only the rest is sent again, not the part
    already recorded (which came back as stale reports, counted as fencing events)."""
    from console.workers.dispatchers.noop import NoopDispatcher
    from console.workers.outcome import Outcome

    conn.execute("SELECT courier.create_endpoint('fine', 'noop', '{}')")
    ids = send(conn, "fine", 30)
    poison = ids[-1]

    async def deliver(self, target, message):
        return Outcome.success({"body": _Unencodable()} if message.id == poison else None)

    proxy = PostgresProxy(dsn)
    report = Reporter._report
    state = {"refused": 0, "cut": False}

    async def report_then_lose_the_database(self, batch):
        try:
            await report(self, batch)
        except Exception as error:
            if not isinstance(error, psycopg.Error | CourierError):
                state["refused"] += 1
            raise
        if state["refused"] and not state["cut"]:
            state["cut"] = True
            proxy.cut()  # right after the first part of the split batch was recorded
            asyncio.get_running_loop().call_later(0.5, proxy.restore)

    monkeypatch.setattr(NoopDispatcher, "deliver", deliver)
    monkeypatch.setattr(NoopDispatcher, "batched", False)
    monkeypatch.setattr(Reporter, "_report", report_then_lose_the_database)
    try:
        pool = run_pool_until(proxy.proxied_dsn, lambda: archived(conn) == 29 and in_queue(conn, "true") == 1,
                              timeout=60, batch_size=50, maintenance=None)
    finally:
        proxy.close()
    assert state["cut"], "the batch was split and the database lost halfway"
    assert archived(conn) == 29 and pool.stats.delivered == 29
    assert pool.stats.stale_reports == 0, "outcomes already recorded were sent again"
    assert scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'stale_reports_total'") == 0


def test_a_late_report_after_recovery_is_a_no_op_and_the_new_holder_keeps_the_message(dsn, conn, sink, caplog):
    """The endpoint answers after the claim went stale; recovery already gave it to another."""
    create(conn, "slow", f"{sink.url}/sleep/1500")
    (message,) = send(conn, "slow", 1)
    thief: list[tuple[int, int]] = []

    def done() -> bool:
        if not thief:
            if in_queue(conn, "status = 'processing'") == 0:
                return False
            with conn.transaction():  # recovered and claimed again at once: the pool cannot take it back
                conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '1 hour'")
                assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
                conn.execute("UPDATE courier.queue SET next_retry_at = NULL")
                thief.append(conn.execute("SELECT id, lease FROM courier.claim_batch('thief', 1, "
                                          "(SELECT id FROM courier.endpoints))").fetchone())
            return False
        return scalar(conn, "SELECT metric_value FROM courier.metrics() "
                            "WHERE metric_name = 'stale_reports_total'") >= 1

    pool = run_pool_until(dsn, done, timeout=20)
    assert pool.stats.stale_reports == 1 and pool.stats.delivered == 0
    assert thief[0][0] == message
    row = conn.execute("SELECT status, worker_id, lease FROM courier.queue WHERE id = %s", (message,)).fetchone()
    assert row == ("processing", "thief", thief[0][1]), "the late report touched the new holder's claim"
    said = [r.getMessage() for r in caplog.records if r.name == "courier.worker" and "outcomes" in r.getMessage()]
    assert said and all(line.startswith("outcomes ignored: their claims were recovered") for line in said), said


def test_a_report_sent_again_after_its_answer_was_lost_says_it_may_have_committed(dsn, conn, caplog):
    """The report commits, and its answer is lost with the connection (held in a stalled proxy,
    then cut), as in a crash-like restart: the worker never hears that it committed, and sends
    it again. The second attempt finds the claims settled, and the log says why, rather than
    blaming a recovery that never happened."""
    endpoint = scalar(conn, "SELECT courier.create_endpoint('quick', 'noop', '{}')")
    ids = send(conn, "quick", 5)
    proxy = PostgresProxy(dsn)
    reporting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%report%' "
                 "AND datname = current_database()")
    try:
        with psycopg.connect(dsn) as blocker:
            blocker.execute("LOCK TABLE courier.archive IN SHARE MODE")  # reports cannot archive
            cut = threading.Event()

            def done() -> bool:
                if not cut.is_set():
                    if scalar(conn, reporting) == 0:
                        return False
                    proxy.stall()  # whatever the server answers now stays in the proxy
                    blocker.rollback()  # the report goes on, and commits
                    wait_for(lambda: archived(conn) == len(ids), timeout=10)
                    proxy.cut()  # and its answer is lost with the connection
                    time.sleep(0.5)
                    proxy.restore()
                    cut.set()
                    return False
                return any("outcomes" in r.getMessage() for r in caplog.records)

            pool = run_pool_until(proxy.proxied_dsn, done, timeout=60, maintenance=None)
    finally:
        proxy.close()
    assert cut.is_set()
    said = [r for r in caplog.records if r.name == "courier.worker" and "outcomes" in r.getMessage()]
    assert said and all(r.getMessage().startswith("outcomes not applied again: an earlier attempt of this report, "
                                                  "whose answer was lost, may already have recorded them")
                        for r in said), [r.getMessage() for r in said]
    assert sum(r.count for r in said) == pool.stats.stale_reports == len(ids)
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE endpoint_id = %s", (endpoint,)) == len(ids)
    assert scalar(conn, "SELECT sum(retry_count) FROM courier.archive") == 0, "nothing was recovered or redelivered"


def test_a_long_delivery_renews_its_lease_and_is_never_recovered(dsn, conn, sink):
    create(conn, "slow", f"{sink.url}/sleep/2500")
    (message,) = send(conn, "slow", 1)
    started: list[float] = []
    renewed: list[bool] = []

    def done() -> bool:
        row = conn.execute("SELECT extract(epoch FROM now() - processing_started_at) FROM courier.queue "
                           "WHERE id = %s AND status = 'processing'", (message,)).fetchone()
        if row is not None:
            started.append(float(row[0]))
            if len(started) > 1 and started[-1] < started[-2]:
                renewed.append(True)
        return archived(conn) == 1

    run_pool_until(dsn, done, timeout=20, heartbeat_interval=0.2, renew_after=0.5)
    assert renewed, "the lease was never renewed during a 2.5 s delivery"
    assert archived(conn) == 1 and sink.count() == 1


def test_a_message_the_worker_cannot_decode_fails_alone(dsn, conn, sink):
    create(conn, "hook", f"{sink.url}/ok")
    good = send(conn, "hook", 5)
    # Metadata nested deeper than any JSON decoder allows (written past send's own check).
    deep = scalar(conn, "SELECT courier.send('hook', '{}')")
    conn.execute("UPDATE courier.queue SET metadata = (repeat('{\"a\":', 5000) || '1' || repeat('}', 5000))::jsonb"
                 " WHERE id = %s", (deep,))
    run_pool_until(dsn, lambda: in_queue(conn) == 0, timeout=20)
    assert archived(conn) == 5 and set(int(r.headers["x-courier-message-id"]) for r in sink.received) == set(good)
    dead = conn.execute("SELECT last_error FROM courier.dlq WHERE original_message_id = %s", (deep,)).fetchone()
    assert dead is not None and "cannot decode" in dead[0]


# "cut": a database that refuses (every connection dropped, new ones closed at once).
# "stall": a partition that drops packets: every query and connection attempt hangs, and so
# does psycopg's cancellation of a query, 5 s and then 5 s more.
@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_sigterm_while_the_database_is_unreachable_exits_within_the_drain_timeout(dsn, conn, sink, fault):
    create(conn, "slow", f"{sink.url}/sleep/3000")
    send(conn, "slow", 10)
    proxy = PostgresProxy(dsn)
    worker = start_worker_process(proxy.proxied_dsn, "--concurrency", "10", "--drain-timeout", "2")
    try:
        wait_for(lambda: in_queue(conn, "status = 'processing'") >= 5)
        getattr(proxy, fault)()
        time.sleep(0.3)
        began = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        took = time.monotonic() - began
    finally:
        if worker.poll() is None:
            worker.kill()
        proxy.close()
    # The drain timeout, the pool's own bound after it (DRAIN_GRACE 5 s, then 1 s for the last
    # heartbeat, 1 s for closing the connections and 1 s for the process's teardown), and slack.
    assert took < 2 + 8 + 1.5, f"SIGTERM took {took:.1f} s"
    assert '"msg": "worker stopped"' in worker.stderr.read()
    # Nothing is lost: the claims left behind are stale recovery's.
    assert in_queue(conn) + archived(conn) == 10


def test_a_heartbeat_failure_during_the_drain_does_not_abort_it(dsn, conn, sink, monkeypatch):
    create(conn, "slow", f"{sink.url}/sleep/500")
    send(conn, "slow", 6)
    pool = WorkerPool(dsn, PoolSettings(poll_interval=0.1, report_interval=0.005, drain_timeout=10))
    original = pool._heartbeat

    async def heartbeat(state: str | None = None) -> None:
        if state == "draining":
            raise psycopg.OperationalError("the database went away")
        await original(state)

    monkeypatch.setattr(pool, "_heartbeat", heartbeat)

    async def main() -> None:
        task = asyncio.create_task(pool.run())
        # Deliveries under way, not only claims committed: a stop that came before the pool had
        # read its claim's answer would give the claimed messages back undelivered.
        while not pool.stats.round_trips or not pool.deliveries.in_flight_count:
            await asyncio.sleep(0.02)
        pool.stop()
        await task

    asyncio.run(main())
    assert in_queue(conn, "status = 'processing'") == 0  # in-flight deliveries finished and were reported
    assert archived(conn) >= 1


def test_a_claim_still_in_the_database_at_a_stop_has_its_outcomes_reported(dsn, conn):
    """The report loop ended as soon as the pool was stopping with no delivery in flight, while
    a claim could still be on its way: its messages were then delivered after the last report
    and left in processing for recovery to deliver again. Here the claim waits on a lock past
    the report loop's one-second wake-up, and is answered only after the stop."""
    conn.execute("SELECT courier.create_endpoint('held', 'noop', '{}')")
    pool = WorkerPool(dsn, PoolSettings(poll_interval=0.1, maintenance=None))

    async def main() -> None:
        task = asyncio.create_task(pool.run())
        while not pool.stats.round_trips:
            await asyncio.sleep(0.02)
        async with await psycopg.AsyncConnection.connect(dsn) as blocker:
            await blocker.execute("LOCK TABLE courier.queue IN ACCESS EXCLUSIVE MODE")
            await blocker.execute("SELECT courier.send_batch('held', ARRAY(SELECT jsonb_build_object('n', g) "
                                  "FROM generate_series(1, 5) g))")
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'courier-worker' " \
                      "AND wait_event_type = 'Lock'"
            while not (await (await blocker.execute(waiting)).fetchone())[0]:  # a claim is on its way, and waits
                await asyncio.sleep(0.02)
            pool.stop()
            await asyncio.sleep(1.5)  # past the report loop's wake-up with nothing in flight
            await blocker.commit()  # the claim takes the five messages now
        await asyncio.wait_for(task, 15)

    asyncio.run(main())
    assert in_queue(conn, "status = 'processing'") == 0
    assert archived(conn) == 5
