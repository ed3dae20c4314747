"""drain-noop: the worker pool drains preloaded messages on a noop endpoint through the
whole lifecycle (claim, dispatch, report, archive), against the same lifecycle as bare SQL: a
batched SKIP LOCKED claim to processing and a batched completion, driven by pgbench."""

from __future__ import annotations

import asyncio
import time

from console.workers.pool import PoolSettings, WorkerPool
from sqlkit.connection import connect

from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds

CEILING_TABLE = """
DROP TABLE IF EXISTS public.bench_drain;
CREATE TABLE public.bench_drain (LIKE courier.queue INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 70);
ALTER TABLE public.bench_drain ADD PRIMARY KEY (id);
CREATE INDEX ON public.bench_drain (id) WHERE status = 'pending';
"""

CEILING_SCRIPT = """
WITH picked AS (SELECT id FROM public.bench_drain WHERE status = 'pending' ORDER BY id LIMIT 100
                FOR UPDATE SKIP LOCKED),
     claimed AS (UPDATE public.bench_drain q SET status = 'processing' FROM picked WHERE q.id = picked.id
                 RETURNING q.id)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \\gset
UPDATE public.bench_drain SET status = 'completed' WHERE id = ANY (:ids::bigint[]) AND status = 'processing';
"""


def _preload(dsn: str, table: str, messages: int) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.archive")
        if table == "courier.queue":
            for start in range(0, messages, 10_000):
                conn.execute("SELECT courier.send_batch('drain', ARRAY(SELECT jsonb_build_object('n', g) "
                             "FROM generate_series(%s::int, %s::int) g))", (start, min(start + 10_000, messages) - 1))
        else:
            conn.execute("TRUNCATE public.bench_drain")
            conn.execute("INSERT INTO public.bench_drain (endpoint_id, payload) "
                         "SELECT 1, jsonb_build_object('n', g) FROM generate_series(1, %s::int) g", (messages,))
        conn.execute(f"VACUUM ANALYZE {table}")


def _drain_with_pool(dsn: str, messages: int, concurrency: int, batch_size: int) -> Measurement:
    _preload(dsn, "courier.queue", messages)
    pool = WorkerPool(dsn, PoolSettings(concurrency=concurrency, batch_size=batch_size, poll_interval=0.05,
                                        report_interval=0.01, worker_id="bench"))

    async def main() -> float:
        task = asyncio.create_task(pool.run())
        started = time.perf_counter()
        while pool.stats.delivered < messages and not task.done():
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        pool.stop()
        await task
        return elapsed

    elapsed = asyncio.run(main())
    return Measurement(messages / elapsed)


def _drain_with_pgbench(dsn: str, messages: int, clients: int) -> Measurement:
    _preload(dsn, "public.bench_drain", messages)
    per_client = -(-messages // (100 * clients)) + 1
    started = time.perf_counter()
    run_script(dsn, CEILING_SCRIPT, clients=clients, transactions=per_client)
    elapsed = time.perf_counter() - started
    with connect(dsn) as conn:
        done = conn.execute("SELECT count(*) FROM public.bench_drain WHERE status = 'completed'").fetchone()[0]
    return Measurement(done / elapsed)


def drain_noop(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 200_000,
               concurrency: int = 256, batch_size: int = 100) -> ScenarioResult:
    with connect(dsn) as conn:
        conn.execute(CEILING_TABLE)
        if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = 'drain'").fetchone():
            conn.execute("SELECT courier.create_endpoint('drain', 'noop', '{}')")
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    measured = measure_rounds({
        "ceiling": lambda: _drain_with_pgbench(dsn, messages, clients),
        "courier": lambda: _drain_with_pool(dsn, messages, concurrency, batch_size),
    }, rounds)
    return ScenarioResult(
        scenario="drain-noop", variant=f"{messages:,} msgs, pool of {concurrency}", unit="msg/s",
        courier=measured["courier"], ceiling=measured["ceiling"], target_ratio=0.5, target_absolute=15_000,
        notes=f"one worker process vs pgbench ({clients} clients) claiming 100 and completing them in place; "
              "Courier's completion also moves each message to the archive",
    )
