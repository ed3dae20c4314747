"""The depth counters are unlogged (migration 0038): a crash empties them, and one count of the
queue makes them whole again, exactly, even while producers keep sending."""

from __future__ import annotations

import threading

import psycopg

from sqlkit import migrate
from tests.test_soak import EmbeddedServer

COUNTED = """
SELECT coalesce(jsonb_object_agg(endpoint_id || '/' || status, messages), '{}')
FROM (SELECT endpoint_id, status, sum(messages) AS messages FROM courier.queue_depth
      GROUP BY endpoint_id, status HAVING sum(messages) <> 0) d
"""
ACTUAL = """
SELECT coalesce(jsonb_object_agg(endpoint_id || '/' || status, messages), '{}')
FROM (SELECT endpoint_id, status, count(*) AS messages FROM courier.queue GROUP BY endpoint_id, status) q
"""


def _fill(conn: psycopg.Connection) -> None:
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.send_batch('hook', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 40) g")
    conn.execute("SELECT courier.send_batch('jobs', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 30) g")
    conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 7, 60)")


def test_a_crash_empties_the_counters_and_the_next_migrate_counts_the_queue_again():
    server = EmbeddedServer()
    try:
        migrate.migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            _fill(conn)
            before = conn.execute(COUNTED).fetchone()[0]
            assert before == conn.execute(ACTUAL).fetchone()[0]
            assert before  # pending and processing rows of two endpoints
        server.crash_restart()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            # The premise: crash recovery resets unlogged tables, the mark of a whole count included.
            assert conn.execute("SELECT count(*) FROM courier.queue_depth").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM courier.queue_depth_built").fetchone()[0] == 0
            migrate.migrate(server.dsn)  # what every worker, console and `courier migrate` runs at start
            assert conn.execute(COUNTED).fetchone()[0] == before
            assert conn.execute("SELECT courier.rebuild_queue_depth()").fetchone()[0] == 0  # whole: nothing to do
            event = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'queue_depth.rebuilt'"
                                 ).fetchone()
            assert event is not None
            # Sends and claims after the rebuild are counted on top of it.
            conn.execute("SELECT courier.send('hook', '{}')")
            conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 3, 60)")
            assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    finally:
        server.close()


def test_a_rebuild_during_concurrent_sends_leaves_the_counters_exact(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as conn:
        _fill(conn)
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce(target: str) -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as producer:
                    while not stop.is_set():
                        producer.execute("SELECT courier.send(%s, '{}')", (target,))
            except BaseException as error:  # reported by the assertion below
                errors.append(error)

        producers = [threading.Thread(target=produce, args=(t,)) for t in ("hook", "jobs", "hook")]
        for producer in producers:
            producer.start()
        try:
            for _ in range(5):
                # As after a crash: the counters and their mark gone, producers still sending.
                with conn.transaction():
                    conn.execute("DELETE FROM courier.queue_depth")
                    conn.execute("DELETE FROM courier.queue_depth_built")
                assert conn.execute("SELECT courier.rebuild_queue_depth()").fetchone()[0] > 0
        finally:
            stop.set()
            for producer in producers:
                producer.join(30)
        assert not errors
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] > 70
