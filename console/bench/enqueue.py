"""enqueue-single and enqueue-batch: courier.send / send_batch against a raw INSERT ceiling.

The ceiling table has the queue's columns and defaults and only a primary key (BENCHMARKS.md's
"bare table of the same shape"): the price of everything Courier adds (validation,
backpressure, depth counters, the claim index, NOTIFY) shows as the ratio.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator

from sqlkit.connection import connect

from . import pgmq
from .drain import worker_process
from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds
from .scratch import backpressure_out_of_reach, in_background, leader_estimates

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS public.bench_raw_queue
    (LIKE courier.queue INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE public.bench_raw_queue DROP CONSTRAINT IF EXISTS bench_raw_queue_pkey;
ALTER TABLE public.bench_raw_queue ADD PRIMARY KEY (id);
"""


def _prepare(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(RAW_TABLE)
        for name, protocol in (("bench", "noop"), ("bench-topic", "pull")):
            exists = conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (name,)).fetchone()
            if not exists:
                conn.execute("SELECT courier.create_endpoint(%s, %s, '{}')", (name, protocol))
        backpressure_out_of_reach(conn)


def _reset(dsn: str, with_pgmq: bool) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, public.bench_raw_queue")
        conn.execute("VACUUM ANALYZE courier.queue_depth")
    if with_pgmq:
        pgmq.empty(dsn)


def _with_pgmq(dsn: str) -> bool:
    """pgmq installed in the database and its queue made, if the peers extra is there."""
    if not pgmq.available():
        return False
    pgmq.install(dsn)
    return True


def _set_notify(dsn: str, on: bool) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT courier.set_setting('notify_on_send', %s)", ("true" if on else "false",))


def enqueue_single(dsn: str, *, clients: int, seconds: float, rounds: int) -> list[ScenarioResult]:
    _prepare(dsn)
    payload = json.dumps({"order_id": 1, "amount": 99.99, "customer": "c-789"})
    send_sql = f"SELECT courier.send('bench', '{payload}'::jsonb);\n"
    topic_sql = f"SELECT courier.send('bench-topic', '{payload}'::jsonb);\n"
    enqueue_sql = f"SELECT courier.enqueue('bench-topic', '{payload}'::jsonb);\n"
    ceiling_sql = f"INSERT INTO public.bench_raw_queue (endpoint_id, payload) VALUES (1, '{payload}'::jsonb);\n"
    table_sql = f"INSERT INTO courier.queue (endpoint_id, payload) VALUES (1, '{payload}'::jsonb);\n"

    with_pgmq = _with_pgmq(dsn)

    def run(script: str, notify: bool = True) -> Measurement:
        _reset(dsn, with_pgmq)
        _set_notify(dsn, notify)
        with leader_estimates(dsn):
            result = run_script(dsn, script, clients=clients, seconds=seconds)
        return Measurement(result.transactions_per_second, result.latency_ms)

    def drained(script: str, consumer: Callable[[], contextlib.AbstractContextManager[object]]) -> Measurement:
        _reset(dsn, with_pgmq)
        with consumer():
            result = run_script(dsn, script, clients=clients, seconds=seconds)
        return Measurement(result.transactions_per_second, result.latency_ms)

    runs = {"ceiling": lambda: run(ceiling_sql)}
    if with_pgmq:
        runs["pgmq"] = lambda: run(pgmq.send_script(payload))
        runs["send, drained"] = lambda: drained(send_sql, lambda: _worker_running(dsn))
        runs["pgmq, drained"] = lambda: drained(pgmq.send_script(payload), lambda: pgmq.draining(dsn))
        runs["enqueue, drained"] = lambda: drained(enqueue_sql, lambda: _topic_draining(dsn))
    runs |= {
        "send": lambda: run(send_sql),
        "send, notify off": lambda: run(send_sql, notify=False),
        "send to a pull topic": lambda: run(topic_sql),
        "queue table only": lambda: run(table_sql),
    }
    measured = measure_rounds(runs, rounds)
    _set_notify(dsn, True)
    notes = {
        "send": "courier.send() per transaction, NOTIFY on (default)",
        "send, notify off": "notify_on_send = false: workers poll instead",
        "send to a pull topic": "courier.send() to a pull topic, NOTIFY on: its consumers are woken at commit too",
        "queue table only": "reference: raw INSERT into courier.queue (its indexes and depth trigger, no function)",
    }
    results = [
        ScenarioResult(scenario="enqueue-single", variant=f"{name}, {clients} clients", unit="msg/s",
                       courier=measured[name], ceiling=measured["ceiling"],
                       target_ratio=None if name == "queue table only" else 0.6, notes=note)
        for name, note in notes.items()
    ]
    if with_pgmq:
        results.append(ScenarioResult(
            scenario="enqueue-single", variant=f"send vs pgmq send, {clients} clients", unit="msg/s",
            courier=measured["send"], ceiling=measured["pgmq"], target_ratio=0.95,
            notes=f"courier.send() as shipped (NOTIFY on) against pgmq.send(), which notifies no one unless a "
                  f"queue asks for it ({pgmq.note()})"))
        results.append(ScenarioResult(
            scenario="enqueue-single", variant=f"send vs pgmq send, drained, {clients} clients", unit="msg/s",
            courier=measured["send, drained"], ceiling=measured["pgmq, drained"], target_ratio=1.0,
            notes="the same sends while they are consumed on the same machine: `courier worker` with no flags "
                  "delivering to a no-op endpoint, against pgmq's consumer reading 100 under a visibility "
                  "timeout and deleting them (pgbench, as fast as it can)"))
        results.append(ScenarioResult(
            scenario="enqueue-single", variant=f"enqueue vs pgmq send, drained, {clients} clients", unit="msg/s",
            courier=measured["enqueue, drained"], ceiling=measured["pgmq, drained"], target_ratio=1.0,
            notes="courier.enqueue() to a pull topic while a consumer dequeues 100 and acks them (pgbench, as "
                  "fast as it can) and `courier worker` runs for its maintenance leader, against pgmq's "
                  "consumer as above"))
    return results


def _dequeue_ack_script(batch: int) -> str:
    """A pull consumer's cycle, as pgmq's read and delete: dequeue a batch, then ack it."""
    return f"""
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease), '{{}}') AS leases
FROM courier.dequeue('bench-topic', {batch}, 60) \\gset
SELECT count(*) FROM courier.ack(:ids::bigint[], :leases::integer[]);
"""


@contextlib.contextmanager
def _topic_draining(dsn: str) -> Iterator[None]:
    """A pull topic's consumer beside the producers, as fast as it can (dequeue 100 and ack them,
    in pgbench), with `courier worker` running for its maintenance leader, as a deployment has."""
    def consume(stop: threading.Event) -> None:
        while not stop.is_set():
            run_script(dsn, _dequeue_ack_script(100), clients=1, transactions=200)

    with _worker_running(dsn), in_background(consume):
        yield


@contextlib.contextmanager
def _worker_running(dsn: str) -> Iterator[None]:
    """`courier worker` with no flags, once its maintenance leader keeps the send stage alive
    (a send before that goes to the queue, as it does on any deployment's first seconds)."""
    with worker_process(dsn) as worker:
        deadline = time.monotonic() + 60
        with connect(dsn) as conn:
            while not conn.execute("SELECT EXISTS (SELECT FROM courier.get_worker_status() "
                                   "WHERE alive AND maintenance_leader) "
                                   "AND (SELECT stage_until > now() FROM courier.send_limits)").fetchone()[0]:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise worker.failure("did not start leading maintenance")
                time.sleep(0.1)
        yield


def enqueue_batch(dsn: str, *, clients: int, seconds: float, rounds: int) -> list[ScenarioResult]:
    _prepare(dsn)
    with_pgmq = _with_pgmq(dsn)
    results = []
    for size in (100, 1000):
        array = "ARRAY[" + ",".join(
            f"'{json.dumps({'order_id': n, 'amount': 99.99})}'" for n in range(size)) + "]::jsonb[]"
        courier_sql = f"SELECT courier.send_batch('bench', {array});\n"
        ceiling_sql = (f"INSERT INTO public.bench_raw_queue (endpoint_id, payload) "
                       f"SELECT 1, p FROM unnest({array}) AS p;\n")

        def run(script: str, size: int = size) -> Measurement:
            _reset(dsn, with_pgmq)
            with leader_estimates(dsn):
                result = run_script(dsn, script, clients=clients, seconds=seconds)
            return Measurement(result.transactions_per_second * size, result.latency_ms)

        runs = {"ceiling": lambda c=ceiling_sql: run(c)}
        if with_pgmq:
            runs["pgmq"] = lambda a=array: run(pgmq.send_batch_script(a))
        runs["courier"] = lambda c=courier_sql: run(c)  # last: its messages stay for a look afterwards
        measured = measure_rounds(runs, rounds)
        results.append(ScenarioResult(
            scenario="enqueue-batch", variant=f"batch {size}, {clients} clients", unit="msg/s",
            courier=measured["courier"], ceiling=measured["ceiling"], target_ratio=0.7, target_absolute=100_000,
            notes="send_batch vs raw INSERT ... SELECT unnest(...)",
        ))
        if with_pgmq:
            results.append(ScenarioResult(
                scenario="enqueue-batch", variant=f"batch {size} vs pgmq send_batch, {clients} clients",
                unit="msg/s", courier=measured["courier"], ceiling=measured["pgmq"], target_ratio=0.95,
                notes=f"courier.send_batch() against pgmq.send_batch() of the same payloads ({pgmq.note()})"))
    return results
