"""Issue 27: claim slots. However many pools and hosts serve an endpoint, at most two of its
claims (report_and_claim) scan its queue at once; a claim that finds both slots taken still
reports what it carried, claims nothing and says busy, and a worker whose slots stay taken
(a squatter, a stuck claim) claims past them after a second. Only the worker's role can
take a slot."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from tests import test_roles_and_psql
from tests.helpers import archived, scalar
from tests.workers import start_worker_process, wait_for

login_as = test_roles_and_psql.login_as

REPORT_AND_CLAIM = ("SELECT id, lease, delivered, busy FROM courier.report_and_claim("
                    "'test', 10, %s, %s, %s, %s, %s)")


def report_and_claim(conn, endpoint: int, ids=(), leases=()) -> list[tuple]:
    ids, leases = list(ids), list(leases)
    return conn.execute(REPORT_AND_CLAIM, (endpoint, ids, leases, ["success"] * len(ids), [None] * len(ids))).fetchall()


def claims_busy(conn) -> dict[str, float]:
    return dict(conn.execute("SELECT labels ->> 'endpoint', metric_value FROM courier.metrics() "
                             "WHERE metric_name = 'claims_busy_total'").fetchall())


def hold_slots(dsn: str, endpoint: int, count: int = 2) -> psycopg.Connection:
    """A session (of the owner's) in a transaction holding `count` of the endpoint's slots."""
    holder = psycopg.connect(dsn)
    held = holder.execute("SELECT slot FROM courier.claim_slots WHERE endpoint_id = %s ORDER BY slot LIMIT %s "
                          "FOR UPDATE", (endpoint, count)).fetchall()
    assert len(held) == count
    return holder


def test_every_endpoint_has_its_slots_and_loses_them_with_it(conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    other = scalar(conn, "SELECT courier.create_endpoint('other', 'noop', '{}')")
    slots = conn.execute("SELECT endpoint_id, count(*), min(slot), max(slot) FROM courier.claim_slots "
                         "GROUP BY 1 ORDER BY 1").fetchall()
    assert slots == [(hook, 8, 0, 7), (other, 8, 0, 7)]  # as many as claim_slots may ask for
    conn.execute("SELECT courier.drop_endpoint('other', true)")
    assert scalar(conn, "SELECT array_agg(DISTINCT endpoint_id) FROM courier.claim_slots") == [hook]


def test_a_claim_with_both_slots_taken_reports_and_says_busy(dsn, conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[15]))")
    first = report_and_claim(conn, hook)
    assert len(first) == 10 and not any(row[3] for row in first)

    holder = hold_slots(dsn, hook)
    try:
        # The outcomes it carries are reported; nothing is claimed while both slots are held.
        busy = report_and_claim(conn, hook, [row[0] for row in first], [row[1] for row in first])
        assert busy == [(None, None, 10, True)]
        assert archived(conn) == 10
        assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 5
        assert claims_busy(conn) == {"hook": 1}  # what tells an operator to allow more slots
        # One slot free again: claims go on (and with one held, another claim still can).
        holder.rollback()
        holder.execute("SELECT 1 FROM courier.claim_slots WHERE endpoint_id = %s AND slot = 0 FOR UPDATE", (hook,))
        rest = report_and_claim(conn, hook)
        assert len(rest) == 5 and not any(row[3] for row in rest)
        assert claims_busy(conn) == {"hook": 1}
    finally:
        holder.close()


@pytest.mark.parametrize(("setting", "held", "busy"), [("1", 1, True), ("3", 2, False), ("0", 8, False)])
def test_claim_slots_is_how_many_slots_claims_may_take(dsn, conn, setting, held, busy):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send('hook', '{}')")
    conn.execute("SELECT courier.set_setting('claim_slots', %s)", (setting,))
    holder = hold_slots(dsn, hook, held)
    try:
        rows = report_and_claim(conn, hook)
        assert [row[3] for row in rows] == [busy]
        assert (rows[0][0] is None) == busy
    finally:
        holder.close()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="claim_slots = 9 is out of range"):
        conn.execute("SELECT courier.set_setting('claim_slots', '9')")


def test_only_the_workers_role_can_take_a_slot(conn, login_as):
    scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    for role in ("courier_application", "courier_monitor"):
        squatter = login_as(role)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            squatter.execute("SELECT * FROM courier.claim_slots FOR UPDATE")


def test_a_worker_claims_past_slots_held_by_a_squatter(dsn, conn):
    hook = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    holder = hold_slots(dsn, hook)
    worker = start_worker_process(dsn)
    try:
        conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[50]))")
        wait_for(lambda: archived(conn) == 50, timeout=30)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        holder.close()
    assert worker.returncode == 0, worker.stderr.read()
