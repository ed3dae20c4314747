"""pull: drain a preloaded topic with dequeue(100) + one batch ack per dequeue, through SQL
(pgbench) and through the Python consumer (sqlkit.consumer), each against the raw ceiling
measured in the same run: SKIP LOCKED claim-and-delete of 100 rows from a bare table.

Every figure is messages drained per second over the same number of preloaded messages, so
the three drain the same amount of work from a table of the same size."""

from __future__ import annotations

import asyncio
import time

from sqlkit.connection import connect
from sqlkit.consumer import Consumer

from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds

TOPIC = "bench-pull"
BATCH = 100

CEILING_TABLE = """
DROP TABLE IF EXISTS public.bench_pull;
CREATE TABLE public.bench_pull (LIKE courier.queue INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 70);
ALTER TABLE public.bench_pull ADD PRIMARY KEY (id);
CREATE INDEX ON public.bench_pull (endpoint_id, visible_at, id) WHERE status IN ('pending', 'processing');
"""

CEILING_SCRIPT = f"""
DELETE FROM public.bench_pull WHERE id IN (SELECT id FROM public.bench_pull ORDER BY id LIMIT {BATCH}
                                           FOR UPDATE SKIP LOCKED)
RETURNING id, payload;
"""

# Where the loss is: the lease protocol itself (claim to processing under a lease, then a
# fenced delete by id and lease, two transactions) as bare SQL on the bare table.
LEASED_SCRIPT = f"""
WITH picked AS (SELECT id FROM public.bench_pull WHERE endpoint_id = 1 AND status IN ('pending', 'processing')
                  AND visible_at <= now() ORDER BY visible_at, id LIMIT {BATCH} FOR UPDATE SKIP LOCKED),
     taken AS (UPDATE public.bench_pull q SET status = 'processing', lease = q.lease + 1,
                      visible_at = now() + interval '60 seconds'
               FROM picked WHERE q.id = picked.id RETURNING q.id, q.lease, q.payload)
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease), '{{}}') AS leases FROM taken \\gset
DELETE FROM public.bench_pull q USING unnest(:ids::bigint[], :leases::integer[]) AS u(id, lease)
WHERE q.id = u.id AND q.lease = u.lease;
"""

SQL_SCRIPT = f"""
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease), '{{}}') AS leases
FROM courier.dequeue('{TOPIC}', {BATCH}, 60) \\gset
SELECT count(*) FROM courier.ack(:ids::bigint[], :leases::integer[]);
"""


def _preload(dsn: str, table: str, messages: int) -> None:
    """Fill the topic (or the bare table) with one INSERT: rows as courier.enqueue() makes
    them, without paying for a hundred thousand enqueue calls before every run."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.archive, public.bench_pull")
        if table == "courier.queue":
            conn.execute("INSERT INTO courier.queue (endpoint_id, payload, visible_at) "
                         "SELECT e.id, jsonb_build_object('n', g), now() "
                         "FROM courier.endpoints e, generate_series(1, %s::int) g WHERE e.name = %s",
                         (messages, TOPIC))
        else:
            conn.execute("INSERT INTO public.bench_pull (endpoint_id, payload, visible_at) "
                         "SELECT 1, jsonb_build_object('n', g), now() FROM generate_series(1, %s::int) g",
                         (messages,))
        conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute("VACUUM ANALYZE courier.queue_depth")


def _drain_with_pgbench(dsn: str, table: str, script: str, messages: int, clients: int) -> Measurement:
    _preload(dsn, table, messages)
    per_client = -(-messages // (BATCH * clients)) + 1
    started = time.perf_counter()
    run = run_script(dsn, script, clients=clients, transactions=per_client)
    elapsed = time.perf_counter() - started
    with connect(dsn) as conn:
        if table == "courier.queue":
            left = conn.execute("SELECT count(*) FROM courier.queue WHERE status IN ('pending', 'processing')"
                                ).fetchone()[0]
        else:
            left = conn.execute("SELECT count(*) FROM public.bench_pull").fetchone()[0]
    return Measurement((messages - left) / elapsed, run.latency_ms)


def _drain_with_consumer(dsn: str, messages: int, clients: int) -> Measurement:
    _preload(dsn, "courier.queue", messages)
    drained = 0

    async def consume(done: asyncio.Event) -> None:
        nonlocal drained
        async with Consumer(dsn, TOPIC, batch_size=BATCH, visibility_timeout=60, poll_interval=0.05) as consumer:
            async for batch in consumer.batches():
                results = await consumer.ack(batch)
                drained += sum(1 for r in results.values() if r == "acked")
                if drained >= messages:
                    done.set()
                    return

    async def main() -> float:
        done = asyncio.Event()
        started = time.perf_counter()
        tasks = [asyncio.create_task(consume(done)) for _ in range(clients)]
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        elapsed = time.perf_counter() - started
        for task in (waiter, *tasks):
            task.cancel()
        await asyncio.gather(waiter, *tasks, return_exceptions=True)
        for task in tasks:  # a consumer that failed: say why rather than report a figure
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return elapsed

    elapsed = asyncio.run(main())
    return Measurement(drained / elapsed)


def pull(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 100_000) -> list[ScenarioResult]:
    with connect(dsn) as conn:
        conn.execute(CEILING_TABLE)
        if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (TOPIC,)).fetchone():
            conn.execute("SELECT courier.create_endpoint(%s, 'pull', '{}')", (TOPIC,))
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    measured = measure_rounds({
        "ceiling": lambda: _drain_with_pgbench(dsn, "public.bench_pull", CEILING_SCRIPT, messages, clients),
        "leased": lambda: _drain_with_pgbench(dsn, "public.bench_pull", LEASED_SCRIPT, messages, clients),
        "sql": lambda: _drain_with_pgbench(dsn, "courier.queue", SQL_SCRIPT, messages, clients),
        "consumer": lambda: _drain_with_consumer(dsn, messages, clients),
    }, rounds)
    ceiling = measured["ceiling"]
    return [
        ScenarioResult(
            scenario="pull", variant="reference: bare leased claim + delete", unit="msg/s",
            courier=measured["leased"], ceiling=ceiling,
            notes="not Courier: the same two-transaction lease protocol as bare SQL on the bare table, "
                  "to show how much of the gap the protocol itself costs and how much Courier's queue table"),
        ScenarioResult(
            scenario="pull", variant=f"SQL dequeue({BATCH}) + ack, {messages:,} msgs", unit="msg/s",
            courier=measured["sql"], ceiling=ceiling, target_ratio=0.8,
            notes=f"pgbench ({clients} clients): courier.dequeue then courier.ack of the batch, two transactions, "
                  f"vs one DELETE of {BATCH} SKIP LOCKED rows from a bare table"),
        ScenarioResult(
            scenario="pull", variant=f"Python consumer, batches of {BATCH}", unit="msg/s",
            courier=measured["consumer"], ceiling=ceiling, target_ratio=0.5,
            notes=f"{clients} sqlkit.consumer.Consumer instances in one asyncio process, batches() + ack(batch)"),
    ]
