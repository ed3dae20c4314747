"""What a worker's claim (report_and_claim) does besides claiming, in its one round trip: while
the worker lingers after a wake-up it asks first whether a producer of the endpoint is still
committing, so an empty claim that says no is the linger's last; and it commits without waiting
for its WAL to be flushed, since a claim or report a server crash forgets is delivered again."""

from __future__ import annotations

import psycopg

from tests.helpers import scalar
from tests.test_send_wakeups import RunningPool, delivered
from tests.workers import wait_for

CLAIM = ("SELECT id, committing FROM courier.report_and_claim('test', 10, %s, '{}', '{}', '{}', '{}', NULL, NULL, %s)")


def committing_producer(dsn: str, endpoint: int) -> psycopg.Connection:
    """A session holding what a producer holds from its commit-time wake-up until its commit is
    visible (_wake_workers_at_commit): the shared sends_committing key of the endpoint."""
    producer = psycopg.connect(dsn)
    producer.execute("SELECT pg_advisory_xact_lock_shared(hashtext('courier.sends_committing'), %s)", (endpoint,))
    return producer


def test_a_lingering_claim_says_whether_a_producer_was_committing_when_it_looked(dsn, conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    assert conn.execute(CLAIM, (hook, False)).fetchall() == [(None, None)]  # not asked
    assert conn.execute(CLAIM, (hook, True)).fetchall() == [(None, False)]

    producer = committing_producer(dsn, hook)
    try:
        assert conn.execute(CLAIM, (hook, True)).fetchall() == [(None, True)]
        conn.execute("SELECT courier.send('hook', '{}')")
        [(claimed, committing)] = conn.execute(CLAIM, (hook, True)).fetchall()
        assert claimed is not None and committing  # the answer rides on the claimed rows too
    finally:
        producer.close()
    assert conn.execute(CLAIM, (hook, True)).fetchall() == [(None, False)]


def test_the_claim_commits_without_waiting_for_its_wal_and_leaves_the_session_as_it_was(conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send('hook', '{}')")
    with conn.transaction():
        assert len(conn.execute(CLAIM, (hook, False)).fetchall()) == 1
        assert scalar(conn, "SHOW synchronous_commit") == "off"
    assert scalar(conn, "SHOW synchronous_commit") == "on"


def test_a_lone_message_costs_the_worker_two_claims(dsn, conn):
    """Its claim, and the claim that carries its report and, finding nothing, ends the linger:
    no round trip to ask about producers, and no final look after it."""
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")
    with RunningPool(dsn) as pool:
        conn.execute("SELECT courier.send('sink', '{}')")
        delivered(pool, 1)  # the worker listens now
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.queue") == 0)
        before = pool.stats.round_trips
        for sent in range(2, 7):
            conn.execute("SELECT courier.send('sink', '{}')")
            delivered(pool, sent)
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.queue") == 0)  # reported
        assert pool.stats.round_trips - before == 2 * 5
