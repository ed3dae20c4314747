"""pull: drain a preloaded topic through every way a consumer takes messages, each against the
raw SQL that does the same job on a bare table, measured in the same run.

- dequeue + ack (leased; two transactions per batch: take under a lease, then delete by id
  and lease), batches of 10 and 100. Ceiling: the same lease protocol as bare SQL on a bare
  table of courier.queue's shape: one statement claims a batch with SKIP LOCKED and sets its
  lease and visibility deadline, a second deletes the batch by id and lease.
- ack + dequeue in one statement (the previous batch's ack and the next batch's lease, one
  transaction per batch: what the Python Consumer sends while it iterates), batches of 10 and
  100. Ceiling: the bare lease protocol above. Bare SQL gains nothing from the one statement
  (a DELETE and a claim in data-modifying CTEs drained 24-44k msg/s at 10 per batch, median
  32k, against 35-37k as two transactions, in four alternating rounds): what it saves is
  Courier's per-call and per-transaction work.
- receive (destructive; one statement per batch). Ceiling: one bare
  `DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING`.

Each path is measured through SQL (pgbench, against ceilings driven by pgbench too, so the
ratio measures the database work) and through the Python clients (sqlkit.consumer's Consumer
and ReceiveLoop), whose ceilings are the same pgbench figures: what the consumer costs on top
of its SQL shows as the gap between its line and the SQL line beside it.

The ReceiveLoop receives one message per transaction (its handler runs inside it), so its
ceiling is the raw single DELETE of one row per transaction, and both drain a tenth of the
messages: a transaction per message is commit-bound.

With pgmq installed (the `peers` extra), the SQL paths are also measured against pgmq's own,
in the same database and the same rounds: dequeue + ack against pgmq's read + delete of the
same batch, receive against its pop. pgmq is the peer a user would weigh Courier's pull
topics against; unlike the bare ceilings it is a queue as shipped. The Python Consumer is
measured against the loop a pgmq user writes too: psycopg, read a batch then delete it, with as
many asyncio tasks in one process as the Consumer has.

Every figure is messages drained per second; a Courier figure and its ceiling drain the same
number of preloaded messages from a table of the same size."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psycopg

from console import extras
from sqlkit import queries
from sqlkit.connection import connect
from sqlkit.consumer import Consumer, ReceiveLoop

from . import pgmq
from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds

TOPIC = "bench-pull"
BATCHES = (10, 100)
RECEIVE_BATCH = 100

# A bare table of courier.queue's shape: its columns, defaults and storage settings (fillfactor,
# autovacuum), with only the primary key and the one index a pull queue needs.
CEILING_TABLE = """
DROP TABLE IF EXISTS public.bench_pull;
CREATE TABLE public.bench_pull (LIKE courier.queue INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE public.bench_pull ADD PRIMARY KEY (id);
CREATE INDEX ON public.bench_pull (endpoint_id, visible_at, id) WHERE status IN ('pending', 'processing');
"""

_RAW_DUE = ("SELECT id FROM public.bench_pull WHERE endpoint_id = 1 AND status IN ('pending', 'processing') "
            "AND visible_at <= now() ORDER BY visible_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED")


def raw_leased_script(batch: int) -> str:
    """The lease protocol as bare SQL: claim a batch under a new lease, then delete it by id and lease."""
    return f"""
WITH picked AS ({_RAW_DUE.format(batch=batch)}),
     taken AS (UPDATE public.bench_pull q SET status = 'processing', lease = q.lease + 1,
                      visible_at = now() + interval '60 seconds'
               FROM picked WHERE q.id = picked.id RETURNING q.id, q.lease, q.payload)
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease), '{{}}') AS leases FROM taken \\gset
DELETE FROM public.bench_pull q USING unnest(:ids::bigint[], :leases::integer[]) AS u(id, lease)
WHERE q.id = u.id AND q.lease = u.lease;
"""


def raw_delete_script(batch: int) -> str:
    """A destructive take as bare SQL: one DELETE of the first due rows nobody else holds."""
    return f"""
DELETE FROM public.bench_pull WHERE id IN ({_RAW_DUE.format(batch=batch)})
RETURNING id, payload, metadata;
"""


def sql_dequeue_script(batch: int) -> str:
    return f"""
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease), '{{}}') AS leases
FROM courier.dequeue('{TOPIC}', {batch}, 60) \\gset
SELECT count(*) FROM courier.ack(:ids::bigint[], :leases::integer[]);
"""


def sql_carried_script(batch: int) -> str:
    """The Consumer's own statement (queries.sql's consumer_ack_and_dequeue), its new leases
    kept for the next call's ack."""
    statement = queries.query("consumer_ack_and_dequeue") % {
        "ids": "(:ids)", "leases": "(:leases)", "topic": f"'{TOPIC}'", "count": batch, "visibility_timeout": 60}
    return f"""
WITH r AS ({statement.strip().rstrip(';')})
SELECT coalesce(array_agg(id) FILTER (WHERE ack_result IS NULL), '{{}}') AS ids,
       coalesce(array_agg(lease) FILTER (WHERE ack_result IS NULL), '{{}}') AS leases FROM r \\gset
"""


def sql_receive_script(batch: int) -> str:
    return f"SELECT id, payload, metadata FROM courier.receive('{TOPIC}', {batch});\n"


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


def _left(dsn: str, table: str) -> int:
    with connect(dsn) as conn:
        if table == "courier.queue":
            return conn.execute("SELECT count(*) + (SELECT count(*) FROM courier.send_stage) FROM courier.queue "
                                "WHERE status IN ('pending', 'processing')").fetchone()[0]
        return conn.execute("SELECT count(*) FROM public.bench_pull").fetchone()[0]


def _drain_with_pgbench(dsn: str, table: str, script: str, batch: int, messages: int, clients: int,
                        defines: dict[str, str] | None = None) -> Measurement:
    _preload(dsn, table, messages)
    return _timed_drain(dsn, script, batch, messages, clients, lambda: _left(dsn, table), defines)


def _drain_pgmq(dsn: str, script: str, batch: int, messages: int, clients: int) -> Measurement:
    pgmq.preload(dsn, messages)
    return _timed_drain(dsn, script, batch, messages, clients, lambda: pgmq.left(dsn))


def _timed_drain(dsn: str, script: str, batch: int, messages: int, clients: int,
                 left: Callable[[], int], defines: dict[str, str] | None = None) -> Measurement:
    """pgbench runs `script` until the preloaded messages are gone; `left` counts what remains."""
    per_client = -(-messages // (batch * clients)) + 1
    started = time.perf_counter()
    run = run_script(dsn, script, clients=clients, transactions=per_client, defines=defines)
    elapsed = time.perf_counter() - started
    return Measurement((messages - left()) / elapsed, run.latency_ms)


def _drain_with_consumer(dsn: str, batch: int, messages: int, clients: int) -> Measurement:
    _preload(dsn, "courier.queue", messages)
    drained = 0

    async def consume(done: asyncio.Event) -> None:
        nonlocal drained
        async with Consumer(dsn, TOPIC, batch_size=batch, visibility_timeout=60, poll_interval=0.05) as consumer:
            async for messages_ in consumer.batches():
                results = await consumer.ack(messages_)
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


def _drain_pgmq_with_psycopg(dsn: str, batch: int, messages: int, clients: int) -> Measurement:
    """The peer of the Consumer: what a user of pgmq writes, `clients` asyncio tasks in one process,
    each on a psycopg connection of its own, reading a batch (payloads decoded, as the Consumer's
    are) and deleting it, two autocommit transactions per batch, polling as often as the Consumer."""
    pgmq.preload(dsn, messages)
    drained = 0

    async def consume(done: asyncio.Event) -> None:
        nonlocal drained
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not done.is_set():
                rows = await (await conn.execute("SELECT msg_id, message FROM pgmq.read(%s, 60, %s)",
                                                 (pgmq.QUEUE, batch))).fetchall()
                if not rows:
                    await asyncio.sleep(0.05)
                    continue
                deleted = await (await conn.execute("SELECT pgmq.delete(%s, %s::bigint[])",
                                                    (pgmq.QUEUE, [r[0] for r in rows]))).fetchall()
                drained += len(deleted)
                if drained >= messages:
                    done.set()

    async def main() -> float:
        done = asyncio.Event()
        started = time.perf_counter()
        await asyncio.gather(*(consume(done) for _ in range(clients)))
        return time.perf_counter() - started

    elapsed = asyncio.run(main())
    return Measurement(drained / elapsed)


def _drain_with_receive_loop(dsn: str, messages: int, clients: int) -> Measurement:
    _preload(dsn, "courier.queue", messages)

    async def main() -> tuple[float, int]:
        loop: ReceiveLoop | None = None
        received = 0

        async def handler(_message: object) -> None:
            nonlocal received
            received += 1
            if received >= messages and loop is not None:
                loop.stop()

        loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, max_records_to_peek=1000, concurrency=clients)
        started = time.perf_counter()
        await loop.run()
        return time.perf_counter() - started, loop.received

    elapsed, received = asyncio.run(main())
    return Measurement(received / elapsed)


def pull(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 100_000) -> list[ScenarioResult]:
    with connect(dsn) as conn:
        conn.execute(CEILING_TABLE)
        options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'courier.queue'::regclass").fetchone()[0]
        if options:
            conn.execute(f"ALTER TABLE public.bench_pull SET ({', '.join(options)})")
        if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (TOPIC,)).fetchone():
            conn.execute("SELECT courier.create_endpoint(%s, 'pull', '{}')", (TOPIC,))
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    singles = max(messages // 10, 1)
    bare, queue = "public.bench_pull", "courier.queue"
    runs = {}
    for batch in BATCHES:
        runs[f"raw leased {batch}"] = (
            lambda b=batch: _drain_with_pgbench(dsn, bare, raw_leased_script(b), b, messages, clients))
        runs[f"sql dequeue {batch}"] = (
            lambda b=batch: _drain_with_pgbench(dsn, queue, sql_dequeue_script(b), b, messages, clients))
        runs[f"sql carried {batch}"] = (
            # Each client starts with nothing to ack; its last batch stays leased, counted as not drained.
            lambda b=batch: _drain_with_pgbench(dsn, queue, sql_carried_script(b), b, messages, clients,
                                                {"ids": "{}", "leases": "{}"}))
        runs[f"consumer {batch}"] = lambda b=batch: _drain_with_consumer(dsn, b, messages, clients)
    runs["raw delete"] = lambda: _drain_with_pgbench(
        dsn, bare, raw_delete_script(RECEIVE_BATCH), RECEIVE_BATCH, messages, clients)
    runs["sql receive"] = lambda: _drain_with_pgbench(
        dsn, queue, sql_receive_script(RECEIVE_BATCH), RECEIVE_BATCH, messages, clients)
    runs["raw delete 1"] = lambda: _drain_with_pgbench(dsn, bare, raw_delete_script(1), 1, singles, clients)
    runs["receive loop"] = lambda: _drain_with_receive_loop(dsn, singles, clients)
    with_pgmq = pgmq.available()
    if with_pgmq:
        pgmq.install(dsn)
        for batch in BATCHES:
            runs[f"pgmq read {batch}"] = (
                lambda b=batch: _drain_pgmq(dsn, pgmq.read_delete_script(b), b, messages, clients))
            runs[f"pgmq psycopg {batch}"] = (
                lambda b=batch: _drain_pgmq_with_psycopg(dsn, b, messages, clients))
        runs["pgmq pop"] = lambda: _drain_pgmq(dsn, pgmq.pop_script(RECEIVE_BATCH), RECEIVE_BATCH, messages, clients)
        runs["sql receive 1"] = lambda: _drain_with_pgbench(dsn, queue, sql_receive_script(1), 1, singles, clients)
        runs["pgmq pop 1"] = lambda: _drain_pgmq(dsn, pgmq.pop_script(1), 1, singles, clients)
    m = measure_rounds(runs, rounds)

    single_delete = f"{m['raw delete'].rate:,.0f}"
    results = []
    for batch in BATCHES:
        ceiling = m[f"raw leased {batch}"]
        results.append(ScenarioResult(
            scenario="pull", variant=f"SQL dequeue({batch}) + ack, {messages:,} msgs", unit="msg/s",
            courier=m[f"sql dequeue {batch}"], ceiling=ceiling, target_ratio=0.95,
            notes=f"pgbench ({clients} clients): courier.dequeue({batch}) then courier.ack of the batch, two "
                  f"transactions; ceiling: the same lease protocol as bare SQL on a bare table (claim {batch} "
                  f"with SKIP LOCKED setting lease and deadline, then DELETE by id and lease). Not the single "
                  f"DELETE of {RECEIVE_BATCH} (receive's ceiling, {single_delete} msg/s): that takes no lease, "
                  f"so it does half the writes and no second transaction"))
        if with_pgmq:
            results.append(_against_pgmq(
                f"SQL dequeue({batch}) + ack vs pgmq read({batch}) + delete, {messages:,} msgs",
                m[f"sql dequeue {batch}"], m[f"pgmq read {batch}"],
                f"pgbench ({clients} clients), both in this database, alternating rounds: courier.dequeue({batch}) "
                f"+ courier.ack against pgmq.read(queue, 60, {batch}) + pgmq.delete(queue, ids). pgmq's delete "
                f"is by id alone: a consumer whose visibility timeout ran out deletes a message another now holds"))
        results.append(ScenarioResult(
            scenario="pull", variant=f"SQL ack + dequeue({batch}) in one statement, {messages:,} msgs",
            unit="msg/s", courier=m[f"sql carried {batch}"], ceiling=ceiling, target_ratio=0.95,
            notes=f"pgbench ({clients} clients): the Consumer's statement, courier.ack of the last batch and "
                  f"courier.dequeue({batch}) of the next, one transaction per batch; ceiling: the bare leased "
                  f"claim + delete of {batch} above (bare SQL gains nothing from one statement)"))
        results.append(ScenarioResult(
            scenario="pull", variant=f"Python Consumer, batches of {batch}", unit="msg/s",
            courier=m[f"consumer {batch}"], ceiling=ceiling, target_ratio=0.7,
            notes=f"{clients} sqlkit.consumer.Consumer instances in one asyncio process, batches() + ack(batch), "
                  f"each ack carrying the dequeue of the batch after next (the statement above); ceiling: the "
                  f"bare leased claim + delete of {batch} above"))
        if with_pgmq:
            results.append(ScenarioResult(
                scenario="pull", variant=f"Python Consumer vs a psycopg loop of pgmq read({batch}) + delete",
                unit="msg/s", courier=m[f"consumer {batch}"], ceiling=m[f"pgmq psycopg {batch}"], target_ratio=1.0,
                notes=f"the Consumer above against {clients} asyncio tasks in one process, each on a psycopg "
                      f"connection of its own running pgmq.read(queue, 60, {batch}) (payloads decoded) then "
                      f"pgmq.delete(queue, ids), two transactions per batch ({pgmq.note()})"))
    delete = m["raw delete"]
    results.append(ScenarioResult(
        scenario="pull", variant=f"SQL receive({RECEIVE_BATCH}), {messages:,} msgs", unit="msg/s",
        courier=m["sql receive"], ceiling=delete, target_ratio=0.95,
        notes=f"pgbench ({clients} clients): courier.receive({RECEIVE_BATCH}), one transaction; ceiling: one bare "
              f"DELETE ... WHERE id IN (SELECT ... ORDER BY due time FOR UPDATE SKIP LOCKED LIMIT "
              f"{RECEIVE_BATCH}) RETURNING"
              + ("" if with_pgmq else f"; pgmq's rows left out: {extras.EXTRAS['peers'].install}")))
    if with_pgmq:
        results.append(_against_pgmq(
            f"SQL receive({RECEIVE_BATCH}) vs pgmq pop({RECEIVE_BATCH}), {messages:,} msgs", m["sql receive"],
            m["pgmq pop"], f"pgbench ({clients} clients), both in this database, alternating rounds: "
                           f"courier.receive({RECEIVE_BATCH}) against pgmq.pop(queue, {RECEIVE_BATCH})"))
        results.append(_against_pgmq(
            f"SQL receive(1) vs pgmq pop(1), {singles:,} msgs", m["sql receive 1"], m["pgmq pop 1"],
            f"pgbench ({clients} clients), one message per call and transaction, both in this database: what "
            f"the ReceiveLoop below is capped by, against pgmq's pop(queue, 1)"))
    results.append(ScenarioResult(
        scenario="pull", variant=f"Python ReceiveLoop, 1 per transaction, {singles:,} msgs", unit="msg/s",
        courier=m["receive loop"], ceiling=m["raw delete 1"], target_ratio=0.6,
        notes=f"sqlkit.consumer.ReceiveLoop, concurrency {clients}: peek, then courier.receive(1) per transaction "
              f"around the handler (NServiceBus); ceiling: the bare single DELETE of 1 row per transaction, "
              f"pgbench with {clients} clients"))
    return results


def _against_pgmq(variant: str, courier: Measurement, peer: Measurement, notes: str) -> ScenarioResult:
    return ScenarioResult(scenario="pull", variant=variant, unit="msg/s", courier=courier, ceiling=peer,
                          target_ratio=0.95, notes=f"{notes} ({pgmq.note()})")
