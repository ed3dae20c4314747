"""Issue 42: cancel and purge race safely against claims. Two real `courier worker` processes
drain a no-op endpoint while producers send and two sessions cancel and purge as fast as they
can: every message ends exactly once (delivered, cancelled or purged, never two of them), the
counters agree with the rows, and a cancel or purge never takes a message a worker reported
delivered."""

from __future__ import annotations

import random
import threading
import time

import psycopg

from tests.helpers import scalar
from tests.test_verbs import depth_is_exact
from tests.workers import start_worker_process, wait_for

MESSAGES = 3000


def test_cancel_and_purge_race_claims_and_every_message_ends_once(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    stop = threading.Event()
    cancelled: set[int] = set()
    errors: list[BaseException] = []

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            for n in range(0, MESSAGES, 50):
                own.execute("SELECT courier.send_batch_with_options('hook', "
                            "ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%s::int, %s::int) g), "
                            "p_ordering_keys => ARRAY(SELECT CASE WHEN g %% 3 = 0 THEN 'k' || (g %% 7) END "
                            "FROM generate_series(%s::int, %s::int) g))", (n, n + 49, n, n + 49))
                time.sleep(0.005)

    def cancel() -> None:
        rnd = random.Random(1)
        with psycopg.connect(dsn, autocommit=True) as own:
            while not stop.is_set():
                ids = [row[0] for row in own.execute(
                    "SELECT id FROM courier.queue WHERE status IN ('pending', 'processing') "
                    "ORDER BY random() LIMIT 5")]
                for message_id in ids:
                    try:
                        was = own.execute("SELECT was FROM courier.cancel_message(%s)", (message_id,)).fetchone()[0]
                        if was != "cancelled":
                            cancelled.add(message_id)
                    except psycopg.errors.ObjectNotInPrerequisiteState:
                        pass  # delivered (or purged) first: refused, as it should be
                    except psycopg.errors.NoDataFound:
                        pass
                time.sleep(rnd.random() * 0.01)

    def purge() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while not stop.is_set():
                own.execute("SELECT courier.purge_queue('hook')")
                time.sleep(0.05)

    def guarded(work):
        def run() -> None:
            try:
                work()
            except BaseException as error:
                errors.append(error)
        return run

    workers = [start_worker_process(dsn, "--worker-id", name) for name in ("w1", "w2")]
    try:
        # Claims must be running before the first message: otherwise the purge, every 50 ms,
        # can take all of them while the workers are still starting, and nothing races a claim.
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.workers WHERE worker_id IN ('w1', 'w2') "
                                      "AND state = 'running'") == 2, timeout=60)
        threads = [threading.Thread(target=guarded(work)) for work in (produce, cancel, purge)]
        for thread in threads:
            thread.start()
        threads[0].join(120)
        stop.set()
        for thread in threads[1:]:
            thread.join(60)
        assert errors == []
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.queue") == 0, timeout=60)
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(30)

    ended = dict(conn.execute("SELECT status, count(*) FROM courier.archive GROUP BY 1").fetchall())
    assert sum(ended.values()) == MESSAGES
    assert scalar(conn, "SELECT count(DISTINCT id) FROM courier.archive") == MESSAGES  # none archived twice
    assert set(ended) <= {"completed", "cancelled", "purged"}
    assert ended.get("cancelled", 0) == len(cancelled) > 0
    assert ended.get("purged", 0) > 0 and ended.get("completed", 0) > 0
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'cancelled' AND id <> ALL (%s)",
                  (sorted(cancelled),)) == 0
    delivered = scalar(conn, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals WHERE outcome = 'delivered'")
    assert delivered == ended["completed"]  # a delivery counted is a message archived as completed
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
    assert depth_is_exact(conn) == {}
