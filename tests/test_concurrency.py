"""Concurrency with many real connections: idempotency, claiming, ordering keys, priority."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import psycopg

from tests.helpers import complete, scalar

WORKERS = 8


def test_concurrent_sends_with_one_idempotency_key_make_one_row(dsn, conn, webhook):
    barrier = threading.Barrier(WORKERS)

    def send(_: int) -> int:
        with psycopg.connect(dsn, autocommit=True) as own:
            barrier.wait()
            return scalar(own, "SELECT courier.send_with_options('webhook', '{\"order_id\": 7}'::jsonb, "
                               "p_idempotency_key := 'order-7')")

    with ThreadPoolExecutor(WORKERS) as pool:
        ids = list(pool.map(send, range(WORKERS)))
    assert len(set(ids)) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 1


def test_concurrent_claimers_never_share_a_message(dsn, conn, webhook):
    total = 3000
    conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, %s) g))", (total,))
    barrier = threading.Barrier(WORKERS)

    def drain(worker: int) -> list[int]:
        got: list[int] = []
        with psycopg.connect(dsn, autocommit=True) as own:
            barrier.wait()
            while batch := own.execute("SELECT id FROM courier._claim_due(%s, 25)",
                                       (f"w{worker}",)).fetchall():
                got.extend(row[0] for row in batch)
        return got

    with ThreadPoolExecutor(WORKERS) as pool:
        claimed = [message_id for ids in pool.map(drain, range(WORKERS)) for message_id in ids]
    assert len(claimed) == total
    assert len(set(claimed)) == total
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == total


def test_ordering_keys_hold_under_concurrent_workers(dsn, conn, webhook):
    keys = [f"customer-{k}" for k in range(12)]
    per_key = 25
    # Interleave keys and priorities so that FIFO within a key fights priority order.
    rows = [(key, step, random.randint(0, 10)) for step in range(per_key) for key in keys]
    with conn.transaction():
        for key, step, priority in rows:
            conn.execute("SELECT courier.send_with_options('webhook', %s::jsonb, p_priority := %s, "
                         "p_ordering_key := %s)", (f'{{"step": {step}}}', priority, key))
    conn.execute("SELECT courier.send_batch('webhook', ARRAY(SELECT jsonb_build_object('free', g) "
                 "FROM generate_series(1, 200) g))")

    in_flight: set[str] = set()
    delivered: dict[str, list[int]] = defaultdict(list)
    violations: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def watch_database() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while not stop.is_set():
                doubled = own.execute("SELECT ordering_key FROM courier.queue WHERE status = 'processing' "
                                      "AND ordering_key IS NOT NULL GROUP BY 1 HAVING count(*) > 1").fetchall()
                violations.extend(f"database shows two in processing for {row[0]}" for row in doubled)

    def work(worker: int) -> None:
        idle = 0
        with psycopg.connect(dsn, autocommit=True) as own:
            while idle < 20:
                batch = own.execute("SELECT id, payload, ordering_key FROM courier._claim_due(%s, 5)",
                                    (f"w{worker}",)).fetchall()
                if not batch:
                    idle += 1
                    continue
                idle = 0
                with lock:
                    for _, payload, key in batch:
                        if key is None:
                            continue
                        if key in in_flight:
                            violations.append(f"{key} handed out while in flight")
                        in_flight.add(key)
                        delivered[key].append(payload["step"])
                with lock:
                    for _, _, key in batch:
                        in_flight.discard(key)
                complete(own, [row[0] for row in batch])

    watcher = threading.Thread(target=watch_database)
    watcher.start()
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(work, range(WORKERS)))
    finally:
        stop.set()
        watcher.join()

    assert violations == []
    assert {key: steps for key, steps in delivered.items()} == {key: list(range(per_key)) for key in keys}
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status <> 'completed'") == 0


def test_priority_order_holds_for_a_single_claimer(conn, webhook):
    priorities = [random.randint(0, 10) for _ in range(300)]
    with conn.transaction():
        for n, priority in enumerate(priorities):
            conn.execute("SELECT courier.send_with_options('webhook', %s::jsonb, p_priority := %s)",
                         (f'{{"n": {n}}}', priority))
    order = []
    while batch := conn.execute("SELECT priority, id FROM courier._claim_due('w', 7)").fetchall():
        order.extend(batch)
    assert order == sorted(order, key=lambda row: (-row[0], row[1]))
    assert len(order) == len(priorities)


def test_priority_order_holds_per_claim_with_concurrent_claimers(dsn, conn, webhook):
    conn.execute("SELECT courier.send_batch_with_priority('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 400) g), 1)")
    conn.execute("SELECT courier.send_batch_with_priority('webhook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 400) g), 9)")
    claims: list[list[tuple[int, int]]] = []
    lock = threading.Lock()

    def drain(worker: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while batch := own.execute("SELECT priority, id FROM courier._claim_due(%s, 20)",
                                       (f"w{worker}",)).fetchall():
                with lock:
                    claims.append(batch)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(drain, range(4)))
    # Each claim is itself in priority order; a claim that mixes priorities took every 9 it
    # could before any 1, so no claim holds a 1 ahead of a 9.
    for batch in claims:
        assert batch == sorted(batch, key=lambda row: (-row[0], row[1]))
    assert sum(len(batch) for batch in claims) == 800
    assert sum(1 for batch in claims for row in batch if row[0] == 9) == 400
