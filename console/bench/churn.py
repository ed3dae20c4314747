"""churn: the claim's cost, and the queue table's size, before and after a million deliveries
pass through the queue, sent while the worker drains them (at most 50k waiting). Finished
messages leave the hot table as they finish and autovacuum (with the queue's own settings
in the baseline migration) reclaims their rows, so neither the claim nor the table should notice them;
the ceiling is the same claim before the churn."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import psycopg

from console.workers.pool import PoolSettings, WorkerPool
from sqlkit.connection import connect

from .result import Measurement, ScenarioResult

WAITING = 10_000
SAMPLES = 30
BACKLOG = 50_000
SEND_BATCH = 5_000


def _claim_ms(conn: psycopg.Connection, endpoint_id: int) -> float:
    timings = []
    for _ in range(SAMPLES):
        with conn.transaction(force_rollback=True):  # every sample sees the same queue
            started = time.perf_counter()
            conn.execute("SELECT * FROM courier.claim_batch('bench', 50, %s)", (endpoint_id,)).fetchall()
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def _produce(dsn: str, messages: int, stop: threading.Event) -> None:
    """Send in batches, keeping at most BACKLOG messages waiting: sustained churn, as in
    production, rather than a million rows preloaded at once."""
    with connect(dsn) as conn:
        sent = 0
        while sent < messages and not stop.is_set():
            waiting = conn.execute("SELECT coalesce(sum(messages), 0) FROM courier.queue_depth d "
                                   "JOIN courier.endpoints e ON e.id = d.endpoint_id "
                                   "WHERE e.name = 'churn' AND d.status = 'pending'").fetchone()[0]
            if waiting > BACKLOG - SEND_BATCH:
                time.sleep(0.01)
                continue
            count = min(SEND_BATCH, messages - sent)
            conn.execute("SELECT courier.send_batch('churn', ARRAY(SELECT jsonb_build_object('n', g) "
                         "FROM generate_series(1, %s) g))", (count,))
            sent += count


def _deliver(dsn: str, messages: int) -> float:
    pool = WorkerPool(dsn, PoolSettings(worker_id="bench-churn"))  # `courier worker`'s defaults
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(dsn, messages, stop), daemon=True)

    async def main() -> float:
        task = asyncio.create_task(pool.run())
        started = time.perf_counter()
        producer.start()
        try:
            while pool.stats.delivered < messages and not task.done():
                await asyncio.sleep(0.1)
        finally:
            stop.set()
        elapsed = time.perf_counter() - started
        pool.stop()
        await task
        return elapsed

    elapsed = asyncio.run(main())
    producer.join()
    return elapsed


def churn(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 1_000_000) -> ScenarioResult:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.archive")
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
        conn.execute("SELECT courier.create_endpoint('churn', 'noop', '{}')")
        waiting = conn.execute("SELECT courier.create_endpoint('waiting', 'noop', '{}')").fetchone()[0]
        conn.execute("SELECT courier.send_batch('waiting', ARRAY(SELECT jsonb_build_object('n', g) "
                     "FROM generate_series(1, %s) g))", (WAITING,))
        conn.execute("VACUUM ANALYZE courier.queue")
        size_before = _queue_bytes(conn)
        before = _claim_ms(conn, waiting)
        conn.execute("SELECT courier.disable_endpoint('waiting')")  # the pool leaves it alone meanwhile
    elapsed = _deliver(dsn, messages)
    with connect(dsn) as conn:
        conn.execute("SELECT courier.enable_endpoint('waiting')")
        size_after = _queue_bytes(conn)
        after = _claim_ms(conn, waiting)
        left = conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0]
        conn.execute("TRUNCATE courier.queue, courier.archive")
    return ScenarioResult(
        scenario="churn", variant=f"claim 50 of {WAITING:,} after {messages:,} deliveries", unit="claims/s",
        courier=Measurement(1000 / after, after), ceiling=Measurement(1000 / before, before), target_ratio=0.5,
        notes=f"claim {after:.2f} ms after vs {before:.2f} ms before the churn (ceiling); {messages:,} delivered "
              f"at {messages / elapsed:,.0f} msg/s; {left:,} rows left in the queue; queue table and indexes "
              f"{size_before / 2**20:,.1f} MB before, {size_after / 2**20:,.1f} MB after")


def _queue_bytes(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_total_relation_size('courier.queue')").fetchone()[0]
