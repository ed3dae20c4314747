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


def test_a_trickle_of_noop_messages_reports_each_outcome_with_the_next_claim(dsn, conn):
    """One message at a time: the no-op dispatch is done within a turn of the event loop, so
    the claim that follows it carries its outcome, and no report needs a round trip of its own
    (each had one: a quarter of a trickle's round trips, and a step of its latency)."""
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    sent = 0

    def next_delivered() -> bool:
        nonlocal sent
        if scalar(conn, "SELECT count(*) FROM courier.archive") < sent:
            return False
        if sent == 20:
            return True
        conn.execute("SELECT courier.send('hook', '{}')")
        sent += 1
        return False

    pool = run_pool_until(dsn, next_delivered, timeout=60, poll_interval=0.05)
    assert sent == 20 and pool.stats.delivered == 20
    assert pool.stats.lone_reports == 0
