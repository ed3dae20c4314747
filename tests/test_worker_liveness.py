"""A worker's liveness is judged by its database sessions, across a restart of the database too."""

from __future__ import annotations

import psycopg

from sqlkit import migrate
from tests.test_soak import EmbeddedServer


def test_a_worker_that_died_while_the_database_restarted_is_not_alive_once_it_is_back():
    """Issue 41: a worker that died while PostgreSQL restarted showed alive for up to 30 s, by
    its last heartbeat. Once the database has been back 15 s, a worker that registered no
    session since is not connected, and not alive; one that did is."""
    server = EmbeddedServer()
    try:
        migrate.migrate(server.dsn)

        def beat(conn: psycopg.Connection, worker: str) -> None:
            conn.execute("SELECT courier.register_worker_session(%s, %s)", (worker, worker + "-1"))
            conn.execute("SELECT courier.worker_heartbeat(%s, 'h', 1, 1, 0, 0, 0, 'running', NULL)", (worker,))

        with psycopg.connect(server.dsn, autocommit=True) as conn:
            beat(conn, "dies")
            beat(conn, "lives")
        server.crash_restart()
        with psycopg.connect(server.dsn, autocommit=True) as survivor, \
                psycopg.connect(server.dsn, autocommit=True) as conn:
            beat(survivor, "lives")  # a live worker's pools reconnect and register again
            status = "SELECT worker_id, alive, connected FROM courier.get_worker_status() ORDER BY worker_id"
            assert conn.execute(status).fetchall() == [("dies", True, None), ("lives", True, True)]
            conn.execute("SELECT pg_sleep(greatest(0, 15.5 - extract(epoch FROM now() - pg_postmaster_start_time())))")
            assert conn.execute(status).fetchall() == [("dies", False, False), ("lives", True, True)]
    finally:
        server.close()
