"""When outcomes are reported: at once while the pool is quiet, and on the next claim while an
endpoint is busy (report_interval is how long they may wait for it)."""

from __future__ import annotations

import time

from tests.helpers import scalar
from tests.workers import run_pool_until


def test_a_quiet_pool_reports_an_outcome_without_waiting_for_the_report_interval(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send('hook', '{}')")
    started = time.monotonic()
    run_pool_until(dsn, lambda: scalar(conn, "SELECT count(*) FROM courier.archive") == 1,
                   timeout=30, report_interval=20.0)
    assert time.monotonic() - started < 10  # a twenty-second wait would have held it


def test_a_busy_pool_reports_through_its_claims(dsn, conn):
    """Draining a backlog, outcomes ride on the claims: far fewer round trips than batches."""
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('hook', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 20000) g))")
    pool = run_pool_until(dsn, lambda: scalar(conn, "SELECT count(*) FROM courier.archive") == 20000,
                          timeout=120, concurrency=256)
    assert pool.stats.delivered == 20000
    assert pool.stats.round_trips <= 20000 / 100 * 1.5  # claims of 100, most carrying the last outcomes
